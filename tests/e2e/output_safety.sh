#!/usr/bin/env bash
# e2e: the promises of docs/RELIABILITY.md about output files (the full-disk ones are in full_disk.sh):
#  - two outputs naming one file are refused (exit 2) even before the file exists: --trace b.json --json ./b.json;
#  - a symlink planted at PATH.partial is not followed by a checkpoint save; a symlink at PATH (--json, --trace) has
#    its target written and stays a link (docs/RELIABILITY.md section 4);
#  - SIGTERM / SIGINT to bench, sweep and run exit with 128 + the signal (143 / 130) and one line; an interrupted
#    bench --csv keeps every row it printed; no temporary is left;
#  - a rank stuck inside a collective checkpoint write: the I/O watchdog ends the job with exit 3 (bounded time);
#  - two saves of the same run give byte-identical checkpoints (1 and 4 ranks).
# Usage: output_safety.sh SHARDSIM_BINARY CONFIG_DIR [MPIEXEC]
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
e2e_init "$@"
E2E_MPIRUN_NP1=1  # signals and aborts at one rank go through mpirun, as users run it
export OMPI_MCA_btl=self,vader  # single host: shared memory only

with_chips "$SMALL" 1 c1.yaml
with_chips "$SMALL" 4 c4.yaml

no_temporaries() {  # DIR
  local left
  left=$(find "$1" -maxdepth 2 -name '*.partial*' | head -n 3)
  if [ -n "$left" ]; then fail "temporaries left behind: $left"; else pass "no temporary left in $1"; fi
}

# ---- 1. two outputs, one file, neither exists yet ----
e2e_case "--trace b.json --json ./b.json"
if expect_exit 2 '^shardsim: error: .*both write' -- shardsim_mpi 1 run c1.yaml --no-checkpoint --trace b.json --json ./b.json; then
  assert_out_count '^shardsim: error' 1 "one error line"
  if [ -e b.json ]; then fail "b.json was written"; else pass "nothing written"; fi
fi
mkdir -p sub
e2e_case "--json sub/../r.json --trace r.json"
expect_exit 2 'both write' -- shardsim_mpi 1 run c1.yaml --no-checkpoint --json sub/../r.json --trace r.json
e2e_case "checkpoint and --json on one new file"
expect_exit 2 'both write' -- shardsim_mpi 4 run c4.yaml --checkpoint ./sub/x.h5 --json sub/x.h5
e2e_case "bench --csv and --json on one new file"
expect_exit 2 'both write' -- shardsim_mpi 2 bench -b 1K -e 1K --csv o.txt --json ./o.txt

# ---- 2. planted symlinks ----
e2e_case "symlinks planted at ck.h5.partial and r.json"
echo precious >victim1
echo precious >victim2
echo precious >victim3
ln -s victim1 ck.h5.partial
ln -s victim2 r.json
ln -s victim3 t.json
if expect_exit 0 'validation PASS' -- shardsim_mpi 4 run c4.yaml --checkpoint ck.h5 --json r.json --trace t.json; then
  if [ "$(cat victim1)" = precious ]; then pass "victim1 (the .partial link's target) unchanged"
  else fail "victim1 was written through the planted temporary name"; fi
  if [ -L ck.h5.partial ]; then pass "the planted ck.h5.partial is left alone"; else fail "ck.h5.partial was replaced"; fi
  if [ -f ck.h5 ] && [ ! -L ck.h5 ]; then pass "ck.h5 is a regular file"; else fail "ck.h5 is not a regular file"; fi
  # A link at the output's own name points where the output goes: its target gets the content, the link stays.
  for f in r.json t.json; do
    if [ -L "$f" ]; then pass "$f is still a link"; else fail "$f (a link) was replaced"; fi
  done
  check_json victim2 verdict='"PASS"'
  [ "$(head -c 1 victim3)" != p ] && [ -s victim3 ] && pass "victim3 (t.json's target) holds the trace" \
    || fail "t.json's target did not get the trace"
  expect_exit 0 'checksums +4 of 4 verified' -- shardsim_mpi 2 ckpt inspect ck.h5
fi
rm -f ck.h5.partial
no_temporaries .

# ---- 3. signals ----
# wait_lines FILE N SECONDS: until FILE has at least N lines (0 if it got there); SECONDS on an idle host, scaled
# by the load as every timeout (lib.sh e2e_timeout).
wait_lines() {
  local i limit
  limit=$(E2E_TIMEOUT=$3 e2e_timeout)
  for ((i = 0; i < limit * 10; i++)); do
    [ -f "$1" ] && [ "$(wc -l <"$1")" -ge "$2" ] && return 0
    sleep 0.1
  done
  return 1
}

# bench_signal SIG WANT NP: bench --csv, SIG to the ranks once 3 rows landed.
bench_signal() {
  local sig=$1 want=$2 np=$3 pid rows rc
  rm -f sig.csv
  E2E_NCMD=$((E2E_NCMD + 1))
  E2E_STDOUT=$E2E_TMP/cmd$E2E_NCMD.stdout E2E_STDERR=$E2E_TMP/cmd$E2E_NCMD.stderr E2E_OUT=$E2E_TMP/cmd$E2E_NCMD.out
  if [ "$np" = 0 ]; then  # no launcher: the process itself
    timeout -k 5 "$(e2e_timeout)" "$SHARDSIM" bench all_reduce -b 1K -e 32M -f 1.05 -n 100 -w 1 --csv sig.csv \
      >"$E2E_STDOUT" 2>"$E2E_STDERR" &
  else
    timeout -k 5 "$(e2e_timeout)" "$MPIEXEC" ${MPI_FLAGS[@]+"${MPI_FLAGS[@]}"} -np "$np" "$SHARDSIM" bench all_reduce \
      -b 1K -e 32M -f 1.05 -n 100 -w 1 --csv sig.csv >"$E2E_STDOUT" 2>"$E2E_STDERR" &
  fi
  pid=$!
  if ! wait_lines sig.csv 4 30; then
    fail "bench --csv wrote no rows within 30 s"
    kill -KILL $pid 2>/dev/null
    wait $pid 2>/dev/null
    return 1
  fi
  rows=$(wc -l <sig.csv)
  # the ranks: the shardsim processes under timeout (directly, or under the launcher)
  local targets
  targets=$(for t in $(pgrep -f "$SHARDSIM bench all_reduce -b 1K -e 32M"); do
    [ "$(ps -o comm= -p "$t")" = shardsim ] && echo "$t"
  done)
  # shellcheck disable=SC2086
  kill -"$sig" $targets
  wait $pid
  rc=$?
  cat "$E2E_STDOUT" "$E2E_STDERR" >"$E2E_OUT"
  if [ $rc -eq "$want" ]; then pass "SIG$sig at $np rank(s): exit $rc"; else fail "SIG$sig at $np rank(s): exit $rc, want $want"; show_output; fi
  assert_out_count '^shardsim: (terminated|interrupted) by SIG' 1 "one line says why"
  if [ "$(wc -l <sig.csv)" -ge "$rows" ] && [ "$(head -n 1 sig.csv | cut -d, -f1)" = collective ]; then
    pass "sig.csv kept its $(wc -l <sig.csv) lines (>= $rows seen before the signal)"
  else
    fail "sig.csv lost rows: $(wc -l <sig.csv) lines, $rows before the signal"
  fi
  # every printed row is in the CSV: count the table rows on stdout
  local printed
  printed=$(grep -Ec '^ +[0-9]+ +[0-9]+ +fp32' "$E2E_STDOUT")
  if [ "$(($(wc -l <sig.csv) - 1))" -ge $((printed * 2)) ]; then pass "every printed size is in the CSV ($printed)"; else
    fail "printed $printed sizes, CSV has $(($(wc -l <sig.csv) - 1)) rows"; fi
  no_temporaries .
}
e2e_case "SIGTERM to bench --csv (one process, no launcher)"
bench_signal TERM 143 0
e2e_case "SIGINT to bench --csv (one process, no launcher)"
bench_signal INT 130 0
e2e_case "SIGTERM to the ranks of a 2-rank bench --csv"
bench_signal TERM 143 2

e2e_case "SIGINT to a sweep (one process): exit 130, the recorded rows kept, the re-run skips them"
cat >sig_sweep.yaml <<EOF
name: sig
output: sig_out
validate_max_bytes: 4K
axes:
  topology:
    - {kind: ring, chips: 1, bandwidth_gbps: 100, latency_ns: 1000, label: ring1}
  collective: [all_reduce]
  algorithm: [ring]
  size: [1K, 2K, 4K, 8K, 16K, 32K, 64K, 128K, 256K, 512K, 1M, 2M]
EOF
E2E_NCMD=$((E2E_NCMD + 1))
E2E_STDOUT=$E2E_TMP/cmd$E2E_NCMD.stdout E2E_STDERR=$E2E_TMP/cmd$E2E_NCMD.stderr E2E_OUT=$E2E_TMP/cmd$E2E_NCMD.out
SHARDSIM_SWEEP_POINT_DELAY_MS=400 timeout -k 5 "$(e2e_timeout)" "$SHARDSIM" sweep sig_sweep.yaml --no-plots \
  >"$E2E_STDOUT" 2>"$E2E_STDERR" &
pid=$!
if wait_lines sig_out/results.csv 4 30; then
  for t in $(pgrep -P $pid); do kill -INT "$t"; done
  wait $pid
  rc=$?
  cat "$E2E_STDOUT" "$E2E_STDERR" >"$E2E_OUT"
  if [ $rc -eq 130 ]; then pass "exit 130"; else fail "exit $rc, want 130"; show_output; fi
  assert_out_count '^shardsim: interrupted by SIGINT' 1 "one line says why"
  kept=$(($(wc -l <sig_out/results.csv) - 1))
  if [ "$kept" -ge 3 ] && [ "$kept" -lt 12 ]; then pass "results.csv holds $kept complete rows"; else
    fail "results.csv holds $kept rows (want 3..11)"; fi
  no_temporaries sig_out
  expect_exit 0 "12 points, $kept already in" -- "$SHARDSIM" sweep sig_sweep.yaml --no-plots
else
  fail "the sweep wrote no rows within 30 s"
  kill -KILL $pid 2>/dev/null
  wait $pid 2>/dev/null
fi

# ---- the last-resort watchdog over collective checkpoint I/O ----
e2e_case "a rank stuck inside a checkpoint write: the I/O watchdog ends the job (exit 3)"
t0=$SECONDS
if SHARDSIM_WATCHDOG_S=3 SHARDSIM_TEST_CKPT_STALL=1 expect_exit 3 'no progress for 3 s' -- \
    shardsim_mpi 4 run c4.yaml --checkpoint stalled.h5; then
  assert_out "checkpoint stalled.h5: tensor '[a-z0-9_./]+': collective write.*no progress for 3 s on chip [0-3]" \
    "the line names the file, the step and the chip"
  pass "ended after $((SECONDS - t0)) s (limit 3 s + start-up; the timeout would have caught a hang)"
fi
if [ -e stalled.h5 ]; then fail "stalled.h5 exists"; else pass "nothing under the final name"; fi

# ---- 4. byte-identical checkpoints ----
for np in 1 4; do
  e2e_case "two saves of the same run at $np rank(s)"
  expect_exit 0 'validation PASS' -- shardsim_mpi "$np" run "c$np.yaml" --checkpoint "same_a_$np.h5"
  sleep 1.1  # a different second: object timestamps would differ
  expect_exit 0 'validation PASS' -- shardsim_mpi "$np" run "c$np.yaml" --checkpoint "same_b_$np.h5"
  if cmp "same_a_$np.h5" "same_b_$np.h5"; then pass "byte-identical ($(stat -c %s "same_a_$np.h5") bytes)"; else
    fail "the two checkpoints differ"; fi
done

e2e_finish

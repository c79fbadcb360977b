#!/usr/bin/env bash
# e2e: `shardsim sweep` on 4 ranks.
#  - one launch runs points of 1, 2 and 4 chips on sub-communicators (4, 2 and 1 concurrent groups); points that
#    need 8 chips, an inapplicable algorithm (torus on a graph topology) and a plan that does not fit are recorded with
#    verdict error and their reason, and the sweep goes on;
#  - the sweep's simulated times equal `shardsim bench` for the same points (1, 2 and 4 chips), and the shape-only
#    points (validate_max_bytes 0) equal the run with real data bit for bit;
#  - resume: a results file cut after 5 rows (plus a half-written line) completes only the missing points; a
#    sweep killed mid-way and re-run completes only the missing points; a complete file runs nothing; --force
#    recomputes everything;
#  - --plot-only redraws the PNGs, and exits 3 when gnuplot is missing;
#  - bad input: unknown axis, empty axis, missing file: exit 2, one FILE:LINE message.
# Usage: sweep.sh SHARDSIM_BINARY CONFIG_DIR [MPIEXEC]
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
e2e_init "$@"
E2E_MPIRUN_NP1=1  # signals and aborts at one rank go through mpirun, as users run it
E2E_TIMEOUT=${E2E_TIMEOUT_SWEEP:-180}

cat >grid.yaml <<EOF
name: grid
output: out
validate_max_bytes: 64K
axes:
  topology:
    - {kind: ring, chips: 1, bandwidth_gbps: 100, latency_ns: 1000, label: ring1}
    - {kind: ring, chips: 2, bandwidth_gbps: 100, latency_ns: 1000, label: ring2}
    - {kind: ring, chips: 4, bandwidth_gbps: 100, latency_ns: 1000, label: ring4}
    - $CONFIGS/topologies/graph_4.yaml
    - {kind: ring, chips: 8, bandwidth_gbps: 100, latency_ns: 1000, label: ring8}
  collective: [all_reduce]
  algorithm: [ring, torus]
  size: [4K, 256K]
  workload:
    - {config: $CONFIGS/blocks/small_block.yaml, label: small, set: {seq: 32}}
  plan: [{tp: chips}, {tp: 3}]
EOF
# 5 topologies x 2 algorithms x 2 sizes = 20 collective points, 5 x 2 = 10 workload points.
TOTAL=30

# Simulated time of KEY's row in CSV (python3: exact text of the column).
col() {  # CSV KEY_PREFIX COLUMN
  python3 - "$@" <<'PY'
import csv, sys
for r in csv.DictReader(open(sys.argv[1])):
    if r["key"].startswith(sys.argv[2] + "#"):
        print(r[sys.argv[3]]); break
PY
}

e2e_case "one launch, 1/2/4-chip points on sub-communicators, failures recorded"
if expect_exit 0 "sweep grid: ran [0-9]+, skipped 0" -- shardsim_mpi 4 sweep grid.yaml; then
  assert_out "^sweep grid: $TOTAL points, 0 already in" "announces $TOTAL points"
  assert_out "^chips 1: .* on 4 concurrent group\(s\) of 1 chip" "1-chip points: 4 groups side by side"
  assert_out "^chips 2: .* on 2 concurrent group\(s\) of 2 chip" "2-chip points: 2 groups side by side"
  assert_out "^chips 4: .* on 1 concurrent group\(s\) of 4 chip" "4-chip points: one group"
  assert_out "\[$TOTAL/$TOTAL\] 100.0%" "progress reaches $TOTAL/$TOTAL"
  rows=$(($(wc -l <out/results.csv) - 1))
  [ "$rows" -eq $TOTAL ] && pass "results.csv has $TOTAL rows" || fail "results.csv has $rows rows, want $TOTAL"
  # 4 collective points + the block tp8 on ring8 (the block tp3 on ring8 fails on its plan first)
  n=$(grep -c 'needs 8 chips, the launch has 4' out/results.csv)
  [ "$n" -eq 5 ] && pass "5 points needing 8 chips recorded as errors" || fail "$n rows say 'needs 8 chips', want 5"
  grep -q "all_reduce|torus|graph_4|generic|fp32|4096#.*,error,.*cannot run on graph_4: the topology is a graph" out/results.csv \
    && pass "torus on a graph recorded with its reason" || { fail "torus on a graph: no error row"; grep graph_4 out/results.csv | head -3; }
  grep -Eq "^workload\|small\|tp3\|ring2.*,error,.*parallel" out/results.csv \
    && pass "a plan that does not fit recorded with the parser's reason" || fail "tp3 on 2 chips: no error row"
  # The executor's forward mode fills the same columns as a training row (tokens, MFU, memory against HBM, no pipeline).
  grep -Eq "^workload\|small\|tp4\|ring4.*,shape_only,.*,pass,.*,\"hidden=64,ffn=128\",forward,[0-9.e+-]+,[0-9.e+-]+,[0-9.e+-]+,yes,0,1,{15}$" out/results.csv \
    && pass "the 4-chip block ran shape-only and passed its plan's validation" \
    || fail "small block tp4 on ring4 did not pass"
  grep -Eq "^all_reduce\|ring\|ring4\|generic\|fp32\|262144#.*,shape_only,.*,not_validated," out/results.csv \
    && pass "256 KiB > validate_max_bytes: shape-only, verdict not_validated" || fail "no shape-only row for 256K"
  # Placement: 2-chip points went round-robin to the groups on ranks 0-1 and 2-3, 1-chip points to ranks 0..3.
  if python3 - out/results.csv <<'PY'; then pass "points ran on the sub-communicators the schedule says"; else fail "placement"; fi
import csv, sys
rows = [r for r in csv.DictReader(open(sys.argv[1])) if r["timing"] and r["kind"] == "collective"]
by = {}
for r in rows: by.setdefault(r["chips"], []).append(r["ranks"])
assert by["1"] == ["0", "1", "2", "3"], by["1"]
assert by["2"] == ["0-1", "2-3"] * 2, by["2"]
assert set(by["4"]) == {"0-3"}, by["4"]
PY
  check_json out/results.json sweep='"grid"'
  python3 -c "import json; d=json.load(open('out/results.json')); assert len(d['rows'])==$TOTAL" \
    && pass "results.json has $TOTAL rows" || fail "results.json row count"
  cp out/results.csv full.csv
fi

e2e_case "simulated times equal shardsim bench for the same points"
for spec in "1 ring1" "2 ring2" "4 ring4"; do
  set -- $spec
  np=$1 topo=$2
  for coll in all_reduce; do
    if expect_exit 0 "Out of bounds values : 0 OK" -- shardsim_mpi "$np" bench "$coll" -b 4K -e 4K -a ring -n 1 -w 0 --json "b_${topo}_$coll.json"; then
      want=$(python3 -c "import json,sys; print(repr(json.load(open(sys.argv[1]))['rows'][0]['sim_time_us']))" "b_${topo}_$coll.json")
      got=$(col full.csv "$coll|ring|$topo|generic|fp32|4096" sim_time_us)
      if python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) == float(sys.argv[2]) else 1)" "$got" "$want"; then
        pass "$coll ring 4 KiB on $topo: sweep $got us == bench $want us"
      else
        fail "$coll ring 4 KiB on $topo: sweep '$got' us != bench '$want' us"
      fi
    fi
  done
done

e2e_case "shape-only (validate_max_bytes 0) equals the run with real data"
sed -e 's/^validate_max_bytes: 64K/validate_max_bytes: 0/' grid.yaml >replay.yaml
if expect_exit 0 "ran [0-9]+, skipped 0" -- shardsim_mpi 4 sweep replay.yaml --output replay --no-plots; then
  if python3 - full.csv replay/results.csv <<'PY'; then pass "every run point's time equals its shape-only run"; else fail "shape-only differs from run"; fi
import csv, sys
run = {r["key"]: r for r in csv.DictReader(open(sys.argv[1]))}
rep = {r["key"]: r for r in csv.DictReader(open(sys.argv[2]))}
n = 0
for k, r in run.items():
    if r["timing"] != "run" or r["kind"] != "collective": continue
    q = rep[k]
    assert q["timing"] == "shape_only", (k, q["timing"])
    for c in ("sim_time_us", "busbw_gbps", "algorithm_used"):
        assert r[c] == q[c], (k, c, r[c], q[c])
    n += 1
assert n >= 6, n
print(f"{n} points: shape-only == run")
PY
fi

e2e_case "resume from a cut results file"
mkdir -p cut
head -n 6 full.csv >cut/results.csv        # header + 5 rows
tail -n 1 full.csv | head -c 30 >>cut/results.csv  # a half-written line
if expect_exit 0 "ran [0-9]+, skipped 5 .*recorded [0-9]+ without running" -- shardsim_mpi 4 sweep grid.yaml --output cut; then
  assert_out "1 incomplete line\(s\) dropped" "the half-written line is dropped"
  ran=$(sed -n 's/.*: ran \([0-9]*\), skipped.*recorded \([0-9]*\) without.*/\1 \2/p' "$E2E_OUT")
  set -- $ran
  [ $(($1 + $2)) -eq $((TOTAL - 5)) ] && pass "completed only the $((TOTAL - 5)) missing points" || fail "ran $1 + recorded $2 != $((TOTAL - 5))"
  if python3 - full.csv cut/results.csv <<'PY'; then pass "resumed results equal the full run (simulated columns)"; else fail "resumed results differ"; fi
import csv, sys
a = {r["key"]: r for r in csv.DictReader(open(sys.argv[1]))}
b = {r["key"]: r for r in csv.DictReader(open(sys.argv[2]))}
assert a.keys() == b.keys()
for k in a:
    for c in ("sim_time_us", "busbw_gbps", "verdict", "timing", "compute_us", "peak_mem_bytes"):
        assert a[k][c] == b[k][c], (k, c, a[k][c], b[k][c])
PY
fi
expect_exit 0 "ran 0, skipped $TOTAL" -- shardsim_mpi 4 sweep grid.yaml --output cut --no-plots
# The 5 points the 4-chip launch was too small for are kept while the launch stays small (above) and run once a
# launch has their 8 chips (8 chips on one rank): their error rows are replaced by results.
cp -r cut cut8
if expect_exit 0 "ran 5, skipped $((TOTAL - 5))" -- shardsim_mpi 1 --chips 8 sweep grid.yaml --output cut8 --no-plots; then
  n=$(grep -c 'needs 8 chips, the launch has' cut8/results.csv)
  [ "$n" -eq 0 ] && pass "an 8-chip launch ran the points a 4-chip launch recorded as too small" \
    || fail "$n rows still say 'needs 8 chips' after an 8-chip launch"
fi
expect_exit 0 "ran [1-9][0-9]*, skipped 0" -- shardsim_mpi 4 sweep grid.yaml --output cut --no-plots --force

e2e_case "a sweep killed mid-way completes only the missing points"
SHARDSIM_SWEEP_POINT_DELAY_MS=400 setsid "$MPIEXEC" ${MPI_FLAGS[@]+"${MPI_FLAGS[@]}"} -np 4 "$SHARDSIM" sweep grid.yaml \
  --output killed --no-plots >killed.out 2>&1 &
pid=$!
for _ in $(seq 1 $((10 * $(E2E_TIMEOUT=30 e2e_timeout)))); do  # 30 s on an idle host, load-scaled
  [ -f killed/results.csv ] && [ "$(wc -l <killed/results.csv)" -ge 16 ] && break
  sleep 0.1
done
kill -KILL -- -"$pid" 2>/dev/null
wait "$pid" 2>/dev/null
# mpirun is reaped; its ranks may still be exiting (the lock is free once rank 0 closed its files; the lock also
# waits for a dying holder, see common/dir_lock.h).
for _ in $(seq 1 100); do kill -0 -- -"$pid" 2>/dev/null || break; sleep 0.1; done
# Ranks of the killed job that left its process group (orted's children) may still hold the folder's lock: wait
# until none of them is alive (load-scaled, as the lock's own wait for a dying holder is bounded at 10 s).
for _ in $(seq 1 $((10 * $(E2E_TIMEOUT=30 e2e_timeout)))); do
  pgrep -f "sweep grid.yaml --output killed" >/dev/null 2>&1 || break
  sleep 0.1
done
have=$(($(wc -l <killed/results.csv) - 1))
if [ "$have" -gt 0 ] && [ "$have" -lt $TOTAL ]; then pass "killed with $have of $TOTAL rows written"; else fail "killed run wrote $have rows"; fi
if expect_exit 0 "skipped $have " -- shardsim_mpi 4 sweep grid.yaml --output killed --no-plots; then
  ran=$(sed -n 's/.*: ran \([0-9]*\), skipped.*recorded \([0-9]*\) without.*/\1 \2/p' "$E2E_OUT")
  set -- $ran
  [ $(($1 + $2)) -eq $((TOTAL - have)) ] && pass "re-run completed only the $((TOTAL - have)) missing points" \
    || fail "re-run ran $1 + recorded $2, want $((TOTAL - have))"
  rows=$(($(wc -l <killed/results.csv) - 1))
  [ "$rows" -eq $TOTAL ] && pass "results complete after the re-run" || fail "$rows rows after the re-run"
fi

e2e_case "plots"
if command -v gnuplot >/dev/null 2>&1; then
  for p in busbw_all_reduce breakdown; do
    [ -s "out/$p.png" ] && [ -s "out/$p.gp" ] && pass "out/$p.png and its script exist" || fail "out/$p.png missing"
  done
  rm -f out/*.png
  expect_exit 0 "plot .*busbw_all_reduce.png" -- shardsim_mpi 1 sweep grid.yaml --plot-only \
    && { [ -s out/breakdown.png ] && pass "--plot-only redrew the PNGs" || fail "--plot-only: no breakdown.png"; }
fi
SHARDSIM_GNUPLOT=/nonexistent/gnuplot expect_exit 3 "gnuplot not found" -- shardsim_mpi 1 sweep grid.yaml --plot-only
# A sweep (here: complete already, so it only redraws) without gnuplot warns and keeps exit 0.
SHARDSIM_GNUPLOT=/nonexistent/gnuplot expect_exit 0 "warning: gnuplot not found" -- shardsim_mpi 4 sweep grid.yaml \
  && assert_out "ran 0, skipped $TOTAL" "nothing recomputed"
expect_exit 2 "no results file" -- shardsim_mpi 1 sweep grid.yaml --plot-only --output nowhere

e2e_case "bad input"
printf 'axes:\n  topology: [{kind: ring, chips: 2, bandwidth_gbps: 100}]\n  collective: [all_reduce]\n  size: [1K]\n  colour: [red]\n' >bad1.yaml
expect_exit 2 "bad1.yaml:5: unknown key .axes.colour" -- shardsim_mpi 2 sweep bad1.yaml && assert_out_count "error" 1 "one message"
printf 'axes:\n  topology: [{kind: ring, chips: 2, bandwidth_gbps: 100}]\n  collective: []\n  size: [1K]\n' >bad2.yaml
expect_exit 2 "bad2.yaml:3.*empty axis" -- shardsim_mpi 2 sweep bad2.yaml
expect_exit 2 "missing.yaml: cannot open: No such file" -- shardsim_mpi 2 sweep missing.yaml
printf 'axes:\n  topology: [{kind: ring, chips: 2, bandwidth_gbps: 100}]\n  collective: [all_reduce]\n  size: [1K]\n' >ok.yaml
printf 'not,a,results,file\n' >notours.csv
mkdir -p notours && cp notours.csv notours/results.csv
expect_exit 2 "not a shardsim sweep results file" -- shardsim_mpi 2 sweep ok.yaml --output notours

e2e_case "fused plans: plan keys fused/chunks, labels, and a fused workload file stays fused"
sed 's/^  tp: 4/  tp: 4\n  fused: true\n  chunks: 3/' "$CONFIGS/blocks/small_block.yaml" >fusedblk.yaml
cat >fz.yaml <<EOF2
name: fz
output: fzout
axes:
  topology: [{kind: ring, chips: 4, bandwidth_gbps: 100, latency_ns: 1000, label: ring4}]
  workload:
    - {config: $CONFIGS/blocks/small_block.yaml, label: small}
    - {config: $PWD/fusedblk.yaml, label: fusedfile}
  plan: [{tp: chips}, {tp: chips, sp: true}, {tp: chips, fused: true, chunks: 2}]
EOF2
if expect_exit 0 "ran 5, skipped 0 .*recorded 1 without running" -- shardsim_mpi 4 sweep fz.yaml --no-plots; then
  sed 's/^  tp: 4/  tp: 4\n  fused: true\n  chunks: 2/' "$CONFIGS/blocks/small_block.yaml" >runf.yaml
  expect_exit 0 '^PASS$' -- shardsim_mpi 4 run runf.yaml --json runf.json
  if python3 - fzout/results.csv runf.json <<'PY'; then pass "labels tp4 / tp4+sp / tp4+fused-c2; fused rows = run's total"; else fail "fused sweep rows"; fi
import csv, json, sys
rows = {(r["workload"], r["plan"]): r for r in csv.DictReader(open(sys.argv[1]))}
want = json.load(open(sys.argv[2]))["simulated"]["total_ns"] / 1e3
bad = []
for k in [("small", "tp4"), ("small", "tp4+sp"), ("small", "tp4+fused-c2"), ("fusedfile", "tp4+fused-c3"), ("fusedfile", "tp4+fused-c2")]:
    if k not in rows: bad.append(f"no row {k}; have {sorted(rows)}")
for k in [("small", "tp4+fused-c2"), ("fusedfile", "tp4+fused-c2")]:
    if k in rows and abs(float(rows[k]["sim_time_us"]) - want) > 1e-6 * want: bad.append(f"{k}: {rows[k]['sim_time_us']} vs run {want}")
if ("fusedfile", "tp4+fused-c3") in rows and rows[("fusedfile", "tp4+fused-c3")]["sim_time_us"] == rows[("small", "tp4")]["sim_time_us"]:
    bad.append("the fused workload file ran unfused")
if ("small", "tp4") in rows and ("small", "tp4+sp") in rows and rows[("small", "tp4")]["sim_time_us"] == rows[("small", "tp4+sp")]["sim_time_us"]:
    bad.append("tp4 and tp4+sp give the same time: sp not applied")
if bad: sys.exit("; ".join(bad))
PY
fi
printf 'axes:\n  workload: [{config: %s}]\n  plan: [{tp: 4abc}]\n' "$CONFIGS/blocks/small_block.yaml" >badplan.yaml
expect_exit 2 "badplan.yaml:3:.*tp: a size .*chips. \\(got '4abc'\\)" -- shardsim_mpi 4 sweep badplan.yaml

e2e_finish

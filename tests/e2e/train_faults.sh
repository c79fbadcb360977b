#!/usr/bin/env bash
# Fault injection over `train` (docs/RELIABILITY.md), at 1 rank x 1 chip, 1 rank x 8 chips and 4 ranks (the
# tiny configs/lm_train.yaml, dp over the chips). Each fault, with stdout going to a file:
#   - a diverging loss (train.lr 1e30): exit 1, ONE line naming the chip, the step and the non-finite value, no
#     MPI noise, every row before that step in the log;
#   - SIGTERM and SIGINT after a few steps (to the singleton process, or to every rank under mpirun): exit 143 /
#     130, one line, the rows printed so far intact, the checkpoint saved before the signal verifiable;
#   - a full file system under --checkpoint (a 4 MiB tmpfs filled up; skipped without root): exit 3, one "No space
#     left on device" line, the rows intact, the previous checkpoint on that disk byte-identical and verifiable;
#   - kill -9 of one rank in the middle of a save (checkpoint/checkpoint.h's SHARDSIM_TEST_CKPT_CRASH hook): no
#     hang, the rows intact, the previous checkpoint byte-identical and verifiable.
# Usage: train_faults.sh SHARDSIM_BINARY CONFIG_DIR [MPIEXEC]
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
e2e_init "$@"
E2E_MPIRUN_NP1=1  # signals and aborts at one rank go through mpirun, as users run it
export SHARDSIM_WATCHDOG_S=10

TRAIN=$CONFIGS/lm_train.yaml
# batch 8: dp 8 has one sequence per replica; save every step so a signal finds a saved checkpoint.
sed -E 's/^(  batch:).*/\1 8/' "$TRAIN" >t.yaml
sed -E 's/^(  lr:).*/\1 1e30/' t.yaml >diverge.yaml
ROW='^ +[0-9]+ +[0-9.]+ +[0-9.]+( +[0-9.]+){4}$'

# layout NAME: sets NP, CHIPS and PLAN for the three layouts.
layout() {
  case $1 in
    1x1) NP=1 CHIPS=1 PLAN=() ;;
    1x8) NP=1 CHIPS=8 PLAN=(--plan dp=8) ;;
    4x1) NP=4 CHIPS=4 PLAN=(--plan dp=4) ;;
  esac
}
train_cmd() { shardsim_mpi "$NP" --chips "$CHIPS" train "$@" "${PLAN[@]}"; }

rows_intact() {  # FILE WHAT: every line that looks like a step row is complete and the steps count 1, 2, ...
  local file=$1 what=$2 n
  n=$(grep -Ec "$ROW" "$file")
  if grep -E "$ROW" "$file" | awk '{if ($1 != ++k) exit 1} END {exit !(k > 0)}'; then
    pass "$what: $n step rows, complete and in order"
  else
    fail "$what: the step rows are missing or broken"; sed -n 1,40p "$file" >&2
  fi
}
no_noise() {
  if grep -Eqi 'MPI_ABORT|ORTE_ERROR_LOG|internal error|HDF5-DIAG|Segmentation' "$E2E_OUT"; then
    fail "$1: MPI / HDF5 noise or a crash"; show_output
  else pass "$1: no MPI noise"; fi
}
verifies() {  # CKPT WHAT (a singleton: the launcher is not under test here)
  if E2E_MPIRUN_NP1= expect_exit 0 'checksums +[0-9]+ of [0-9]+ verified' -- shardsim_mpi 1 ckpt inspect "$1"; then
    pass "$2: $1 verifies"; fi
}
# setup_cmd ARGS...: train_cmd for a setup step that is not under test (1 rank: a singleton, no launcher teardown).
setup_cmd() { E2E_MPIRUN_NP1=$([ "$NP" = 1 ] || echo 1) train_cmd "$@"; }

for L in 1x1 1x8 4x1; do
  layout $L
  e2e_case "$L: a diverging loss"
  if expect_exit 1 '^shardsim: error: training diverged on chip 0: gradient norm is -?(inf|nan) at step [0-9]+ \(loss ' \
      -- train_cmd diverge.yaml --steps 20; then
    assert_out_count '^shardsim: error' 1 "one error line"
    at=$(sed -nE 's/.*at step ([0-9]+).*/\1/p' "$E2E_STDERR" | head -n 1)
    assert_out_count "$ROW" $((at - 1)) "the $((at - 1)) rows before step $at are in the log"
    no_noise "$L diverging"
  fi
done

# Signals: start a long run in the background (stdout to a file), wait for a few rows and a saved checkpoint,
# send SIG to the singleton process or to every rank, and check what is left.
signal_case() {  # LAYOUT SIG CODE [one: signal only the last rank; mpirun takes the others down]
  local L=$1 sig=$2 code=$3 which=${4:-all}
  layout "$L"
  e2e_case "$L: SIG$sig to $which rank(s) after a few steps"
  rm -f sig.h5 sig.out sig.err
  if [ "$NP" = 1 ] && [ "$CHIPS" = 1 ]; then  # a singleton: no mpirun at all
    "$SHARDSIM" train t.yaml --steps 1000000 --save-every 2 --checkpoint sig.h5 >sig.out 2>sig.err &
  else
    "$MPIEXEC" $MPI_FLAGS -np "$NP" "$SHARDSIM" --chips "$CHIPS" train t.yaml "${PLAN[@]}" --steps 1000000 \
      --save-every 2 --checkpoint sig.h5 >sig.out 2>sig.err &
  fi
  local pid=$! waited=0 limit
  limit=$((10 * $(E2E_TIMEOUT=60 e2e_timeout)))  # 60 s on an idle host, load-scaled
  until grep -q '^checkpoint: step 4 saved' sig.out 2>/dev/null || [ $waited -ge $limit ]; do sleep 0.1; waited=$((waited + 1)); done
  if [ "$NP" = 1 ] && [ "$CHIPS" = 1 ]; then
    kill -s "$sig" "$pid"
  else  # the ranks (mpirun's own exit code after a signal is Open MPI's choice: docs/RELIABILITY.md)
    local ranks
    ranks=$(pgrep -P "$pid")
    [ "$which" = one ] && ranks=$(echo "$ranks" | sort -n | tail -1)
    kill -s "$sig" $ranks
  fi
  local rc=0
  wait "$pid" || rc=$?
  if [ $rc -eq "$code" ]; then pass "exit $code"; else fail "exit $rc, expected $code"; sed -n 1,20p sig.err >&2; fi
  if [ "$(grep -Ec '^shardsim: (error|interrupted|terminated|watchdog)' sig.err)" = 1 ] && grep -Eq "^shardsim: (interrupted|terminated) by SIG$sig" sig.err; then
    pass "one line on stderr"; else fail "stderr is not one line"; sed -n 1,20p sig.err >&2; fi
  E2E_OUT=sig.err no_noise "$L SIG$sig"
  rows_intact sig.out "$L SIG$sig"
  verifies sig.h5 "$L SIG$sig: the last checkpoint saved"
}
for L in 1x1 1x8 4x1; do
  signal_case $L TERM 143
  signal_case $L INT 130
done
# One rank of four interrupted: its line (not mpirun's SIGTERM to the others, 143) is the one reported.
signal_case 4x1 INT 130 one

# kill -9 of one rank during a save: rank 0 (1 rank) or rank 2 (4 ranks) dies after the first tensor.
for L in 1x1 1x8 4x1; do
  layout $L
  e2e_case "$L: kill -9 of a rank in the middle of a save"
  victim=0
  [ "$NP" = 4 ] && victim=2
  rm -f k.h5 k.h5.partial*
  expect_exit 0 '^checkpoint: step 2 saved to k\.h5' -- setup_cmd t.yaml --steps 2 --checkpoint k.h5
  cp k.h5 k_prev.h5
  # 4 ranks: 2 s between mpirun's SIGTERM and SIGKILL give rank 0's handler time to remove the temporary (not
  # asserted here: tests/e2e/ckpt.sh does); one rank has no other to wait for (1 s, Open MPI's default; the 5 s
  # used before made each case 4-8 s slower).
  OMPI_MCA_odls_base_sigkill_timeout=$([ "$NP" = 4 ] && echo 2 || echo 1) SHARDSIM_TEST_CKPT_CRASH=$victim:1 \
    train_cmd t.yaml --steps 3 --checkpoint k.h5 >kill.out 2>kill.err
  rc=$?
  if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "SHARDSIM_TEST_CKPT_CRASH: rank $victim kills itself" kill.err; then
    pass "the save died (exit $rc) without hanging"
  else
    fail "exit $rc (timeout 124 = hang)"; sed -n 1,20p kill.err >&2
  fi
  rows_intact kill.out "$L kill -9"
  if cmp -s k.h5 k_prev.h5; then pass "the previous checkpoint is byte-identical"; else fail "the previous checkpoint changed"; fi
  verifies k.h5 "$L kill -9"
done

# A full disk under --checkpoint (needs a tmpfs mount: root / CAP_SYS_ADMIN).
FULL=$E2E_TMP/full
mkdir -p "$FULL"
if mount -t tmpfs -o size=4M,mode=0755 tmpfs "$FULL" 2>mount.err; then
  trap 'umount "$FULL" 2>/dev/null || umount -l "$FULL" 2>/dev/null; _e2e_cleanup' EXIT
  for L in 1x1 1x8 4x1; do
    layout $L
    e2e_case "$L: a full disk under --checkpoint"
    rm -f "$FULL"/*
    expect_exit 0 '^checkpoint: step 2 saved' -- setup_cmd t.yaml --steps 2 --checkpoint "$FULL/prev.h5"
    cp "$FULL/prev.h5" full_prev.h5
    dd if=/dev/zero of="$FULL/filler" bs=4096 2>/dev/null
    if expect_exit 3 '^shardsim: error.*No space left on device' -- train_cmd t.yaml --steps 3 --checkpoint "$FULL/prev.h5"; then
      assert_out_count '^shardsim: error' 1 "one error line"
      assert_out_fixed "$FULL/prev.h5" "the line names the checkpoint"
      assert_out 'No space left on device \(the save reserves 0\.[0-9]+ MiB for the data and a bound on its metadata, [0-9.]+ MiB free\)' \
        "the line says what the save reserves: under 1 MiB for this ~111 KB checkpoint (it said 'needs about 2.3 MiB')"
      assert_out_count "$ROW" 3 "the 3 rows are in the log"
      no_noise "$L full disk"
    fi
    if cmp -s "$FULL/prev.h5" full_prev.h5; then pass "the previous checkpoint is byte-identical"; else fail "the previous checkpoint changed"; fi
    rm -f "$FULL/filler"
    verifies "$FULL/prev.h5" "$L full disk"
  done
  # A training checkpoint that fits is saved (issue 31 item 7: 107,538 bytes onto 0.9 MiB free were refused as
  # "needs about 2.3 MiB"): the issue's 0.9 MiB free, byte-identical to a save on a roomy disk.
  layout 1x1
  e2e_case "1x1: a training checkpoint onto 0.9 MiB free is saved"
  rm -f "$FULL"/*
  E2E_MPIRUN_NP1= expect_exit 0 '^checkpoint: step 2 saved' -- train_cmd t.yaml --steps 2 --checkpoint roomy.h5
  dd if=/dev/zero of="$FULL/filler" bs=4096 2>/dev/null
  truncate -s $(( $(stat -c %s "$FULL/filler") - 922 * 1024 )) "$FULL/filler"
  if E2E_MPIRUN_NP1= expect_exit 0 '^checkpoint: step 2 saved' -- train_cmd t.yaml --steps 2 --checkpoint "$FULL/fits.h5"; then
    if cmp -s roomy.h5 "$FULL/fits.h5"; then pass "saved ($(stat -c %s roomy.h5) bytes) with 0.9 MiB free, byte-identical"
    else fail "the checkpoint saved with 0.9 MiB free differs from the roomy save"; fi
  fi
  rm -f "$FULL/filler"
else
  echo "SKIP (full disk): cannot mount a tmpfs ($(head -c 200 mount.err)); run as root"
fi

e2e_finish

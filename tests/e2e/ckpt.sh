#!/usr/bin/env bash
# e2e: HDF5 checkpoints users can trust (issue 7).
#   1. resharding: `run`'s checkpoint (the weights part of a training state, whole fp32 masters) saved at tp=8,
#      resumed at tp=4, then tp=1, and at dp=3 gives bit-identical weights and the same loss, bit for bit, as a
#      fresh run under that plan;
#   2. `ckpt inspect` at 1 and N ranks; `ckpt convert` (gzip, chunks, contiguous) keeps every checksum;
#   3. a rank SIGKILLed in the middle of a save: the previous checkpoint is intact and loads, at two crash points;
#      rank 2 killed: rank 0's SIGTERM handler (mpirun ends the job) removes the temporary; rank 0 killed: the
#      half-written .partial.p<PID>h<HOST>.XXXXXX stays behind, is rejected (exit 2) and the next save sweeps it;
#   4. corruption: truncated, flipped bytes, missing tensor, shape and dtype mismatch -> exit 2 naming file+tensor;
#   5. h5py (python3-h5py) reads two fp32 tensors (a bf16 run's file too: its masters are fp32) and matches the
#      C++ values and checksums.
# Usage: ckpt.sh SHARDSIM_BINARY CONFIG_DIR [MPIEXEC]
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
e2e_init "$@"
E2E_MPIRUN_NP1=1  # signals and aborts at one rank go through mpirun, as users run it

PY=$(h5py_python) ||
  fail "no python3 with h5py and numpy (Debian: python3-h5py python3-numpy; scripts/setup.sh installs them)"

# checksums NP FILE: "name checksum" lines from `ckpt inspect --json` on NP ranks (fails the check if inspect fails).
checksums() {
  local np=$1 f=$2 js=$2.inspect.json
  if ! shardsim_mpi "$np" ckpt inspect "$f" --json "$js" >"$js.out" 2>&1; then
    fail "ckpt inspect $f on $np ranks failed: $(tail -n 3 "$js.out")"
    return 1
  fi
  python3 -c 'import json,sys
for t in json.load(open(sys.argv[1]))["tensors"]: print(t["name"], t["checksum"], t["verified"])' "$js"
}
# sum_of NP FILE TENSOR: the tensor's checksum (inspected once per file on NP ranks, then cached).
sum_of() {
  [ -s "$2.sums" ] || checksums "$1" "$2" >"$2.sums" || return 1
  awk -v t="$3" '$1 == t && $3 == "ok" { print $2 }' "$2.sums"
}
same_sum() {  # WHAT FILE_A FILE_B TENSOR: the tensor is bit-identical in both files (same checksum, both verified)
  local a b
  a=$(sum_of 1 "$2" "$4")
  b=$(sum_of 3 "$3" "$4")
  if [ -n "$a" ] && [ "$a" = "$b" ]; then pass "$1: $4 $a"; else fail "$1: $4 differs: $2 '$a' vs $3 '$b'"; fi
}

for n in 8 4 3 1; do with_chips "$SMALL" $n c$n.yaml; done
plan_of() { case $1 in 3) echo dp=3 ;; *) echo tp=$1 ;; esac; }  # 200 FFN columns split over 8, 4, 1
loss_of() { python3 -c 'import json,sys; print(repr(json.load(open(sys.argv[1]))["train"]["steps"][0]["loss"]))' "$1"; }
same_loss() {  # WHAT A.json B.json: the forward's loss, bit for bit
  local a b
  a=$(loss_of "$2"); b=$(loss_of "$3")
  if [ -n "$a" ] && [ "$a" = "$b" ]; then pass "$1: loss $a"; else fail "$1: loss $a vs $b"; fi
}

# ---- 1. resharding tp8 -> tp4 -> tp1, tp8 -> dp3 ----
e2e_case "fresh runs at tp=8, tp=4, dp=3, tp=1"
for n in 8 4 3 1; do
  expect_exit 0 'validation PASS' -- shardsim_mpi $n run c$n.yaml --plan "$(plan_of $n)" --checkpoint fresh$n.h5 \
    --json fresh$n.json
done

e2e_case "resume tp8 -> tp4 -> tp1 and tp8 -> dp3"
expect_exit 0 'resumed: fresh8.h5 at step 0 \(saved under dp=1 x tp=8' -- \
  shardsim_mpi 4 run c4.yaml --plan tp=4 --resume fresh8.h5 --checkpoint r4.h5 --json r4.json
expect_exit 0 'resumed: r4.h5 at step 0 \(saved under dp=1 x tp=4' -- \
  shardsim_mpi 1 run c1.yaml --plan tp=1 --resume r4.h5 --checkpoint r1.h5 --json r1.json
expect_exit 0 'resumed: fresh8.h5 at step 0' -- \
  shardsim_mpi 3 run c3.yaml --plan dp=3 --resume fresh8.h5 --checkpoint r3.h5 --json r3.json
for t in master/layers.0.w_gate master/layers.0.w_up master/layers.0.w_down master/layers.0.mlp_norm; do
  same_sum "tp8 -> tp4 weights bit-identical" fresh8.h5 r4.h5 $t
  same_sum "tp4 -> tp1 weights bit-identical" fresh8.h5 r1.h5 $t
  same_sum "tp8 -> dp3 weights bit-identical" fresh8.h5 r3.h5 $t
done
# The loss of a resumed run is the loss of the original run under that plan, bit for bit.
same_loss "resumed at tp4 = fresh tp4 run" fresh4.json r4.json
same_loss "resumed at tp1 = fresh tp1 run" fresh1.json r1.json
same_loss "resumed at dp3 = fresh dp3 run" fresh3.json r3.json

# ---- 2. inspect and convert ----
e2e_case "ckpt inspect at 1 and 8 ranks"
for np in 1 8; do
  expect_exit 0 'checksums  4 of 4 verified' -- shardsim_mpi $np ckpt inspect fresh8.h5
  assert_out 'master/layers.0.w_gate +fp32 +\[64, 200\] +Replicate \(whole, global layout\) +chunk' \
    "w_gate listed with shape, sharding, layout"
  assert_out 'mesh +dp=1 x tp=8' "the device mesh at save is shown"
done

e2e_case "ckpt convert keeps every checksum"
expect_exit 0 'converted fresh8.h5 -> gz.h5' -- shardsim_mpi 3 ckpt convert fresh8.h5 gz.h5 --compression gzip:6 --chunk 2K
expect_exit 0 'chunk \[[0-9, ]+\] gzip:6' -- shardsim_mpi 2 ckpt inspect gz.h5
expect_exit 0 'contiguous' -- shardsim_mpi 1 ckpt convert gz.h5 flat.h5 --chunk contiguous
for t in master/layers.0.w_gate master/layers.0.w_down master/layers.0.mlp_norm; do
  same_sum "gzip copy" fresh8.h5 gz.h5 $t
  same_sum "contiguous copy" fresh8.h5 flat.h5 $t
done
expect_exit 0 'validation PASS' -- shardsim_mpi 8 run c8.yaml --plan tp=8 --resume gz.h5 --no-checkpoint --json gz.json
same_loss "resumed from the gzip copy = fresh tp8 run" fresh8.json gz.json
expect_exit 2 'needs a chunked layout' -- shardsim_mpi 2 ckpt convert fresh8.h5 x.h5 --chunk contiguous --compression gzip
expect_exit 2 "--chunk 16x16x16 has 3 dimensions but tensor '[a-z0-9_./]+' of fresh8.h5 has [12]" -- shardsim_mpi 2 ckpt convert fresh8.h5 x3.h5 --chunk 16x16x16
expect_exit 2 "--compression 'lz4'" -- shardsim_mpi 2 ckpt convert fresh8.h5 x.h5 --compression lz4
expect_exit 2 'same file' -- shardsim_mpi 2 ckpt convert fresh8.h5 ./fresh8.h5

# ---- 3. a writer killed mid-save ----
sed 's/seed: 7/seed: 8/' c4.yaml >c4_other.yaml
grep -q 'seed: 8' c4_other.yaml || fail "test bug: could not change the seed"
for crash in 2:1 0:3; do
  victim=${crash%%:*} point=${crash##*:}
  e2e_case "rank $victim SIGKILLed after tensor $point of a save"
  rm -f keep.h5 keep.h5.partial*
  expect_exit 0 'validation PASS' -- shardsim_mpi 4 run c4.yaml --checkpoint keep.h5
  before=$(checksums 1 keep.h5)
  t0=$SECONDS
  # mpirun answers the dead rank with SIGTERM to the others and SIGKILL 1 s later (odls_base_sigkill_timeout);
  # on a loaded host rank 0 can miss that window before its handler removes the temporary. The product promise
  # is "a terminated rank 0 removes it", so give it 5 s here (mpirun then waits the full 5 s: ~4 s per case).
  kill_after=1
  [ "$victim" != 0 ] && kill_after=5
  OMPI_MCA_odls_base_sigkill_timeout=$kill_after SHARDSIM_TEST_CKPT_CRASH=$crash \
    shardsim_mpi 4 run c4_other.yaml --checkpoint keep.h5 >crash.out 2>&1
  rc=$?
  if [ $rc -ne 0 ] && [ $((SECONDS - t0)) -lt "$E2E_TIMEOUT" ] && grep -q "SHARDSIM_TEST_CKPT_CRASH: rank $victim kills itself" crash.out; then
    pass "the save died (exit $rc) without hanging"
  else
    fail "expected rank $victim to die mid-save (exit $rc, $((SECONDS - t0))s): $(tail -n 3 crash.out)"
  fi
  after=$(checksums 1 keep.h5)
  if [ -n "$before" ] && [ "$before" = "$after" ]; then pass "the previous checkpoint is untouched and verifies"; else
    fail "keep.h5 changed or does not verify: before '$before' after '$after'"; fi
  left=$(compgen -G 'keep.h5.partial.*' | head -n 1)
  if [ "$victim" != 0 ]; then
    if [ -z "$left" ]; then pass "rank 0 removed the temporary when the job was ended"; else
      fail "temporary $left left behind although rank 0 was only terminated"; fi
  elif [ -n "$left" ] && [ -f "$left" ]; then
    pass "the interrupted save left its temporary $left"
    expect_exit 2 "checkpoint $left: (incomplete|not an HDF5|HDF5 cannot open|.*truncated)" -- \
      shardsim_mpi 2 ckpt inspect "$left"
    expect_exit 2 "checkpoint $left" -- shardsim_mpi 4 run c4.yaml --resume "$left" --no-checkpoint
    # Its writer is gone: the next save of keep.h5 on this host sweeps it (common/output_file.h).
    cp keep.h5 keep_before_sweep.h5
    expect_exit 0 "removed .*$(basename "$left")" -- shardsim_mpi 4 run c4.yaml --checkpoint keep.h5
    if compgen -G 'keep.h5.partial.*' >/dev/null; then fail "stale temporaries left: $(compgen -G 'keep.h5.partial.*')"
    else pass "the next save removed the dead writer's temporary"; fi
    cp keep_before_sweep.h5 keep.h5  # the resume below checks the pre-crash checkpoint
  else
    fail "no keep.h5.partial.* after the crash"
  fi
  expect_exit 0 'validation PASS' -- shardsim_mpi 4 run c4.yaml --resume keep.h5 --no-checkpoint
done

# ---- 4. corruption ----
e2e_case "truncated"
cp fresh8.h5 trunc.h5 && truncate -s $(($(stat -c %s fresh8.h5) * 2 / 3)) trunc.h5
expect_exit 2 'checkpoint trunc.h5: .*truncated' -- shardsim_mpi 3 ckpt inspect trunc.h5
expect_exit 2 'checkpoint trunc.h5: .*truncated' -- shardsim_mpi 4 run c4.yaml --resume trunc.h5 --no-checkpoint
assert_out_count 'shardsim: error' 1 "one error line, not one per rank"

if [ -n "$PY" ]; then
  e2e_case "flipped bytes"
  cp flat.h5 flip.h5
  if "$PY" - flip.h5 <<'PYEOF'; then
import sys, h5py
with h5py.File(sys.argv[1], "r") as f:
    off = f["master/layers.0.w_up"].id.get_offset()
with open(sys.argv[1], "r+b") as f:
    f.seek(off + 1001)
    b = f.read(2)
    f.seek(off + 1001)
    f.write(bytes([b[0] ^ 0x40, b[1] ^ 0x01]))
PYEOF
    expect_exit 2 "checkpoint flip.h5: tensor 'master/layers.0.w_up': checksum mismatch" -- shardsim_mpi 3 ckpt inspect flip.h5
    assert_out 'master/layers.0.w_up .*MISMATCH' "inspect marks the tensor"
    assert_out 'master/layers.0.w_gate .* ok' "the other tensors still verify"
    expect_exit 2 "checkpoint flip.h5: tensor 'master/layers.0.w_up': checksum mismatch" -- \
      shardsim_mpi 8 run c8.yaml --resume flip.h5 --no-checkpoint
  else
    fail "could not flip bytes with h5py"
  fi

  e2e_case "flipped bytes in compressed chunks"
  cp gz.h5 gzflip.h5
  "$PY" - gzflip.h5 <<'PYEOF'
import sys, h5py
with h5py.File(sys.argv[1], "r") as f:
    info = f["master/layers.0.w_down"].id.get_chunk_info(2)
with open(sys.argv[1], "r+b") as f:
    f.seek(info.byte_offset + info.size // 2)
    f.write(b"\xde\xad\xbe\xef")
PYEOF
  expect_exit 2 "checkpoint gzflip.h5: tensor 'master/layers.0.w_down'" -- shardsim_mpi 3 ckpt inspect gzflip.h5

  e2e_case "missing tensor"
  cp fresh8.h5 missing.h5
  "$PY" -c 'import sys, h5py; f = h5py.File(sys.argv[1], "r+"); del f["master/layers.0.w_up"]; f.close()' missing.h5
  expect_exit 2 "checkpoint missing.h5: tensor 'master/layers.0.w_up': listed in the manifest but missing" -- \
    shardsim_mpi 2 ckpt inspect missing.h5
  expect_exit 2 "checkpoint missing.h5: tensor 'master/layers.0.w_up'" -- shardsim_mpi 4 run c4.yaml --resume missing.h5 --no-checkpoint
fi

e2e_case "shape and dtype mismatch against the workload"
sed 's/hidden: 64/hidden: 32/' c4.yaml >c4_h32.yaml
expect_exit 2 "checkpoint fresh8.h5: saved for model '.*hidden 64 .*' but the config's model is '.*hidden 32 " -- \
  shardsim_mpi 4 run c4_h32.yaml --resume fresh8.h5 --no-checkpoint
# The file holds fp32 masters whatever the compute dtype: a bf16 run starts from an fp32 run's weights.
with_dtype c4.yaml bf16 c4_bf16.yaml
expect_exit 0 'validation PASS' -- shardsim_mpi 4 run c4_bf16.yaml --resume fresh8.h5 --no-checkpoint
expect_exit 2 'checkpoint c4.yaml: not an HDF5 file' -- shardsim_mpi 2 ckpt inspect c4.yaml

# ---- 5. h5py reads what the C++ side reports ----
e2e_case "h5py vs ckpt inspect --dump (an fp32 run's and a bf16 run's fp32 masters)"
expect_exit 0 'validation PASS' -- shardsim_mpi 4 run c4_bf16.yaml --checkpoint bf16.h5
expect_exit 0 '"dtype": "fp32"' -- shardsim_mpi 3 ckpt inspect bf16.h5 --dump master/layers.0.w_down
cp "$E2E_STDOUT" bf16_dump.json
expect_exit 0 '"dtype": "fp32"' -- shardsim_mpi 1 ckpt inspect fresh8.h5 --dump master/layers.0.w_gate
cp "$E2E_STDOUT" fp32_dump.json
if [ -n "$PY" ]; then
  expect_exit 0 'checksum 0x[0-9a-f]{16} ok' -- "$PY" "$HERE/ckpt_h5py.py" fresh8.h5 fp32_dump.json bf16.h5 bf16_dump.json
  assert_out_count 'values equal, checksum .* ok' 2 "both tensors match h5py"
  # and the checker can fail: a dump of another tensor under the same name must not match.
  sed 's/"master\/layers.0.w_down"/"master\/layers.0.w_gate"/' bf16_dump.json >wrong_dump.json
  sed -i 's/"shape": \[200,64\]/"shape": [64,200]/' wrong_dump.json
  expect_exit 1 'FAIL' -- "$PY" "$HERE/ckpt_h5py.py" bf16.h5 wrong_dump.json
fi

e2e_finish

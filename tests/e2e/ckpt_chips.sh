#!/usr/bin/env bash
# e2e: checkpoints and traces with several chips per rank (issue 17; runtime/chips.h rank_handover,
# checkpoint/checkpoint.h). The same job at K = 1 and K > 1 chips per rank writes checkpoints with the same content
# (every dataset's data and attributes, as h5dump prints them) and the same --trace file; a checkpoint written at
# one K resumes at another bit-identically: the MLP (8 chips: 8 x 1, 2 x 4, 1 x 8), a transformer block with tp
# (4 chips: 4 x 1, 1 x 4) and `train` on dp 2 x tp 2 with ZeRO-1 (4 chips: 4 x 1, 1 x 4). Bad files and unwritable
# paths fail with the same exit code and one line at K > 1, and a rank stuck in the collective write is ended by the
# I/O watchdog (exit 3); `ckpt inspect` / `ckpt convert` (gzip: collective writes) work at K > 1.
# Usage: ckpt_chips.sh SHARDSIM_BINARY CONFIG_DIR [MPIEXEC]
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
e2e_init "$@"
command -v h5dump >/dev/null 2>&1 || { echo "[$E2E_NAME] SKIP: h5dump (Debian hdf5-tools) not installed"; exit 77; }
command -v python3 >/dev/null 2>&1 || { echo "[$E2E_NAME] SKIP: python3 not installed"; exit 77; }

# The whole content of a checkpoint (data, attributes, chunk layout) without the file name.
dump() { h5dump -p "$1" | tail -n +2; }
same_content() {  # A B WHAT
  if [ -s "$1" ] && [ -s "$2" ] && cmp -s <(dump "$1") <(dump "$2"); then
    pass "$3: same datasets, data, attributes and checksums (h5dump -p)"
  else
    fail "$3: $1 and $2 differ: $(diff <(dump "$1") <(dump "$2") 2>&1 | head -n 8)"
  fi
}
# Every field of a JSON report but the wall-clock ones and the named files (and with a 2nd argument, the resume_*
# fields).
strip() {
  python3 - "$1" "${2:-}" <<'PY'
import json, sys
drop = ("checkpoint", "checkpoints", "resumed_from", "config_file", "trace", "trace_note")
def strip(x):
    if isinstance(x, dict):
        return {k: strip(v) for k, v in sorted(x.items())
                if not k.startswith("wall") and k not in drop and not (sys.argv[2] and k.startswith("resume"))}
    if isinstance(x, list): return [strip(v) for v in x]
    return x
print(json.dumps(strip(json.load(open(sys.argv[1]))), sort_keys=True))
PY
}
same_json() {  # A B WHAT [no-resume]
  if [ -s "$1" ] && [ -s "$2" ] && [ "$(strip "$1" "${4:-}")" = "$(strip "$2" "${4:-}")" ]; then pass "$3"; else
    fail "$3: $1 and $2 differ: $(diff <(strip "$1" "${4:-}" | tr ',' '\n') <(strip "$2" "${4:-}" | tr ',' '\n') | head -n 6)"
  fi
}

e2e_case "MLP on 8 chips: checkpoint and trace at K = 1 (8 ranks) and K = 4 (2 ranks x 4)"
with_chips "$SMALL" 8 mlp8.yaml
expect_exit 0 'validation PASS' -- shardsim_mpi 8 run mlp8.yaml --checkpoint m1.h5 --trace t1.json --json r1.json
expect_exit 0 'validation PASS' -- shardsim_mpi 2 --chips 8 run mlp8.yaml --checkpoint m4.h5 --trace t4.json --json r4.json
same_content m1.h5 m4.h5 "MLP checkpoint K=4 vs K=1"
if [ -s t1.json ] && cmp -s t1.json t4.json; then pass "--trace at K=4 is byte-identical to K=1"; else
  fail "--trace differs between K=1 and K=4"
fi
grep -q '"process_name"' t4.json && grep -q '"name":"chip 7"' t4.json && pass "the K=4 trace has chip 7" ||
  fail "the K=4 trace lacks chip 7's process"
same_json r1.json r4.json "report at K=4 = K=1"

e2e_case "MLP: resume K=4's file at K=1 (8 x 1) and K=1's file at K=8 (1 x 8): outputs bit-identical"
expect_exit 0 'validation PASS' -- shardsim_mpi 8 run mlp8.yaml --resume m4.h5 --no-checkpoint --json rr1.json
expect_exit 0 'validation PASS' -- shardsim_mpi 1 --chips 8 run mlp8.yaml --resume m1.h5 --checkpoint m8.h5 --json rr8.json
same_json rr1.json rr8.json "resumed reports at K=1 and K=8 are identical"
same_json r1.json rr1.json "a resumed MLP's report equals the seeded run's (same weights)" no-resume
same_content m1.h5 m8.h5 "a K=8 run resumed from K=1's file saves the same checkpoint"

e2e_case "transformer block, tp 4 on 4 chips: K = 1 (4 ranks) and K = 4 (1 rank)"
expect_exit 0 'validation PASS' -- shardsim_mpi 4 run "$CONFIGS/blocks/small_block.yaml" --checkpoint b1.h5 --json b1.json
expect_exit 0 'validation PASS' -- shardsim_mpi 1 --chips 4 run "$CONFIGS/blocks/small_block.yaml" --checkpoint b4.h5 \
  --json b4.json
same_content b1.h5 b4.h5 "block checkpoint K=4 vs K=1"
expect_exit 0 'validation PASS' -- shardsim_mpi 4 run "$CONFIGS/blocks/small_block.yaml" --resume b4.h5 --json br1.json
expect_exit 0 'validation PASS' -- shardsim_mpi 1 --chips 4 run "$CONFIGS/blocks/small_block.yaml" --resume b1.h5 \
  --json br4.json
same_json br1.json br4.json "block resumed K=4 -> K=1 and K=1 -> K=4: identical reports"
same_json b1.json br1.json "a resumed block's report equals the seeded run's (same weights)" no-resume

e2e_case "train: dp 2 x tp 2, ZeRO-1 on 4 chips; save at step 3 at K = 1 and K = 4, resume each at the other K"
sed -E 's/^(  dtype:.*)$/\1\nparallel:\n  tp: 2\n  zero: 1/' "$CONFIGS/lm_train.yaml" >tz1.yaml
rows() { awk '$1 ~ /^[0-9]+$/ && NF == 7' "$E2E_STDOUT"; }
expect_exit 0 '^checkpoint: step 3 saved to s1\.h5' -- shardsim_mpi 4 train tz1.yaml --steps 3 --checkpoint s1.h5
expect_exit 0 '^checkpoint: step 3 saved to s4\.h5' -- shardsim_mpi 1 --chips 4 train tz1.yaml --steps 3 --checkpoint s4.h5
same_content s1.h5 s4.h5 "training state K=4 vs K=1"
expect_exit 0 '^  plan +tensor parallel tp=2 .*; data parallel dp=2 ' -- shardsim_mpi 1 --chips 4 train tz1.yaml --steps 5
rows >full.txt
expect_exit 0 '^resumed: s4\.h5 at step 3' -- shardsim_mpi 4 train tz1.yaml --steps 5 --resume s4.h5
rows >res1.txt
expect_exit 0 '^resumed: s1\.h5 at step 3' -- shardsim_mpi 1 --chips 4 train tz1.yaml --steps 5 --resume s1.h5
rows >res4.txt
grep -E '^ +[45] ' full.txt >full45.txt
if [ -s res1.txt ] && cmp -s res1.txt full45.txt && cmp -s res4.txt full45.txt; then
  pass "steps 4-5 resumed at K=1 and at K=4 equal the uninterrupted run's rows (loss, grad norm, simulated times)"
else
  fail "resumed rows differ"; paste full45.txt res1.txt res4.txt >&2
fi

e2e_case "ckpt inspect and convert at K > 1"
expect_exit 0 'checksums  4 of 4 verified \(read by 1 rank for 4 chips\)' -- shardsim_mpi 1 --chips 4 ckpt inspect m4.h5
expect_exit 0 '^converted m1\.h5 -> g4\.h5: 4 tensors' -- \
  shardsim_mpi 2 --chips 6 ckpt convert m1.h5 g4.h5 --chunk 4K --compression gzip:2
expect_exit 0 '^converted m1\.h5 -> g1\.h5: 4 tensors' -- shardsim_mpi 1 ckpt convert m1.h5 g1.h5 --chunk 4K --compression gzip:2
same_content g1.h5 g4.h5 "gzip convert at 2 ranks x 3 chips vs 1 rank"

e2e_case "errors at K = 4: one line, the K = 1 exit codes, no hang"
head -c 3000 m1.h5 >trunc.h5
if expect_exit 2 '^shardsim: error: checkpoint trunc\.h5: .*truncated' -- \
  shardsim_mpi 2 --chips 8 run mlp8.yaml --resume trunc.h5 --no-checkpoint; then
  assert_out_count '^shardsim: error' 1 "exactly one error line"
fi
# One bit of w_down's data flipped (found by its first 32 bytes, which occur once in the file): the checksum check
# fails while the chips' blocks are read.
cp m1.h5 bad.h5
h5dump -d /master/layers.0.w_down -b LE -o w_down.bin bad.h5 >/dev/null 2>&1
if python3 - bad.h5 w_down.bin <<'PY'
import sys
data = open(sys.argv[1], "rb").read(); needle = open(sys.argv[2], "rb").read()[:32]
if len(needle) < 32 or data.count(needle) != 1: sys.exit(1)
pos = data.find(needle) + 5
with open(sys.argv[1], "r+b") as f:
    f.seek(pos); f.write(bytes([data[pos] ^ 0x10]))
PY
then
  if expect_exit 2 "^shardsim: error: checkpoint bad\.h5: tensor 'master/layers\.0\.w_down': checksum mismatch" -- \
    shardsim_mpi 2 --chips 8 run mlp8.yaml --resume bad.h5 --no-checkpoint; then
    assert_out_count '^shardsim: error' 1 "exactly one error line"
  fi
  if expect_exit 2 "^shardsim: error: checkpoint bad\.h5: tensor 'master/layers\.0\.w_down': checksum mismatch" -- \
    shardsim_mpi 1 --chips 4 ckpt inspect bad.h5; then
    assert_out "^  master/layers\.0\.w_down .*MISMATCH$" "ckpt inspect at K=4 lists w_down as MISMATCH"
    assert_out_count '^shardsim: error' 1 "exactly one error line"
  fi
else
  fail "test bug: could not locate master/layers.0.w_down's data in bad.h5"
fi
if expect_exit 2 '^shardsim: error: .*nodir/' -- \
  shardsim_mpi 2 --chips 8 run mlp8.yaml --checkpoint nodir/x.h5; then
  assert_out_count '^shardsim: error' 1 "exactly one error line"
fi
# A rank stuck inside the collective write (test hook): the I/O watchdog ends the job, naming the rank's chips.
if SHARDSIM_WATCHDOG_S=3 SHARDSIM_TEST_CKPT_STALL=1 expect_exit 3 'no progress for 3 s' -- \
  shardsim_mpi 2 --chips 8 run mlp8.yaml --checkpoint stalled.h5; then
  assert_out "checkpoint stalled\.h5: tensor '[a-z0-9_./]+': collective write.*no progress for 3 s on rank [01] \(chips [04]\.\.[37]\)" \
    "the line names the file, the step and the rank's chips"
fi
if [ -e stalled.h5 ]; then fail "stalled.h5 exists"; else pass "nothing under the final name"; fi

# Checkpoint memory: no chip holds a tensor it does not own while saving or resuming (each writes and reads its own
# blocks; only chip 0 holds the whole weights, for the single-device reference). A save used to add ~13x the file to
# the peak RSS of the same run without one, a resume ~23x (every chip held the whole model).
e2e_case "checkpoint memory: 8 chips on one rank, the default MLP at 1/8 of its ffn: save <= +2x, resume <= +5x the file"
peak_rss() { python3 -c 'import json,sys
def f(x):
    if isinstance(x, dict):
        for k, v in x.items():
            if k == "peak_rss_mib": return v
            r = f(v)
            if r is not None: return r
    return None
print(int(f(json.load(open(sys.argv[1])))))' "$1"; }
expect_exit 0 'validation PASS' -- shardsim_mpi 1 --chips 8 run --set model.ffn=1376 --no-checkpoint --json mem0.json
expect_exit 0 'validation PASS' -- shardsim_mpi 1 --chips 8 run --set model.ffn=1376 --checkpoint mem.h5 --json mem1.json
expect_exit 0 'validation PASS' -- shardsim_mpi 1 --chips 8 run --set model.ffn=1376 --resume mem.h5 --no-checkpoint \
  --json mem2.json
if [ -s mem0.json ] && [ -s mem1.json ] && [ -s mem2.json ] && [ -s mem.h5 ]; then
  file_mib=$(( $(stat -c %s mem.h5) / 1048576 ))
  base=$(peak_rss mem0.json) save=$(peak_rss mem1.json) resume=$(peak_rss mem2.json)
  echo "  peak RSS MiB: no checkpoint $base, save $save, resume $resume; file $file_mib MiB"
  if [ "$save" -le $(( base + 2 * file_mib )) ]; then pass "a save adds at most 2x the file ($save MiB)"; else
    fail "a save's peak RSS $save MiB > $base + 2 x $file_mib MiB"; fi
  if [ "$resume" -le $(( base + 5 * file_mib )) ]; then pass "a resume adds at most 5x the file ($resume MiB)"; else
    fail "a resume's peak RSS $resume MiB > $base + 5 x $file_mib MiB"; fi
else
  fail "the three runs did not leave their reports and the checkpoint"
fi
# A chunk layout HDF5 cannot index (1-byte chunks: millions per tensor) is refused before anything is written.
expect_exit 2 "--chunk 1 cuts tensor '[a-z0-9_./]+' .* chunks; at most 1048576 per tensor" -- \
  shardsim_mpi 1 ckpt convert mem.h5 c1.h5 --chunk 1
if [ -e c1.h5 ]; then fail "--chunk 1 wrote c1.h5"; else pass "nothing written for --chunk 1"; fi

e2e_finish

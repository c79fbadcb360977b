#!/usr/bin/env bash
# e2e: checkpoint/resume of `run` (the executor's forward mode). A run's checkpoint is the weights part of a
# training state (fp32 masters, master/<name>). Resumed on the same plan, the forward's loss equals the original
# run's bit for bit and the weights are written back unchanged (a forward updates nothing); resumed under another
# plan (tp=2 on 2 chips) it validates against one device and says what it resumed; fp32 and bf16 (whose file holds
# fp32 masters: the bf16 compute copy is rebuilt from them).
# Usage: resume.sh SHARDSIM_BINARY CONFIG_DIR [MPIEXEC]
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
e2e_init "$@"

loss_json() { python3 -c 'import json,sys; print(repr(json.load(open(sys.argv[1]))["train"]["steps"][0]["loss"]))' "$1"; }
sums() {  # FILE: "name checksum" of every tensor (ckpt inspect --json)
  shardsim_mpi 1 ckpt inspect "$1" --json "$1.json" >/dev/null 2>&1 &&
    python3 -c 'import json,sys
for t in json.load(open(sys.argv[1]))["tensors"]: print(t["name"], t["checksum"])' "$1.json"
}

# resume_ok NP CONFIG CKPT OUT_CKPT BASE_JSON [PLAN]: resumes CKPT, expects PASS; without PLAN the loss equals
# BASE_JSON's bit for bit and OUT_CKPT holds the same weights.
resume_ok() {
  local np=$1 cfg=$2 ck=$3 out=$4 base=$5 plan=${6:-} json=${4%.h5}.json
  local args=(run "$cfg" --resume "$ck" --checkpoint "$out" --json "$json")
  [ -n "$plan" ] && args+=(--plan "$plan")
  expect_exit 0 'validation PASS' -- shardsim_mpi "$np" "${args[@]}" || return 1
  assert_out "^resumed: $ck at step 0" "report says it resumed from $ck"
  assert_stdout_last_line PASS
  check_json "$json" verdict='"PASS"' chips="$np" "resumed_from=\"$ck\""
  if [ -z "$plan" ]; then
    if [ "$(loss_json "$json")" = "$(loss_json "$base")" ]; then pass "the resumed forward's loss is the original's, bit for bit"
    else fail "resumed loss $(loss_json "$json") differs from the original's $(loss_json "$base")"; fi
    if [ -n "$(sums "$ck")" ] && [ "$(sums "$ck")" = "$(sums "$out")" ]; then
      pass "the resumed run wrote the same weights back (a forward updates nothing)"
    else fail "the weights of $out differ from $ck's"; fi
  fi
}

e2e_case "fp32 base run, 4 chips"
with_chips "$SMALL" 4 fp32_4.yaml
with_chips "$SMALL" 2 fp32_2.yaml
ck=""
if expect_exit 0 'validation PASS' -- shardsim_mpi 4 run fp32_4.yaml --json base_fp32.json; then
  assert_stdout_last_line PASS
  ck=$(report_checkpoint)
  if [ -n "$ck" ] && [ -f "$ck" ]; then pass "checkpoint $ck written"; else
    fail "no checkpoint file named by the report ('$ck')"
  fi
fi

if [ -n "$ck" ] && [ -f "$ck" ]; then
  cp "$ck" base_fp32.h5  # a pristine copy: later cases must not depend on each other's outputs
  e2e_case "fp32 resume, 4 chips -> 4 chips"
  resume_ok 4 fp32_4.yaml base_fp32.h5 resumed_4.h5 base_fp32.json

  e2e_case "fp32 resume, dp=4 -> tp=2 on 2 chips"
  resume_ok 2 fp32_2.yaml base_fp32.h5 resumed_2.h5 base_fp32.json tp=2

  e2e_case "fp32 resume, checkpoint written over the file it resumed from"
  cp base_fp32.h5 inplace.h5
  if expect_exit 0 'validation PASS' -- shardsim_mpi 4 run fp32_4.yaml --resume inplace.h5 --checkpoint inplace.h5; then
    expect_exit 0 'validation PASS' -- shardsim_mpi 4 run fp32_4.yaml --resume inplace.h5 --no-checkpoint
  fi
else
  fail "no base checkpoint: skipping the fp32 resume cases"
fi

e2e_case "bf16 base run, 4 chips"
with_dtype fp32_4.yaml bf16 bf16_4.yaml
if expect_exit 0 'validation PASS' -- shardsim_mpi 4 run bf16_4.yaml --checkpoint base_bf16.h5 --json bf16.json; then
  assert_stdout_last_line PASS
  assert_out 'bf16 compute, fp32 master weights' "the model line says bf16 compute"
  check_json bf16.json verdict='"PASS"' dtype='"bf16"' validation.passed=true
  expect_exit 0 'master/layers.0.w_gate +fp32 +\[64, 200\]' -- shardsim_mpi 1 ckpt inspect base_bf16.h5
  e2e_case "bf16 resume, 4 chips -> 4 chips"
  resume_ok 4 bf16_4.yaml base_bf16.h5 resumed_bf16_4.h5 bf16.json
fi

e2e_finish

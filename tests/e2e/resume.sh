#!/usr/bin/env bash
# e2e: checkpoint/resume. A run resumed from its own checkpoint on the same chip count must reproduce the stored
# output bit for bit; resharded onto another chip count (the all_reduce then sums in another order) it must
# match within the validation tolerance and say it was resharded; fp32 and bf16.
# Usage: resume.sh SHARDSIM_BINARY CONFIG_DIR [MPIEXEC]
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
e2e_init "$@"

# resume_ok NP CONFIG CKPT OUT_CKPT: resumes CKPT on NP chips, expects exit 0, a bit-identical output and PASS.
resume_ok() {
  local np=$1 cfg=$2 ck=$3 out=$4 json=${4%.h5}.json
  expect_exit 0 'output bit-identical to the stored output' -- \
    shardsim_mpi "$np" run "$cfg" --resume "$ck" --checkpoint "$out" --json "$json" || return 1
  assert_out "resume +weights from $ck" "report says it resumed from $ck"
  assert_out 'validation PASS' "validation passes"
  assert_stdout_last_line PASS
  check_json "$json" verdict='"PASS"' chips="$np" validation.resume_bit_exact=true "validation.resumed_from=\"$ck\""
  if [ -f "$out" ]; then pass "resumed run wrote its checkpoint $out"; else fail "resumed run did not write $out"; fi
}

# ---- fp32: make a checkpoint on 4 chips ----
e2e_case "fp32 base run, 4 chips"
with_chips "$SMALL" 4 fp32_4.yaml
with_chips "$SMALL" 2 fp32_2.yaml
ck=""
if expect_exit 0 'validation PASS' -- shardsim_mpi 4 run fp32_4.yaml; then
  assert_stdout_last_line PASS
  ck=$(report_checkpoint)
  if [ -n "$ck" ] && [ -f "$ck" ]; then pass "checkpoint $ck written"; else
    fail "no checkpoint file named by the report ('$ck')"
  fi
fi

if [ -n "$ck" ] && [ -f "$ck" ]; then
  cp "$ck" base_fp32.h5  # a pristine copy: later cases must not depend on each other's outputs
  e2e_case "fp32 resume, 4 chips -> 4 chips"
  resume_ok 4 fp32_4.yaml base_fp32.h5 resumed_4.h5

  e2e_case "fp32 resume, 4 chips -> 2 chips (resharded)"
  if expect_exit 0 'resharded from tp=4 to tp=2, output within tolerance of the stored output' -- \
      shardsim_mpi 2 run fp32_2.yaml --resume base_fp32.h5 --checkpoint resumed_2.h5 --json resumed_2.json; then
    assert_out 'validation PASS' "validation passes"
    assert_stdout_last_line PASS
    check_json resumed_2.json verdict='"PASS"' chips=2 validation.resume_ok=true validation.resume_same_layout=false \
      validation.resume_saved_tp=4
    # The resharded run's own checkpoint is a tp=2 checkpoint: resuming it on 2 chips is bit-exact again.
    resume_ok 2 fp32_2.yaml resumed_2.h5 resumed_2b.h5
  fi

  e2e_case "fp32 resume, checkpoint written over the file it resumed from"
  cp base_fp32.h5 inplace.h5
  if expect_exit 0 'output bit-identical to the stored output' -- \
      shardsim_mpi 4 run fp32_4.yaml --resume inplace.h5 --checkpoint inplace.h5; then
    expect_exit 0 'output bit-identical to the stored output' -- \
      shardsim_mpi 4 run fp32_4.yaml --resume inplace.h5 --no-checkpoint
  fi
else
  fail "no base checkpoint: skipping the fp32 resume cases"
fi

# ---- bf16 ----
e2e_case "bf16 base run, 4 chips"
with_dtype fp32_4.yaml bf16 bf16_4.yaml
if expect_exit 0 'validation PASS' -- shardsim_mpi 4 run bf16_4.yaml --checkpoint base_bf16.h5 --json bf16.json; then
  assert_stdout_last_line PASS
  assert_out 'dtype bf16' "report says dtype bf16"
  check_json bf16.json verdict='"PASS"' dtype='"bf16"' validation.passed=true
  if h5dump -H base_bf16.h5 >bf16_h5.txt 2>&1; then
    # bf16 is stored as 16-bit floats, not widened to fp32.
    if awk '/DATASET "w_gate"/{f=1} f&&/DATATYPE/{print; exit}' bf16_h5.txt | grep -q '16-bit'; then
      pass "bf16 checkpoint stores 16-bit weights"
    else
      fail "bf16 checkpoint w_gate is not a 16-bit type: $(awk '/DATASET "w_gate"/{f=1} f&&/DATATYPE/{print; exit}' bf16_h5.txt)"
    fi
    e2e_case "bf16 resume, 4 chips -> 4 chips"
    resume_ok 4 bf16_4.yaml base_bf16.h5 resumed_bf16_4.h5
  else
    fail "h5dump -H base_bf16.h5 failed: $(head -n 3 bf16_h5.txt)"
  fi
fi

e2e_finish

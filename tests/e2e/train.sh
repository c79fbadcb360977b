#!/usr/bin/env bash
# e2e: `shardsim train` runs the single-device reference language model: losses fall, the report has the
# simulated step time, tokens/s and MFU, two runs print the same bytes; bad configs exit 2 with one line.
# Usage: train.sh SHARDSIM_BINARY CONFIG_DIR [MPIEXEC]
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
e2e_init "$@"

one_error_line() { assert_out_count '^shardsim: error' 1 "exactly one 'shardsim: error' line"; }
TRAIN=$CONFIGS/lm_train.yaml

e2e_case "(a) 12 steps of the default config, twice"
if expect_exit 0 '^simulated step time: [0-9.]+ us; tokens/s: ' -- shardsim_mpi 1 train "$TRAIN" --steps 12; then
  assert_out_count '^ +[0-9]+ +[0-9.]+ +[0-9.]+ +[0-9.]+$' 12 "one row per step"
  assert_out 'MFU [0-9.]+% of trainium1 fp32 peak' "MFU against the device's peak"
  first=$(awk '$1 == "1" {print $2}' "$E2E_STDOUT")
  last=$(awk '$1 == "12" {print $2}' "$E2E_STDOUT")
  if awk -v a="$first" -v b="$last" 'BEGIN {exit !(b < 0.8 * a)}'; then pass "loss falls: $first -> $last"; else
    fail "loss did not fall by 20% in 12 steps: $first -> $last"
  fi
  cp "$E2E_STDOUT" first_run.txt
  if expect_exit 0 '^loss: ' -- shardsim_mpi 1 train "$TRAIN" --steps 12; then
    if cmp -s first_run.txt "$E2E_STDOUT"; then pass "second run prints the same bytes"; else
      fail "two runs differ"
      diff first_run.txt "$E2E_STDOUT" | head -n 10 >&2
    fi
  fi
fi

e2e_case "(a2) bf16 mixed precision"
sed -E 's/^(  dtype:).*/\1 bf16/' "$TRAIN" >bf16.yaml
if expect_exit 0 'bf16 compute, fp32 master weights' -- shardsim_mpi 1 train bf16.yaml --steps 12; then
  assert_out 'MFU [0-9.]+% of trainium1 bf16 peak' "MFU against the bf16 peak"
fi

e2e_case "(b) more than one rank"
if expect_exit 2 '^shardsim: error: .*one chip.*2 ranks' -- shardsim_mpi 2 train "$TRAIN"; then one_error_line; fi

e2e_case "(c) heads not a multiple of kv_heads"
sed -E 's/^(  kv_heads:).*/\1 3/' "$TRAIN" >bad_heads.yaml
if expect_exit 2 '^shardsim: error: .*bad_heads\.yaml:[0-9]+: .*multiple of kv_heads' -- shardsim_mpi 1 train bad_heads.yaml
then one_error_line; fi

e2e_case "(d) a typo in train:"
sed -E 's/^(  )lr:/\1learning_rate:/' "$TRAIN" >typo.yaml
if expect_exit 2 '^shardsim: error: .*typo\.yaml:[0-9]+: .*learning_rate' -- shardsim_mpi 1 train typo.yaml
then one_error_line; fi

e2e_case "(e) a NaN learning rate"
sed -E 's/^(  lr:).*/\1 .nan/' "$TRAIN" >nan_lr.yaml
if expect_exit 2 '^shardsim: error: .*nan_lr\.yaml:[0-9]+: .*lr.*finite' -- shardsim_mpi 1 train nan_lr.yaml
then one_error_line; fi

e2e_case "(f) an unsupported dtype"
sed -E 's/^(  dtype:).*/\1 fp8_e4m3/' "$TRAIN" >fp8.yaml
if expect_exit 2 '^shardsim: error: .*fp8\.yaml:[0-9]+: .*dtype.*fp32 or bf16' -- shardsim_mpi 1 train fp8.yaml
then one_error_line; fi

e2e_finish

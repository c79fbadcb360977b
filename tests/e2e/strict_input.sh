#!/usr/bin/env bash
# e2e: issue 46, round 5 of the hostile re-run (scripts/hostile/rerun.sh), kinds 3 and 8 as kinds:
#   - every figure bounded: serve.trace keys are checked with or without --requests (one rule: a key a flag replaces
#     is still checked), serve.slo / swap_space_gib / host_link_gbps and model.moe figures have upper bounds, a
#     --what-if factor multiplies the device's own value (host_launch_ns=2x doubled 0 and accepted 1e300x);
#   - numbers are decimal (0x10 in a request CSV, --bandwidth 0x10, -f 2abc), list flags refuse an empty or repeated
#     item (--plan ep=2, / --trace-chips 0,0 / --counts 8,8), every flag given must have a value (--trace-window ''),
#     and a config key without a value (`key:`, `--set key=`) is an error, not its default.
# All at one rank, shape-only: seconds.
# Usage: strict_input.sh SHARDSIM_BINARY CONFIG_DIR [MPIEXEC]
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
e2e_init "$@"

SERVE=$CONFIGS/serve/llama3_8b_h100.yaml
MOE=$CONFIGS/moe/tiny_moe.yaml
TRAIN=$CONFIGS/lm_train.yaml
printf 'arrival_s,prompt_tokens,output_tokens\n0,64,4\n0.01,32,4\n' >small.csv

e2e_case "kind 3: keys a flag replaces are still checked (serve.trace under --requests, device: under --device, plan keys under --plan)"
for v in nan inf -1 1e300; do
  expect_exit 2 'serve\.trace\.rate: (must be|expected a number)' -- shardsim_mpi 1 serve "$SERVE" --requests small.csv --set serve.trace.rate=$v
done
expect_exit 2 'serve\.trace\.arrival' -- shardsim_mpi 1 serve "$SERVE" --requests small.csv --set serve.trace.arrival=sometimes
expect_exit 0 'replacing the config.s serve\.trace' -- shardsim_mpi 1 serve "$SERVE" --requests small.csv
{ sed '/^parallel:/,$d' "$TRAIN"; printf 'parallel:\n  tp: -3\n'; } >badplan.yaml
L=$(grep -n '^  tp: -3' badplan.yaml | cut -d: -f1)
expect_exit 2 "badplan\.yaml[^:]*:$L: parallel\.tp: must be between 1 and" -- \
  shardsim_mpi 1 --chips 2 train badplan.yaml --steps 1 --shape-only --plan dp=2
{ sed '/^device:/d' "$TRAIN"; printf 'device: {preset: h100, hbm_gib: .nan}\n'; } >baddev.yaml
expect_exit 2 "baddev\.yaml[^:]*:[0-9]+: device\.hbm_gib" -- \
  shardsim_mpi 1 --chips 2 train baddev.yaml --steps 1 --shape-only --plan dp=2 --device a100

e2e_case "kind 3: serve and MoE figures have upper bounds"
expect_exit 2 'serve\.slo\.ttft_ms: must be between 0 and 1e\+09' -- \
  shardsim_mpi 1 serve "$SERVE" --requests small.csv --set serve.slo.ttft_ms=1e300
expect_exit 2 'serve\.swap_space_gib: must be between' -- \
  shardsim_mpi 1 serve "$SERVE" --requests small.csv --set serve.preemption=swap --set serve.swap_space_gib=1e300
expect_exit 2 'serve\.host_link_gbps: must be between' -- \
  shardsim_mpi 1 serve "$SERVE" --requests small.csv --set serve.host_link_gbps=1e300
for kv in capacity_factor=1e300 scale=1e300 bias_update=5 aux_loss_coef=1e300; do
  expect_exit 2 "model\.moe\.${kv%%=*}: must be between" -- \
    shardsim_mpi 1 --chips 2 train "$MOE" --steps 1 --shape-only --plan ep=2 --set "model.moe.$kv"
done
expect_exit 2 'model\.rope_theta: must be at most 1e\+12' -- \
  shardsim_mpi 1 --chips 2 train "$TRAIN" --steps 1 --shape-only --plan dp=2 --set model.rope_theta=1e300

e2e_case "kind 3: a --what-if factor multiplies the device's own value"
expect_exit 2 'what-if host_launch_ns=1e300x: device\.host_launch_ns would be .*must be between' -- \
  shardsim_mpi 1 --chips 2 train "$TRAIN" --steps 1 --shape-only --plan dp=2 --device h100 --what-if host_launch_ns=1e300x
if expect_exit 0 'what-if' -- shardsim_mpi 1 --chips 2 train "$TRAIN" --steps 1 --shape-only --plan dp=2 --device h100 \
     --what-if host_launch_ns=2x; then
  h100_host=$(sed -n 's/^ *device .*, host \([0-9.]*\) ns per kernel.*/\1/p' "$E2E_STDOUT" | head -1)
  want=$(awk -v h="${h100_host:-0}" 'BEGIN { printf "%.17g", 2 * h }')
  if [ -n "$h100_host" ] && [ "$h100_host" != 0 ]; then
    assert_out "host_launch_ns: $want\}" "host_launch_ns=2x is twice the device's $h100_host ns (it was 0)"
  else
    fail "the h100 device line states no host launch time"
  fi
fi
expect_exit 2 'what-if vector_engine_gelems=2x: device\.vector_engine_gelems is 0 \(unset\) on this device' -- \
  shardsim_mpi 1 --chips 2 train "$TRAIN" --steps 1 --shape-only --plan dp=2 --device h100 --what-if vector_engine_gelems=2x

e2e_case "kind 8: numbers are decimal"
printf 'arrival_s,prompt_tokens,output_tokens\n0,0x10,4\n' >hex.csv
expect_exit 2 'hex\.csv:2: prompt_tokens: .0x10. is not a decimal number' -- shardsim_mpi 1 serve "$SERVE" --requests hex.csv
printf 'arrival_s,prompt_tokens,output_tokens\ninf,4,4\n' >inf.csv
expect_exit 2 'inf\.csv:2: arrival_s' -- shardsim_mpi 1 serve "$SERVE" --requests inf.csv
expect_exit 2 '--bandwidth: must be' -- shardsim_mpi 1 --chips 2 train "$TRAIN" --steps 1 --shape-only --plan dp=2 --bandwidth 0x10
expect_exit 2 'stepfactor' -- shardsim_mpi 1 --chips 2 bench all_reduce -b 8 -e 64 -f 2abc
expect_exit 2 '--chips' -- shardsim_mpi 1 --chips ' 2' bench all_reduce -b 8 -e 8
expect_exit 2 'bucket_bytes' -- shardsim_mpi 1 --chips 2 train "$TRAIN" --steps 1 --shape-only --plan dp=2 \
  --set parallel.bucket_bytes=0x10K

e2e_case "kind 8: list flags refuse an empty or repeated item"
for p in 'ep=2,' ',ep=2' 'ep=2,,tp=1'; do
  expect_exit 2 "--plan: .*an empty item" -- shardsim_mpi 1 --chips 2 train "$MOE" --steps 1 --shape-only --plan "$p"
done
expect_exit 0 'step' -- shardsim_mpi 1 --chips 4 train "$TRAIN" --steps 1 --shape-only --set model.layers=4 \
  --plan 'pp=2,dp=2,pp_layers=[3,1]'
expect_exit 2 "trace-chips: .*chip 0 given twice" -- \
  shardsim_mpi 1 --chips 2 train "$MOE" --steps 1 --shape-only --plan ep=2 --trace t.json --trace-chips 0,0
expect_exit 2 "trace-chips: .*chip 1 given twice" -- \
  shardsim_mpi 1 --chips 2 train "$MOE" --steps 1 --shape-only --plan ep=2 --trace t.json --trace-chips 0-1,1
expect_exit 2 "given twice" -- shardsim_mpi 1 --chips 2 validate -c all_reduce --counts 8,8

e2e_case "kind 8: every flag given has a value; a config key without one is an error"
expect_exit 2 '--trace-window: an empty value' -- \
  shardsim_mpi 1 --chips 2 train "$MOE" --steps 1 --shape-only --plan ep=2 --trace t.json --trace-window ''
expect_exit 2 '--plan: an empty value' -- shardsim_mpi 1 --chips 2 train "$MOE" --steps 1 --shape-only --plan ''
expect_exit 2 'device\.kernel_fusion: no value' -- \
  shardsim_mpi 1 --chips 2 train "$MOE" --steps 1 --shape-only --plan ep=2 --set device.kernel_fusion=
{ cat "$TRAIN"; printf '\nname:\n'; } >nullkey.yaml
L=$(grep -n '^name:$' nullkey.yaml | cut -d: -f1)
expect_exit 2 "nullkey\.yaml[^:]*:$L: name: no value" -- shardsim_mpi 1 --chips 2 train nullkey.yaml --steps 1 --shape-only --plan dp=2

e2e_finish

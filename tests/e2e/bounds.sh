#!/usr/bin/env bash
# e2e: issue 46, kinds 2, 3, 7 (parallel.algorithm), 8, 10, 14 and 15 (docs/RELIABILITY.md and docs/SECURITY.md, "Bounds and overrides"):
#   - sizes that would wrap int64 (pp_layers summing to the layer count, topology dims, ASTRA-sim npus_count, a
#     sweep plan's axis) are refused entry by entry, with the entry's FILE:LINE, before any work; pp_layers [] and
#     null too;
#   - every input figure bounded and NaN refused the same way in run, train and profile: device peaks, HBM
#     bandwidth and capacity, launch overhead, efficiencies, --bandwidth/--latency nan, --what-if results, kernel-table
#     times at or below the launch overhead;
#   - nonsense refused: duplicate --what-if changes, calibrate --predict of a fitted log, link flags with --kernels;
#     a sweep takes recompute: selective;
#   - train --resume --validate with a changed learning rate compares against a reference resumed from the same
#     checkpoint (PASS), not one retrained from step 0;
#   - --set reaches one dimension of a stacked topology (topology.dims[0].bandwidth_gbps) and --what-if link_bw /
#     dimN.bandwidth work on stacked topologies given inline or by file, each row equal to a run with its --set;
#   - a named parallel.algorithm that cannot run on a group of the plan is refused before the run header with
#     its FILE:LINE (config, --set, --plan); collectives without the name and one-chip groups run auto;
#   - error lines keep the config's own line numbers after --set/--plan; `shardsim help` lists its topics; a
#     training run's JSON says its layers; train's memory line states the HBM reserve.
# All at one rank (shape-only where a run is needed): seconds.
# Usage: bounds.sh SHARDSIM_BINARY CONFIG_DIR [MPIEXEC]
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
e2e_init "$@"

MLP=$CONFIGS/workloads/llama2_7b_mlp_tp8.yaml
TRAIN=$CONFIGS/lm_train.yaml

# ---- kind 2: sizes that wrap ----
e2e_case "kind 2: pp_layers entries that would wrap the sum"
cat >pp_wrap.yaml <<'EOF'
model: {vocab: 32, hidden: 16, layers: 4, heads: 4, kv_heads: 2, head_dim: 4, ffn: 32, seq: 8, batch: 4}
train: {steps: 1}
parallel:
  pp: 4
  pp_layers: [9223372036854775807, 9223372036854775807, 3, 3]
EOF
expect_exit 2 'pp_wrap\.yaml:5: parallel\.pp_layers\[0\]: must be between 1 and 4096' -- \
  shardsim_mpi 1 train pp_wrap.yaml --chips 4 --shape-only
for v in '[]' 'null'; do
  sed "s/pp_layers: .*/pp_layers: $v/" pp_wrap.yaml >pp_empty.yaml
  expect_exit 2 'pp_empty\.yaml:5: parallel\.pp_layers' -- shardsim_mpi 1 train pp_empty.yaml --chips 4 --shape-only
done

e2e_case "kind 2: topology dims and ASTRA-sim npus_count whose product wraps"
cat >dims_wrap.yaml <<'EOF'
topology:
  kind: torus
  dims: [2, 4611686018427387904]
  bandwidth_gbps: 100
EOF
expect_exit 2 'dims_wrap\.yaml:3: topology\.dims\[1\]: must be between 1 and 16777216' -- \
  shardsim_mpi 1 topo describe dims_wrap.yaml
cat >astra_wrap.yml <<'EOF'
topology: [Ring, Ring]
npus_count: [4, 4611686018427387904]
bandwidth: [50, 50]
latency: [500, 500]
EOF
expect_exit 2 'astra_wrap\.yml:2: npus_count\[1\]: must be between 1 and 16777216' -- \
  shardsim_mpi 1 topo describe astra_wrap.yml

# ---- kind 3: every figure bounded, NaN refused everywhere ----
e2e_case "kind 3: device figures out of bounds"
for kv in 'peak_tflops_fp32: 4.9e-324' 'peak_tflops_bf16: 1e-298' 'hbm_gib: 1e-9' 'hbm_gbps: 1e300' \
          'launch_overhead_ns: 1e300' 'gemm_efficiency: 1e-300' 'hbm_reserve_gib: 32'; do
  key=${kv%%:*}
  printf 'device:\n  preset: trainium1\n  %s\n' "$kv" >dev.yaml
  expect_exit 2 "dev\.yaml:3: device\.$key: must be" -- shardsim_mpi 1 run "$MLP" --device dev.yaml --shape-only \
    --no-checkpoint
done
expect_exit 2 'device\.peak_tflops_fp32: must be between 0\.001 and' -- \
  shardsim_mpi 1 train "$TRAIN" --set device.peak_tflops_fp32=4.9e-324 --steps 1

e2e_case "kind 3: --bandwidth nan / --latency nan refused by run, train and profile as by bench"
for cmd in "run $MLP --shape-only --no-checkpoint" "profile $MLP" "train $TRAIN --steps 1"; do
  # shellcheck disable=SC2086  # the command's words
  expect_exit 2 '--bandwidth: must be' -- shardsim_mpi 1 $cmd --bandwidth nan
  # shellcheck disable=SC2086
  expect_exit 2 '--latency: must be' -- shardsim_mpi 1 $cmd --latency nan
done
expect_exit 2 '--bandwidth: must be' -- shardsim_mpi 1 bench all_reduce --chips 2 --bandwidth nan

e2e_case "kind 3: --what-if changes whose result is out of bounds"
expect_exit 2 'what-if peak=1e-300x: device\.peak_tflops_[a-z0-9]+ would be .*must be between' -- \
  shardsim_mpi 1 --chips 8 profile "$MLP" --what-if peak=1e-300x
expect_exit 2 'what-if link_bw=1e-300x: bandwidth_gbps would be' -- \
  shardsim_mpi 1 --chips 8 profile "$MLP" --what-if link_bw=1e-300x

e2e_case "kind 3: kernel-table times at or below the launch overhead"
printf 'kernel,dtype,m,n,k,batch,time_us\ngemm,bf16,4096,4096,4096,1,1e-300\n' >tiny.csv
expect_exit 2 'tiny\.csv:2: time_us must be a number from 0\.001' -- \
  shardsim_mpi 1 calibrate --kernels tiny.csv --device h100
printf 'kernel,dtype,m,n,k,batch,time_us\ngemm,bf16,64,64,64,1,0.5\n' >fast.csv
expect_exit 2 'line 2: time_us 0\.5.* not above the device.s launch overhead' -- \
  shardsim_mpi 1 calibrate --kernels fast.csv --device h100

# ---- kind 4: the profiler and the trace when a switch reduces ----
e2e_case "kind 4: --profile and --trace under in_switch (NVLink SHARP): the path covers the step, peers are chips"
if expect_exit 0 'critical path: ' -- shardsim_mpi 1 --chips 8 run "$MLP" --shape-only --no-checkpoint --profile \
     --topology "$CONFIGS/topologies/dgx_h100_nvls.yaml" --set parallel.algorithm=in_switch --trace sw.trace; then
  assert_out 'path by class: .* waiting 0\.[0-9]%' "the path covers the step (it was 99 % waiting)"
  if command -v python3 >/dev/null 2>&1; then
    if python3 - sw.trace <<'PY'; then pass "every receive is paired with a send and names a chip (0..7)"; else fail "sw.trace receives"; fi
import json, sys
ev = json.load(open(sys.argv[1]))["traceEvents"]
recv = [e for e in ev if e.get("cat") == "recv"]
bad = [e for e in recv if not e.get("flow_in") or not 0 <= e["args"]["peer"] < 8]
sys.exit(1 if not recv or bad else 0)
PY
  fi
fi

# ---- kind 8: nonsense accepted ----
e2e_case "kind 8: duplicate what-if changes, calibrate predicting its own fit, link flags with --kernels"
expect_exit 2 "what-if: 'link_bw=2x' given twice" -- shardsim_mpi 1 --chips 8 profile "$MLP" --what-if link_bw=2x,link_bw=2x
printf '#       size    count   type   redop    root     time   algbw   busbw #wrong\n' >log.txt
ln -f log.txt same.txt  # the same file under another name
expect_exit 2 '--predict same\.txt: is also a fitted log \(log\.txt\)' -- \
  shardsim_mpi 1 calibrate log.txt --predict same.txt
for v in 0x10 99999999999999999999 1e3; do
  expect_exit 2 "--save-every: '$v' is not a decimal integer" -- shardsim_mpi 1 train "$TRAIN" --save-every "$v" \
    --checkpoint c.h5
done
expect_exit 2 "--steps: '0x3' is not a decimal integer" -- shardsim_mpi 1 train "$TRAIN" --steps 0x3
expect_exit 2 '--protocols: a link fit.s flag' -- \
  shardsim_mpi 1 calibrate --kernels fast.csv --device h100 --protocols 2

# ---- kind 10: resume + validate with a changed learning rate ----
e2e_case "kind 10: train --resume CK --validate with a changed learning rate: the reference resumes too"
if expect_exit 0 'checkpoint: step 2 saved' -- shardsim_mpi 1 train "$TRAIN" --chips 2 --plan dp=2 --steps 2 \
     --set model.batch=4 --checkpoint ck.h5; then
  expect_exit 0 'PASS' -- shardsim_mpi 1 train "$TRAIN" --chips 2 --plan dp=2 --steps 4 --set model.batch=4 \
    --set train.lr=0.003 --resume ck.h5 --validate
fi

# ---- kind 14: what-if and --set on stacked topologies ----
e2e_case "kind 14: --set topology.dims[I].KEY and --what-if on a stacked topology (inline and by file)"
RAILS=$CONFIGS/topologies/dgx_h100_2nodes_rails.yaml
cat >stacked.yaml <<EOF
topology:
  kind: stacked
  dims:
    - {kind: switch, size: 2, bandwidth_gbps: 50, latency_ns: 5000}
    - {kind: ring, size: 8, bandwidth_gbps: 450, latency_ns: 1000}
device: h100
model: {kind: mlp, hidden: 1024, ffn: 4096, tokens: 256, dtype: bf16}
parallel: {tp: 16}
EOF
if expect_exit 0 'forward time' -- shardsim_mpi 1 --chips 16 run stacked.yaml --shape-only --no-checkpoint \
     --set 'topology.dims[0].bandwidth_gbps=100'; then
  want=$(sed -n 's/^  forward time  *\([0-9.]*\) us.*/\1/p' "$E2E_STDOUT" | head -1)
  if expect_exit 0 'what-if' -- shardsim_mpi 1 --chips 16 profile stacked.yaml --what-if dim0.bandwidth=2x,link_bw=2x; then
    assert_out "^  dim0\.bandwidth=2x +$want us .*\(--set topology\.dims\[0\]\.bandwidth_gbps=100\)$" \
      "the dim0 row = a run with --set topology.dims[0].bandwidth_gbps=100 ($want us)"
    assert_out_fixed '(--set topology.dims[0].bandwidth_gbps=100 --set topology.dims[1].bandwidth_gbps=900)' \
      "link_bw scales every dimension"
  fi
fi
expect_exit 2 "'dims' has 2 entries" -- shardsim_mpi 1 --chips 16 run stacked.yaml --shape-only --no-checkpoint \
  --set 'topology.dims[5].bandwidth_gbps=1'
if expect_exit 0 '^  link_bw=2x ' -- shardsim_mpi 1 --chips 16 profile stacked.yaml --topology "$RAILS" \
     --what-if link_bw=2x,dim1.latency=0.5x; then
  assert_out '^  dim1\.latency=0\.5x .*--set topology=\{kind: stacked' "a topology file's change is set inline"
fi

# ---- kind 7: a named parallel.algorithm that cannot run on a group of the plan ----
e2e_case "kind 7: parallel.algorithm refused before the run header, FILE:LINE, exit 2"
sed '/^parallel:/,$d' "$TRAIN" >algo.yaml
printf 'parallel:\n  tp: 2\n  dp: 2\n  algorithm: in_switch\n' >>algo.yaml
line=$(grep -n 'algorithm: in_switch' algo.yaml | cut -d: -f1)
expect_exit 2 "algo\.yaml:$line: parallel\.algorithm: 'in_switch' cannot run the tp group's all_reduce over 2 chips" -- \
  shardsim_mpi 1 train algo.yaml --chips 4 --steps 1
assert_out_count '^shardsim train:|^  step ' 0 "no run header, no step"
for a in torus multi_ring rail_ring; do
  expect_exit 2 "--set parallel\.algorithm=$a: parallel\.algorithm: '$a' cannot run" -- \
    shardsim_mpi 1 train "$TRAIN" --chips 4 --steps 1 --plan tp=2,dp=2 --set parallel.algorithm=$a
done
expect_exit 2 "--plan tp=2,dp=2,algorithm=torus: parallel\.algorithm: 'torus' cannot run" -- \
  shardsim_mpi 1 train "$TRAIN" --chips 4 --steps 1 --plan tp=2,dp=2,algorithm=torus
expect_exit 2 "parallel\.algorithm: 'in_switch' cannot run" -- \
  shardsim_mpi 1 run "$CONFIGS/blocks/small_block.yaml" --chips 4 --set parallel.algorithm=in_switch
assert_out_count 'on chip' 0 "not a fault of a chip"

e2e_case "kind 7: the plan rule: collectives without the name, and one-chip groups, run auto"
# double_binary_tree is an all_reduce algorithm: the all_gathers and reduce_scatters of ZeRO and the gradient
# norm run auto (they used to fail at the first collective); in_switch on the whole NVLS switch runs although
# the tp groups (one chip each) cannot reduce in the switch.
for z in 0 1 3; do
  expect_exit 0 '^  step ' -- shardsim_mpi 1 train "$TRAIN" --chips 4 --steps 1 --plan tp=2,dp=2,zero=$z \
    --set parallel.algorithm=double_binary_tree
done
expect_exit 0 '^  step ' -- shardsim_mpi 1 train "$TRAIN" --chips 8 --steps 1 --plan dp=8 --set model.batch=8 \
  --topology "$CONFIGS/topologies/dgx_h100_nvls.yaml" --set parallel.algorithm=in_switch

e2e_case "kind 5: serve never writes over its --requests trace"
printf 'arrival_s,prompt_tokens,output_tokens\n0,4,4\n' >req.csv
cp req.csv req.bak
expect_exit 2 "--json \./req\.csv: would overwrite the --requests file" -- \
  shardsim_mpi 1 serve "$CONFIGS/serve/llama3_8b_h100.yaml" --requests req.csv --json ./req.csv
if cmp -s req.csv req.bak; then pass "the trace is intact"; else fail "req.csv was overwritten"; fi

# ---- kind 15: small things ----
e2e_case "kind 15: error lines after --set keep the file's line numbers"
cat >lines.yaml <<'EOF'
topology: {kind: ring, chips: 8, bandwidth_gbps: 100}
device: trainium1
model:
  kind: mlp
  hidden: 1024
  ffn: 4096
  tokens: 64
  dtype: fp32
parallel:
  tp: 8
  bogus: 1
EOF
expect_exit 2 'lines\.yaml \(with command-line overrides\):11: unknown key .parallel\.bogus' -- \
  shardsim_mpi 1 --chips 8 run lines.yaml --shape-only --no-checkpoint --set model.tokens=128 --set device=h100

e2e_case "kind 15: shardsim help without a topic lists the topics"
expect_exit 0 '^  config ' -- shardsim_mpi 1 help && assert_out '^  devices '

e2e_case "kind 15: a training run's JSON says its layers; the memory line states the HBM reserve"
if expect_exit 0 'kept in reserve' -- shardsim_mpi 1 train "$TRAIN" --chips 2 --plan dp=2 --steps 1 \
     --set model.batch=4 --set model.layers=5 --json t.json; then
  if grep -q '"layers": *5' t.json; then pass "JSON layers 5"; else fail "t.json does not say layers 5"; fi
fi

e2e_finish

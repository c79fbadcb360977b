#!/usr/bin/env bash
# e2e: folded train runs (docs/performance/fold.md). A shape-only Llama-3-405B-shaped step (TP8 x DP and
# TP8 x PP2 x DP, ZeRO-3, 1F1B, 16-chip 4x4-torus nodes joined by a switch) at 64 and 256 chips on one rank: the
# default does not fold it; fold: on refuses it with one line and exit 3 where the step's collectives break the
# replica symmetry (never a wrong number); --no-fold wins; runs the fold cannot prove symmetric (a line dimension,
# --trace) are not folded; fold: with a bad value is exit 2.
# Usage: fold.sh SHARDSIM_BINARY CONFIG_DIR [MPIEXEC]
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
E2E_TIMEOUT=${E2E_TIMEOUT:-600}
e2e_init "$@"

cat > step.yaml <<'Y'
name: fold_step
mode: shape_only
device:
  preset: h100
model:
  vocab: 128256
  hidden: 16384
  heads: 128
  kv_heads: 8
  head_dim: 128
  ffn: 53248
  layers: 4
  seq: 2048
  batch: 8
  micro_batch: 1
  dtype: bf16
  seed: 1
parallel:
  tp: 8
  zero: 3
  sp: true
train:
  steps: 1
Y

topo() {  # CHIPS OUTER_KIND: N/16 nodes of 4x4 tori joined by OUTER_KIND
  cat > "topo_$1_$2.yaml" <<T
topology:
  kind: stacked
  dims:
    - {kind: $2, size: $(($1 / 16)), bandwidth_gbps: 50, latency_ns: 5000}
    - {kind: ring, size: 4, bandwidth_gbps: 100, latency_ns: 500}
    - {kind: ring, size: 4, bandwidth_gbps: 100, latency_ns: 500}
T
}

for spec in "64 1" "256 2"; do
  set -- $spec
  n=$1 pp=$2
  dp=$((n / (8 * pp)))
  e2e_case "chips=$n pp=$pp dp=$dp"
  topo "$n" switch
  args=(train step.yaml --topology "topo_${n}_switch.yaml" --set parallel.pp=$pp --set parallel.dp=$dp
        --set model.batch=$((dp * 2 * pp)))
  [ "$pp" -gt 1 ] && args+=(--set parallel.schedule=1f1b)
  export SHARDSIM_PROGRESS_S=0.2  # the progress line of a long step, every 0.2 s here (default 30 s)
  expect_exit 0 'simulated' -- shardsim_mpi 1 --chips "$n" "${args[@]}" || continue
  unset SHARDSIM_PROGRESS_S
  assert_out "chips simulated +$n of $n\$" "fold: auto does not fold a train step (its gradient-norm all_reduce is not symmetric)"
  assert_out "peak RSS [0-9]+ MiB, [0-9]+ scheduler events" "the host line"
  [ "$n" -gt 64 ] && assert_out "^shardsim: train: step 1 of 1 in progress, .* scheduler events, [0-9]+ s elapsed \(wall\)" "progress line"
  # fold: on: the step's collectives are not symmetric under the replica shift (the dp groups' bidirectional
  # rings book ties in chip order; the gradient norm's one-element all_reduce): one line, exit 3, no wrong number.
  for alg in auto ring; do
    expect_exit 3 '^shardsim: error on chip [0-9]+: fold: .*not provably identical' -- \
      shardsim_mpi 1 --chips "$n" "${args[@]}" --set parallel.algorithm=$alg --set fold=on || continue
    assert_out_count '^shardsim: error' 1 "one error line ($alg)"
  done
  expect_exit 0 'simulated' -- shardsim_mpi 1 --chips "$n" "${args[@]}" --set fold=on --no-fold
  assert_out "chips simulated +$n of $n\$" "--no-fold wins over fold: on"
done

e2e_case "not provably symmetric: not folded, even with fold: on"
topo 64 line
expect_exit 0 'simulated' -- shardsim_mpi 1 --chips 64 train step.yaml --topology topo_64_line.yaml --set parallel.dp=8 --set fold=on
assert_out "chips simulated +64 of 64" "a line outer dimension is not folded"
topo 64 switch
expect_exit 0 'simulated' -- shardsim_mpi 1 --chips 64 train step.yaml --topology topo_64_switch.yaml --set parallel.dp=8 --set fold=on --trace t.json
assert_out "chips simulated +64 of 64" "--trace is not folded"

e2e_case "bad fold: value"
sed 's/^mode: shape_only/mode: shape_only\nfold: sometimes/' step.yaml > bad.yaml
expect_exit 2 "fold: 'sometimes' \(auto \| on \| off\)" -- shardsim_mpi 1 --chips 64 train bad.yaml --topology topo_64_switch.yaml --set parallel.dp=8

e2e_finish

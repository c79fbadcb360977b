#!/usr/bin/env bash
# e2e: folded train runs (docs/performance/fold.md). A shape-only Llama-3-405B-shaped step (TP8 x DP and
# TP8 x PP2 x DP, ZeRO-3, 1F1B, 16-chip 4x4-torus nodes joined by a switch) at 64, 256 and 1,024 chips on one
# rank: the default (fold: auto) folds it and its JSON report equals the unfolded run's byte for byte (the host
# `wall` block aside); where the replicas turn out not to be identical (recursive doubling's XOR partners) auto
# falls back to every chip with one note and the unfolded result, printed once, while fold: on stops with exit 3
# and one line (never a wrong number); ZeRO 1-3 over a dp that divides no bucket fold (padded buffers); cp and
# Ulysses axes fold; interleaved and ZB-H1 pipelines fold; rail_ring over the whole topology folds (a two-node period); several MPI
# ranks are decided unfolded before any chip starts (auto: one note; on: exit 2); training sweep points fold as train folds them (one MPI rank); --no-fold wins; runs the fold cannot prove symmetric (a line dimension,
# --trace) are not folded (auto: one note; fold: on and past 4,096 chips: exit 2, one line); fold: with a bad value is exit 2.
# Usage: fold.sh SHARDSIM_BINARY CONFIG_DIR [MPIEXEC]
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
# Its own knob: lib.sh has already set E2E_TIMEOUT to 60 s (the unfolded 1,024-chip step took longer under load).
E2E_TIMEOUT=${E2E_TIMEOUT_FOLD:-600}
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

same_json() {  # A B WHAT: the two reports are equal, the host-side `wall` block aside
  if python3 - "$1" "$2" <<'EOF'
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:3])
for d in (a, b):
    d.pop("wall", None)
sys.exit(0 if a == b else 1)
EOF
  then pass "$3"; else fail "$3: $1 and $2 differ"; fi
}

for spec in "64 1 16" "256 2 32" "1024 2 32"; do
  set -- $spec
  n=$1 pp=$2 sim=$3
  dp=$((n / (8 * pp)))
  e2e_case "chips=$n pp=$pp dp=$dp: folded by default, byte-identical to every chip"
  topo "$n" switch
  args=(train step.yaml --topology "topo_${n}_switch.yaml" --set parallel.pp=$pp --set parallel.dp=$dp
        --set model.batch=$((dp * 2 * pp)))
  [ "$pp" -gt 1 ] && args+=(--set parallel.schedule=1f1b)
  expect_exit 0 'simulated' -- shardsim_mpi 1 --chips "$n" "${args[@]}" --json "folded_$n.json" || continue
  assert_out "chips simulated +$sim of $n \(folded" "fold: auto folds the step ($sim of $n chips run)"
  assert_out "peak RSS [0-9]+ MiB, [0-9]+ scheduler events" "the host line"
  [ "$n" -gt 64 ] && export SHARDSIM_PROGRESS_S=0.2  # the progress line of a long step (default every 30 s)
  expect_exit 0 'simulated' -- shardsim_mpi 1 --chips "$n" "${args[@]}" --no-fold --json "full_$n.json" || continue
  unset SHARDSIM_PROGRESS_S
  assert_out "chips simulated +$n of $n\$" "--no-fold runs every chip"
  [ "$n" -gt 64 ] && assert_out "^shardsim: train: step 1 of 1 in progress, .* scheduler events, [0-9]+ s elapsed \(wall\)" "progress line"
  same_json "folded_$n.json" "full_$n.json" "folded and unfolded reports are byte-identical at $n chips"
done

e2e_case "replicas not provably identical: auto falls back to every chip, on is refused before the run (exit 2)"
n=64
args=(train step.yaml --topology topo_64_switch.yaml --set parallel.dp=8 --set model.batch=16
      --set parallel.algorithm=halving_doubling)
expect_exit 0 'simulated' -- shardsim_mpi 1 --chips $n "${args[@]}" --json fallback.json
assert_out_count '^shardsim: note: fold: auto simulates every chip: .*halving_doubling over data-parallel replicas' 1 "one note says why"
assert_out "chips simulated +64 of 64\$" "the fallback ran every chip"
assert_out_count '^DONE' 1 "the report is printed once"
assert_out_count 'sim_step_us' 1 "the step table's header is printed once"
cp "$E2E_STDOUT" fallback.stdout
expect_exit 0 'simulated' -- shardsim_mpi 1 --chips $n "${args[@]}" --no-fold --json nofold.json
same_json fallback.json nofold.json "the fallback's report equals --no-fold's"
if diff <(grep -Ev '^ *(total|peak RSS)' fallback.stdout) <(grep -Ev '^ *(total|peak RSS)' "$E2E_STDOUT") >/dev/null; then
  pass "the fallback's standard output equals --no-fold's (host lines aside)"
else
  fail "the fallback's standard output differs from --no-fold's"
fi
expect_exit 2 '^shardsim: error: fold: this run does not fold: [a-z_]+: halving_doubling over data-parallel replicas' -- \
  shardsim_mpi 1 --chips $n "${args[@]}" --set fold=on
assert_out_count '^shardsim: error' 1 "fold: on: one error line"
expect_exit 0 'simulated' -- shardsim_mpi 1 --chips $n "${args[@]}" --set fold=on --no-fold
assert_out "chips simulated +$n of $n\$" "--no-fold wins over fold: on"
topo 8192 switch
expect_exit 2 '^shardsim: error: fold: this run does not fold: .*halving_doubling over data-parallel replicas' -- \
  shardsim_mpi 1 --chips 8192 train step.yaml --topology topo_8192_switch.yaml \
  --set parallel.dp=1024 --set model.batch=2048 --set model.layers=1 --set parallel.algorithm=halving_doubling
assert_out_count '^shardsim: (note|error)' 1 "beyond 4,096 chips per rank auto cannot fall back: one fold line, exit 2 before the run"

e2e_case "a tree over an odd dp (ZeRO 0, auto picks double_binary_tree): not folded, the unfolded result"
# Rank 0 of an odd dp is a leaf of both trees: the router's size and deadlock checks alone would not see that
# the mirrored parents' messages are its own (a wrong step, found by a hostile test); only ring and bidir_ring
# over the replicas keep a run folded.
cat > tree.yaml <<'Y'
name: fold_tree
mode: shape_only
device: {preset: h100}
model: {vocab: 256, hidden: 64, heads: 8, kv_heads: 8, head_dim: 8, ffn: 128, layers: 1, seq: 16, batch: 3, micro_batch: 1, dtype: bf16, seed: 1}
parallel: {tp: 1, zero: 0}
train: {steps: 1}
Y
expect_exit 0 'simulated' -- shardsim_mpi 1 --chips 3 train tree.yaml --ring 3 --json tree_auto.json
assert_out_count '^shardsim: note: fold: auto simulates every chip: all_reduce: double_binary_tree over data-parallel' 1 \
  "the tree over the replicas ends the folded attempt"
expect_exit 0 'simulated' -- shardsim_mpi 1 --chips 3 train tree.yaml --ring 3 --no-fold --json tree_full.json
same_json tree_auto.json tree_full.json "the tree step equals --no-fold's"
expect_exit 2 '^shardsim: error: fold: this run does not fold: all_reduce: double_binary_tree over data-parallel replicas' -- \
  shardsim_mpi 1 --chips 3 train tree.yaml --ring 3 --set fold=on

e2e_case "padded ZeRO buffers: dp 6 does not divide the buckets, ZeRO 1-3 still fold, byte-identical"
# Megatron's distributed-optimizer padding (sharding/plans/data_parallel.h): every bucket ends at a multiple of
# lcm(dp, 128) elements, so the reduce_scatter / all_gather chunks are equal on every replica.
cat > pad.yaml <<'Y'
name: fold_pad
mode: shape_only
device: {preset: h100}
model: {vocab: 250, hidden: 64, heads: 8, kv_heads: 8, head_dim: 8, ffn: 136, layers: 2, seq: 16, batch: 6, micro_batch: 1, dtype: bf16, seed: 1}
parallel: {tp: 1, zero: 1, bucket_bytes: 20000}
train: {steps: 2}
Y
for z in 1 2 3; do
  expect_exit 0 'simulated' -- shardsim_mpi 1 --chips 6 train pad.yaml --ring 6 --set parallel.zero=$z --json pad_f$z.json
  assert_out "chips simulated +1 of 6 \(folded" "ZeRO $z over 6 replicas folds"
  assert_out "elements of padding per flat buffer" "ZeRO $z: the memory rows say how much padding"
  expect_exit 0 'simulated' -- shardsim_mpi 1 --chips 6 train pad.yaml --ring 6 --set parallel.zero=$z --no-fold --json pad_u$z.json
  same_json pad_f$z.json pad_u$z.json "ZeRO $z: folded equals every chip"
done

e2e_case "ep x tp inside the replica: the fold's stride is the dp axis's (tp x cp x ep), byte-identical"
# The mesh order is tp, cp, ep, dp, pp: a replica is tp x ep = 4 chips here, 4 of 16 run; a stride of tp x cp would
# take the ep coordinates for replicas (what the fold refused before this case was added).
expect_exit 0 'simulated' -- shardsim_mpi 1 --chips 16 train "$CONFIGS/moe/tiny_moe.yaml" --shape-only --steps 1 \
  --plan ep=2,dp=4,tp=2 --json ep_f.json
assert_out "chips simulated +4 of 16 \(folded" "ep2 x tp2 x dp4: folded (4 of 16 chips run)"
expect_exit 0 'simulated' -- shardsim_mpi 1 --chips 16 train "$CONFIGS/moe/tiny_moe.yaml" --shape-only --steps 1 \
  --plan ep=2,dp=4,tp=2 --no-fold --json ep_u.json
same_json ep_f.json ep_u.json "ep2 x tp2 x dp4: folded equals every chip"

e2e_case "cp and Ulysses axes fold (the dp-cp group rotates under the replica shift), byte-identical"
# TP8 x CP2 fills a 16-chip node, so one replica runs (16 of 64 chips); its gradients are averaged over dp x cp.
for plan in "parallel.cp=2" "parallel.ulysses=2"; do
  args=(train step.yaml --topology topo_64_switch.yaml --set parallel.dp=4 --set $plan --set model.batch=8
        --set model.layers=2)
  expect_exit 0 'simulated' -- shardsim_mpi 1 --chips 64 "${args[@]}" --json "cp_f.json" || continue
  assert_out "chips simulated +16 of 64 \(folded" "$plan: folded (16 of 64 chips run)"
  expect_exit 0 'simulated' -- shardsim_mpi 1 --chips 64 "${args[@]}" --no-fold --json "cp_u.json" || continue
  same_json cp_f.json cp_u.json "$plan: folded equals every chip"
done

e2e_case "interleaved and ZB-H1 pipelines fold, byte-identical"
# The tiny padded-ZeRO model on 2 stages x 4 replicas (8 chips on one switch): 2 of 8 chips run; interleaved with 2
# virtual stages per chip (4 micro-batches per replica), and ZB-H1 (deferred weight gradients).
cat > sw8.yaml <<'Y'
topology: {kind: switch, chips: 8, bandwidth_gbps: 100, latency_ns: 1000}
Y
for sched in "interleaved --set parallel.virtual_stages=2" "zb_h1"; do
  args=(train pad.yaml --topology sw8.yaml --set parallel.dp=4 --set parallel.pp=2 --set model.layers=4 --set model.batch=16
        --set parallel.schedule=$sched)
  expect_exit 0 'simulated' -- shardsim_mpi 1 --chips 8 "${args[@]}" --json pp_f.json || continue
  assert_out "chips simulated +2 of 8 \(folded" "${sched%% *}: folded (2 of 8 chips run)"
  expect_exit 0 'simulated' -- shardsim_mpi 1 --chips 8 "${args[@]}" --no-fold --json pp_u.json || continue
  same_json pp_f.json pp_u.json "${sched%% *}: folded equals every chip"
done

e2e_case "several MPI ranks: decided before any chip starts (auto: one note, every chip; on: exit 2)"
# The router mirrors a message to a chip of another replica onto a chip of replica 0 on the same rank
# (runtime/chips.cpp, post); across ranks the replicas' chips live in other processes, so the run is not folded.
expect_exit 0 'simulated' -- shardsim_mpi 2 --chips 8 train pad.yaml --topology sw8.yaml --set parallel.dp=8 --set model.batch=8 \
  --json mr_u.json
assert_out "chips simulated +8 of 8\$" "2 ranks: every chip simulated"
assert_out_count '^shardsim: note: fold: auto simulates every chip: it runs on 2 MPI ranks' 1 "one note says why"
expect_exit 2 '^shardsim: error: fold: on: this run does not fold: it runs on 2 MPI ranks' -- \
  shardsim_mpi 2 --chips 8 train pad.yaml --topology sw8.yaml --set parallel.dp=8 --set model.batch=8 --set fold=on
expect_exit 0 'simulated' -- shardsim_mpi 1 --chips 8 train pad.yaml --topology sw8.yaml --set parallel.dp=8 --set model.batch=8 \
  --json mr_f.json
same_json mr_f.json mr_u.json "one rank folded equals two ranks of every chip"

e2e_case "rail_ring over the whole topology folds: the period rounded up to two nodes, byte-identical"
# rail_ring's rings visit even nodes upwards and odd ones downwards: a shift by one node maps each onto its reverse,
# a shift by two onto itself (collectives/rail_ring.h), so 4 nodes of 4 fold into 2 replicas of 8 chips.
cat > rail_topo.yaml <<'T'
topology:
  kind: stacked
  dims:
    - {kind: switch, size: 4, bandwidth_gbps: 50, latency_ns: 5000}
    - {kind: switch, size: 4, bandwidth_gbps: 450, latency_ns: 1000}
T
for z in 1 3; do
  args=(train pad.yaml --topology rail_topo.yaml --set parallel.dp=16 --set model.batch=16 --set parallel.zero=$z
        --set parallel.algorithm=rail_ring --set train.steps=1)
  expect_exit 0 'simulated' -- shardsim_mpi 1 --chips 16 "${args[@]}" --json rail_f$z.json || continue
  assert_out "chips simulated +8 of 16 \(folded" "ZeRO $z, rail_ring over 16 replicas: 8 of 16 chips run"
  expect_exit 0 'simulated' -- shardsim_mpi 1 --chips 16 "${args[@]}" --no-fold --json rail_u$z.json || continue
  same_json rail_f$z.json rail_u$z.json "ZeRO $z, rail_ring: folded equals every chip"
done

e2e_case "not provably symmetric: decided before any chip starts; auto says why, fold: on refuses"
topo 64 line
expect_exit 0 'simulated' -- shardsim_mpi 1 --chips 64 train step.yaml --topology topo_64_line.yaml --set parallel.dp=8
assert_out "chips simulated +64 of 64" "a line outer dimension is not folded"
assert_out_count '^shardsim: note: fold: auto simulates every chip: shifting the data-parallel replicas is not a symmetry of the topology.*simulating all 64 chips needs at least' 1 \
  "one note says why and what simulating every chip costs"
expect_exit 2 '^shardsim: error: fold: on: this run does not fold: shifting the data-parallel replicas' -- \
  shardsim_mpi 1 --chips 64 train step.yaml --topology topo_64_line.yaml --set parallel.dp=8 --set fold=on
assert_out_count '^shardsim: (error|note)' 1 "fold: on never runs unfolded: one line, exit 2"
assert_out_count 'sim_step_us' 0 "nothing was simulated"
topo 64 switch
expect_exit 2 '^shardsim: error: fold: on: this run does not fold: --trace records' -- \
  shardsim_mpi 1 --chips 64 train step.yaml --topology topo_64_switch.yaml --set parallel.dp=8 --set fold=on --trace t.json
expect_exit 0 'simulated' -- shardsim_mpi 1 --chips 64 train step.yaml --topology topo_64_switch.yaml --set parallel.dp=8 --trace t.json
assert_out "chips simulated +64 of 64" "--trace is not folded under auto"
topo 8192 line
expect_exit 2 '^shardsim: error: fold: auto: this run does not fold: shifting .*past the 4096 chips one rank may host' -- \
  shardsim_mpi 1 --chips 8192 train step.yaml --topology topo_8192_line.yaml --set parallel.dp=1024 --set model.batch=2048
assert_out_count '^shardsim: (error|note)' 1 "past the chips one rank may host unfolded: one line, exit 2, before any chip starts"

e2e_case "sweep points fold as train folds them (one rank: each point starts its own chips)"
topo 64 switch
sed 's/^  tp: 8$/  tp: 8\n  algorithm: halving_doubling/' step.yaml > hd.yaml
cat > sweep.yaml <<Y
name: fold_sweep
output: sweep_out
axes:
  workload: [{config: step.yaml, label: step, set: {batch: 16}}, {config: hd.yaml, label: hd, set: {batch: 16}}]
  topology: [topo_64_switch.yaml]
  device: [h100]
  plan: [{tp: 8, sp: true, zero: 3, dp: 8}]
Y
if expect_exit 0 '^sweep fold_sweep: ran 2' -- shardsim_mpi 1 --chips 64 sweep sweep.yaml --no-plots; then
  assert_out "done step tp8xdp8\+sp-z3 .*; folded: 16 of 64 chips simulated" "the ring point folds (16 of 64 chips)"
  assert_out "done hd tp8xdp8\+sp-z3 .*; every chip simulated: fold: .*halving_doubling" \
    "the halving-doubling point falls back to every chip and says why"
  python3 - sweep_out/results.csv folded_64.json fallback.json <<'EOF2' && pass "each point's step equals train's (folded, fallback)" || fail "sweep steps differ from train's"
import csv, json, sys
rows = list(csv.DictReader(open(sys.argv[1])))
assert len(rows) == 2 and all(r["verdict"] == "not_validated" for r in rows), rows
for r, f in zip(rows, sys.argv[2:]):
    want = json.load(open(f))["train"]["step_ns"] / 1e3
    assert abs(float(r["sim_time_us"]) - want) <= 1e-9 * want, (r["plan"], r["sim_time_us"], want)
EOF2
fi

e2e_case "bad fold: value"
sed 's/^mode: shape_only/mode: shape_only\nfold: sometimes/' step.yaml > bad.yaml
expect_exit 2 "fold: 'sometimes' \(auto \| on \| off\)" -- shardsim_mpi 1 --chips 64 train bad.yaml --topology topo_64_switch.yaml --set parallel.dp=8

e2e_finish

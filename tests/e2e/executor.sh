#!/usr/bin/env bash
# e2e: one executor, two modes (models/lm_tp.h, apps/train.cpp). `run` on a language-model config is the forward
# mode: one forward of the step's batch through the plan (dp, tp, pp with its schedule's forward actions), its loss
# against the single-device forward, the same loss under every plan; `run` on a block config (model.kind
# transformer_block: no vocabulary, a regression loss) is the same forward mode with every output row validated;
# `train` on a block config trains it and validates the losses against one device; `train` on an MLP config
# (model.kind mlp: the block with attention off, x + mlp(rmsnorm(x))) likewise.
# Usage: executor.sh SHARDSIM_BINARY CONFIG_DIR [MPIEXEC]
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
e2e_init "$@"

LM=$CONFIGS/lm_train_dp4.yaml
BLOCK=$CONFIGS/blocks/small_block.yaml
same_forward_time() {  # A.json B.json WHAT: the same simulated forward time, to the nanosecond
  if python3 -c "import json,sys; a=json.load(open(sys.argv[1])); b=json.load(open(sys.argv[2])); \
sys.exit(0 if a['simulated']['total_ns']==b['simulated']['total_ns'] else 1)" "$1" "$2"; then
    pass "$3: the same forward time"
  else fail "$3: the forward times differ"; fi
}
loss_of() { awk '/^loss: /{gsub(",", "", $2); print $2}' "$E2E_STDOUT"; }
same_loss() {  # A B WHAT: equal within 1e-2 relative (bf16 configs) - the forward's limit is the dtype's
  if awk -v a="$1" -v b="$2" 'BEGIN {d = a - b; if (d < 0) d = -d; exit !(a != "" && d <= 1e-2 * (a < 0 ? -a : a))}'; then
    pass "$3: $1 = $2"
  else fail "$3: $1 vs $2"; fi
}

e2e_case "(a) run on a training config: the forward mode, validated against one device"
if expect_exit 0 'validation: PASS' -- shardsim_mpi 1 --chips 4 run "$LM" --json fwd.json; then
  assert_out 'forward mode of the executor' "the report names the mode"
  assert_out '^  forward time +[0-9.]+ (us|ms)$' "the simulated forward time"
  assert_out 'model FLOPs per forward' "MFU counts a forward's FLOPs"
  assert_out "the config's train: section is ignored by run" "the header says the train: section is unused"
  base=$(loss_of)
  if python3 -c "import json,sys; j=json.load(open('fwd.json')); t=j['train']; \
sys.exit(0 if j['run_mode']=='forward' and t['forward'] and abs(t['steps'][0]['loss']-t['reference_loss'])<1e-2 else 1)"; then
    pass "JSON: run_mode forward, the loss and the reference loss"
  else fail "JSON of the forward mode"; fi
fi

e2e_case "(b) the same forward pipelined (pp=2 x tp=2, 4 micro-batches) and at tp=4, on 4 ranks"
if expect_exit 0 'validation: PASS' -- shardsim_mpi 4 run "$LM" --plan pp=2,tp=2 --set model.micro_batch=2; then
  assert_out 'pipeline pp=2 \(1f1b' "the pipelined plan"
  same_loss "$base" "$(loss_of)" "pp=2 x tp=2 forward loss = dp=4's"
fi
if expect_exit 0 'validation: PASS' -- shardsim_mpi 1 --chips 4 run "$LM" --plan tp=4,sp=true; then
  same_loss "$base" "$(loss_of)" "tp=4 + sp forward loss = dp=4's"
fi

e2e_case "(c) shape-only forward: the same simulated time, not validated"
if expect_exit 0 'forward time' -- shardsim_mpi 1 --chips 4 run "$LM" --json fwd_real.json; then
  if expect_exit 0 'forward time' -- shardsim_mpi 1 --chips 4 run "$LM" --shape-only --json fwd_shape.json; then
    if python3 -c "import json,sys; a=json.load(open('fwd_real.json')); b=json.load(open('fwd_shape.json')); \
sys.exit(0 if a['train']['step_ns']==b['train']['step_ns'] and not b['validated'] else 1)"; then
      pass "shape-only forward time = real data's, not validated"
    else fail "shape-only forward differs from real data"; fi
  fi
fi

e2e_case "(d) a forward checkpoint is the weights part of a training state: train resumes it, run reads it"
if expect_exit 0 'validation: PASS' -- shardsim_mpi 1 --chips 4 run "$LM" --checkpoint fwd.h5; then
  expect_exit 0 'validation: PASS' -- shardsim_mpi 1 --chips 4 run "$LM" --resume fwd.h5 --plan tp=2
  same_loss "$base" "$(loss_of)" "the resumed forward's loss"
  expect_exit 0 'resumed: .* at step 0 .*weights only' -- \
    shardsim_mpi 1 --chips 4 train "$LM" --resume fwd.h5 --steps 1 --validate
  if expect_exit 0 'master/layers.0.wq' -- shardsim_mpi 1 ckpt inspect fwd.h5; then
    assert_out_count '^  adam_(m|v)/' 0 "the forward checkpoint holds no AdamW moments (the weights part)"
  fi
fi
# A file of the older run schema (workload mlp | block, datasets weights/<w>): one line saying how to write the
# current one.
if PY=$(h5py_python) && cp fwd.h5 old.h5 && "$PY" -c 'import sys, h5py; f = h5py.File(sys.argv[1], "r+"); \
f.attrs["workload"] = "mlp"; f.close()' old.h5; then
  expect_exit 2 'written by `shardsim run` before version 0.2 .*run the config again with --checkpoint' -- \
    shardsim_mpi 1 --chips 4 run "$LM" --resume old.h5
fi

e2e_case "(e) train on a block config (no vocabulary: a regression loss), validated against one device"
if expect_exit 0 'validation: PASS' -- shardsim_mpi 1 --chips 4 train "$BLOCK" --steps 3 --plan tp=2; then
  assert_out 'a stack of 1 transformer blocks' "the model line says what trains"
  assert_out_count '^ +[0-9]+ +[0-9.]+ +[0-9.]+( +[0-9.]+){4}$' 3 "one row per step"
fi
for plan in "tp=2,sp=true" "tp=2,cp=2" "ulysses=2,tp=2" "pp=2,tp=2" "dp=4,zero=3"; do
  extra=()
  case $plan in pp=*) extra=(--set model.layers=2 --set model.batch=4 --set model.micro_batch=1) ;; esac
  expect_exit 0 'validation: PASS' -- shardsim_mpi 1 --chips 4 train "$BLOCK" --steps 3 --plan "$plan" \
    ${extra[@]+"${extra[@]}"}
done
expect_exit 0 'validation: PASS' -- shardsim_mpi 4 train "$BLOCK" --steps 2 --plan tp=2,sp=true
# Tp above the KV heads (the shipped tp 4 over 2 KV heads; tp 8: 4x): each chip holds its query heads' KV head, the
# replicas' Wk / Wv gradients summed over the chips sharing it (all_reduce.kv_grads).
if expect_exit 0 'validation: PASS' -- shardsim_mpi 1 --chips 4 train "$BLOCK" --steps 3 --profile; then
  assert_out 'all_reduce\.kv_grads' "the KV replicas' gradient all_reduce is on the chip's timeline"
fi
expect_exit 0 'validation: PASS' -- shardsim_mpi 4 train "$BLOCK" --steps 2 --plan tp=4,sp=true
expect_exit 0 'validation: PASS' -- shardsim_mpi 1 --chips 8 train "$BLOCK" --steps 2 --plan tp=8,sp=true \
  --set topology.chips=8

e2e_case "(g) run on a block config: the forward mode, every output row against one device, run's tables"
if expect_exit 0 'validation: PASS' -- shardsim_mpi 1 --chips 4 run "$BLOCK" --json blk.json; then
  assert_out 'forward mode of the executor' "the report names the mode"
  assert_out '^validation PASS  max\|y-y_ref\| = [0-9.e-]+, .*relative [0-9.e-]+ \(tolerance 0.0001\)' \
    "the output rows compared"
  assert_out '^communication per chip' "the per-collective table"
  assert_out '^  tp all_reduce +[0-9.]+ MiB in 2 call\(s\)' "the tp all_reduces, with their formula"
  assert_out '^time by op \(critical chip' "the per-op table"
  assert_out '^  single device +[0-9.]+ (us|ms) +-> speedup' "the single-device time"
  if python3 -c "import json,sys; j=json.load(open('blk.json')); v=j['validation']; \
sys.exit(0 if j['train']['rows_validated'] and v['passed'] and 0 <= v['relative_error'] <= 1e-4 and \
j['simulated']['per_chip'] and j['simulated']['ops'] and 'tp all_reduce' in j['communication'] else 1)"; then
    pass "JSON: rows validated, per-chip rows, ops and the communication table"
  else fail "JSON of a block forward"; fi
fi
for plan in "tp=2,sp=true" "tp=2,sp=true,fused=true" "tp=2,cp=2" "tp=2,cp=2,cp_split=contiguous" "ulysses=2,tp=2" \
            "dp=4" "dp=2,tp=2"; do
  expect_exit 0 'validation: PASS' -- shardsim_mpi 1 --chips 4 run "$BLOCK" --plan "$plan"
done
expect_exit 0 '^fused collectives' -- shardsim_mpi 1 --chips 4 run "$BLOCK" --plan tp=4,sp=true,fused=true
# must-show 3: a pipelined forward on 4 ranks
if expect_exit 0 'validation: PASS' -- shardsim_mpi 4 run "$BLOCK" --plan pp=2,tp=2 --set model.layers=2 \
     --set model.batch=4 --set model.micro_batch=1; then
  assert_out 'pipeline pp=2 \(1f1b' "the pipelined plan"
fi
# Every chip of one rank, one chip per rank: the same figures.
if expect_exit 0 'validation: PASS' -- shardsim_mpi 4 run "$BLOCK" --plan tp=2,cp=2 --json blk_ranks.json; then
  if expect_exit 0 'validation: PASS' -- shardsim_mpi 1 --chips 4 run "$BLOCK" --plan tp=2,cp=2 --json blk_chips.json; then
    same_forward_time blk_ranks.json blk_chips.json "4 ranks and 4 chips of one rank"
  fi
fi

e2e_case "(i) must-show 2, forward mode at 8 chips on one rank: every plan and composition against one device"
# (1 chip per rank: (b) and (g) above.) small_block: 8 heads, 2 KV heads (tp above them replicates KV in a forward).
B8=(--set topology.chips=8 --set model.layers=4 --set model.batch=8)
for plan in "tp=8" "tp=4,sp=true" "tp=4,sp=true,fused=true" "tp=2,cp=4" "tp=2,cp=4,cp_split=contiguous" \
            "dp=2,tp=2,cp=2" "dp=8" "pp=2,tp=4" "pp=2,tp=4,schedule=gpipe" "pp=2,tp=4,schedule=interleaved,virtual_stages=2" \
            "pp=2,tp=4,schedule=zb_h1"; do
  expect_exit 0 'validation: PASS' -- shardsim_mpi 1 --chips 8 run "$BLOCK" --plan "$plan" "${B8[@]}" \
    --set model.micro_batch=1 --no-checkpoint
done
for plan in "ulysses=2,tp=4" "ulysses=8"; do  # Ulysses x tp and Ulysses alone: 8 KV heads over 2 x 4 and over 8
  expect_exit 0 'validation: PASS' -- shardsim_mpi 1 --chips 8 run "$BLOCK" --plan "$plan" "${B8[@]}" \
    --set model.kv_heads=8 --no-checkpoint
done
for variant in "model.norm=layernorm" "model.mlp=gelu" "model.rope=false"; do
  expect_exit 0 'validation: PASS' -- shardsim_mpi 1 --chips 8 run "$BLOCK" --plan tp=2,cp=2,dp=2 "${B8[@]}" \
    --set "$variant" --no-checkpoint
done
# Megatron's unfused attention core (tp, sp and dp only: cp and Ulysses run the flash-style core).
expect_exit 0 'validation: PASS' -- shardsim_mpi 1 --chips 8 run "$BLOCK" --plan tp=2,sp=true,dp=4 "${B8[@]}" \
  --set model.attention_impl=unfused --no-checkpoint

e2e_case "(j) must-show 2, forward mode at 1 chip per rank: what tests/mpi/forward_plans_test.cpp does not run"
# (That test runs tp, sp, fused, cp both splits, Ulysses, Ulysses x tp, tp x cp and dp x tp x cp on 1-8 ranks;
# tests/mpi/train_plans_test.cpp runs every plan in the training mode at 1 chip per rank and 8 chips of one rank.)
B4=(--set model.layers=4 --set model.batch=4 --set model.micro_batch=1 --no-checkpoint)
for plan in "pp=2,tp=2,schedule=gpipe" "pp=2,tp=2,schedule=interleaved,virtual_stages=2" "pp=2,tp=2,schedule=zb_h1"; do
  expect_exit 0 'validation: PASS' -- shardsim_mpi 4 run "$BLOCK" --plan "$plan" "${B4[@]}"
done
for variant in "model.norm=layernorm" "model.mlp=gelu" "model.rope=false"; do
  expect_exit 0 'validation: PASS' -- shardsim_mpi 4 run "$BLOCK" --plan tp=2,cp=2 --set "$variant" --no-checkpoint
done
expect_exit 0 'validation: PASS' -- shardsim_mpi 4 run "$BLOCK" --plan tp=2,sp=true,dp=2 \
  --set model.attention_impl=unfused --no-checkpoint
# The GPT block of a language model (layernorm, gelu MLP, learned positions, tied embeddings), forward mode: at 1
# chip per rank and 8 chips of one rank.
GPT=(--set model.norm=layernorm --set model.mlp=gelu --set model.position=learned --set model.tied_embeddings=true
     --no-checkpoint)
expect_exit 0 'validation: PASS' -- shardsim_mpi 4 run "$LM" --plan tp=2,cp=2 "${GPT[@]}"
expect_exit 0 'validation: PASS' -- shardsim_mpi 1 --chips 8 run "$LM" --plan tp=2,cp=2,dp=2 "${GPT[@]}" \
  --set topology.chips=8

# The fused workload's pieces are 1 MiB or more: with one chip per rank the host overlaps them on the engine
# (async), with 8 chips on one rank it runs them in turn:
# validated, and the same forward time either way.
FUSED=$CONFIGS/workloads/llama2_7b_mlp_tp8_fused.yaml
if expect_exit 0 'validation: PASS' -- shardsim_mpi 1 --chips 8 run "$FUSED" --no-checkpoint --json fused_chips.json; then
  if expect_exit 0 'validation: PASS' -- shardsim_mpi 8 run "$FUSED" --no-checkpoint --json fused_ranks.json; then
    same_forward_time fused_ranks.json fused_chips.json "fused: 8 ranks and 8 chips of one rank"
  fi
fi

e2e_case "(k) one mesh builder in both modes: train honours parallel.mesh_dims as run does (tests/e2e/engine.sh)"
cat >boards.yaml <<'EOF'
name: boards
topology: {kind: torus, dims: [2, 4], bandwidth_gbps: [10, 200], latency_ns: 1000}
device: generic
model: {kind: transformer_block, hidden: 256, heads: 8, kv_heads: 4, ffn: 512, seq: 64}
parallel: {tp: 4, cp: 2}
EOF
total_of() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['simulated']['total_ns'])" "$1"; }
if expect_exit 0 'validation: PASS' -- shardsim_mpi 1 --chips 8 train boards.yaml --steps 2 --validate --json mfast.json; then
  assert_out '^  mesh +tp=4 x cp=2: tp -> dim 1 \(4 chips, 200 GB/s links\), cp -> dim 0 \(2 chips, 10 GB/s' \
    "default: tp on the fast dimension"
  if expect_exit 0 'validation: PASS' -- shardsim_mpi 1 --chips 8 train boards.yaml --steps 2 --validate \
       --set 'parallel.mesh_dims=[0, 1]' --json mslow.json; then
    assert_out '^  mesh +tp=4 x cp=2: tp -> dim 0 \(2 chips, 10 GB/s links\) x 2 of dim 1' "mesh_dims: tp on the slow one"
    if [ "$(total_of mfast.json)" != "$(total_of mslow.json)" ]; then
      pass "the two mappings step in different times ($(total_of mfast.json) vs $(total_of mslow.json) ns)"
    else fail "mesh_dims changed nothing in the step time"; fi
  fi
fi

e2e_case "(h) train on an MLP config: the block with attention off, x + mlp(rmsnorm(x)), validated against one device"
MLP=$CONFIGS/workloads/small_mlp.yaml
if expect_exit 0 'validation: PASS' -- shardsim_mpi 1 --chips 4 train "$MLP" --steps 3 --plan tp=4; then
  assert_out 'a stack of 1 MLP blocks x \+ mlp\(rmsnorm\(x\)\) \(no attention' "the model line says what trains"
  assert_out_count '^ +[0-9]+ +[0-9.]+ +[0-9.]+( +[0-9.]+){4}$' 3 "one row per step"
  assert_out_count 'gemm\.(q|k|v|o) ' 0 "no attention kernel runs"
fi
for plan in "tp=4,sp=true" "tp=4,sp=true,fused=true" "tp=2,dp=2,zero=3" "dp=4"; do
  expect_exit 0 'validation: PASS' -- shardsim_mpi 1 --chips 4 train "$MLP" --steps 3 --plan "$plan"
done

e2e_case "(l) plan modes: each plan is accepted or refused (exit 2) in each mode as \`help plans\` lists it"
# help's "  modes: ..." line of each unit: the modes listed before any ':' part run (or have no effect: accepted);
# the ones listed under "refused" exit 2 naming the key. forward (run) and train are run shape-only on the LM
# config; serve's refusals are checked on the serve config (its accepted plans run in tests/e2e/serve.sh).
expect_exit 0 '^tp  tensor parallel' -- shardsim_mpi 1 help plans
cp "$E2E_OUT" help_plans.txt
mode_use() {  # UNIT MODE -> runs | no_effect | refused, from help's modes line of UNIT
  awk -v u="$1" -v m="$2" '
    $1 == u && $0 !~ /^ / { inside = 1; next }
    inside && /^  modes: / {
      line = substr($0, 10); sub(/ \(.*$/, "", line); n = split(line, part, "; ")
      for (i = 1; i <= n; i++) {
        use = "runs"; list = part[i]
        if (list ~ /: no effect$/) { use = "no_effect"; sub(/: no effect$/, "", list) }
        if (list ~ /: refused$/) { use = "refused"; sub(/: refused$/, "", list) }
        k = split(list, ms, ", "); for (j = 1; j <= k; j++) if (ms[j] == m) { print use; exit }
      }
      exit
    }' help_plans.txt
}
S8=$CONFIGS/serve/llama3_8b_h100.yaml
for item in tp:tp=2 sp:tp=2,sp=true fused:tp=2,sp=true,fused=true cp:cp=2 ulysses:ulysses=2 pp:pp=2 dp:dp=4 \
            recompute:recompute=full; do
  unit=${item%%:*} plan=${item#*:}
  for mode in forward train serve; do
    use=$(mode_use "$unit" "$mode")
    [ -n "$use" ] || { fail "help plans lists no $mode mode for $unit"; continue; }
    case $mode in
      forward) cmd=(run "$LM" --shape-only --no-checkpoint --plan "$plan") ;;
      train) cmd=(train "$LM" --shape-only --steps 1 --plan "$plan") ;;
      serve) [ "$use" = refused ] || continue  # accepted serving plans: tests/e2e/serve.sh
             cmd=(serve "$S8" --plan "$plan") ;;
    esac
    if [ "$use" = refused ]; then  # refused naming one of the plan's keys (fused's case: sp, refused first)
      keys=$(echo "$plan" | sed 's/=[^,]*//g; s/,/|/g')
      expect_exit 2 "parallel\.($keys): refused in the $mode mode" -- shardsim_mpi 1 --chips 4 "${cmd[@]}"
    else
      expect_exit 0 '' -- shardsim_mpi 1 --chips 4 "${cmd[@]}"
    fi
  done
done
# etp's choice is written as help writes it (1 | tp).
expect_exit 0 'expert tensor parallel etp=2' -- shardsim_mpi 1 --chips 4 run "$CONFIGS/moe/tiny_moe.yaml" --shape-only \
  --no-checkpoint --plan tp=2,ep=2,etp=tp
# The attention-sharding plans on the MLP-only model: refused naming the key, before any rule of their own.
for plan in cp=2 ulysses=4; do
  if expect_exit 2 "parallel\.${plan%%=*}: needs attention" -- shardsim_mpi 1 --chips 4 run "$SMALL" --plan "$plan"; then
    assert_out_count 'KV heads|ring attention' 0 "$plan: no unit rule of its own ran"
  fi
done

e2e_case "(m) one summary rule: the critical chip's row and summary, the pipeline bubble apart from exposed comm"
if expect_exit 0 'pipeline bubble' -- shardsim_mpi 1 --chips 4 run "$LM" --shape-only --no-checkpoint \
     --plan pp=2,tp=2,recompute=full --json pp_fwd.json; then
  assert_out 'recompute: n/a in the forward mode' "a forward's plan line says recompute does nothing there"
  assert_out_count 'recompute: (full|selective)' 0 "no recomputation claimed in a forward"
  if python3 -c "import json,sys; j=json.load(open('pp_fwd.json')); s=j['simulated']; st=j['train']['steps'][0]; \
b=s['breakdown']; ok=abs(st['total_ns']-s['total_ns'])<1e-6 and st['bubble_ns']==s['bubble_ns']>0 and \
abs(b['total_ns']-b['compute_ns']-b['exposed_comm_ns']-s['bubble_ns']-s['idle_ns'])<1e-3 and \
s['total_ns']==max(c['simulated']['total_ns'] for c in s['per_chip']); sys.exit(0 if ok else 1)"; then
    pass "the step row is the summary's chip (the critical one), its bubble apart: compute + exposed + bubble + idle = total"
  else fail "pipelined forward: row, summary and bubble disagree"; fi
fi
if expect_exit 0 'pipeline bubble' -- shardsim_mpi 1 --chips 4 train "$LM" --shape-only --steps 2 --plan pp=2,tp=2 \
     --json pp_train.json; then
  if python3 -c "import json,sys; j=json.load(open('pp_train.json')); s=j['simulated']; st=j['train']['steps'][-1]; \
ok=abs(st['total_ns']-j['train']['step_ns'])<1e-6 and st['bubble_ns']>0 and \
s['total_ns']==max(c['simulated']['total_ns'] for c in s['per_chip']); sys.exit(0 if ok else 1)"; then
    pass "train: the last row and the step time are the critical chip's, with its bubble"
  else fail "pipelined train: row and summary disagree"; fi
fi

e2e_case "(n) one command surface: --no-checkpoint in run and train, refused with --checkpoint in both"
expect_exit 0 '' -- shardsim_mpi 1 --chips 4 train "$LM" --shape-only --steps 1 --no-checkpoint
for cmd in run train; do
  expect_exit 2 '^shardsim: error: --checkpoint and --no-checkpoint contradict each other$' -- \
    shardsim_mpi 1 --chips 4 $cmd "$LM" --no-checkpoint --checkpoint both.h5
done

e2e_case "(f) bad input: a vocabulary in a block config, attention keys in an MLP config"
expect_exit 2 'vocab: model.kind transformer_block has no embedding' -- \
  shardsim_mpi 1 --chips 4 train "$BLOCK" --set model.vocab=64
expect_exit 2 'heads: model.kind mlp has no attention \(its block: x \+ mlp\(rmsnorm\(x\)\)\)' -- \
  shardsim_mpi 1 --chips 4 train "$MLP" --set model.heads=4

e2e_finish

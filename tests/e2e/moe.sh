#!/usr/bin/env bash
# e2e: a mixture-of-experts model through the one executor (models/lm_tp.h; the ep plan unit,
# sharding/plans/expert_parallel.h; docs/MOE.md). `train --validate` (5 fp32 steps: losses with the aux loss) and
# `run` (the forward) equal one device for ep, ep x tp, ep x etp, ep x dp with ZeRO 1, ep x pp (1F1B, ZB-H1),
# dropless and with a capacity factor, at one chip per rank and at 8 chips on one rank; ZeRO-3 with ep; a
# checkpoint saved under ep 4 resumed under other plans continues the loss curve; the selection bias's update
# (aux-loss-free balancing), its biases in checkpoints (a resumed run continues them exactly); ep with sp, cp and
# Ulysses, dropless and with a capacity factor; the report's MoE section (uniform routing's
# dispatch bytes = the closed form, Zipf skew); bad plans exit 2.
# Usage: moe.sh SHARDSIM_BINARY CONFIG_DIR [MPIEXEC]
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
e2e_init "$@"

MOE=$CONFIGS/moe/tiny_moe.yaml
CAP="--set model.moe.capacity_factor=1.0"

e2e_case "(a) train, ep alone and composed, one chip per rank: validated against one device"
if expect_exit 0 'validation: PASS' -- shardsim_mpi 4 train "$MOE" --plan ep=4 --validate; then
  assert_out 'expert parallel ep=4 \(2 experts per chip' "the plan line names ep"
fi
expect_exit 0 'validation: PASS' -- shardsim_mpi 4 train "$MOE" --plan ep=2,tp=2 --validate
expect_exit 0 'validation: PASS' -- shardsim_mpi 4 train "$MOE" --plan ep=2,tp=2,etp=2 --validate
expect_exit 0 'validation: PASS' -- shardsim_mpi 4 train "$MOE" --plan ep=2,dp=2 --set parallel.zero=1 --validate
expect_exit 0 'validation: PASS' -- shardsim_mpi 4 train "$MOE" --plan ep=2,pp=2 --set model.micro_batch=2 --validate
expect_exit 0 'validation: PASS' -- shardsim_mpi 4 train "$MOE" --plan ep=4 $CAP --validate

e2e_case "(b) chips on one rank: ep 8, ep 4 x etp 2 with capacity, ep 2 x dp 2 x pp 2, pp 2 and ep 2 x pp 2 under ZB-H1"
expect_exit 0 'validation: PASS' -- shardsim_mpi 1 --chips 8 train "$MOE" --plan ep=8 --validate
expect_exit 0 'validation: PASS' -- shardsim_mpi 1 --chips 8 train "$MOE" --plan ep=4,tp=2,etp=2 $CAP --validate
expect_exit 0 'validation: PASS' -- shardsim_mpi 1 --chips 8 train "$MOE" --plan ep=2,dp=2,pp=2 \
  --set model.micro_batch=1 --set parallel.zero=1 --validate
# ZB-H1 with more micro-batches than stages: a MoE layer's gradients of a micro-batch are kept until its W pass.
expect_exit 0 'validation: PASS' -- shardsim_mpi 1 --chips 2 train "$MOE" --plan pp=2,schedule=zb_h1 \
  --set model.micro_batch=1 --validate
expect_exit 0 'validation: PASS' -- shardsim_mpi 1 --chips 4 train "$MOE" --plan ep=2,pp=2,schedule=zb_h1 \
  --set model.micro_batch=1 --validate

e2e_case "(c) run: the forward mode through the same executor, validated"
expect_exit 0 'validation: PASS' -- shardsim_mpi 1 --chips 4 run "$MOE" --plan ep=4
expect_exit 0 'validation: PASS' -- shardsim_mpi 1 --chips 8 run "$MOE" --plan ep=2,tp=2,pp=2,etp=2 $CAP

e2e_case "(e) the report: shape-only uniform routing sends the closed form's dispatch bytes; Zipf routing is skewed"
if expect_exit 0 'mixture of experts' -- shardsim_mpi 1 --chips 4 train "$MOE" --plan ep=4 --shape-only --json u.json; then
  python3 -c "import json,sys; m=json.load(open('u.json'))['train']['moe']; L=m['layers']; \
sys.exit(0 if L and all(l['dispatch_bytes']==l['dispatch_closed_form_bytes']>0 and l['max_tokens_per_expert']==l['mean_tokens_per_expert'] for l in L) and m['active_params']<m['total_params'] else 1)" \
    && pass "dispatch bytes = T*k*h*bytes*(ep-1)/ep per layer, balanced experts, active < total parameters" \
    || fail "uniform routing's dispatch bytes or balance"
fi
if expect_exit 0 'mixture of experts' -- shardsim_mpi 1 --chips 4 train "$MOE" --plan ep=4 --shape-only \
    --set model.moe.routing=zipf --set model.moe.skew=1.5 --json z.json; then
  python3 -c "import json,sys; L=json.load(open('z.json'))['train']['moe']['layers']; \
sys.exit(0 if all(l['max_tokens_per_expert']>1.5*l['mean_tokens_per_expert'] for l in L) else 1)" \
    && pass "Zipf 1.5: the hottest expert gets more than 1.5x the mean" || fail "Zipf routing is not skewed"
  # Dispatch bytes per link: on the 4-chip ring each chip's 3 equal flows (B each) load its +1 link with its own flow
  # to the next chip and the flows routed through it; the slowest chip's dispatch never beats the busiest link.
  python3 -c "import json,sys; U=json.load(open('u.json'))['train']['moe']['layers']; \
Z=json.load(open('z.json'))['train']['moe']['layers']; \
ok=all(l['busiest_link'] and l['busiest_link_bytes']>=l['dispatch_bytes']/3 and l['busiest_link_bound_ns']>0 for l in U+Z); \
ok=ok and all(l['dispatch_ns']>=l['busiest_link_bound_ns'] for l in U+Z); \
ok=ok and max(l['busiest_link_bytes'] for l in Z)>max(l['busiest_link_bytes'] for l in U); sys.exit(0 if ok else 1)" \
    && pass "per link: the busiest link named with its bytes; dispatch time >= its bytes at its bandwidth; Zipf loads it more" \
    || fail "dispatch bytes per link"
fi

e2e_case "(f) ZeRO-3 with ep: each unit's dense bucket gathered over dp x ep, its experts' over dp; validated"
expect_exit 0 'validation: PASS' -- shardsim_mpi 4 train "$MOE" --plan ep=2,dp=2 --set parallel.zero=3 --validate
expect_exit 0 'validation: PASS' -- shardsim_mpi 1 --chips 8 train "$MOE" --plan ep=2,dp=2,tp=2,etp=2 \
  --set parallel.zero=3 $CAP --validate

e2e_case "(g) checkpoints of an ep run: saved under ep 4, resumed under other plans; the loss curve continues"
# The aux loss is per token group (a dp x ep replica's micro-batch): plans with dp x ep = 4 route the uninterrupted
# run's groups and continue its curve; ep 2 x tp 2 (2 groups) is validated against the reference of its groups.
if expect_exit 0 'validation: PASS' -- shardsim_mpi 4 train "$MOE" --plan ep=4 --steps 5 --validate --json full.json \
    && expect_exit 0 'saved' -- shardsim_mpi 4 train "$MOE" --plan ep=4 --steps 3 --checkpoint ep4.h5; then
  expect_exit 0 'validation: PASS' -- shardsim_mpi 4 train "$MOE" --plan ep=2,tp=2,etp=2 --steps 5 --resume ep4.h5 \
    --validate
  assert_out '^resumed: ep4\.h5 at step 3 \(saved under dp=1 x ep=4, ZeRO stage 0\)' "the resume line names the saved plan's ep"
  expect_exit 0 'validation: PASS' -- shardsim_mpi 4 train "$MOE" --plan ep=2,dp=2 --set parallel.zero=2 --steps 5 \
    --resume ep4.h5 --validate --json r1.json
  expect_exit 0 'validation: PASS' -- shardsim_mpi 1 --chips 4 train "$MOE" --plan dp=4 --steps 5 --resume ep4.h5 \
    --validate --json r2.json
  python3 -c "import json,sys; f=[s['loss'] for s in json.load(open('full.json'))['train']['steps']][3:]; \
r=[[s['loss'] for s in json.load(open(p))['train']['steps']] for p in ('r1.json','r2.json')]; \
sys.exit(0 if all(len(x)==2 and all(abs(a-b)<=1e-6*abs(b) for a,b in zip(x,f)) for x in r) else 1)" \
    && pass "steps 4-5 resumed under ep 2 x dp 2 (ZeRO 2) and dp 4 equal the uninterrupted ep 4 run's (1e-6)" \
    || fail "the resumed loss curve departs from the uninterrupted run"
fi

e2e_case "(h) the selection bias's update (aux-loss-free balancing) and a sequence split over chips: validated"
BIAS="--set model.moe.router=sigmoid --set model.moe.aux_loss_coef=0 --set model.moe.bias_update=0.05"
if expect_exit 0 'validation: PASS' -- shardsim_mpi 4 train "$MOE" --plan ep=2,dp=2 $BIAS --validate --json b1.json \
    && expect_exit 0 'validation: PASS' -- shardsim_mpi 4 train "$MOE" --plan ep=2,dp=2 ${BIAS/bias_update=0.05/bias_update=0} \
      --validate --json b0.json; then
  python3 -c "import json,sys; f=lambda p: [s['loss'] for s in json.load(open(p))['train']['steps']]; \
sys.exit(0 if f('b1.json')[0]==f('b0.json')[0] and f('b1.json')[4]!=f('b0.json')[4] else 1)" \
    && pass "the biases start at 0 (step 1 equal) and then route otherwise (step 5's loss moves)" \
    || fail "the selection bias's update changes nothing"
fi
expect_exit 0 'validation: PASS' -- shardsim_mpi 4 train "$MOE" --plan ep=2,tp=2,sp=true --validate
expect_exit 0 'validation: PASS' -- shardsim_mpi 4 train "$MOE" --plan ep=2,cp=2 --validate
expect_exit 0 'validation: PASS' -- shardsim_mpi 1 --chips 8 train "$MOE" --plan ep=2,tp=2,sp=true,cp=2 $BIAS --validate
expect_exit 0 'validation: PASS' -- shardsim_mpi 1 --chips 4 train "$MOE" --plan ep=2,ulysses=2 --validate
expect_exit 0 'validation: PASS' -- shardsim_mpi 1 --chips 4 run "$MOE" --plan ep=2,cp=2
# With a capacity factor each chip of a split sequence drops over its own rows (the reference's capacity pieces).
expect_exit 0 'validation: PASS' -- shardsim_mpi 1 --chips 4 train "$MOE" --plan ep=2,cp=2 $CAP --validate
expect_exit 0 'validation: PASS' -- shardsim_mpi 1 --chips 8 train "$MOE" --plan ep=2,tp=2,sp=true,cp=2 $CAP --validate
# etp with sp: the tp group's rows gathered for the experts, the output reduce_scattered back.
if expect_exit 0 'validation: PASS' -- shardsim_mpi 4 train "$MOE" --plan ep=2,tp=2,etp=2,sp=true $CAP --validate; then
  assert_out 'etp reduce_scatter' "the etp group's output is reduce_scattered"
fi

e2e_case "(i) the selection biases in checkpoints: a resumed run continues them exactly"
# moe_bias/layers.L in the file; steps 4-5 resumed under the same plan equal the uninterrupted run's bit for bit
# (with the biases restarted at 0 they route otherwise: (h)), and under another plan pass --validate (the
# reference continues from the file's biases).
if expect_exit 0 'saved' -- shardsim_mpi 4 train "$MOE" --plan ep=2,dp=2 $BIAS --steps 5 --checkpoint bfull.h5 \
      --json bfull.json \
    && expect_exit 0 'saved' -- shardsim_mpi 4 train "$MOE" --plan ep=2,dp=2 $BIAS --steps 3 --checkpoint b3.h5; then
  expect_exit 0 'moe_bias/layers.3' -- shardsim_mpi 1 ckpt inspect b3.h5
  expect_exit 0 'validation: PASS' -- shardsim_mpi 1 --chips 4 train "$MOE" --plan ep=4,tp=1 $BIAS --steps 5 \
    --resume b3.h5 --validate
  if expect_exit 0 '' -- shardsim_mpi 4 train "$MOE" --plan ep=2,dp=2 $BIAS --steps 5 --resume b3.h5 --json br.json
  then
    python3 -c "import json,sys; f=lambda p: [(s['loss'], s['grad_norm']) for s in json.load(open(p))['train']['steps']]; \
sys.exit(0 if f('br.json')==f('bfull.json')[3:] else 1)" \
      && pass "steps 4-5 resumed from step 3 equal the uninterrupted run's exactly (losses and gradient norms)" \
      || fail "the resumed run's biases depart from the uninterrupted run's"
  fi
fi

e2e_case "(j) node-limited routing (DeepSeek-V3's M groups per token): ep 4, validated against one device"
# 8 experts in 4 groups of 2 (one ep chip each), every token's top-3 among its best 2 groups; the reference routes
# by the same rule, so losses, gradient norms and tokens per expert stay equal.
NODES="--set model.moe.router=sigmoid --set model.moe.top_k=3 --set model.moe.expert_groups=4 --set model.moe.group_limit=2"
if expect_exit 0 'node-limited: 2 of 4 expert groups' -- shardsim_mpi 4 train "$MOE" --plan ep=4 $NODES --validate \
      --json nl_real.json \
    && expect_exit 0 'node-limited routing: 1.500 remote expert groups' -- shardsim_mpi 1 --chips 4 train "$MOE" \
      --plan ep=4 $NODES --shape-only --json nl_shape.json; then
  # Remote groups per token: a token's 3 experts lie in exactly 2 of the 4 groups (2 experts each), so M·(G-1)/G =
  # 1.5 on average and at most 2 for real routing; the declared (shape-only) routing gives the closed form.
  python3 -c "import json,sys; f=lambda p: [l['remote_nodes_per_token'] for l in json.load(open(p))['train']['moe']['layers']]; \
r=f('nl_real.json'); d=f('nl_shape.json'); print('remote nodes per token: real', r, 'declared', d); \
sys.exit(0 if d and all(x==1.5 for x in d) and len(r)==len(d) and all(abs(x-1.5)<=0.25 for x in r) else 1)" \
    && pass "remote expert groups per token: declared 1.5 = M(G-1)/G, real data within 0.25 of it" \
    || fail "remote expert groups per token, real against declared"
fi
expect_exit 0 'validation: PASS' -- shardsim_mpi 1 --chips 4 train "$MOE" --plan ep=2,dp=2 $NODES $CAP --validate
expect_exit 2 'model.moe.group_limit' -- shardsim_mpi 1 train "$MOE" --set model.moe.expert_groups=4 \
  --set model.moe.group_limit=1 --set model.moe.top_k=3

e2e_case "(k) every MoE layer in the report (pp 2: stage 0 holds 2 of the 4 layers); placement by load under Zipf"
# Shape-only, Zipf 1.5 routing, ep 2 x pp 2, the tiny model widened (h 1024, experts of 4096, 512-token sequences)
# so that the experts' GEMMs, not launches, set their time: the report has MoE layers 1-3 (the dense layer 0 and
# MoE layer 1 on stage 0) with what imbalance costs; placement: balanced moves the experts so the slowest chip's
# experts and the step take less time (44.9 -> 37.3 ms here).
ZIPF="--plan ep=2,pp=2 --shape-only --steps 1 --set model.micro_batch=2 --set model.moe.routing=zipf \
  --set model.moe.skew=1.5 --set model.hidden=1024 --set model.heads=8 --set model.kv_heads=8 --set model.head_dim=128 \
  --set model.seq=512 --set model.moe.expert_ffn=4096"
if expect_exit 0 'imbalance' -- shardsim_mpi 1 --chips 4 train "$MOE" $ZIPF --json zc.json \
    && expect_exit 0 'placement by load' -- shardsim_mpi 1 --chips 4 train "$MOE" $ZIPF \
      --set model.moe.placement=balanced --json zb.json; then
  python3 -c "import json,sys; c=json.load(open('zc.json'))['train']; b=json.load(open('zb.json'))['train']; \
L=c['moe']['layers']; ok=[l['layer'] for l in L]==[1,2,3] and all(l['imbalance_ns']>0 for l in L); \
ok=ok and sum(l['slowest_expert_ns'] for l in b['moe']['layers'])<sum(l['slowest_expert_ns'] for l in L); \
ok=ok and b['step_ns']<c['step_ns']; sys.exit(0 if ok else 1)" \
    && pass "layers 1-3 reported with their imbalance; balanced placement: less expert time on the slowest chip" \
    || fail "the layer table or the placement's saving"
fi
expect_exit 2 'model.moe.placement' -- shardsim_mpi 1 --chips 2 train "$MOE" --plan ep=2 \
  --set model.moe.placement=balanced

e2e_case "(l) routing: histogram: a measured tokens-per-expert CSV beside the config sets each expert's load"
# Layer 1-2 ("all"): expert 0 weighs 5 of 12, the others 1 each; layer 3 its own row. Relative to the config's folder.
mkdir -p hcfg && cp "$MOE" hcfg/m.yaml
printf 'layer,expert,tokens\nall,0,5\n' > hcfg/h.csv
for e in 1 2 3 4 5 6 7; do printf 'all,%d,1\n' "$e" >> hcfg/h.csv; done
for e in 0 1 2 3 4 5 6 7; do printf '3,%d,1\n' "$e" >> hcfg/h.csv; done
python3 - hcfg/m.yaml <<'PY'
import sys
p = sys.argv[1]; s = open(p).read()
s = s.replace("    dense_layers: 1\n", "    dense_layers: 1\n    routing: histogram\n    routing_file: h.csv\n", 1)
open(p, "w").write(s)
PY
if expect_exit 0 'mixture of experts' -- shardsim_mpi 1 --chips 4 train hcfg/m.yaml --plan ep=4 --shape-only --json h.json; then
  python3 -c "import json,sys; L={l['layer']:l for l in json.load(open('h.json'))['train']['moe']['layers']}; \
r=[L[i]['max_tokens_per_expert']/L[i]['mean_tokens_per_expert'] for i in (1,2,3)]; \
sys.exit(0 if abs(r[0]-8*5/12)<0.15 and abs(r[1]-8*5/12)<0.15 and r[2]==1 else 1)" \
    && pass "expert 0 gets 5/12 of layers 1-2's assignments (max/mean 3.25 after rounding, 3.33 exact), layer 3 is balanced" \
    || fail "the histogram's shares"
fi
printf 'layer,expert,tokens\nall,0,nan\n' > hcfg/bad.csv
expect_exit 2 'bad.csv:2: model.moe.routing_file: tokens' -- shardsim_mpi 1 --chips 4 train hcfg/m.yaml --plan ep=4 \
  --shape-only --set model.moe.routing_file="$PWD/hcfg/bad.csv"

e2e_case "(d) bad plans exit 2 naming the key"
expect_exit 2 'parallel.ep: 8 experts do not split over ep = 3' -- shardsim_mpi 1 --chips 3 train "$MOE" --plan ep=3
expect_exit 2 'parallel.etp' -- shardsim_mpi 1 --chips 4 train "$MOE" --plan ep=1,tp=4,etp=2
expect_exit 2 'parallel.ep: needs model.moe' -- shardsim_mpi 1 --chips 2 train "$CONFIGS/lm_train.yaml" --plan ep=2

e2e_finish

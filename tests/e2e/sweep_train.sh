#!/usr/bin/env bash
# e2e: sweeps over training plans (a `shardsim train` config as the sweep's workload).
#  - a shape-only grid (a 2.7B-parameter LM, 2 topologies x 2 devices x 6 plans on 4 chips): the best-plan table
#    names one winner per topology x device, and the winner has the highest tokens/s among the plans in
#    results.csv that ran and fit in HBM; dp4 without ZeRO (38.5 GiB per chip) is marked over HBM on trainium1
#    (32 GiB) and listed, never named best, while it fits the h100 (80 GiB); interleaving with 2 micro-batches on
#    4 stages is skipped with the parser's one-line reason; one progress line per finished point with its wall
#    time; results.json agrees; train.dat holds every plan that ran;
#  - a point's row equals `shardsim train` of the same plan (the same runner, not a second one);
#  - a resumed sweep runs nothing and gives the same table;
#  - --what-if adds a speedup column per change, equal to re-running `train` / `run` with the changed config;
#    a change a point cannot run keeps the point's row and says why in its own column only;
#  - a bad value in a workload's set: is exit 2 with FILE:LINE before any point runs;
#  - a real-data tiny sweep validates each plan's losses against one device (verdict pass, validated_at self);
#  - the issue's command: train --torus 4x4 --device h100 --plan tp=4,dp=4 --set model.layers=2 --json (real data).
# Usage: sweep_train.sh SHARDSIM_BINARY CONFIG_DIR [MPIEXEC]
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
e2e_init "$@"
E2E_TIMEOUT=${E2E_TIMEOUT_SWEEP:-180}

cat >lm.yaml <<'EOF'
name: lm
mode: shape_only
device: h100
topology: {kind: ring, chips: 4, bandwidth_gbps: 100, latency_ns: 1000}
model: {vocab: 32000, hidden: 4096, layers: 12, heads: 32, kv_heads: 8, head_dim: 128, ffn: 11008, seq: 1024,
        batch: 8, dtype: bf16}
train: {steps: 1}
EOF
cat >ring4.yaml <<'EOF'
topology: {kind: ring, chips: 4, bandwidth_gbps: 100, latency_ns: 1000}
EOF
cat >plans.yaml <<'EOF'
name: plans
output: out
axes:
  workload: [lm.yaml]
  topology:
    - ring4.yaml
    - {kind: torus, dims: [2, 2], bandwidth_gbps: 50, latency_ns: 1000, label: torus2x2}
  device: [trainium1, h100]
  plan:
    - {dp: 4}
    - {dp: 4, zero: 3}
    - {tp: 4, sp: true}
    - {tp: 2, dp: 2, zero: 1}
    - {pp: 2, dp: 2, schedule: 1f1b, micro_batch: 1}
    - {pp: 4, schedule: interleaved, virtual_stages: 3, micro_batch: 4}
EOF

e2e_case "a training-plan sweep: winner per topology x device by tokens/s, over-HBM marked, illegal pp skipped"
if expect_exit 0 '^best training plan per topology x device' -- shardsim_mpi 1 --chips 4 sweep plans.yaml; then
  cp "$E2E_STDOUT" first.out
  assert_out_count '^\[[0-9]+/24\] done lm .*: not_validated, [0-9.]+ us simulated, [0-9.]+ s wall(; (folded: [0-9]+ of 4 chips simulated|every chip simulated: .*))?$' 20 \
    "one progress line per finished point with its simulated and wall time"
  for topo in ring4 torus2x2; do
    for dev in trainium1 h100; do
      assert_out "^  lm +$topo +$dev +[a-z0-9+-]+ +[0-9.]+ +[0-9]+ +[0-9.]+ .* fitting plan\(s\)" "a winner for $topo x $dev"
      assert_out "^    skipped pp4-interleaved-v3-mb4 on $topo / $dev: plan does not fit: model.micro_batch: .*multiple of parallel.pp \(4\)" \
        "the illegal interleaved point on $topo x $dev is skipped with its reason"
    done
    assert_out "^    over HBM dp4 .*\(does not fit: 38\.[0-9]+ GiB > 32\.00 GiB\)" "dp4 without ZeRO marked over HBM on $topo x trainium1"
  done
  if python3 - out/results.csv out/results.json out/train.dat <<'PY'; then pass "winners = highest tokens/s among fitting rows; over-HBM rows marked and listed; JSON agrees; plot data"; else fail "winner check"; fi
import csv, json, sys
rows = [r for r in csv.DictReader(open(sys.argv[1])) if r["kind"] == "workload"]
assert len(rows) == 24, len(rows)
assert all(r["run_mode"] == "train" for r in rows)
doc = json.load(open(sys.argv[2]))
best = {(b["topology"], b["device"]): b for b in doc["best_plans"]}
assert len(best) == 4, sorted(best)
bad = []
for (topo, dev), b in best.items():
    group = [r for r in rows if r["topology"] == topo and r["device"] == dev]
    ran = [r for r in group if r["verdict"] != "error"]
    fitting = [r for r in ran if r["fits_hbm"] == "yes"]
    fastest = max(fitting, key=lambda r: float(r["tokens_per_s"]))
    if b["best_plan"] != fastest["plan"]: bad.append(f"{topo}/{dev}: best {b['best_plan']} but fastest fitting {fastest['plan']}")
    if b["tokens_per_s"] != float(fastest["tokens_per_s"]): bad.append(f"{topo}/{dev}: tokens/s differ")
    # Same global batch: every plan processes the workload's 8 x 1024 tokens per step.
    if {r["tokens_per_step"] for r in ran} != {"8192"}: bad.append(f"{topo}/{dev}: tokens_per_step {set(r['tokens_per_step'] for r in ran)}")
    over = [r["plan"] for r in ran if r["fits_hbm"] == "no"]
    want_over = ["dp4"] if dev == "trainium1" else []
    if over != want_over or [o["plan"] for o in b["over_hbm"]] != want_over: bad.append(f"{topo}/{dev}: over HBM {over} / {b['over_hbm']}")
    for r in ran:
        if (float(r["peak_mem_bytes"]) <= float(r["hbm_capacity_bytes"])) != (r["fits_hbm"] == "yes"): bad.append(f"{r['plan']}: fits_hbm")
    if b["best_plan"] in over: bad.append(f"{topo}/{dev}: an over-HBM plan won")
    skipped = [(s["plan"], s["reason"]) for s in b["skipped"]]
    if len(skipped) != 1 or skipped[0][0] != "pp4-interleaved-v3-mb4" or "multiple of parallel.pp" not in skipped[0][1]:
        bad.append(f"{topo}/{dev}: skipped {skipped}")
    pp = [r for r in ran if r["plan"] == "pp2xdp2-1f1b-mb1"][0]
    if pp["micro_batches"] != "4" or not 0 < float(pp["bubble_fraction"]) < 0.5: bad.append(f"pp row: m {pp['micro_batches']} bubble {pp['bubble_fraction']}")
    if any(float(r["bubble_fraction"]) != 0 for r in ran if not r["plan"].startswith("pp")): bad.append("bubble without pp")
    if not 0 < float(fastest["mfu"]) <= 1: bad.append(f"mfu {fastest['mfu']}")
dat = open(sys.argv[3]).read()
if dat.count("\n") != 21 or "dp4 ring4 trainium1 (over HBM)" not in dat or "interleaved" in dat: bad.append("train.dat: " + dat[:300])
if bad: sys.exit("; ".join(bad))
PY
  [ -s out/train.gp ] && pass "train.gp written (step time and bubble per plan)" || fail "no train.gp"
fi

e2e_case "the sweep runs train's runner: a point's row = shardsim train of the same plan"
if expect_exit 0 '^DONE' -- shardsim_mpi 1 --chips 4 train lm.yaml --topology ring4.yaml --device h100 --plan tp=4,sp=true --json tp4.json; then
  if python3 - out/results.csv tp4.json <<'PY'; then pass "tp4+sp on ring4/h100: the row's step, tokens/s and memory = train's report"; else fail "row differs from train"; fi
import csv, json, sys
row = [r for r in csv.DictReader(open(sys.argv[1])) if r["plan"] == "tp4+sp" and r["topology"] == "ring4" and r["device"] == "h100"][0]
t = json.load(open(sys.argv[2]))
step_us = t["train"]["step_ns"] / 1e3
assert abs(float(row["sim_time_us"]) - step_us) <= 1e-9 * step_us, (row["sim_time_us"], step_us)
tps = t["simulated"]["tokens_per_s"]
assert abs(float(row["tokens_per_s"]) - tps) <= 1e-9 * tps, (row["tokens_per_s"], tps)
PY
fi

e2e_case "resume: a second run runs nothing and prints the same table"
if expect_exit 0 '24 already in out/results.csv' -- shardsim_mpi 1 --chips 4 sweep plans.yaml --no-plots; then
  if diff <(sed -n '/^best training plan/,/^results/p' first.out) <(sed -n '/^best training plan/,/^results/p' "$E2E_OUT") >/dev/null; then
    pass "same best-plan table from the resumed results"
  else fail "the resumed table differs"; fi
fi

e2e_case "sweep --what-if: per-point speedup columns = re-running with the changed config (training and forward)"
if expect_exit 0 '^best training plan' -- shardsim_mpi 1 --chips 4 sweep plans.yaml --output wi --no-plots --what-if link_bw=2x,peak=2x; then
  expect_exit 0 '^DONE' -- shardsim_mpi 1 --chips 4 train lm.yaml --device h100 --plan tp=4,sp=true --set topology.bandwidth_gbps=200 \
    --json tp4_bw2.json &&
  python3 - wi/results.csv tp4.json tp4_bw2.json <<'PY' && pass "train: speedup[link_bw=2x] = step / step with 200 GB/s links; both columns on every row that ran" || fail "train what-if"
import csv, json, sys
rows = list(csv.DictReader(open(sys.argv[1])))
ran = [r for r in rows if r["verdict"] != "error"]
assert len(ran) == 20 and all(float(r["speedup[link_bw=2x]"]) >= 1 and float(r["speedup[peak=2x]"]) >= 1 for r in ran), rows[0]
assert all(r["speedup[peak=2x]"] == "" for r in rows if r["verdict"] == "error")
row = [r for r in ran if r["plan"] == "tp4+sp" and r["topology"] == "ring4" and r["device"] == "h100"][0]
base, bw2 = (json.load(open(f))["train"]["step_ns"] for f in sys.argv[2:4])
assert float(row["speedup[link_bw=2x]"]) == base / bw2, (row["speedup[link_bw=2x]"], base / bw2)
PY
fi
cat >fwd.yaml <<EOF
name: fwd
output: fwd
axes:
  workload: [{config: $CONFIGS/blocks/small_block.yaml, label: small, set: {seq: 32}}]
  plan: [{tp: 4}]
EOF
if expect_exit 0 '^best plan per topology' -- shardsim_mpi 1 --chips 4 sweep fwd.yaml --no-plots --what-if link_bw=2x; then
  expect_exit 0 '^DONE' -- shardsim_mpi 1 --chips 4 run "$CONFIGS/blocks/small_block.yaml" --plan tp=4 --set model.seq=32 --shape-only --json f1.json &&
  expect_exit 0 '^DONE' -- shardsim_mpi 1 --chips 4 run "$CONFIGS/blocks/small_block.yaml" --plan tp=4 --set model.seq=32 \
    --set topology.bandwidth_gbps=200 --shape-only --json f2.json &&
  python3 - fwd/results.csv f1.json f2.json <<'PY' && pass "forward: speedup[link_bw=2x] = run / run with 200 GB/s links" || fail "forward what-if"
import csv, json, sys
row = list(csv.DictReader(open(sys.argv[1])))[0]
a, b = (json.load(open(f))["simulated"]["total_ns"] for f in sys.argv[2:4])
assert float(row["speedup[link_bw=2x]"]) == a / b and a / b > 1, (row["speedup[link_bw=2x]"], a / b)
PY
fi
expect_exit 2 'bogus' -- shardsim_mpi 1 --chips 4 sweep fwd.yaml --no-plots --output fwd_bad --what-if bogus=2x

e2e_case "sweep --what-if: a change a point cannot run keeps the point's row; only that change's column says why"
cat >wi1.yaml <<'EOF'
name: wi1
output: wi1
axes:
  workload: [lm.yaml]
  topology: [ring4.yaml]
  device: [h100]
  plan: [{dp: 4}]
EOF
if expect_exit 0 '' -- shardsim_mpi 1 --chips 4 sweep wi1.yaml --no-plots --what-if 'link_bw=2x,parallel.dp=2x'; then
  python3 - wi1/results.csv <<'PY' && pass "training point: baseline row and link_bw=2x kept, parallel.dp=2x says why" || fail "training what-if row"
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
assert len(rows) == 1 and rows[0]["verdict"] != "error" and float(rows[0]["sim_time_us"]) > 0, rows
assert float(rows[0]["speedup[link_bw=2x]"]) > 1, rows[0]
assert rows[0]["speedup[parallel.dp=2x]"].startswith("error: "), rows[0]
PY
fi
if expect_exit 0 '' -- shardsim_mpi 1 --chips 4 sweep fwd.yaml --no-plots --output fwd_wi --what-if 'link_bw=2x,parallel.tp=2x'; then
  python3 - fwd_wi/results.csv <<'PY' && pass "forward point: link_bw=2x kept, parallel.tp=2x says why" || fail "forward what-if row"
import csv, sys
row = list(csv.DictReader(open(sys.argv[1])))[0]
assert float(row["sim_time_us"]) > 0 and float(row["speedup[link_bw=2x]"]) > 1, row
assert row["speedup[parallel.tp=2x]"].startswith("error: "), row
PY
fi

e2e_case "a bad value in a workload's set: is exit 2 naming FILE:LINE before any point runs"
cat >badset.yaml <<EOF
name: badset
output: badset
axes:
  workload: [{config: $CONFIGS/blocks/small_block.yaml, label: small, set: {seq: many}}]
  plan: [{tp: 4}]
EOF
expect_exit 2 'badset.yaml:4: .*seq.*expected an integer' -- shardsim_mpi 1 --chips 4 sweep badset.yaml --no-plots
[ -e badset/results.csv ] && fail "a point ran" || pass "no point ran"

e2e_case "real data: a tiny training sweep validates each plan against one device"
cat >tiny.yaml <<EOF
name: tiny
output: tiny
axes:
  workload: [{config: $CONFIGS/lm_train.yaml, label: tiny}]
  topology: [{kind: ring, chips: 2, bandwidth_gbps: 100, latency_ns: 1000, label: ring2}]
  device: [h100]
  plan: [{dp: 2}, {tp: 2}, {pp: 2, micro_batch: 1}]
EOF
if expect_exit 0 '^best training plan' -- shardsim_mpi 1 --chips 2 sweep tiny.yaml --no-plots; then
  if python3 - tiny/results.csv <<'PY'; then pass "dp2, tp2, pp2: timing run, verdict pass, validated_at self"; else fail "real-data rows"; fi
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
assert [r["plan"] for r in rows] == ["dp2", "tp2", "pp2-mb1"], [r["plan"] for r in rows]
for r in rows:
    assert (r["timing"], r["verdict"], r["validated_at"]) == ("run", "pass", "self"), r
    assert float(r["max_rel_error"]) >= 0 and float(r["sim_time_us"]) > 0, r
PY
fi

e2e_case "the issue's command: train --torus 4x4 --device h100 --plan tp=4,dp=4 --set model.layers=2 --json (real data)"
if expect_exit 0 '^  plan +tensor parallel tp=4 .*; data parallel dp=4 ' -- shardsim_mpi 1 --chips 16 train "$CONFIGS/lm_train_dp4.yaml" --torus 4x4 \
    --device h100 --plan tp=4,dp=4 --set model.layers=2 --json r.json; then
  python3 - r.json <<'PY' && pass "--json: train, 16 chips, h100, torus 4x4, 2 layers, losses" || fail "r.json"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["run_mode"] == "train" and r["chips"] == 16, (r["run_mode"], r["chips"])
assert r["device"].startswith("h100") and r["topology"].startswith("torus 4x4"), (r["device"], r["topology"])
assert ", 2 layers," in r["train"]["model"], r["train"]["model"]
assert r["train"]["steps"] and all(s["loss"] > 0 for s in r["train"]["steps"]), r["train"]["steps"][:1]
PY
fi

e2e_finish

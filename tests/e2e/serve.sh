#!/usr/bin/env bash
# e2e: `shardsim serve` (issue 50, docs/SERVING.md): a small generated trace on Llama-3-8B / 1 H100 and 70B TP8 on
# 8 chips of one rank (report, JSON: every request finished, the KV cache's capacity = its formula from the
# model's sizes computed here), the same trace from a CSV and a JSONL file gives the same metrics, chunked prefill
# keeps its token budget, dp replicas and pp batches in flight (and --trace), prefill/decode disaggregation, a
# mixture of experts over ep chips, a sweep over serve points (rate x batching), and bad input: one line, exit 2,
# nothing written.
# Usage: serve.sh SHARDSIM_BINARY CONFIG_DIR [MPIEXEC]
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
e2e_init "$@"

S8=$CONFIGS/serve/llama3_8b_h100.yaml
S70=$CONFIGS/serve/llama3_70b_h100_tp8.yaml
SMALL=(--set serve.trace.count=20 --set serve.trace.rate=8)

e2e_case "(a) Llama-3-8B on one H100: report, JSON, the cache capacity's formula"
if expect_exit 0 'TTFT +p50' -- shardsim_mpi 1 serve "$S8" "${SMALL[@]}" --json s8.json; then
  assert_out 'KV cache per chip: floor\(\(0\.90 x 80\.000 GiB HBM' "the capacity formula in the report"
  assert_out 'goodput: ' "goodput under the SLO"
  if python3 - s8.json <<'PY'; then pass "JSON: 20 requests done; capacity = floor((0.9 HBM - W - A) / (16 x 2 L Hkv d 2)) x 16"; else fail "JSON of serve"; fi
import json, math, sys
j = json.load(open(sys.argv[1]))
m, kv = j["metrics"], j["kv_cache"]
assert m["requests"] == 20 and len(j["requests"]) == 20, m
assert all(r[1] > 0 and r[2] >= r[1] for r in j["requests"])            # ttft > 0, e2e >= ttft
V, h, L, H, Hkv, d, F = 128256, 4096, 32, 32, 8, 128, 14336             # Llama-3-8B (arXiv:2407.21783, Table 3)
params = 2 * V * h + L * (2 * h + h * (H + 2 * Hkv) * d + H * d * h + 3 * h * F) + h
W = 2 * params                                                            # bf16
A = 8192 * 2 * (2 * h + (H + 2 * Hkv) * d + 2 * F) + 256 * V * 4         # serve.cpp's activation estimate
per = 2 * L * Hkv * d * 2
blocks = math.floor((0.9 * 80 * 2**30 - W - A) / (16 * per))
assert abs(kv["weights_bytes"] - W) < 1, (kv["weights_bytes"], W)
assert kv["blocks"] == blocks and kv["tokens"] == 16 * blocks, (kv, blocks)
PY
fi

e2e_case "(b) Llama-3-70B TP8 on 8 chips of one rank; chunked prefill keeps its token budget"
if expect_exit 0 'plan tp=8 x pp=1' -- shardsim_mpi 1 --chips 8 serve "$S70" "${SMALL[@]}" --json s70.json; then
  check_json s70.json chips=8 tp=8 metrics.requests=20
fi
if expect_exit 0 'policy chunked' -- shardsim_mpi 1 --chips 8 serve "$S70" "${SMALL[@]}" --set serve.policy=chunked \
     --set serve.max_num_batched_tokens=512 --json chunked.json; then
  if python3 -c "import json,sys; j=json.load(open('chunked.json')); sys.exit(0 if max(i[3] for i in j['iterations'])<=512 and j['metrics']['requests']==20 else 1)"; then
    pass "every iteration within 512 tokens"
  else fail "chunked token budget"; fi
fi

e2e_case "(c) a trace file (CSV and JSONL) gives the same metrics"
printf 'arrival_s,prompt_tokens,output_tokens\n0,100,20\n0.05,300,10\n0.2,50,40\n' > t.csv
printf '{"arrival_s": 0, "prompt_tokens": 100, "output_tokens": 20}\n{"arrival_s": 0.05, "prompt_tokens": 300, "output_tokens": 10}\n{"arrival_s": 0.2, "prompt_tokens": 50, "output_tokens": 40}\n' > t.jsonl
if expect_exit 0 'trace file' -- shardsim_mpi 1 serve "$S8" --requests t.csv --json c.json &&
   expect_exit 0 'trace file' -- shardsim_mpi 1 serve "$S8" --requests t.jsonl --json l.json; then
  if python3 -c "import json,sys; a=json.load(open('c.json'))['metrics']; b=json.load(open('l.json'))['metrics']; sys.exit(0 if a==b and a['requests']==3 else 1)"; then
    pass "CSV = JSONL"
  else fail "CSV and JSONL metrics differ"; fi
fi

e2e_case "(e) dp replicas share the requests; pp keeps a batch per stage in flight; --trace"
if expect_exit 0 'plan tp=1 x pp=1 x dp=2' -- shardsim_mpi 1 --chips 2 serve "$S8" "${SMALL[@]}" --set parallel.dp=2 \
     --json dp.json --trace dp_trace.json; then
  if python3 - dp.json dp_trace.json <<'PY'; then pass "dp 2: 20 requests over both replicas; the trace has both"; else fail "dp replicas"; fi
import json, sys
j, t = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
assert j["metrics"]["requests"] == 20 and j["dp"] == 2
assert {i[7] for i in j["iterations"]} == {0, 1}
assert all(r[1] > 0 and r[2] >= r[1] for r in j["requests"])
assert {e["pid"] for e in t["traceEvents"] if e["ph"] == "X"} == {0, 1}
assert sum(1 for e in t["traceEvents"] if e["ph"] == "b") >= 20
PY
fi
if expect_exit 0 '2 batches in flight per replica' -- shardsim_mpi 1 --chips 2 serve "$S8" "${SMALL[@]}" --set parallel.pp=2 \
     --json pp.json; then
  if python3 - pp.json <<'PY'; then pass "pp 2: both engines run, their iterations overlap"; else fail "pp batches in flight"; fi
import json, sys
j = json.load(open(sys.argv[1]))
it = j["iterations"]
assert j["metrics"]["requests"] == 20 and {i[8] for i in it} == {0, 1}
assert any(b[0] < a[1] for a, b in zip(it, it[1:]))
PY
fi

e2e_case "(f) prefill/decode disaggregation: replica 0 prefills, replica 1 decodes after the KV cache's transfer"
if expect_exit 0 'disaggregated: replica 0..0 prefill' -- shardsim_mpi 1 --chips 2 serve "$S8" "${SMALL[@]}" \
     --set parallel.dp=2 --set serve.disaggregation.prefill_replicas=1 --json dis.json; then
  assert_out 'KV cache transfers: 20 over the dp axis' "20 transfers reported"
  if python3 - dis.json <<'PY'; then pass "prefill only on replica 0, decode only on replica 1, every transfer after its prefill"; else fail "disaggregation"; fi
import json, sys
j = json.load(open(sys.argv[1]))
it, d = j["iterations"], j["disaggregation"]
assert j["metrics"]["requests"] == 20 and d["transfers"] == 20 and d["prefill_replicas"] == 1
assert all(i[5] == 0 for i in it if i[7] == 0) and all(i[4] == 0 for i in it if i[7] == 1)
assert {i[7] for i in it} == {0, 1}
assert all(t > 0 for t in d["transfer_s"])
per = 2 * 32 * 8 * 128 * 2                  # Llama-3-8B's K and V bytes per token (bf16), one chip
assert all(t >= 0 for t in d["transfer_s"]) and d["transfer_bytes_per_chip_pair"] % per == 0
assert all(r[1] > 0 and r[2] > r[1] for r in j["requests"])
PY
fi
# Load-aware: one prefill replica, two decode replicas; each cache to the decode replica with the fewest
# outstanding tokens. Round-robin alternates them in prefill-end order; both use both and finish every request.
for lb in round_robin least_tokens; do
  if expect_exit 0 'disaggregated: replica 0..0 prefill' -- shardsim_mpi 1 --chips 3 serve "$S8" "${SMALL[@]}" \
       --set parallel.dp=3 --set serve.disaggregation.prefill_replicas=1 --set serve.load_balance=$lb --json dis3.json; then
    if python3 - dis3.json $lb <<'PY'; then pass "$lb: both decode replicas decode, every request done"; else fail "disaggregated $lb"; fi
import json, sys
j = json.load(open(sys.argv[1]))
it, rq = j["iterations"], j["requests"]
assert j["metrics"]["requests"] == 20 and j["disaggregation"]["transfers"] == 20 and j["load_balance"] == sys.argv[2]
assert {i[7] for i in it} == {0, 1, 2} and all(i[4] == 0 for i in it if i[7] > 0)
assert all(r[1] > 0 and r[2] > r[1] for r in rq)
PY
  fi
done
assert_out_fixed 'decode (each cache to the one with the fewest outstanding tokens)' "the report states the rule"
expect_exit 2 'prefill_replicas: 2 prefill replicas need parallel.dp > 2' -- shardsim_mpi 1 --chips 2 serve "$S8" \
  --set parallel.dp=2 --set serve.disaggregation.prefill_replicas=2 --json bad.json

e2e_case "(f2) a KV cache transfer meets the decode iterations' collectives on the receiver's link (one switch)"
# switch_8: every chip has one 100 GB/s link to the switch (500 ns per hop). Two 2,048-token prompts 1 s apart,
# 1,024 output tokens each: the second prompt's cache reaches the decode replica while it decodes the first.
# tp 1 (dp 8, 7 prefill replicas): no collectives, both transfers take bytes / bandwidth + 2 hops' latency.
# tp 4 (dp 2): the first transfer is alone (the same closed form); the second shares the switch's down-link to
# each decode chip with the tp all_reduces of the first request's decode steps and takes longer.
SW=(--topology "$CONFIGS/topologies/switch_8.yaml" --set serve.trace.count=2 --set serve.trace.arrival=fixed
    --set serve.trace.rate=1 --set serve.trace.prompt=2048 --set serve.trace.output=1024)
if expect_exit 0 'KV cache transfers: 2 over' -- shardsim_mpi 1 --chips 8 serve "$S8" "${SW[@]}" --set parallel.tp=1 \
     --set parallel.dp=8 --set serve.disaggregation.prefill_replicas=7 --json sw1.json \
   && expect_exit 0 'KV cache transfers: 2 over' -- shardsim_mpi 1 --chips 8 serve "$S8" "${SW[@]}" --set parallel.tp=4 \
     --set parallel.dp=2 --set serve.disaggregation.prefill_replicas=1 --json sw4.json; then
  if python3 - sw1.json sw4.json <<'PY'; then pass "alone: bytes / 100 GB/s + 1 us exactly (tp 1 both, tp 4 the first); tp 4's second longer"; else fail "KV transfer contention"; fi
import json, sys
per = 2 * 32 * 8 * 128 * 2                       # Llama-3-8B's K and V bytes per token (bf16), all kv heads
for path, tp in ((sys.argv[1], 1), (sys.argv[2], 4)):
    d = json.load(open(path))["disaggregation"]
    alone = 2048 * per / tp / 100e9 + 2 * 500e-9  # one chip pair's bytes over the 100 GB/s links, two hops
    t = d["transfer_s"]
    assert d["transfer_bytes_per_chip_pair"] == 2 * 2048 * per / tp, d
    assert abs(t[0] - alone) <= 1e-9 * alone, (path, t, alone)
    if tp == 1:
        assert abs(t[1] - alone) <= 1e-9 * alone, (path, t, alone)
    else:
        assert t[1] > 1.5 * alone, (path, t, alone)
PY
fi

e2e_case "(f4) two KV caches into one chip at once share its link, as the network model's crossing flows do"
# switch_8, tp 1, dp 8, 7 prefill replicas: two 2,048-token prompts at t = 0 on replicas 0 and 1 end their prefills
# together and both caches go to replica 7's chip: two senders' flows on its one down-link, each at half its
# bandwidth (sim/timeline.h StepShare): both arrive 2 x bytes / bandwidth + 1 us after the prefill, where booking
# one after the other would give the first bytes / bandwidth + 1 us.
SW2=(--topology "$CONFIGS/topologies/switch_8.yaml" --set serve.trace.count=2 --set serve.trace.arrival=at_once
     --set serve.trace.rate=1 --set serve.trace.prompt=2048 --set serve.trace.output=16)  # (a key is set once)
if expect_exit 0 'KV cache transfers: 2 over' -- shardsim_mpi 1 --chips 8 serve "$S8" "${SW2[@]}" --set parallel.tp=1 \
     --set parallel.dp=8 --set serve.disaggregation.prefill_replicas=7 --json sw2.json; then
  if python3 - sw2.json <<'PY'; then pass "both transfers 2 x bytes / 100 GB/s + 1 us (shared, not queued)"; else fail "concurrent KV transfers"; fi
import json, sys
per = 2 * 32 * 8 * 128 * 2
j = json.load(open(sys.argv[1]))
t = j["disaggregation"]["transfer_s"]
shared = 2 * 2048 * per / 100e9 + 2 * 500e-9
assert len(t) == 2 and all(abs(x - shared) <= 1e-9 * shared for x in t), (t, shared)
assert j["requests"][0][1] == j["requests"][1][1], j["requests"]   # same prefill end, same first token
PY
fi

e2e_case "(f5) per-phase plans: prefill tp 2 x dp 2, decode tp 4; each cache resharded through kv_transfer"
# switch_8 (one 100 GB/s link per chip, 500 ns per hop). Llama-3-8B has 8 KV heads: a tp 2 prefill chip holds 4,
# a tp 4 decode chip 2, so each prefill chip of the request's replica sends 2 messages of 2,048 x 32 layers x 2 x
# 2 heads x 128 x 2 B, one after the other through its port: the cache is there 2 x message / 100 GB/s + 2 hops'
# latency after the prefill. Chips 0-3 prefill (2 replicas), 4-7 decode.
sed '/^parallel:/,/^  tp: 1$/d' "$S8" > pp8.yaml
PP=(--topology "$CONFIGS/topologies/switch_8.yaml" --set serve.trace.count=2 --set serve.trace.arrival=fixed
    --set serve.trace.rate=1 --set serve.trace.prompt=2048 --set serve.trace.output=16)
PPG=(--set serve.disaggregation.prefill.parallel.tp=2 --set serve.disaggregation.prefill.parallel.dp=2
     --set serve.disaggregation.decode.parallel.tp=4)
if expect_exit 0 'plan per phase: prefill tp=2 x dp=2 on 4 chips, decode tp=4 on 4 chips' -- shardsim_mpi 1 --chips 8 \
     serve pp8.yaml "${PP[@]}" "${PPG[@]}" --json pp8.json; then
  assert_out 'KV cache transfers: 2 resharded from the prefill plan to the decode plan, 4 chip pairs each' "4 chip pairs per cache"
  assert_out 'KV cache per chip, decode: ' "each group's cache"
  if python3 - pp8.json <<'PY'; then pass "both plans in the JSON; each cache 2 x message / 100 GB/s + 1 us; prefill on replicas 0-1, decode on 2"; else fail "per-phase plans"; fi
import json, sys
j = json.load(open(sys.argv[1]))
d, it = j["disaggregation"], j["iterations"]
assert d["per_phase"] and j["tp"] is None and j["dp"] == 3, (d, j["tp"])
assert (d["prefill"]["tp"], d["prefill"]["dp"], d["prefill"]["chips"]) == (2, 2, 4), d["prefill"]
assert (d["decode"]["tp"], d["decode"]["dp"], d["decode"]["chips"]) == (4, 1, 4), d["decode"]
full = 2 * 32 * 8 * 128 * 2                      # Llama-3-8B's K and V bytes per token (bf16), all 8 KV heads
msg = 2048 * full / 4                            # one prefill chip's half of its 4 heads to one decode chip
assert d["transfer_bytes"] == 2 * 2048 * full, d["transfer_bytes"]
assert d["prefill"]["kv_cache"]["bytes_per_token"] == full / 2 and d["decode"]["kv_cache"]["bytes_per_token"] == full / 4
t, want = d["transfer_s"], 2 * msg / 100e9 + 2 * 500e-9
assert len(t) == 2 and all(abs(x - want) <= 1e-9 * want for x in t), (t, want)
assert all(i[4] == 0 for i in it if i[7] == 2) and {i[7] for i in it} == {0, 1, 2}, {i[7] for i in it}
assert j["metrics"]["requests"] == 2 and all(r[2] > r[1] > 0 for r in j["requests"])
PY
fi
# Per-phase plans that equal the config's plan (tp 2: prefill dp 3, decode dp 1) run what prefill_replicas: 3 runs
# on tp 2 x dp 4: the same requests, iterations, transfers and metrics, to the bit.
SWS=(--topology "$CONFIGS/topologies/switch_8.yaml" "${SMALL[@]}")
if expect_exit 0 'KV cache transfers: 20 over' -- shardsim_mpi 1 --chips 8 serve "$S8" "${SWS[@]}" --set parallel.tp=2 \
     --set parallel.dp=4 --set serve.disaggregation.prefill_replicas=3 --json same8.json \
   && expect_exit 0 'plan per phase: prefill tp=2 x dp=3 on 6 chips, decode tp=2 on 2 chips' -- shardsim_mpi 1 --chips 8 \
     serve pp8.yaml "${SWS[@]}" --set 'serve.disaggregation.prefill.parallel={tp: 2, dp: 3}' \
     --set 'serve.disaggregation.decode.parallel={tp: 2}' --json per8.json; then
  if python3 - same8.json per8.json <<'PY'; then pass "equal per-phase plans = prefill_replicas on the config's plan, bit for bit"; else fail "per-phase equal plans"; fi
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
for k in ("requests", "iterations", "metrics"):
    assert a[k] == b[k], k
assert a["disaggregation"]["transfer_s"] == b["disaggregation"]["transfer_s"]
assert b["disaggregation"]["per_phase"] and not a["disaggregation"]["per_phase"]
PY
fi
# KV heads replicated over tp (2 KV heads at tp 4): each decode chip takes its head from its peer (the same copy),
# so a transfer alone is one chip's bytes / 100 GB/s + 2 hops, not twice that through one holder's port.
if expect_exit 0 'KV cache transfers: 1 over' -- shardsim_mpi 1 --chips 8 serve "$S8" --topology "$CONFIGS/topologies/switch_8.yaml" \
     --set serve.trace.count=1 --set serve.trace.prompt=2048 --set serve.trace.output=4 --set model.kv_heads=2 \
     --set parallel.tp=4 --set parallel.dp=2 --set serve.disaggregation.prefill_replicas=1 --json kvrep.json; then
  if python3 - kvrep.json <<'PY'; then pass "replicated KV heads: each chip's cache to its peer (bytes / 100 GB/s + 1 us)"; else fail "replicated KV heads transfer"; fi
import json, sys
d = json.load(open(sys.argv[1]))["disaggregation"]
per = 2 * 32 * 1 * 128 * 2 * 2048            # one chip's one KV head, 32 layers, K and V, bf16, 2,048 tokens
want = per / 100e9 + 2 * 500e-9
assert d["transfer_bytes_per_chip_pair"] == per and abs(d["transfer_s"][0] - want) <= 1e-9 * want, (d, want)
PY
fi
expect_exit 2 "serve.disaggregation: the prefill group's plan takes 2 chips and the decode group's 4: 6, but the launch has 8" -- \
  shardsim_mpi 1 --chips 8 serve pp8.yaml "${PP[@]}" --set serve.disaggregation.prefill.parallel.tp=2 \
  --set serve.disaggregation.decode.parallel.tp=4 --json bad.json
expect_exit 2 'parallel: with serve.disaggregation.prefill and decode each group.s plan is its own' -- \
  shardsim_mpi 1 --chips 8 serve "$S8" "${PP[@]}" "${PPG[@]}" --json bad.json
expect_exit 2 'serve.disaggregation.decode: missing' -- \
  shardsim_mpi 1 --chips 8 serve pp8.yaml "${PP[@]}" --set serve.disaggregation.prefill.parallel.tp=8 --json bad.json
expect_exit 2 'parallel.tp: .*3' -- shardsim_mpi 1 --chips 8 serve pp8.yaml "${PP[@]}" \
  --set serve.disaggregation.prefill.parallel.tp=3 --set serve.disaggregation.decode.parallel.tp=5 --json bad.json

e2e_case "(f3) CUDA graphs for decode batches (serve.cuda_graphs): a host-bound decode runs faster, prefill eagerly"
# 50 us of host issue per kernel (far above Llama-3-8B's decode kernels at a small batch): eager decode steps wait
# for the host, graph replays do not; the first request's prefill (alone, eager either way) takes the same time.
for g in false true; do
  expect_exit 0 'TPOT +p50' -- shardsim_mpi 1 serve "$S8" --set serve.trace.count=4 --set serve.trace.rate=1 \
    --set device.host_launch_ns=50000 --set serve.cuda_graphs=$g --json graphs_$g.json
done
if python3 - graphs_false.json graphs_true.json <<'PY'; then pass "graphs: TPOT p50 under half the eager one's; request 0's TTFT equal"; else fail "CUDA graphs for decode"; fi
import json, sys
e, g = (json.load(open(p)) for p in sys.argv[1:3])
assert g["metrics"]["tpot_s"]["p50"] < 0.5 * e["metrics"]["tpot_s"]["p50"], (g["metrics"]["tpot_s"], e["metrics"]["tpot_s"])
assert g["requests"][0][1] == e["requests"][0][1]
PY

e2e_case "(h) load balancing by outstanding tokens over dp replicas"
if expect_exit 0 'each request to the replica with the fewest outstanding tokens' -- shardsim_mpi 1 --chips 2 serve "$S8" \
     "${SMALL[@]}" --set parallel.dp=2 --set serve.load_balance=least_tokens --json lb.json; then
  if python3 - lb.json <<'PY'; then pass "least_tokens: 20 requests done over both replicas"; else fail "least_tokens"; fi
import json, sys
j = json.load(open(sys.argv[1]))
assert j["metrics"]["requests"] == 20 and j["load_balance"] == "least_tokens"
assert {i[7] for i in j["iterations"]} == {0, 1}
assert all(r[1] > 0 and r[2] >= r[1] for r in j["requests"])
PY
fi
expect_exit 2 'serve.load_balance' -- shardsim_mpi 1 serve "$S8" --set serve.load_balance=random --json bad.json

e2e_case "(g) --profile (the longest iteration's critical path) and --what-if (the trace served again per change)"
if expect_exit 0 'profile of the longest iteration' -- shardsim_mpi 1 --chips 2 serve "$S8" "${SMALL[@]}" --set parallel.tp=2 \
     --profile --what-if hbm_bw=2x,parallel.tp=1 --json wi.json; then
  assert_out 'critical path: ' "the profile's critical path"
  assert_out 'hbm_bw=2x +[0-9.]+ / ' "a what-if row per change"
  if python3 - wi.json <<'PY'; then pass "JSON: twice the HBM bandwidth lowers TPOT, one chip instead of tp 2 raises it"; else fail "serve what-if"; fi
import json, sys
j = json.load(open(sys.argv[1]))
w = {x["change"]: x for x in j["what_if"]}
assert j["profile"]["critical_path"] and set(w) == {"hbm_bw=2x", "parallel.tp=1"}
assert w["hbm_bw=2x"]["speedup"] > 1 > w["parallel.tp=1"]["speedup"] > 0
assert all(x["metrics"]["requests"] == 20 for x in w.values())
PY
fi
expect_exit 2 '--what-if nonsense=2x' -- shardsim_mpi 1 serve "$S8" "${SMALL[@]}" --what-if nonsense=2x --json bad.json

e2e_case "(i) a mixture of experts: Mixtral-8x7B with ep 8 (data-parallel attention), and ep 4 x tp 2 with etp"
SMX=$CONFIGS/serve/mixtral_8x7b_h100_ep8.yaml
if expect_exit 0 'plan tp=1 x pp=1 x ep=8 x dp=1' -- shardsim_mpi 1 --chips 8 serve "$SMX" "${SMALL[@]}" --json mx.json; then
  assert_out 'KV cache per replica: 8 ep chips x [0-9]+ blocks' "one cache pool per ep chip"
  check_json mx.json chips=8 ep=8 metrics.requests=20
fi
expect_exit 0 'plan tp=2 x pp=1 x ep=4 x dp=1' -- shardsim_mpi 1 --chips 8 serve "$SMX" "${SMALL[@]}" \
  --set parallel.ep=4 --set parallel.tp=2 --set parallel.etp=2
# Disaggregated MoE: replica 0 (ep 4) prefills, replica 1 (ep 4) decodes; each sequence's cache lives on its ep
# chip (request id mod ep) on both sides, so one chip pair moves it: the bytes per pair are the prompts' tokens
# times one chip's K and V per token.
if expect_exit 0 'disaggregated: replica 0..0 prefill' -- shardsim_mpi 1 --chips 8 serve "$SMX" "${SMALL[@]}" \
     --set parallel.ep=4 --set parallel.dp=2 --set serve.disaggregation.prefill_replicas=1 --json mxd.json; then
  if python3 - mxd.json <<'PY'; then pass "MoE disaggregated: 20 transfers, one chip pair each, prefill on 0, decode on 1"; else fail "MoE disaggregated"; fi
import json, sys
j = json.load(open(sys.argv[1]))
it, d = j["iterations"], j["disaggregation"]
assert j["ep"] == 4 and j["metrics"]["requests"] == 20 and d["transfers"] == 20
assert all(i[5] == 0 for i in it if i[7] == 0) and all(i[4] == 0 for i in it if i[7] == 1)
prompts = sum(r[3] for r in j["requests"] if r[4] > 1)
assert d["transfer_bytes_per_chip_pair"] == prompts * j["kv_cache"]["bytes_per_token"], (d, prompts)
assert all(r[1] > 0 and r[2] > r[1] for r in j["requests"])
PY
fi
# Per-phase plans with a MoE model: ep 4 in both groups runs what prefill_replicas runs on ep 4 x dp 2 (to the bit);
# ep 4 prefill into ep 2 x tp 2 (etp 2) decode: each cache from its ep chip (request id mod 4) to the tp pair of
# its ep chip (id mod 2), 2 chip pairs each.
mkdir -p mxp/serve mxp/topologies && cp "$CONFIGS/topologies/dgx_h100_nvls.yaml" mxp/topologies/  # its relative path
sed '/^parallel:/,/^  ep: 8$/d' "$SMX" > mxp/serve/mx.yaml
MXP=mxp/serve/mx.yaml
if expect_exit 0 'plan per phase: prefill ep=4 on 4 chips, decode ep=4 on 4 chips' -- shardsim_mpi 1 --chips 8 serve "$MXP" \
     "${SMALL[@]}" --set 'serve.disaggregation.prefill.parallel={ep: 4}' --set 'serve.disaggregation.decode.parallel={ep: 4}' \
     --json mxp.json \
   && expect_exit 0 'in decode \(ep 2\)' -- shardsim_mpi 1 --chips 8 serve "$MXP" "${SMALL[@]}" \
     --set 'serve.disaggregation.prefill.parallel={ep: 4}' --set 'serve.disaggregation.decode.parallel={ep: 2, tp: 2, etp: 2}' \
     --json mxp2.json; then
  if python3 - mxd.json mxp.json mxp2.json <<'PY'; then pass "MoE per phase: equal plans = prefill_replicas to the bit; ep 4 -> ep 2 x tp 2, 2 chip pairs a cache"; else fail "MoE per-phase plans"; fi
import json, sys
a, b, c = (json.load(open(p)) for p in sys.argv[1:4])
for k in ("requests", "iterations", "metrics"):
    assert a[k] == b[k], k
assert a["disaggregation"]["transfer_s"] == b["disaggregation"]["transfer_s"]
d = c["disaggregation"]
assert d["per_phase"] and d["decode"]["ep"] == 2 and d["decode"]["tp"] == 2 and d["transfers"] == 20
assert d["transfer_bytes"] == 2 * d["transfer_bytes_per_chip_pair"] and c["metrics"]["requests"] == 20
PY
fi

e2e_case "(j) a sweep over a serve config: rate x batching, each point what serve runs; rows, JSON and the latency plot"
cat > sw.yaml <<EOF
name: serve_e2e
axes:
  workload:
    - {config: $S70, label: l70, requests: 6}
  plan:
    - {tp: 8}
  batching:
    - {policy: continuous}
    - {policy: chunked, max_num_batched_tokens: 512, label: chunked512}
  rate: [4, 16]
EOF
if expect_exit 0 'ran 4' -- shardsim_mpi 1 --chips 8 sweep sw.yaml --output swout; then
  [ -s swout/serve_latency.gp ] && [ -s swout/serve_latency.dat ] && pass "serve_latency.gp and its data" ||
    fail "no serve_latency plot"
  if expect_exit 0 'TTFT +p50' -- shardsim_mpi 1 --chips 8 serve "$S70" --set serve.trace.count=6 \
       --set serve.trace.rate=16 --set serve.policy=chunked --set serve.max_num_batched_tokens=512 --json one.json; then
    if python3 - swout/results.json one.json <<'PY'; then pass "4 serve rows; the chunked512 16 req/s row = serve's own run"; else fail "serve sweep rows"; fi
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
m = json.load(open(sys.argv[2]))["metrics"]
assert len(rows) == 4 and all(r["run_mode"] == "serve" and r["verdict"] == "not_validated" for r in rows), rows
assert {(r["batching"], r["rate"]) for r in rows} == {("continuous", 4), ("continuous", 16), ("chunked512", 4), ("chunked512", 16)}
r = next(r for r in rows if r["batching"] == "chunked512" and r["rate"] == 16)
for col, want in [("ttft_p50_ms", 1e3 * m["ttft_s"]["p50"]), ("ttft_p99_ms", 1e3 * m["ttft_s"]["p99"]),
                  ("tpot_p99_ms", 1e3 * m["tpot_s"]["p99"]), ("goodput_requests_per_s", m["goodput_requests_per_s"])]:
    assert abs(r[col] - want) <= 1e-9 * abs(want), (col, r[col], want)
PY
  fi
fi
cat > bad_sw.yaml <<EOF
axes:
  workload: [$S70]
  plan: [{tp: 8}]
  rate: [0]
EOF
expect_exit 2 'bad_sw.yaml:4: axes.rate\[0\]: a request rate in requests/s from 1e-6 to 1e9' -- shardsim_mpi 1 --chips 8 sweep bad_sw.yaml --output badout

e2e_case "(k) tp above the KV heads: Llama-3-70B at tp 16, each chip holding its query heads' KV head"
# 8 KV heads over 16 chips: every chip caches one KV head (replicated over the two chips of its GQA group), so a
# token's cache is 2 x 80 layers x 1 head x 128 x 2 B per chip (real data: tests/mpi/serve_decode_test.cpp).
if expect_exit 0 'plan tp=16 x pp=1 x dp=1' -- shardsim_mpi 1 --chips 16 serve "$S70" --set parallel.tp=16 \
     --topology "$CONFIGS/topologies/dgx_h100_2nodes_rails.yaml" --set serve.trace.count=4 --json tp16.json; then
  if python3 - tp16.json <<'PY'; then pass "tp 16: 4 requests done, 40,960 B of KV cache per token per chip"; else fail "tp above the KV heads"; fi
import json, sys
j = json.load(open(sys.argv[1]))
assert j["metrics"]["requests"] == 4, j["metrics"]
assert j["kv_cache"]["bytes_per_token"] == 2 * 80 * 1 * 128 * 2, j["kv_cache"]
PY
fi

e2e_case "(d) bad input: one line, exit 2, no JSON written"
printf 'arrival_s,prompt_tokens,output_tokens\n0,-5,20\n' > neg.csv
printf 'arrival_s,prompt_tokens,output_tokens\n1,5,20\n0.5,5,20\n' > order.csv
printf 'arrival_s,prompt_tokens,output_tokens\n0,9000,20\n' > long.csv
expect_exit 2 'neg\.csv:2: prompt_tokens' -- shardsim_mpi 1 serve "$S8" --requests neg.csv --json bad.json
expect_exit 2 'order\.csv:3: arrival_s' -- shardsim_mpi 1 serve "$S8" --requests order.csv --json bad.json
expect_exit 2 'exceeds the model.s context of 8192' -- shardsim_mpi 1 serve "$S8" --requests long.csv --json bad.json
expect_exit 2 'KV cache is too small' -- shardsim_mpi 1 serve "$S8" --set serve.memory_fraction=0.15 --json bad.json
expect_exit 2 'generated request [0-9]+: needs [0-9]+ tokens of KV cache, more than its capacity' -- shardsim_mpi 1 serve "$S8" --set serve.memory_fraction=0.2 --json bad.json
expect_exit 2 'serve.policy' -- shardsim_mpi 1 serve "$S8" --set serve.policy=fifo --json bad.json
expect_exit 2 'parallel.sp: refused in the serve mode: serving runs without sequence parallelism' -- shardsim_mpi 1 --chips 8 serve "$S70" --set parallel.sp=true
expect_exit 2 'parallel.fused: refused in the serve mode: serving runs the GEMMs and their collectives unfused' -- shardsim_mpi 1 --chips 8 serve "$S70" \
  --set parallel.fused=true --json bad.json
# A what-if change whose KV cache holds no block: refused before the baseline runs (no report line), naming it.
expect_exit 2 '^shardsim: error: --what-if serve\.memory_fraction=0\.01: .*the KV cache is too small' -- \
  shardsim_mpi 1 serve "$S8" --set serve.trace.count=4 --what-if hbm_bw=2x,serve.memory_fraction=0.01 --json bad.json
assert_out_count "TTFT" 0 "no report printed"
if [ -e bad.json ]; then fail "a refused run wrote its JSON"; else pass "nothing written by the refused runs"; fi

e2e_case "(d2) no request makes a second token: TPOT / ITL n/a (JSON null), and none within a TPOT SLO"
printf 'arrival_s,prompt_tokens,output_tokens\n0,100,1\n0.5,100,1\n' > one.csv
if expect_exit 0 'TPOT  n/a' -- shardsim_mpi 1 serve "$S8" --requests one.csv --json one.json; then
  assert_out 'ITL   n/a' "ITL n/a"
  assert_out 'goodput: 0\.000 requests/s \(0 of 2 within .*; 2 with one output token have no TPOT and do not count\)' \
    "one-token requests do not count as within the TPOT SLO"
  python3 -c "import json,sys; m=json.load(open('one.json'))['metrics']; \
sys.exit(0 if all(m[k][q] is None for k in ('tpot_s','itl_s') for q in ('p50','p90','p99','mean')) and m['tpot_s']['count']==0 else 1)" \
    && pass "the JSON's TPOT and ITL are null with count 0" || fail "TPOT / ITL in the JSON are not null"
fi

e2e_finish

#!/usr/bin/env bash
# The classes of failure (docs/RELIABILITY.md, section 11) tried with further inputs on the newest surfaces:
# routing histograms (model.moe.routing_file), serve sweeps' batching and rate axes, serve --trace at size and its
# window, serve's disaggregated and tp 8 configs under --set / --what-if / --profile, outputs that are inputs,
# MoE resumes. Same helpers, arguments and table as surfaces.sh (not a ctest: a few minutes at one rank).
#
#   bash scripts/hostile/audit.sh [build/apps/shardsim] [configs]      (HOSTILE_ONLY=8 for one class)
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh" "$@"
S=$BIN
MOE=$CONFIGS/moe/tiny_moe.yaml
SERVE=$CONFIGS/serve/llama3_8b_h100.yaml
DIS=$CONFIGS/serve/llama3_70b_h100_disagg.yaml
MIX=$CONFIGS/serve/mixtral_8x7b_h100_ep8.yaml
TP8=$CONFIGS/serve/llama3_70b_h100_tp8.yaml
TRAIN=$CONFIGS/lm_train.yaml
printf 'arrival_s,prompt_tokens,output_tokens\n0,64,4\n0.01,32,4\n0.02,48,2\n0.5,16,3\n' >small.csv
R=(--requests small.csv)
HR=(--set model.moe.routing=histogram)
rf() { printf 'layer,expert,tokens\n%s\n' "$2" >"$1"; }
rf ok.csv $'all,0,10\nall,1,5'
ln -s ok.csv ok_link.csv

kind 1
mkfifo fifo; ln -s /dev/null to_null; ln -s fifo to_fifo; echo old >target.json; ln -s target.json to_file
for o in /dev/stdout to_null to_file; do
  hc 0 'TTFT' -- $S serve "$SERVE" "${R[@]}" --trace $o --trace-window 0:1000000
  hc 0 'TTFT' -- $S serve "$SERVE" "${R[@]}" --trace $o --trace-max-mib 0
done
ok '[ -L to_file ] && [ -L to_null ] && python3 -c "import json;json.load(open(\"target.json\"))"' "links intact"
(timeout 60 cat fifo >fifo.out 2>/dev/null &); sleep 0.2
hc 0 'TTFT' -- $S serve "$SERVE" "${R[@]}" --trace to_fifo --json /dev/stdout
sleep 0.3; ok '[ -p fifo ] && [ -s fifo.out ]' "serve --trace to a FIFO"
hc 0 'step' -- $S --chips 2 train "$MOE" --steps 1 --shape-only --plan ep=2 "${HR[@]}" --set model.moe.routing_file=ok_link.csv --json to_file
ok '[ -L ok_link.csv ] && [ -L to_file ]' "routing file via link"
hc 2 'stream|regular' -- $S --chips 2 train "$MOE" --steps 1 --shape-only --plan ep=2 "${HR[@]}" --set model.moe.routing_file=/dev/stdin
hc 2 'regular|fifo|FIFO' -- $S --chips 2 train "$MOE" --steps 1 --shape-only --plan ep=2 "${HR[@]}" --set model.moe.routing_file=fifo
hc 2 'directory' -- $S --chips 2 train "$MOE" --steps 1 --shape-only --plan ep=2 "${HR[@]}" --set model.moe.routing_file=.

kind 2
rf big.csv $'all,0,9223372036854775807\nall,1,9223372036854775807'
hc 2 'tokens .* between 0 and 1e18' -- $S --chips 2 train "$MOE" --steps 1 --shape-only --plan ep=2 "${HR[@]}" --set model.moe.routing_file=big.csv
rf big2.csv $'all,0,99999999999999999999'
hc 2 'tokens' -- $S --chips 2 train "$MOE" --steps 1 --shape-only --plan ep=2 "${HR[@]}" --set model.moe.routing_file=big2.csv
rf lay.csv $'9223372036854775807,0,1'
hc 2 'layer' -- $S --chips 2 train "$MOE" --steps 1 --shape-only --plan ep=2 "${HR[@]}" --set model.moe.routing_file=lay.csv
rf ex.csv $'all,9223372036854775807,1'
hc 2 'expert' -- $S --chips 2 train "$MOE" --steps 1 --shape-only --plan ep=2 "${HR[@]}" --set model.moe.routing_file=ex.csv
rf neg.csv $'all,-1,1'
hc 2 'expert' -- $S --chips 2 train "$MOE" --steps 1 --shape-only --plan ep=2 "${HR[@]}" --set model.moe.routing_file=neg.csv
hc 2 'max_num_seqs' -- $S serve "$SERVE" "${R[@]}" --set serve.max_num_seqs=9223372036854775807
hc 2 'max_num_batched_tokens' -- $S serve "$SERVE" "${R[@]}" --set serve.max_num_batched_tokens=9223372036854775807
hc 2 'block_size' -- $S serve "$SERVE" "${R[@]}" --set serve.block_size=9223372036854775807
hc 2 'count' -- $S serve "$SERVE" --set serve.trace.count=9223372036854775807
hc 2 'tp|kv|head' -- $S serve "$SERVE" --chips 2 "${R[@]}" --set parallel.tp=9223372036854775807
hc 2 'plan|ep' -- $S serve "$MIX" --chips 8 "${R[@]}" --plan ep=9223372036854775807
hc 2 'trace-window' -- $S serve "$SERVE" "${R[@]}" --trace w.json --trace-window 0:1e300
hc 2 'trace-window' -- $S serve "$SERVE" "${R[@]}" --trace w.json --trace-window 99999999999999999999999:

kind 3
for v in nan inf -1 1e300; do
  rf f.csv "all,0,$v"
  hc 2 'tokens' -- $S --chips 2 train "$MOE" --steps 1 --shape-only --plan ep=2 "${HR[@]}" --set model.moe.routing_file=f.csv
done
for v in nan -1 1e300 1e10; do
  hc 2 'trace-max-mib' -- $S serve "$SERVE" "${R[@]}" --trace w.json --trace-max-mib $v
done
for kv in graph_launch_overhead_ns=1e300 graph_launch_overhead_ns=nan host_launch_ns=-1 launch_mode=bogus launch_mode=1; do
  hc 2 "${kv%%=*}" -- $S serve "$SERVE" "${R[@]}" --set device.$kv
done
for v in 2 maybe 1e300; do hc 2 'cuda_graphs' -- $S serve "$SERVE" "${R[@]}" --set serve.cuda_graphs=$v; done
hc 2 'what-if' -- $S serve "$SERVE" "${R[@]}" --what-if graph_launch_overhead_ns=1e300x
hc 2 'what-if' -- $S serve "$SERVE" "${R[@]}" --what-if serve.cuda_graphs=maybe
hc 2 'what-if' -- $S serve "$DIS" --chips 16 "${R[@]}" --what-if dim0.bandwidth=1e-300x

kind 5
hc 2 'routing_file|overwrite|input' -- $S --chips 2 train "$MOE" --steps 1 --shape-only --plan ep=2 "${HR[@]}" --set model.moe.routing_file=ok.csv --json ok.csv
ok 'head -1 ok.csv | grep -q layer' "routing file intact"
hc 2 'overwrite|input' -- $S --chips 2 train "$MOE" --steps 1 --shape-only --plan ep=2 "${HR[@]}" --set model.moe.routing_file=ok.csv --trace ./ok_link.csv
ok 'head -1 ok.csv | grep -q layer' "routing file intact (link)"
cp "$SERVE" s.yaml
hc 2 'overwrite|input|both' -- $S serve s.yaml "${R[@]}" --trace small.csv
hc 2 'overwrite|input|both' -- $S serve s.yaml "${R[@]}" --json s.yaml
mkdir -p pl; hc 2 'both write|overwrite' -- $S serve s.yaml "${R[@]}" --json a.json --trace ./pl/../a.json

kind 6
E=$'\e]0;PWN\a'
rf "r${E}.csv" 'all,0,1'
hc 2 'control character' -- $S --chips 2 train "$MOE" --steps 1 --shape-only --plan ep=2 "${HR[@]}" --set "model.moe.routing_file=r${E}.csv"
rf esc.csv $'all,0,1\e[2J'
hc 2 'tokens' -- $S --chips 2 train "$MOE" --steps 1 --shape-only --plan ep=2 "${HR[@]}" --set model.moe.routing_file=esc.csv
hc 2 'routing_file' -- $S --chips 2 train "$MOE" --steps 1 --shape-only --plan ep=2 "${HR[@]}" --set "model.moe.routing_file=missing${E}.csv"
hc 2 'trace-window' -- $S serve "$SERVE" "${R[@]}" --trace w.json --trace-window "1${E}:2"
hc 2 'TTFT|trace' -- $S serve "$SERVE" "${R[@]}" --trace "w${E}.json" --trace-max-mib 0.0001
printf 'arrival_s,prompt_tokens,output_tokens\n0,64,4\n' >"q${E}.csv"
hc 0 'TTFT' -- $S serve "$SERVE" --requests "q${E}.csv"
sed "s/^name:.*/name: \"x\\\\e[2Jy\"/" "$SERVE" >ename.yaml
hc 2 'control character' -- $S serve ename.yaml "${R[@]}"

kind 7
echo x >afile
hc 2 'not a directory' -- $S serve "$SERVE" "${R[@]}" --trace afile/t.json
hc 2 'trace-max-mib' -- $S serve "$SERVE" --set serve.trace.count=50000 --trace big.json --trace-max-mib 1
hc 2 'model\.moe\.routing_file: nope\.csv: cannot open' -- $S --chips 2 train "$MOE" --steps 1 --shape-only --plan ep=2 "${HR[@]}" --set model.moe.routing_file=nope.csv
hc 2 'routing_file|histogram' -- $S --chips 2 run "$MOE" --shape-only --plan ep=2 "${HR[@]}" --set model.moe.routing_file=nope.csv
hc 0 'step' -- $S --chips 2 train "$MOE" --steps 1 --plan ep=2 "${HR[@]}" --set model.moe.routing_file=ok.csv  # routing: applies to shape-only runs (docs/CONFIG.md)

kind 8
rf dup.csv $'all,0,1\nall,0,2'
hc 2 'twice|again|duplicate|repeated' -- $S --chips 2 train "$MOE" --steps 1 --shape-only --plan ep=2 "${HR[@]}" --set model.moe.routing_file=dup.csv
rf dense.csv $'0,0,1'
hc 2 'layer' -- $S --chips 2 train "$MOE" --steps 1 --shape-only --plan ep=2 "${HR[@]}" --set model.moe.routing_file=dense.csv
rf zero.csv $'all,0,0'
hc 2 'tokens|zero|weigh' -- $S --chips 2 train "$MOE" --steps 1 --shape-only --plan ep=2 "${HR[@]}" --set model.moe.routing_file=zero.csv
printf 'layer,expert,tokens\n' >empty.csv
hc 2 'routing_file|empty|record' -- $S --chips 2 train "$MOE" --steps 1 --shape-only --plan ep=2 "${HR[@]}" --set model.moe.routing_file=empty.csv
printf 'layer,expert\nall,0\n' >hdr.csv
hc 2 'tokens|header' -- $S --chips 2 train "$MOE" --steps 1 --shape-only --plan ep=2 "${HR[@]}" --set model.moe.routing_file=hdr.csv
printf 'layer,expert,tokens,extra\nall,0,1,2\n' >hdr2.csv
hc 2 'header|column|extra' -- $S --chips 2 train "$MOE" --steps 1 --shape-only --plan ep=2 "${HR[@]}" --set model.moe.routing_file=hdr2.csv
rf hex.csv 'all,0x1,1'
hc 2 'expert' -- $S --chips 2 train "$MOE" --steps 1 --shape-only --plan ep=2 "${HR[@]}" --set model.moe.routing_file=hex.csv
rf sp.csv 'all, 0,1'
hc 2 'expert' -- $S --chips 2 train "$MOE" --steps 1 --shape-only --plan ep=2 "${HR[@]}" --set model.moe.routing_file=sp.csv
rf ex8.csv 'all,8,1'
hc 2 'expert' -- $S --chips 2 train "$MOE" --steps 1 --shape-only --plan ep=2 "${HR[@]}" --set model.moe.routing_file=ex8.csv
hc 2 'routing_file' -- $S --chips 2 train "$MOE" --steps 1 --shape-only --plan ep=2 --set model.moe.routing_file=ok.csv
hc 2 'routing_file' -- $S --chips 2 train "$MOE" --steps 1 --shape-only --plan ep=2 "${HR[@]}" --set model.moe.routing_file=
hc 2 'trace-window|trace' -- $S serve "$SERVE" "${R[@]}" --trace-window 0:1
hc 2 'trace-window' -- $S serve "$SERVE" "${R[@]}" --trace w.json --trace-window 0:1 --trace-window 1:2
hc 2 'trace-chips|unknown|extra|not expected' -- $S serve "$SERVE" "${R[@]}" --trace w.json --trace-chips 0
hc 2 'plan|ep' -- $S serve "$MIX" --chips 8 "${R[@]}" --plan ep=2,ep=4
hc 2 'plan' -- $S serve "$MIX" --chips 8 "${R[@]}" --plan 'ep=2,,tp=4'
hc 2 'cuda_graphs|launch_mode' -- $S serve "$SERVE" "${R[@]}" --set serve.cuda_graphs=
hc 2 'requests' -- $S serve "$SERVE" --requests ''
hc 2 'what-if' -- $S serve "$SERVE" "${R[@]}" --what-if serve.cuda_graphs=false,serve.cuda_graphs=false

kind 9
hc 2 'ep' -- $S serve "$MIX" --chips 8 "${R[@]}" --plan ep=3
hc 2 '--chips 16|16 chips' -- $S serve "$DIS" "${R[@]}"
hc 2 'trace-max-mib' -- $S serve "$SERVE" "${R[@]}" --trace w.json --trace-max-mib abc

kind 13
hc 0 'trace: [0-9]+ events' -- $S serve "$DIS" --chips 16 "${R[@]}" --trace d.json
ok 'python3 -c "import json;t=json.load(open(\"d.json\"))[\"traceEvents\"];assert any(e.get(\"pid\")==1 and e[\"ph\"]==\"X\" for e in t)"' "disagg trace has both replicas"
hc 0 'trace: [0-9]+ events.*kept' -- $S --chips 4 train "$MOE" --steps 1 --shape-only --plan ep=2,dp=2 --trace m.json --trace-axis ep
hc 0 'trace: not written' -- $S --chips 4 train "$MOE" --steps 1 --shape-only --plan ep=2,dp=2 --trace m2.json --trace-max-mib 0.001
ok '[ ! -e m2.json ]' "train trace past its limit not written"

kind 14
hc 0 'what-if' -- $S serve "$DIS" --chips 16 "${R[@]}" --what-if dim0.bandwidth=2x,dim1.bandwidth=2x
hc 0 'TTFT' -- $S serve "$DIS" --chips 16 "${R[@]}" --set 'topology.dims[1].bandwidth_gbps=100'
hc 2 'dims' -- $S serve "$DIS" --chips 16 "${R[@]}" --set 'topology.dims[9].bandwidth_gbps=100'

kind 15
hc 0 'trace-window' -- $S serve --help
hc 2 'topic: serve not in' -- $S help serve


# serve sweeps, profiles under in-switch reduction, MoE resumes
sw() {  # sw NAME BATCHING RATE REQUESTS [PLAN]
  cat >"$1.yaml" <<Y
name: $1
axes:
  workload:
    - {config: $SERVE, label: s, requests: $4}
  topology:
    - {kind: ring, chips: 1, bandwidth_gbps: 100}
  plan:
    - ${5:-{tp: 1}}
  batching:
    - $2
  rate: $3
Y
}

kind 7
sw b1 '{policy: bogus}' '[1]' 3;               hc 2 'b1\.yaml:[0-9]+.*policy' -- $S sweep b1.yaml --output o_b1
sw b2 '{policy: continuous}' '[nan]' 3;        hc 2 'b2\.yaml:[0-9]+.*rate' -- $S sweep b2.yaml --output o_b2
sw b3 '{policy: continuous}' '[-1]' 3;         hc 2 'b3\.yaml:[0-9]+.*rate' -- $S sweep b3.yaml --output o_b3
sw b4 '{policy: continuous}' '[1]' 0;          hc 2 'b4\.yaml:[0-9]+.*requests' -- $S sweep b4.yaml --output o_b4
sw b5 '{policy: continuous}' '[1]' 9223372036854775807; hc 2 'b5\.yaml:[0-9]+.*requests' -- $S sweep b5.yaml --output o_b5
sw b6 '{max_num_seqs: 0}' '[1]' 3;             hc 2 'b6\.yaml:[0-9]+.*max_num_seqs' -- $S sweep b6.yaml --output o_b6
sw b7 '{preemption: later}' '[1]' 3;           hc 2 'b7\.yaml:[0-9]+.*preemption' -- $S sweep b7.yaml --output o_b7
sw b8 '{policy: continuous, bogus: 1}' '[1]' 3; hc 2 'b8\.yaml:[0-9]+.*bogus' -- $S sweep b8.yaml --output o_b8
sw b9 '{policy: continuous}' '[1, 1]' 3;       hc 2 'b9\.yaml:[0-9]+.*(twice|again|repeat|duplicate)' -- $S sweep b9.yaml --output o_b9
sw b10 '{policy: continuous}' '[]' 3;          hc 2 'b10\.yaml:[0-9]+.*rate' -- $S sweep b10.yaml --output o_b10
sw b11 '{policy: continuous}' '1' 3;           hc 0 'b11' -- $S sweep b11.yaml --output o_b11
sw b12 '{policy: continuous}' '[1e300]' 3;     hc 2 'b12\.yaml:[0-9]+.*rate' -- $S sweep b12.yaml --output o_b12
sw b13 '{max_num_batched_tokens: 1}' '[1]' 3;  hc 0 'b13' -- $S sweep b13.yaml --output o_b13
for o in o_b1 o_b2 o_b6; do ok "[ ! -s $o/results.csv ]" "$o: no rows written before the refusal"; done
sw g1 '{policy: continuous}' '[2]' 3;          hc 0 'best|point|done|rows' -- $S sweep g1.yaml --output o_g1
ok 'grep -q ttft o_g1/results.csv' "a good serve sweep writes ttft columns"
cat >m1.yaml <<Y
name: m1
axes:
  workload:
    - {config: $MOE, label: m, set: {moe: {experts: 0, top_k: 2, expert_ffn: 8}}}
  plan:
    - {ep: 2}
Y
hc 2 'm1\.yaml:[0-9]+.*experts' -- $S --chips 2 sweep m1.yaml --output o_m1
cat >m2.yaml <<Y
name: m2
axes:
  workload:
    - {config: $MOE, label: m, set: {moe: {experts: 8, top_k: 2, expert_ffn: 8, routing: histogram, routing_file: nope.csv}}}
  plan:
    - {ep: 2}
Y
hc 2 'm2\.yaml:[0-9]+.*routing_file' -- $S --chips 2 sweep m2.yaml --output o_m2
cat >m3.yaml <<Y
name: m3
axes:
  workload:
    - {config: $MOE, label: m}
  plan:
    - {ep: 3}
    - {ep: 2, bogus: 1}
Y
hc 2 'm3\.yaml:[0-9]+.*bogus' -- $S --chips 2 sweep m3.yaml --output o_m3

kind 4
hc 0 'critical path' -- $S serve "$TP8" --chips 8 "${R[@]}" --topology $CONFIGS/topologies/dgx_h100_nvls.yaml --profile --json p.json
ok 'python3 - <<PY
import json
j = json.load(open("p.json")); cp = j["profile"]["critical_path"]
s = json.dumps(cp)
assert "chip 8" not in s and "\"chip\": 8" not in s, "switch named as a chip"
PY' "serve --profile under in-switch reduction: chips only"

kind 10
hc 0 'saved' -- $S --chips 2 train "$MOE" --steps 1 --plan ep=2 --checkpoint m.h5
hc 2 'experts|shape|checkpoint' -- $S --chips 2 train "$MOE" --steps 2 --plan ep=2 --resume m.h5 --set model.moe.experts=4
hc 0 'step' -- $S --chips 2 train "$MOE" --steps 2 --plan ep=2 --resume m.h5 --set model.moe.top_k=1
hc 0 'PASS' -- $S --chips 2 train "$MOE" --steps 2 --plan ep=2 --resume m.h5 --validate --set train.lr=0.02

kind 11
hc 0 'TTFT' -- $S serve "$SERVE" --set serve.trace.count=2000 --set serve.trace.rate=1000000 --set 'serve.trace.output={kind: uniform, min: 1, max: 4}' --set 'serve.trace.prompt={kind: uniform, min: 1, max: 4}'

kind 8
hc 2 'fold' -- $S --chips 8 train "$TRAIN" --steps 1 --shape-only --plan dp=8 --set fold=maybe
hc 2 'cuda_graphs|launch' -- $S serve "$SERVE" "${R[@]}" --set device.launch_mode=cuda_graph --set serve.cuda_graphs=maybe
hc 0 'TTFT' -- $S serve "$MIX" --chips 8 "${R[@]}" --plan ep=8 --set model.moe.routing=zipf
hc 2 'plan|ep' -- $S serve "$MIX" --chips 8 "${R[@]}" --plan 'ep=8,pp_layers=[16,16]'
hc 2 'disaggregation|prefill' -- $S serve "$MIX" --chips 8 "${R[@]}" --set serve.disaggregation.prefill_replicas=1

kind 15

# serve outputs, figures, messages
kind 1
mkfifo nofifo; ln -s nofifo to_nofifo
hc 2 'no process has it open|reader' -- $S serve "$SERVE" "${R[@]}" --trace to_nofifo
ok '[ -p nofifo ] && [ -L to_nofifo ]' "FIFO without reader untouched"
hc 2 'dev/full, where every write fails' -- $S serve "$SERVE" "${R[@]}" --trace /dev/full
echo x >tgt.json; ln -s tgt.json lnk.json
hc 2 'both write' -- $S serve "$SERVE" "${R[@]}" --trace lnk.json --json tgt.json
hc 2 'socket|device|refusing' -- $S serve "$SERVE" "${R[@]}" --trace /dev/urandom
kind 3
hc 2 'tp|heads' -- $S serve "$TP8" --chips 8 "${R[@]}" --set parallel.tp=3
hc 2 'tp|heads' -- $S serve "$TP8" --chips 8 "${R[@]}" --set model.kv_heads=0
hc 2 'memory_fraction' -- $S serve "$SERVE" "${R[@]}" --set serve.memory_fraction=1e-300
hc 2 'swap_space_gib' -- $S serve "$SERVE" "${R[@]}" --set serve.swap_space_gib=1e300
hc 2 'host_link_gbps' -- $S serve "$SERVE" "${R[@]}" --set serve.host_link_gbps=0
hc 2 'ttft_ms' -- $S serve "$SERVE" "${R[@]}" --set serve.slo.ttft_ms=-1
kind 8
hc 2 'load_balance' -- $S serve "$SERVE" "${R[@]}" --set serve.load_balance=fewest
hc 2 'prefill_replicas' -- $S serve "$DIS" --chips 16 "${R[@]}" --set serve.disaggregation.prefill_replicas=2
hc 2 'fused' -- $S serve "$TP8" --chips 8 "${R[@]}" --set parallel.fused=true
hc 2 'checkpoint|unknown' -- $S serve "$SERVE" "${R[@]}" --checkpoint x.h5
kind 9
hc 2 "job's 1 chip \(a job of 2 chips runs it: --chips 2" -- $S serve "$SERVE" "${R[@]}" --set parallel.dp=2
hc 2 '--chips 8|8 chips' -- $S serve "$TP8" "${R[@]}"
kind 13
hc 0 'trace: [0-9]+ events' -- $S serve "$TP8" --chips 8 "${R[@]}" --trace tp8.json --profile
ok 'python3 -c "import json;json.load(open(\"tp8.json\"))"' "tp8 trace is JSON"

hostile_summary

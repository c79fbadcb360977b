#!/usr/bin/env bash
# The hostile cases of issue 46's kinds on the newest surfaces (round 4, session 5): serve with prefill/decode
# disaggregation under --what-if and --profile, MoE configs with the bias update and ep x sp/cp, `--plan` strings,
# checkpoints of MoE/ep runs and `ckpt convert`, sweeps that fold, outputs through symlinks (/dev/stdout must stay a
# link: lib.sh checks it after every case), a full disk on a small tmpfs, kill -9 in a save, two runs on one output.
# Each case is a command and its clean result (lib.sh `hc`): exit 2 with one `shardsim: error` line naming the
# key or flag, or the right result; no raw control byte; nothing hung.
#
#   bash scripts/hostile/surfaces.sh [build/apps/shardsim] [configs]      (HOSTILE_ONLY=8 for one kind)
#
# One rank (--chips N in fibers), shape-only where a model runs: a few minutes on a loaded 2-core host.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh" "$@"

S=$BIN
TRAIN=$CONFIGS/lm_train.yaml
MOE=$CONFIGS/moe/tiny_moe.yaml
SERVE=$CONFIGS/serve/llama3_8b_h100.yaml
printf 'arrival_s,prompt_tokens,output_tokens\n0,64,4\n0.01,32,4\n0.02,48,2\n0.5,16,3\n' >small.csv
# 8B on two replicas, replica 0 prefills and replica 1 decodes (the disaggregated form at its smallest).
PD=(--chips 2 --requests small.csv --set parallel.dp=2 --set serve.disaggregation.prefill_replicas=1)
PDT=("${PD[@]:0:1}" "${PD[@]:1:1}" "${PD[@]:4}")  # the same without its --requests: the cases give their own trace

# ---------------------------------------------------------------------------------------------------------------
kind 1  # outputs through links: the link stays, the bytes go where it points
mkfifo fifo; ln -s /dev/null to_null; echo old >target.json; ln -s target.json to_file
hc 0 'disaggregated' -- $S serve "$SERVE" "${PD[@]}" --json /dev/stdout
hc 0 'disaggregated' -- $S serve "$SERVE" "${PD[@]}" --trace to_file
ok '[ -L to_file ] && [ "$(head -c1 target.json)" = "{" ]' "serve P/D --trace to a link: the link stays, its target holds JSON"
hc 0 'critical path' -- $S serve "$SERVE" "${PD[@]}" --profile --json to_null
ok '[ -L to_null ] && [ -c /dev/null ]' "serve --profile --json to a link to /dev/null: the link stays"
hc 0 'saved' -- $S --chips 2 train "$MOE" --steps 1 --plan ep=2 --checkpoint ep.h5
echo old >conv_target.h5; ln -s conv_target.h5 conv_link.h5  # a link to a missing file is refused (kind 1)
hc 0 'convert|wrote|->' -- $S ckpt convert ep.h5 conv_link.h5 --compression gzip:1
ok '[ -L conv_link.h5 ] && [ -f conv_target.h5 ]' "ckpt convert to a link: the link stays, its target is the checkpoint"
hc 2 'stream|checkpoint|convert' -- $S ckpt convert ep.h5 /dev/stdout
hc 2 'stream|checkpoint|convert' -- $S ckpt convert ep.h5 to_null
hc 2 'same|itself|convert' -- $S ckpt convert ep.h5 ./ep.h5

# ---------------------------------------------------------------------------------------------------------------
kind 2  # sizes that wrap
for v in 9223372036854775807 -1 1e300 2.5; do
  hc 2 'prefill_replicas' -- $S serve "$SERVE" "${PD[@]}" --set serve.disaggregation.prefill_replicas=$v
done
hc 2 'prefill_replicas' -- $S serve "$SERVE" "${PD[@]}" --set serve.disaggregation.prefill_replicas=2
for v in 9223372036854775807 0 -3; do
  hc 2 'ep|plan' -- $S --chips 4 train "$MOE" --steps 1 --shape-only --plan "ep=2,sp=true,tp=$v"
  hc 2 'cp|plan' -- $S --chips 4 train "$MOE" --steps 1 --shape-only --plan "ep=2,cp=$v"
done
hc 2 'pp_layers' -- $S --chips 2 train "$TRAIN" --steps 1 --shape-only --set model.layers=4 \
  --plan 'pp=2,pp_layers=[9223372036854775807,-9223372036854775805]'

# ---------------------------------------------------------------------------------------------------------------
kind 3  # every figure bounded
for v in nan inf -1 2 1e300; do
  hc 2 'bias_update' -- $S --chips 2 train "$MOE" --steps 1 --shape-only --plan ep=2 --set model.moe.bias_update=$v
done
for kv in experts=0 experts=1000000000 experts=9223372036854775807 top_k=0 top_k=9 top_k=-1 expert_ffn=0 \
          expert_ffn=99999999999 dense_layers=5 layer_step=0 capacity_factor=-1 capacity_factor=1e300; do
  hc 2 "model\.moe\.${kv%%=*}|top_k" -- $S --chips 2 train "$MOE" --steps 1 --shape-only --plan ep=2 --set model.moe.$kv
done
hc 2 'ep|experts' -- $S --chips 4 train "$MOE" --steps 1 --shape-only --plan ep=3
for v in nan -1 1e300; do
  hc 2 'skew' -- $S --chips 2 train "$MOE" --steps 1 --shape-only --plan ep=2 --set model.moe.routing=zipf \
    --set model.moe.skew=$v
  hc 2 'serve\.trace\.(rate|prompt)' -- $S serve "$SERVE" --requests small.csv --set serve.trace.prompt.kind=normal \
    --set serve.trace.prompt.min=1 --set serve.trace.prompt.max=8 --set serve.trace.prompt.mean=$v
done
hc 2 'what-if' -- $S serve "$SERVE" "${PD[@]}" --what-if host_launch_ns=1e300x
hc 2 'what-if' -- $S serve "$SERVE" "${PD[@]}" --what-if hbm_bw=1e-300x
hc 2 'what-if' -- $S serve "$SERVE" "${PD[@]}" --what-if link_bw=nanx
hc 2 'what-if' -- $S serve "$SERVE" "${PD[@]}" --what-if peak=0x10x

# Request traces, crafted (session 7): every field bounded, echoed as written, a byte-order mark skipped.
H='arrival_s,prompt_tokens,output_tokens'
printf "$H\n1e308,64,4\n" >far.csv
hc 2 'far\.csv:2: arrival_s: 1e308 must be a time from 0 to' -- $S serve "$SERVE" "${PDT[@]}" --requests far.csv
printf '{"arrival_s": 1e300, "prompt_tokens": 64, "output_tokens": 4}\n' >far.jsonl
hc 2 'far\.jsonl:1: arrival_s' -- $S serve "$SERVE" "${PDT[@]}" --requests far.jsonl
printf "$H\n0,9223372036854775807,4\n" >huge.csv
hc 2 'prompt_tokens: 9223372036854775807 must be an integer' -- $S serve "$SERVE" "${PDT[@]}" --requests huge.csv
for v in nan -4 0 2.5 0x10 1e400 ' '; do
  printf "$H\n0,64,%s\n" "$v" >bad_out.csv
  hc 2 'bad_out\.csv:2: output_tokens' -- $S serve "$SERVE" "${PDT[@]}" --requests bad_out.csv
done
printf '{"arrival_s": 0, "prompt_tokens": NaN, "output_tokens": 4}\n' >nan.jsonl
hc 2 'nan\.jsonl:1' -- $S serve "$SERVE" "${PDT[@]}" --requests nan.jsonl
printf '{"arrival_s": 0, "prompt_tokens": "64", "output_tokens": 4}\n' >str.jsonl
hc 2 'str\.jsonl:1: prompt_tokens: not a number' -- $S serve "$SERVE" "${PDT[@]}" --requests str.jsonl
printf '\xef\xbb\xbf%s\n0,64,4\n' "$H" >bom.csv
hc 0 'disaggregated' -- $S serve "$SERVE" "${PDT[@]}" --requests bom.csv
hc 2 'serve\.trace' -- $S serve "$SERVE" --set serve.trace.arrival=fixed --set serve.trace.rate=0.000001 \
  --set serve.trace.count=3

# ---------------------------------------------------------------------------------------------------------------
kind 5  # two outputs never one file
hc 2 '--json|--trace' -- $S serve "$SERVE" "${PD[@]}" --profile --json pd.json --trace ./pd.json
ok '[ ! -e pd.json ]' "serve P/D --json X --trace ./X: nothing written"

# ---------------------------------------------------------------------------------------------------------------
kind 6  # untrusted text escaped
hc 2 'what-if' -- $S serve "$SERVE" "${PD[@]}" --what-if $'serve.policy=\033[2Jx'
hc 2 'plan' -- $S --chips 2 train "$MOE" --steps 1 --shape-only --plan $'ep=2,\033]0;PWNED\007=1'
hc 2 'plan|schedule' -- $S --chips 2 train "$TRAIN" --steps 1 --shape-only --plan $'pp=2,schedule=\033[2J'
cp ep.h5 $'e\033[2Jp.h5'
hc 0 'verified|tensors' -- $S ckpt inspect $'e\033[2Jp.h5'
hc 0 'convert|wrote|->' -- $S ckpt convert $'e\033[2Jp.h5' $'o\033[2Jut.h5'

# ---------------------------------------------------------------------------------------------------------------
kind 7  # refused before the run, the right code
hc 2 'prefill_replicas|what-if' -- $S serve "$SERVE" "${PD[@]}" --what-if parallel.dp=1
# The selection biases are checkpoint state now (models/lm_checkpoint.h): a bias_update run saves and resumes.
hc 0 'saved' -- $S --chips 2 train "$MOE" --steps 1 --plan ep=2 --set model.moe.bias_update=0.001 --checkpoint bias.h5
hc 0 'step' -- $S --chips 2 train "$MOE" --steps 2 --plan ep=2 --set model.moe.bias_update=0.001 --resume bias.h5
# Capacity under sp/cp splits over the chips (sharding/plans/expert_parallel_config.cpp); an uneven split is refused.
hc 0 'DONE' -- $S --chips 4 train "$MOE" --steps 1 --shape-only --plan ep=2,tp=2,sp=true \
  --set model.moe.capacity_factor=1.0
hc 2 'capacity_factor|parallel\.sp' -- $S --chips 4 train "$MOE" --steps 1 --shape-only --plan ep=2,tp=2,sp=true \
  --set model.moe.capacity_factor=1.0 --set model.seq=7 --set model.batch=1
for a in halving_doubling recursive_doubling double_binary_tree; do
  hc 2 'fold' -- $S --chips 4 train "$MOE" --steps 1 --shape-only --plan ep=2,dp=2 --set model.batch=4 --set fold=on \
    --set parallel.algorithm=$a
done
# Sweeps whose points fold: a bad fold value in the workload is refused before any point (FILE:LINE); `fold: on`
# that a point's plan cannot keep is that point's error row, the sweep goes on.
RING4='topology: {kind: ring, chips: 4, bandwidth_gbps: 100}\n'
{ sed '/^parallel:/,$d' "$TRAIN"; printf "${RING4}mode: shape_only\nfold: sometimes\n"; } >fold_bad.yaml
printf 'name: fs\noutput: fs\naxes:\n  workload: [{config: fold_bad.yaml, label: w}]\n  plan: [{dp: 4}]\n' >foldsweep.yaml
hc 2 'fold_bad\.yaml:[0-9]+: fold' -- $S --chips 4 sweep foldsweep.yaml --no-plots
ok '[ ! -e fs/results.csv ]' "a sweep with a bad fold value: no point ran"
{ sed '/^parallel:/,$d' "$TRAIN"; printf "${RING4}mode: shape_only\nfold: on\nparallel:\n  algorithm: halving_doubling\n"; } >fold_on.yaml
printf 'name: fo\noutput: fo\naxes:\n  workload: [{config: fold_on.yaml, label: w, set: {batch: 4}}]\n  plan: [{dp: 4}, {dp: 2}]\n' >foldsweep2.yaml
hc 0 'best plan|error' -- $S --chips 4 sweep foldsweep2.yaml --no-plots
ok 'grep -q "^workload|w|dp4|.*,error,\"\\?fold: on, but this run does not fold" fo/results.csv' \
  "fold: on that a point cannot keep: that point's row is an error naming the fold"

# ---------------------------------------------------------------------------------------------------------------
kind 8  # nonsense refused
for p in 'ep=2;dp=1' 'ep=2 dp=1' 'ep=02x' 'ep=0x2' 'ep=1e1' 'ep=+2' 'ep= 2' 'sp=maybe' 'zero=4' 'schedule=bogus' \
         'pp_layers=[1,' 'ep=2,EP=2' 'ep=[2]' 'ep={a: 1}' 'ep=2,=' 'ep==2'; do
  hc 2 'plan|ep|sp|zero|schedule|pp_layers' -- $S --chips 2 train "$MOE" --steps 1 --shape-only --plan "$p"
done
for kv in 'model.moe.bias_update=' 'model.moe=' 'serve.disaggregation=' 'serve.disaggregation.prefill_replicas=~' \
          'serve.disaggregation.bogus=1' 'serve.load_balance=random'; do
  hc 2 "${kv%%=*}|serve|moe" -- $S serve "$SERVE" "${PD[@]}" --set "$kv"
done
hc 2 'ckpt|checkpoint|h5|HDF5' -- $S ckpt convert small.csv out.h5
hc 2 'chunk' -- $S ckpt convert ep.h5 c2.h5 --chunk 0x10
hc 2 'compression' -- $S ckpt convert ep.h5 c2.h5 --compression gzip:10
hc 2 'what-if' -- $S serve "$SERVE" "${PD[@]}" --what-if link_bw=2x,
hc 2 'what-if' -- $S serve "$SERVE" "${PD[@]}" --what-if link_bw=2x,link_bw=2x

# ---------------------------------------------------------------------------------------------------------------
kind 13  # serve --trace at size: stated before and after the run, a limit, a window, bounded memory
MANY=(--set serve.trace.count=20000 --set serve.trace.rate=1000 --set 'serve.trace.prompt={kind: uniform, min: 16, max: 64}'
      --set 'serve.trace.output={kind: uniform, min: 1, max: 8}')
hc 2 '--trace big\.json: 20000 requests: at least [0-9]+ events, [0-9.]+ MiB .*more than --trace-max-mib 1; keep a time window' \
  -- $S serve "$SERVE" "${MANY[@]}" --trace big.json --trace-max-mib 1
ok '[ ! -e big.json ]' "serve --trace past the limit before the run: nothing written"
hc 0 'trace: not written: [0-9]+ events, [0-9.]+ MiB, more than --trace-max-mib 8' \
  -- $S serve "$SERVE" "${MANY[@]}" --trace big.json --trace-max-mib 8
ok '[ ! -e big.json ] && grep -q "warning: --trace big.json not written" last.out' "serve --trace past the limit after the run: a warning, nothing written"
hc 0 'trace: [0-9]+ events, [0-9.]+ [KM]iB; kept: 1e\+06 \.\. 1\.1e\+06 us' \
  -- $S serve "$SERVE" "${MANY[@]}" --trace win.json --trace-window 1000000:1100000 --json win_report.json
ok 'python3 - <<PY
import json
t = json.load(open("win.json"))["traceEvents"]; r = json.load(open("win_report.json"))
assert r["trace_note"].startswith("%d events" % len(t)), (r["trace_note"], len(t))
ends = {}
for e in t:
    if e["ph"] == "X": assert e["ts"] <= 1.1e6 and e["ts"] + e["dur"] >= 1e6, e
    if e["ph"] == "b": ends[(e["id"], e["name"])] = e["ts"]
    if e["ph"] == "e": assert ends.pop((e["id"], e["name"])) <= 1.1e6 and e["ts"] >= 1e6, e
assert not ends and any(e["ph"] == "X" for e in t)
PY' "serve --trace-window: only iterations and request spans overlapping the window, the report counts the file's events"
for w in : 5:1 abc 1:2:3 -1:5 ''; do
  hc 2 '--trace-window' -- $S serve "$SERVE" --requests small.csv --trace w.json --trace-window "$w"
done
hc 2 '--trace-max-mib' -- $S serve "$SERVE" --requests small.csv --trace w.json --trace-max-mib nan
hc 2 'requires --trace' -- $S serve "$SERVE" --requests small.csv --trace-max-mib 5
ok '[ ! -e w.json ]' "bad serve trace flags: nothing written"

# ---------------------------------------------------------------------------------------------------------------
kind 7  # a serve sweep's batching and rate values refused with the sweep file's line before any point runs
serve_sweep() {  # NAME BATCHING RATE
  printf 'name: %s\naxes:\n  workload:\n    - {config: %s, requests: 3}\n  topology:\n    - {kind: ring, chips: 1, bandwidth_gbps: 100}\n  plan:\n    - {tp: 1}\n  batching:\n    - %s\n  rate: %s\n' \
    "$1" "$SERVE" "$2" "$3" >"$1.yaml"
}
for b in '{policy: bogus}|policy' '{max_num_seqs: 0}|max_num_seqs' '{preemption: later}|preemption' \
         '{max_num_batched_tokens: 99999999999}|max_num_batched_tokens'; do
  serve_sweep sb "${b%|*}" '[1]'
  hc 2 "sb\.yaml:[0-9]+: axes\.batching\[0\]\.${b#*|}" -- $S sweep sb.yaml --output o_sb
  ok '[ ! -s o_sb/results.csv ]' "a bad batching value: no row written"
done
for r in 1e300 0x10 0 nan; do
  serve_sweep sr '{policy: continuous}' "[$r]"
  hc 2 'sr\.yaml:[0-9]+: axes\.rate\[0\]' -- $S sweep sr.yaml --output o_sr
done

# ---------------------------------------------------------------------------------------------------------------
kind 8  # an output is never an input, by any name: a hard link, ../, a file the config names
hc 0 'saved' -- $S --chips 2 train "$MOE" --steps 1 --plan ep=2 --checkpoint ep_copy.h5
ln ep_copy.h5 ep_hard.h5; cp ep_copy.h5 ep_keep.h5
hc 2 'same file' -- $S ckpt convert ep_copy.h5 ep_hard.h5
mkdir -p sub; hc 2 'same file' -- $S ckpt convert ep_copy.h5 sub/../ep_hard.h5
hc 2 'would overwrite the checkpoint' -- $S ckpt inspect ep_copy.h5 --json ep_hard.h5
hc 2 'would overwrite the --resume checkpoint' -- $S --chips 2 train "$MOE" --steps 2 --plan ep=2 --resume ep_copy.h5 --json ep_hard.h5
ok 'cmp -s ep_copy.h5 ep_keep.h5' "the checkpoint under every refused output is unchanged"
printf 'topology:\n  kind: ring\n  chips: 1\n  bandwidth_gbps: 100\n' >topo1.yaml
sed 's|^mode: shape_only|mode: shape_only\ntopology: topo1.yaml|' "$SERVE" >serve_topo.yaml; ln topo1.yaml topo1_hard.yaml
hc 2 'would overwrite a config file this command reads' -- $S serve serve_topo.yaml --requests small.csv --json topo1.yaml
hc 2 'would overwrite a config file this command reads' -- $S serve serve_topo.yaml --requests small.csv --trace topo1_hard.yaml
printf 'layer,expert,tokens\nall,0,3\nall,1,1\n' >hist.csv
hc 2 'would overwrite a routing histogram' -- $S --chips 2 train "$MOE" --steps 1 --shape-only --plan ep=2 \
  --set model.moe.routing=histogram --set model.moe.routing_file=hist.csv --json ./hist.csv
ok 'head -c 5 topo1.yaml | grep -q topol && head -c 5 hist.csv | grep -q layer' "inputs named as outputs are unchanged"
hc 0 'step' -- $S --chips 2 train "$MOE" --steps 2 --plan ep=2 --resume ep_copy.h5 --checkpoint ep_copy.h5

# ---------------------------------------------------------------------------------------------------------------
kind 9  # a file a key or flag names that cannot be read: the key with its line, or the flag
hc 2 'model\.moe\.routing_file: nope\.csv: cannot open' -- $S --chips 2 train "$MOE" --steps 1 --shape-only --plan ep=2 \
  --set model.moe.routing=histogram --set model.moe.routing_file=nope.csv
hc 2 'serve\.trace\.file: .*nope\.csv: cannot open' -- $S serve "$SERVE" --set 'serve.trace={file: nope.csv}'
hc 2 'serve\.trace\.file: .*is a directory' -- $S serve "$SERVE" --set 'serve.trace={file: /tmp}'
hc 2 '\--requests nope\.csv: cannot open' -- $S serve "$SERVE" --requests nope.csv
# a plan larger than the job: its size and how to run it ("the job's 1 chips (ranks x chips per rank)" said neither)
hc 2 "job's 1 chip \(a job of 2 chips runs it: --chips 2" -- $S serve "$SERVE" --requests small.csv --set parallel.dp=2

# ---------------------------------------------------------------------------------------------------------------
# Request traces, the token budget, exclusive keys and outputs on one stream (the round after the audit).
R=(--requests small.csv)
kind 8  # a key or column given twice, a field no column names, a budget the policy cannot keep: refused
printf '{"arrival_s":0,"prompt_tokens":100,"prompt_tokens":300,"output_tokens":10}\n' >dupkey.jsonl
hc 2 'dupkey\.jsonl:1: key prompt_tokens given twice' -- $S serve "$SERVE" --requests dupkey.jsonl
printf '{"arrival_s":0,"prompt_tokens":10,"output_tokens":1}\n{"arrival_s":0,"arrival_s":5,"prompt_tokens":10,"output_tokens":1}\n' >dupkey2.jsonl
hc 2 'dupkey2\.jsonl:2: key arrival_s given twice' -- $S serve "$SERVE" --requests dupkey2.jsonl
printf 'arrival_s,prompt_tokens,prompt_tokens,output_tokens\n0,100,200,10\n' >dupcol.csv
hc 2 'dupcol\.csv:1: the header names column prompt_tokens twice' -- $S serve "$SERVE" --requests dupcol.csv
printf 'arrival_s,prompt_tokens,output_tokens\n0,100,10\n0,100,10,5\n' >extra.csv
hc 2 'extra\.csv:3: 4 fields, the header names 3 columns' -- $S serve "$SERVE" --requests extra.csv
python3 -c "print('{\"arrival_s\":0,\"prompt_tokens\":1,\"output_tokens\":1}'); print('{\"arrival_s\":0,\"prompt_tokens\":1,\"output_tokens\":1,\"pad\":\"' + 'a' * 100000 + '\"}')" >longline.jsonl
hc 2 'longline\.jsonl:2: a line of 1000[0-9]{2} bytes; at most 65536' -- $S serve "$SERVE" --requests longline.jsonl
for v in mode=real validate.enabled=true fold=on; do
  hc 2 "--set ${v//./\\.}: .*(serve runs shape-only|not used by serve)" -- $S serve "$SERVE" "${R[@]}" --set "$v"
done
printf 'arrival_s,note,prompt_tokens,note,output_tokens\n0,a,64,b,4\n' >othercols.csv
hc 0 'TTFT' -- $S serve "$SERVE" --requests othercols.csv
hc 2 'max_num_batched_tokens: 1 is below the model.s context of 8192' -- $S serve "$SERVE" "${R[@]}" \
  --set serve.max_num_batched_tokens=1
hc 2 'max_num_batched_tokens: 100 is below max_num_seqs 256' -- $S serve "$SERVE" "${R[@]}" \
  --set serve.policy=static --set serve.max_num_batched_tokens=100
hc 2 'small\.csv:2: request 0: prompt_tokens \+ output_tokens - 1 = 67 .* more than max_num_batched_tokens 64' -- \
  $S serve "$SERVE" "${R[@]}" --set serve.policy=static --set serve.max_num_seqs=2 --set serve.max_num_batched_tokens=64
hc 0 'TTFT' -- $S serve "$SERVE" "${R[@]}" --set serve.policy=chunked --set serve.max_num_batched_tokens=16
for v in yes on y 1; do
  hc 2 'cuda_graphs: expected true or false' -- $S serve "$SERVE" "${R[@]}" --set serve.cuda_graphs=$v
done
hc 2 'sp: expected true or false' -- $S --chips 2 train "$TRAIN" --steps 1 --shape-only --plan tp=2,sp=on
hc 2 'serve\.trace\.prompt\.min .*is not a key of kind fixed' -- $S serve "$SERVE" --set serve.trace.prompt.kind=fixed \
  --set serve.trace.prompt.value=64
hc 2 'serve\.trace\.output\.value .*is not a key of kind uniform' -- $S serve "$SERVE" --set serve.trace.output.value=64

# Overrides that set one key twice: the later one won silently.
hc 2 '--set model\.seq=4 and --set model\.seq=8 both set model\.seq' -- $S --chips 2 train "$TRAIN" --steps 1 \
  --shape-only --set model.seq=4 --set model.seq=8
hc 2 '--plan tp=2 and --set parallel\.tp=1 both set parallel\.tp' -- $S --chips 2 train "$TRAIN" --steps 1 \
  --shape-only --plan tp=2 --set parallel.tp=1
hc 2 '--bandwidth and --set topology\.bandwidth_gbps=50 both set' -- $S --chips 2 train "$TRAIN" --steps 1 \
  --shape-only --ring 2 --bandwidth 10 --set topology.bandwidth_gbps=50

# A sweep point the launch was too small for was kept as an error row and never re-run ("already in results").
printf 'name: small_launch\noutput: sl\naxes:\n  topology: [{kind: ring, chips: 4, bandwidth_gbps: 100, latency_ns: 1000, label: r4}]\n  device: [trainium1]\n  collective: [all_reduce]\n  algorithm: [ring]\n  size: [1K]\n  dtype: [fp32]\n' >sl.yaml
hc 0 'sweep' -- $S sweep sl.yaml --no-plots
ok 'grep -q "the launch has 1" sl/results.csv' "a sweep launched too small: the point's row says so"
hc 0 'ran 1' -- $S --chips 4 sweep sl.yaml --no-plots
ok '! grep -q "the launch has" sl/results.csv' "the same sweep on 4 chips: the point ran"

kind 9  # keys that exclude each other named as the conflict, with where each came from
hc 2 'serve\.trace\.file and serve\.trace\.arrival \(.*llama3_8b_h100\.yaml[^,]*:[0-9]+\) exclude each other.*--requests' -- \
  $S serve "$SERVE" --set serve.trace.file=$PWD/small.csv
{ cat "$TRAIN"; printf 'topology: {kind: ring, chips: 2, bandwidth_gbps: 100, latency_ns: 1000}\n'; } >ring2.yaml
hc 2 "unknown key 'topology\.bandwidth_gbps'.*--set topology\.kind=stacked changed this section" -- \
  $S --chips 2 train ring2.yaml --steps 1 --shape-only --set topology.kind=stacked \
  --set 'topology.dims=[{kind: ring, size: 2, bandwidth_gbps: 100, latency_ns: 1000}]'
hc 2 'the first [0-9]+ requests arrive in time' -- $S serve "$SERVE" --set serve.trace.count=4194304

# Training keys in a serve config were accepted and ignored (zero 3 gave zero 0's figures); virtual stages failed
# on a micro-batch rule at the model's line; a what-if change whose cache cannot fit did not name the change; weights
# past the HBM were blamed on memory_fraction; a flag given twice spoke CLI11; names were unbounded.
for kv in train.steps=5 parallel.zero=1 parallel.recompute=full parallel.bucket_bytes=1 model.micro_batch=1 \
          parallel.virtual_stages=2 parallel.schedule=gpipe; do
  hc 2 "--set ${kv//./\\.}: .*(training only|training pipeline)" -- $S serve "$SERVE" "${R[@]}" --set "$kv"
done
hc 2 'parallel\.sp: (refused in the serve mode: )?serving runs without sequence parallelism' -- $S --chips 2 serve "$SERVE" \
  "${R[@]}" --set parallel.tp=2 --set parallel.sp=true
hc 2 '--what-if serve\.memory_fraction=0\.01: .*KV cache is too small' -- $S serve "$SERVE" "${R[@]}" \
  --what-if serve.memory_fraction=0.01
hc 2 'the weights per chip \([0-9.]+ GiB\) exceed the device.s HBM \(80\.000 GiB\): shard the model' -- \
  $S serve "$SERVE" "${R[@]}" --set model.layers=4096
hc 2 '--plan given 2 times; give it once \(join its items with commas' -- $S --chips 2 serve "$SERVE" "${R[@]}" \
  --plan tp=2 --plan tp=2
hc 2 "unknown command 'srve' \(commands: .*serve" -- $S srve "$SERVE"
hc 2 'name: 5000 characters; names, labels and paths are at most 4096' -- $S serve "$SERVE" "${R[@]}" \
  --set "name=$(printf 'n%.0s' $(seq 1 5000))"
printf 'arrival_s,prompt_tokens,output_tokens\n0,100,1\n0.5,100,1\n' >one_token.csv
hc 0 'TPOT  n/a \(no request made a second token\)' -- $S serve "$SERVE" --requests one_token.csv

kind 7  # a per-request error names the trace's FILE:LINE, or the generated request
printf 'arrival_s,prompt_tokens,output_tokens\n\n0,9000,10\n' >long.csv
hc 2 'long\.csv:3: request 0: prompt_tokens \+ output_tokens = 9010 exceeds the model.s context of 8192 tokens \(model\.seq' -- \
  $S serve "$SERVE" --requests long.csv
hc 2 'llama3_8b_h100\.yaml.* \(serve\.trace\): generated request 0: prompt_tokens \+ output_tokens' -- \
  $S serve "$SERVE" --set serve.trace.prompt=9000
hc 2 'llama3_8b_h100\.yaml.* \(serve\.trace\): generated request 0: needs 4125 tokens of KV cache' -- \
  $S serve "$SERVE" --set serve.memory_fraction=0.2 --set serve.trace.count=2 --set serve.trace.prompt=4000

# An output where no file can be created: found after the whole run (exit 3, "error on chip 0"), now before it.
hc 2 '--json /proc/foo\.json: cannot create a file next to it' -- $S serve "$SERVE" "${R[@]}" --json /proc/foo.json
hc 2 '--json /sys/foo\.json: cannot create a file next to it' -- $S serve "$SERVE" "${R[@]}" --json /sys/foo.json
LONG=$(printf 'a%.0s' $(seq 1 240)).json
hc 2 'File name too long \(the file name and its temporary' -- $S serve "$SERVE" "${R[@]}" --json "$LONG"
hc 2 'File name too long \(the file name and its temporary' -- $S --chips 2 train "$TRAIN" --steps 1 --shape-only \
  --trace "$LONG"
hc 2 'dev/full, where every write fails' -- $S serve "$SERVE" "${R[@]}" --json /dev/full

# A checkpoint whose root metadata is damaged was called "incomplete: the save did not finish".
python3 - ep.h5 ep_bad.h5 <<'PY'
import sys
b = open(sys.argv[1], 'rb').read()
i = b.find(b'shardsim_version')
v = b.find(b'0.', i) if i >= 0 else -1
open(sys.argv[2], 'wb').write(b[:v] + b'XXXXX' + b[v + 5:] if v >= 0 else b)
PY
hc 2 'ep_bad\.h5: corrupted: the root.s attributes cannot be read' -- $S ckpt inspect ep_bad.h5

kind 5  # two outputs on one stream; an output on standard output gets it alone
hc 2 'both write standard output' -- $S serve "$SERVE" "${R[@]}" --json /dev/stdout --trace /dev/stdout
hc 2 'both write standard output' -- $S serve "$SERVE" "${R[@]}" --json /dev/fd/1 --trace /dev/stdout
hc 2 'both write standard output' -- $S --chips 2 train "$TRAIN" --steps 1 --shape-only --json /dev/stdout --trace /dev/stdout
hc 2 'both write standard output' -- $S --chips 2 run "$TRAIN" --shape-only --no-checkpoint --json /dev/stdout --trace /dev/stdout
hc 2 'both write standard output' -- $S --chips 2 bench all_reduce --shape-only -b 1K -e 1K -n 1 -w 0 -c 0 \
  --csv /dev/stdout --json /dev/stdout
# (hc puts standard output and error in one file: either name is right)
hc 2 'both write standard (error|output)' -- $S serve "$SERVE" "${R[@]}" --json /dev/stderr --trace /dev/stderr
ok "! $S serve '$SERVE' ${R[*]} --json o.txt --trace /dev/stdout >o.txt 2>o.err && grep -q 'both write standard output' o.err" \
  "--json FILE --trace /dev/stdout > FILE: refused (one file by two names)"
ln -sf fifo fifo_a; ln -sf fifo fifo_b
(timeout 60 cat fifo >/dev/null 2>&1 &); sleep 0.2
hc 2 'both write one pipe' -- $S serve "$SERVE" "${R[@]}" --json fifo_a --trace fifo_b
hc 0 'TTFT' -- $S serve "$SERVE" "${R[@]}" --json /dev/null --trace /dev/null
ok "$S serve '$SERVE' ${R[*]} --json /dev/stdout 2>/dev/null | python3 -c 'import json,sys; json.load(sys.stdin)'" \
  "serve --json /dev/stdout: the JSON alone on standard output"
ok "$S serve '$SERVE' ${R[*]} --json /dev/stdout 2>rep.err | cat >/dev/null; grep -q TTFT rep.err" \
  "serve --json /dev/stdout: the report on standard error"
ok "$S --chips 2 train '$TRAIN' --steps 1 --shape-only --json /dev/stdout 2>/dev/null | python3 -c 'import json,sys; json.load(sys.stdin)'" \
  "train --json /dev/stdout: the JSON alone"
ok "$S --chips 2 run '$TRAIN' --shape-only --no-checkpoint --json /dev/stdout 2>/dev/null | python3 -c 'import json,sys; json.load(sys.stdin)'" \
  "run --json /dev/stdout: the JSON alone"
ok "$S --chips 2 bench all_reduce --shape-only -b 1K -e 4K -n 1 -w 0 -c 0 --csv /dev/stdout 2>/dev/null | python3 -c 'import csv,sys; r=list(csv.reader(sys.stdin)); assert len(r) == 4 and all(len(x) == len(r[0]) for x in r), r'" \
  "bench --csv /dev/stdout: the CSV alone (a header and 3 rows)"

# ---------------------------------------------------------------------------------------------------------------
kind 14  # --set reaches one dimension of a stacked topology given as a file
DIS=$CONFIGS/serve/llama3_70b_h100_disagg.yaml
hc 0 'disaggregated' -- $S serve "$DIS" --chips 16 --requests small.csv --set 'topology.dims[1].bandwidth_gbps=25' --json d25.json
hc 2 "'dims' has 2 entries" -- $S serve "$DIS" --chips 16 --requests small.csv --set 'topology.dims[2].bandwidth_gbps=25'

# ---------------------------------------------------------------------------------------------------------------
kind 10  # checkpoints of ep runs resume under other plans
hc 0 'step' -- $S --chips 2 train "$MOE" --steps 2 --plan dp=2 --resume ep.h5
hc 0 'step' -- $S --chips 4 train "$MOE" --steps 2 --plan ep=2,tp=2 --resume conv_target.h5

# ---------------------------------------------------------------------------------------------------------------
kind 7  # a what-if change whose KV cache holds no block: refused before the baseline, the change named
hc 2 '^shardsim: error: --what-if serve\.memory_fraction=0\.01: ' -- $S serve "$SERVE" --set serve.trace.count=4 \
  --what-if hbm_bw=2x,serve.memory_fraction=0.01
kind 3  # TPOT / ITL with no second token: n/a (JSON null), none within a TPOT SLO
printf 'arrival_s,prompt_tokens,output_tokens\n0,100,1\n0.5,100,1\n' >one_tok.csv
hc 0 'TPOT  n/a.*|goodput: 0\.000 .*have no TPOT' -- $S serve "$SERVE" --requests one_tok.csv --json one_tok.json
ok 'python3 -c "import json,sys; m=json.load(open(\"one_tok.json\"))[\"metrics\"]; sys.exit(m[\"tpot_s\"][\"p50\"] is not None)"' \
  "TPOT p50 is null in the JSON"
kind 9  # a key no line holds; another command's flag; a flag given twice; the saved plan's ep
hc 2 '\(model\.micro_batch is not set: its default\)' -- $S --chips 2 run "$TRAIN" \
  --plan pp=2,schedule=interleaved,virtual_stages=2 --set model.layers=4 --set model.batch=4
hc 2 'serve takes no --resume' -- $S serve "$SERVE" --resume ep.h5
hc 2 '--chips given twice' -- $S --chips 2 --chips 4 train "$TRAIN" --steps 1
hc 0 'saved under dp=1 x ep=2' -- $S --chips 2 train "$MOE" --steps 2 --plan ep=2 --resume ep.h5
kind 8  # integers read decimal
hc 0 'over 10 steps' -- $S train "$TRAIN" --steps 010
kind 11  # checkpoint memory: a resume holds no tensor a chip does not own (peak RSS within 5x the file over a run without)
if ! skip_kind; then
  $S --chips 8 run --set model.ffn=688 --checkpoint mem_q.h5 --json mem_a.json >/dev/null 2>&1
  hc 0 'PASS' -- $S --chips 8 run --set model.ffn=688 --resume mem_q.h5 --no-checkpoint --json mem_b.json
  ok 'python3 -c "import json,os,sys; f=lambda p: json.load(open(p))[\"wall\"][\"peak_rss_mib\"]; sys.exit(f(\"mem_b.json\") > f(\"mem_a.json\") + 5 * os.path.getsize(\"mem_q.h5\") / 2**20)"' \
    "a resume's peak RSS within the save's + 5x the file"
fi

kind disk  # a full disk: exit 3, one line, nothing left under the final name (needs a tmpfs mount: root)
if ! skip_kind && mkdir -p full && mount -t tmpfs -o size=64k tmpfs full 2>/dev/null; then
  dd if=/dev/zero of=full/fill bs=4k count=1000 2>/dev/null
  hc 3 'No space left' -- $S serve "$SERVE" "${PD[@]}" --profile --json full/pd.json
  hc 3 'No space left' -- $S ckpt convert ep.h5 full/c.h5
  hc 3 'No space left' -- $S --chips 4 train "$MOE" --steps 1 --plan ep=2,tp=2 --checkpoint full/e.h5
  ok '[ -z "$(ls full | grep -v fill)" ]' "full disk: no temporary left"
  umount full
fi

# ---------------------------------------------------------------------------------------------------------------
kind kill  # kill -9 in an ep save and in a convert: the previous file intact
if ! skip_kind; then
  cp ep.h5 ep.bak
  timeout -s KILL 1 $S --chips 4 train "$MOE" --steps 500 --save-every 1 --plan ep=2,tp=2 --checkpoint ep.h5 >/dev/null 2>&1
  hc 0 'verified|tensors' -- $S ckpt inspect ep.h5
  timeout -s KILL 0.05 $S ckpt convert ep.bak conv_target.h5 --compression gzip:9 >/dev/null 2>&1
  hc 0 'verified|tensors' -- $S ckpt inspect conv_target.h5
  ok '[ -L conv_link.h5 ]' "a killed convert through a link: the link stays"
fi

# ---------------------------------------------------------------------------------------------------------------
kind conc  # two runs on one output
if ! skip_kind; then
  for i in 1 2; do $S ckpt convert ep.bak cc.h5 --compression gzip:$i >/dev/null 2>&1 & done; wait
  hc 0 'verified|tensors' -- $S ckpt inspect cc.h5
  ok '[ -z "$(ls | grep "cc.h5.partial")" ]' "two converts onto one file: no temporary left"
  for i in 1 2; do $S serve "$SERVE" "${PD[@]}" --trace cc.json >/dev/null 2>&1 & done; wait
  ok 'python3 -c "import json; json.load(open(\"cc.json\"))"' "two P/D serves onto one --trace: a complete JSON file"
fi

hostile_summary

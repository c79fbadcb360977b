#!/usr/bin/env bash
# The hostile re-run of issue 46's kinds on the round-4 surfaces (serve, MoE configs, --plan ep=, kernel_fusion,
# the host-launch profile, trace filters, sweep folding): each case is a command and what a clean result is (an
# exit code, one `shardsim: error` line matching a pattern, no raw control byte, /dev/stdout still a link). Prints
# one line per failure and a table of cases tried and failures per kind; exit 1 when any case failed.
#
#   bash scripts/hostile/rerun.sh [build/apps/shardsim] [configs]      (as root: OMPI_ALLOW_RUN_AS_ROOT=1 ...)
#   HOSTILE_ONLY=7 bash scripts/hostile/rerun.sh ...                    (one kind)
#
# Every case runs on one rank (--chips N in fibers), shape-only where a model runs, so the whole script takes a
# few minutes on a loaded 2-core host. Kinds (issue 46): 1 outputs replacing what they point at, 2 sizes that wrap,
# 3 unbounded or non-finite figures, 4 in-switch profiles, 5 outputs overwriting each other, 6 untrusted text
# echoed raw, 7 refused only after the run, 8 nonsense accepted, 9 misleading messages, 13 trace filters,
# 14 what-if on stacked topologies, 15 small things; "disk" full disks, "kill" kill -9 in a save, "conc"
# concurrent runs on one output.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh" "$@"

S=$BIN
TRAIN=$CONFIGS/lm_train.yaml
MOE=$CONFIGS/moe/tiny_moe.yaml
SERVE=$CONFIGS/serve/llama3_8b_h100.yaml
SERVE70=$CONFIGS/serve/llama3_70b_h100_tp8.yaml
NVLS=$CONFIGS/topologies/dgx_h100_nvls.yaml
BLOCK=$CONFIGS/blocks/small_block.yaml
printf 'arrival_s,prompt_tokens,output_tokens\n0,64,4\n0.01,32,4\n0.02,48,2\n0.5,16,3\n' >small.csv
SMALL_SERVE=(--requests small.csv)

# ---------------------------------------------------------------------------------------------------------------
kind 1  # an output never replaces what it points at: /dev/stdout, links to /dev/null, a FIFO, a regular file
mkfifo fifo; ln -s /dev/null to_null; ln -s fifo to_fifo; echo old >target.json; ln -s target.json to_file
for flag in --json --trace; do
  hc 0 'TTFT|ttft' -- $S serve "$SERVE" "${SMALL_SERVE[@]}" $flag /dev/stdout
  hc 0 'TTFT|ttft' -- $S serve "$SERVE" "${SMALL_SERVE[@]}" $flag to_null
  ok '[ -L to_null ] && [ -c /dev/null ]' "serve $flag: the link to /dev/null stays"
  hc 0 'TTFT|ttft' -- $S serve "$SERVE" "${SMALL_SERVE[@]}" $flag to_file
  ok '[ -L to_file ] && [ "$(head -c1 target.json)" = "{" ]' "serve $flag: the link stays, its target holds JSON"
  skip_kind || { (timeout 60 cat fifo >fifo.out 2>/dev/null &) ; sleep 0.2; }
  hc 0 'TTFT|ttft' -- $S serve "$SERVE" "${SMALL_SERVE[@]}" $flag to_fifo
  sleep 0.3; ok '[ -p fifo ] && [ -s fifo.out ]' "serve $flag: the FIFO got the output and stays a FIFO"
done
hc 0 'step' -- $S --chips 2 train "$MOE" --steps 1 --shape-only --plan ep=2 --json /dev/stdout
hc 0 'step' -- $S --chips 2 train "$MOE" --steps 1 --shape-only --plan ep=2 --trace to_file --trace-chips 0
ok '[ -L to_file ]' "train --trace to a link: the link stays"
hc 2 'stream|checkpoint' -- $S --chips 2 train "$MOE" --steps 1 --plan ep=2 --checkpoint /dev/stdout
hc 2 'stream|checkpoint' -- $S --chips 2 train "$MOE" --steps 1 --plan ep=2 --checkpoint to_null
ok '[ -L to_null ]' "--checkpoint to a link to /dev/null: refused, the link stays"

# ---------------------------------------------------------------------------------------------------------------
kind 2  # sizes that wrap: every list and product checked entry by entry
for v in 9223372036854775807 9223372036854775808 -1 0 1e300; do
  hc 2 'serve\.trace\.count' -- $S serve "$SERVE" --set serve.trace.count=$v
  hc 2 'serve\.max_num_seqs' -- $S serve "$SERVE" "${SMALL_SERVE[@]}" --set serve.max_num_seqs=$v
  hc 2 'serve\.block_size' -- $S serve "$SERVE" "${SMALL_SERVE[@]}" --set serve.block_size=$v
  hc 2 'parallel\.ep|ep' -- $S --chips 2 train "$MOE" --steps 1 --shape-only --plan ep=$v
  hc 2 'num_experts|moe' -- $S --chips 2 train "$MOE" --steps 1 --shape-only --set model.moe.experts=$v
done
hc 2 'pp_layers' -- $S --chips 4 train "$TRAIN" --steps 1 --shape-only --set model.layers=4 --plan pp=4 \
  --set 'parallel.pp_layers=[4611686018427387904,4611686018427387904,-9223372036854775808,4]'
printf 'arrival_s,prompt_tokens,output_tokens\n0,9223372036854775807,1\n' >big.csv
hc 2 'big\.csv:2' -- $S serve "$SERVE" --requests big.csv
printf 'arrival_s,prompt_tokens,output_tokens\n0,4,18446744073709551617\n' >wrap.csv
hc 2 'wrap\.csv:2' -- $S serve "$SERVE" --requests wrap.csv
hc 2 'trace-chips' -- $S --chips 2 train "$MOE" --steps 1 --shape-only --plan ep=2 --trace t.json --trace-chips 0-9223372036854775807
hc 2 'trace-chips' -- $S --chips 2 train "$MOE" --steps 1 --shape-only --plan ep=2 --trace t.json --trace-chips 99999999999999999999

# ---------------------------------------------------------------------------------------------------------------
kind 3  # every input figure bounded, every simulated figure finite
for v in nan inf -inf -1 1e300; do
  hc 2 'host_launch_ns' -- $S --chips 2 train "$TRAIN" --steps 1 --shape-only --plan dp=2 --device h100 --set device.host_launch_ns=$v
  hc 2 'serve\.trace\.rate' -- $S serve "$SERVE" "${SMALL_SERVE[@]}" --set serve.trace.rate=$v
  hc 2 'serve\.memory_fraction' -- $S serve "$SERVE" "${SMALL_SERVE[@]}" --set serve.memory_fraction=$v
  hc 2 'serve\.slo\.ttft_ms' -- $S serve "$SERVE" "${SMALL_SERVE[@]}" --set serve.slo.ttft_ms=$v
  hc 2 'capacity' -- $S --chips 2 train "$MOE" --steps 1 --shape-only --plan ep=2 --set model.moe.capacity_factor=$v
done
for v in nan inf -1 1e300; do
  hc 2 'swap_space_gib|host_link_gbps' -- $S serve "$SERVE" "${SMALL_SERVE[@]}" --set serve.preemption=swap --set serve.swap_space_gib=$v
  hc 2 'host_link_gbps' -- $S serve "$SERVE" "${SMALL_SERVE[@]}" --set serve.preemption=swap --set serve.host_link_gbps=$v
  hc 2 'what-if' -- $S --chips 2 train "$TRAIN" --steps 1 --shape-only --plan dp=2 --device h100 --what-if "host_launch_ns=${v}x"
  hc 2 'bandwidth' -- $S serve "$SERVE" "${SMALL_SERVE[@]}" --bandwidth $v
done
for a in nan inf -1 1e400; do
  printf 'arrival_s,prompt_tokens,output_tokens\n%s,4,4\n' "$a" >arr.csv
  hc 2 'arr\.csv:2' -- $S serve "$SERVE" --requests arr.csv
done
hc 2 'trace-window' -- $S --chips 2 train "$MOE" --steps 1 --shape-only --plan ep=2 --trace t.json --trace-window nan:1
hc 2 'trace-max-mib' -- $S --chips 2 train "$MOE" --steps 1 --shape-only --plan ep=2 --trace t.json --trace-max-mib nan

# ---------------------------------------------------------------------------------------------------------------
kind 4  # in-switch reduction under the profiler: the path covers the step, chips only
hc 0 'waiting' -- $S --chips 8 train "$TRAIN" --steps 1 --shape-only --topology "$NVLS" --set model.batch=8 --plan dp=8 \
  --set parallel.algorithm=in_switch --profile
ok '! grep -q "chip 8\b\|chip 9\b\|chip 1[0-9]\b" '"$LAST_OUT" "the in-switch path names only chips 0-7"

# ---------------------------------------------------------------------------------------------------------------
kind 5  # two outputs never name one file
hc 2 '--json|--trace' -- $S serve "$SERVE" "${SMALL_SERVE[@]}" --json same.json --trace ./same.json
ok '[ ! -e same.json ]' "serve --json X --trace ./X: nothing written"
cp "$SERVE" myserve.yaml
hc 2 'config' -- $S serve myserve.yaml "${SMALL_SERVE[@]}" --json myserve.yaml
ok 'cmp -s myserve.yaml "$SERVE"' "serve --json over its config: the config intact"
printf 'arrival_s,prompt_tokens,output_tokens\n0,4,4\n' >req.csv; cp req.csv req.bak
hc 2 'requests|--json' -- $S serve "$SERVE" --requests req.csv --json req.csv
ok 'cmp -s req.csv req.bak' "serve --json over its --requests file: the trace intact"
hc 2 '--plots|--json' -- $S --chips 2 train "$TRAIN" --steps 1 --shape-only --plan dp=2 --plots pl --json pl/utilisation.gp

# ---------------------------------------------------------------------------------------------------------------
kind 6  # untrusted text escaped in every echo
printf 'arrival_s,prompt_tokens,output_tokens\n0,\033]0;PWNED\007,4\n' >esc.csv
hc 2 'esc\.csv:2' -- $S serve "$SERVE" --requests esc.csv
printf 'arrival_s,prompt\033[2J_tokens,output_tokens\n0,4,4\n' >eschead.csv
hc 2 'eschead\.csv' -- $S serve "$SERVE" --requests eschead.csv
printf '{"arrival_s": 0, "prompt_tokens": "\\u001b[2J", "output_tokens": 4}\n' >esc.jsonl
hc 2 'esc\.jsonl:1' -- $S serve "$SERVE" --requests esc.jsonl
cp "$SERVE" $'n\033[2Jame.yaml'
hc 0 'TTFT|ttft' -- $S serve $'n\033[2Jame.yaml' "${SMALL_SERVE[@]}"
sed 's/^name: .*/name: "x\\e]0;PWNED\\a"/' "$SERVE" >escname.yaml
hc 2 'name' -- $S serve escname.yaml "${SMALL_SERVE[@]}"
hc 2 'serve\.policy' -- $S serve "$SERVE" --set $'serve.policy=\033[2Jx'
hc 2 'kernel_fusion' -- $S --chips 2 train "$TRAIN" --steps 1 --shape-only --plan dp=2 --set $'device.kernel_fusion=\033]0;x\007'
hc 2 'requests|cannot open' -- $S serve "$SERVE" --requests $'/nonexistent/\033[2Jx.csv'

# ---------------------------------------------------------------------------------------------------------------
kind 7  # refused before the run, FILE:LINE, exit 2
echo notadir >afile
for a in in_switch torus rail_ring multi_ring torus_concurrent; do
  hc 2 "parallel\.algorithm: '$a' cannot run" -- $S --chips 4 train "$TRAIN" --steps 1 --plan tp=2,dp=2 --set parallel.algorithm=$a
  ok '! grep -q "^  step" '"$LAST_OUT" "train $a: refused before the step header"
done
for a in in_switch nvls; do  # the MoE, serve and forward-mode paths (groups that are the whole ring: torus would run)
  hc 2 "parallel\.algorithm: '$a' cannot run" -- $S --chips 4 train "$MOE" --steps 1 --shape-only --plan ep=2,tp=2 --set parallel.algorithm=$a
  hc 2 "parallel\.algorithm" -- $S serve "$SERVE70" --chips 8 "${SMALL_SERVE[@]}" --ring 8 --set parallel.algorithm=$a
  hc 2 "parallel\.algorithm" -- $S --chips 4 run "$BLOCK" --set parallel.algorithm=$a
done
printf 'parallel:\n  tp: 2\n  dp: 2\n  algorithm: in_switch\n' >algo.yaml
sed '/^parallel:/,$d' "$TRAIN" >algo_train.yaml; cat algo.yaml >>algo_train.yaml
L=$(grep -n 'algorithm: in_switch' algo_train.yaml | cut -d: -f1)
hc 2 "algo_train\.yaml:$L: parallel\.algorithm" -- $S --chips 4 train algo_train.yaml --steps 1
hc 2 "--plan.*parallel\.algorithm" -- $S --chips 4 train "$TRAIN" --steps 1 --plan tp=2,dp=2,algorithm=in_switch
for a in double_binary_tree recursive_doubling halving_doubling bidir_ring; do  # where implemented, else auto
  hc 0 'step' -- $S --chips 4 train "$TRAIN" --steps 1 --plan tp=2,dp=2 --set parallel.algorithm=$a
  hc 0 'step' -- $S --chips 4 train "$TRAIN" --steps 1 --plan dp=2,tp=2,zero=1 --set parallel.algorithm=$a
done
hc 0 'step' -- $S --chips 8 train "$TRAIN" --steps 1 --topology "$NVLS" --set model.batch=8 --plan dp=8 --set parallel.algorithm=in_switch
for flag in --json --trace; do
  hc 2 "afile.*not a directory" -- $S serve "$SERVE" "${SMALL_SERVE[@]}" $flag afile/x.json
  hc 2 "afile.*not a directory" -- $S --chips 2 train "$MOE" --steps 1 --shape-only --plan ep=2 $flag afile/x.json
done
hc 2 "afile.*[Nn]ot a directory" -- $S --chips 2 train "$TRAIN" --steps 1 --shape-only --plan dp=2 --plots afile/pl
hc 2 "afile.*not a directory" -- $S --chips 2 train "$MOE" --steps 1 --plan ep=2 --checkpoint afile/c.h5
hc 2 "afile.*not a directory" -- $S --chips 2 profile "$TRAIN" --plan dp=2 --json afile/p.json
hc 2 'fold' -- $S --chips 4 train "$TRAIN" --steps 1 --shape-only --plan dp=4 --set model.batch=4 --set fold=on --set parallel.algorithm=halving_doubling

# ---------------------------------------------------------------------------------------------------------------
kind 8  # nonsense refused
for p in 'ep=' 'ep=2,ep=2' 'ep=0' 'ep=-2' 'ep=2x' 'ep=1.5' 'etp=3' ',' 'ep=2,' '=2'; do
  hc 2 'plan' -- $S --chips 2 train "$MOE" --steps 1 --shape-only --plan "$p"
done
for k in 'device.kernel_fusion=maybe' 'device.launch_mode=lazy' 'device.kernel_fusion=' 'model.moe.top_k=0' \
         'model.moe.top_k=999' 'model.moe.router=bogus' 'model.moe.experts=[1,2]'; do
  hc 2 "${k%%=*}" -- $S --chips 2 train "$MOE" --steps 1 --shape-only --plan ep=2 --set "$k"
done
for k in 'serve.policy=bogus' 'serve.preemption=maybe' 'serve.trace.arrival=sometimes' 'serve.trace.prompt.kind=zipf' \
         'serve.bogus=1' 'serve.trace.prompt.min=4096' 'serve.slo=[1]'; do
  hc 2 "${k%%=*}|serve" -- $S serve "$SERVE" "${SMALL_SERVE[@]}" --set "$k"
done
# A valid serve.trace key under --requests: checked, then replaced (the report says so).
hc 0 "replacing the config's serve.trace" -- $S serve "$SERVE" "${SMALL_SERVE[@]}" --set serve.trace.prompt.min=100
hc 2 'MoE|moe' -- $S serve "$SERVE" "${SMALL_SERVE[@]}" --set model.moe.experts=4
printf 'arrival_s,prompt_tokens\n0,4\n' >nocol.csv
hc 2 'nocol\.csv' -- $S serve "$SERVE" --requests nocol.csv
printf 'arrival_s,prompt_tokens,output_tokens\n' >empty.csv
hc 2 'empty\.csv' -- $S serve "$SERVE" --requests empty.csv
printf 'arrival_s,prompt_tokens,output_tokens\n1,4,4\n0,4,4\n' >order.csv
hc 2 'order\.csv:3' -- $S serve "$SERVE" --requests order.csv
printf 'arrival_s,prompt_tokens,output_tokens\n0,4.5,4\n' >frac.csv
hc 2 'frac\.csv:2' -- $S serve "$SERVE" --requests frac.csv
printf 'arrival_s,prompt_tokens,output_tokens\n0,0x10,4\n' >hex.csv
hc 2 'hex\.csv:2' -- $S serve "$SERVE" --requests hex.csv
hc 2 'requests|regular file|directory' -- $S serve "$SERVE" --requests fifo
hc 2 'requests|regular file|directory' -- $S serve "$SERVE" --requests /dev/zero
hc 2 'requests|regular file|directory' -- $S serve "$SERVE" --requests .
for f in '0:-1' '5:1' 'a:b' '' '1:1:1'; do
  hc 2 'trace-window' -- $S --chips 2 train "$MOE" --steps 1 --shape-only --plan ep=2 --trace t.json --trace-window "$f"
done
hc 2 'trace-axis' -- $S --chips 2 train "$MOE" --steps 1 --shape-only --plan ep=2 --trace t.json --trace-axis bogus
hc 2 'trace-step' -- $S --chips 2 train "$MOE" --steps 1 --shape-only --plan ep=2 --trace t.json --trace-step 0
hc 2 'trace-step' -- $S --chips 2 train "$MOE" --steps 1 --shape-only --plan ep=2 --trace t.json --trace-step 5
hc 2 'trace-chips' -- $S --chips 2 train "$MOE" --steps 1 --shape-only --plan ep=2 --trace t.json --trace-chips 0,0
hc 2 'trace-chips' -- $S --chips 2 train "$MOE" --steps 1 --shape-only --plan ep=2 --trace t.json --trace-chips 2

# ---------------------------------------------------------------------------------------------------------------
kind 9  # messages say what to fix
hc 2 'chips' -- $S --chips 3 serve "$SERVE70" "${SMALL_SERVE[@]}"
ok '! grep -q "on chip [0-9]" '"$LAST_OUT" "serve on the wrong chip count: not 'error on chip N'"
hc 2 'ep' -- $S --chips 3 train "$MOE" --steps 1 --shape-only --plan ep=2
ok '! grep -q "mpirun -np" '"$LAST_OUT" "one rank: no mpirun advice"
hc 2 'serve' -- $S serve "$TRAIN"
hc 2 'serve' -- $S serve "$MOE" "${SMALL_SERVE[@]}"

# ---------------------------------------------------------------------------------------------------------------
kind 13  # trace filters: what was asked, the size first
hc 0 'events' -- $S --chips 2 train "$MOE" --steps 1 --shape-only --plan ep=2 --trace t.json --trace-chips 1
ok 'python3 -c "import json,sys; d=json.load(open(\"t.json\")); sys.exit(0 if d else 1)"' "filtered trace is JSON"
hc 0 'step' -- $S --chips 2 train "$MOE" --steps 1 --shape-only --plan ep=2 --trace t2.json --trace-max-mib 0.000001
ok '[ ! -e t2.json ]' "--trace-max-mib tiny: nothing written"

# ---------------------------------------------------------------------------------------------------------------
kind 14  # what-if and --set on stacked topologies
hc 2 'dim7' -- $S --chips 2 train "$TRAIN" --steps 1 --shape-only --plan dp=2 --what-if dim7.bandwidth=2x
hc 2 'dims\[' -- $S --chips 2 train "$TRAIN" --steps 1 --shape-only --plan dp=2 --set 'topology.dims[-1].bandwidth_gbps=1'
hc 2 'dims\[' -- $S --chips 2 train "$TRAIN" --steps 1 --shape-only --plan dp=2 --set 'topology.dims[99999999999999999999].bandwidth_gbps=1'

# ---------------------------------------------------------------------------------------------------------------
kind 15  # small things
hc 0 'config|devices|plans' -- $S help
hc 0 'ep' -- $S help plans
hc 0 'serve' -- $S serve --help

# ---------------------------------------------------------------------------------------------------------------
kind disk  # a full disk: exit 3, one line, nothing under the final name (needs a tmpfs mount: root)
if mkdir -p full && mount -t tmpfs -o size=64k tmpfs full 2>/dev/null; then
  dd if=/dev/zero of=full/fill bs=4k count=1000 2>/dev/null
  hc 3 'No space left' -- $S serve "$SERVE" "${SMALL_SERVE[@]}" --json full/s.json
  ok '[ ! -e full/s.json ] && [ -z "$(ls full | grep -v fill)" ]' "serve --json on a full disk: nothing left"
  hc 3 'No space left' -- $S serve "$SERVE" "${SMALL_SERVE[@]}" --trace full/s.trace.json
  hc 3 'No space left' -- $S --chips 2 train "$MOE" --steps 1 --plan ep=2 --checkpoint full/c.h5
  ok '[ -z "$(ls full | grep -v fill)" ]' "train --checkpoint on a full disk: no temporary left"
  umount full
fi

# ---------------------------------------------------------------------------------------------------------------
kind kill  # kill -9 in a MoE save: the previous checkpoint intact
if ! skip_kind; then
  hc 0 'saved' -- $S --chips 2 train "$MOE" --steps 2 --plan ep=2 --checkpoint moe.h5
  cp moe.h5 moe.bak
  timeout -s KILL 1 $S --chips 2 train "$MOE" --steps 200 --save-every 1 --plan ep=2 --checkpoint moe.h5 >/dev/null 2>&1
  hc 0 'verified|tensors' -- $S ckpt inspect moe.h5
  hc 0 'step' -- $S --chips 2 train "$MOE" --steps 201 --plan ep=2 --resume moe.h5
fi

# ---------------------------------------------------------------------------------------------------------------
kind conc  # concurrent runs on one output
if ! skip_kind; then
  for i in 1 2 3; do $S serve "$SERVE" "${SMALL_SERVE[@]}" --json conc.json >/dev/null 2>&1 & done; wait
  ok 'python3 -c "import json; json.load(open(\"conc.json\"))"' "three serves onto one --json: a complete JSON file"
  ok '[ -z "$(ls | grep conc.json.partial)" ]' "no temporaries left"
  $S --chips 2 train "$MOE" --steps 1000000 --plan ep=2 --checkpoint cc.h5 >first.out 2>&1 &
  first=$!
  sleep 2
  hc 2 'in use|lock' -- $S --chips 2 train "$MOE" --steps 2 --plan ep=2 --checkpoint cc.h5
  kill -TERM $first; wait $first
fi

hostile_summary

#!/usr/bin/env bash
# Prints every published simulated number of the repository's configs, one line per run, so two builds can be
# compared: "every published number unchanged" is an empty diff.
#   bash scripts/published_numbers.sh [SHARDSIM_BINARY [REGEX]] > before.txt     # e.g. main's build
#   (REGEX: only the runs whose line name matches, grep -E; e.g. '^train' or 'blocks/llama3')
#   bash scripts/published_numbers.sh build/apps/shardsim > after.txt
#   diff before.txt after.txt
# What runs (on one MPI rank with --chips N, so the simulated numbers are those of N ranks; docs/ARCHITECTURE.md
# "Several chips per rank"; the fused MLP, whose async collectives need one chip per rank, on N ranks), and what each line holds (simulated, us, 3 decimals; nothing wall-clock):
#   run  configs/workloads/* (real data, validated; the default job is workloads/llama2_7b_mlp_tp8), configs/blocks/*
#        and configs/models/*_64 and *_256 (shape-only: the same simulated figures as real data, docs/ARCHITECTURE.md
#        "Shape-only mode for workloads"; REAL=1 runs the blocks with real data and validates them, ~1-2 min each
#        here): total, compute, communication, exposed communication of the critical chip, critical chip, verdict
#   train configs/lm_train.yaml (one chip, 3 steps), every row of docs/performance/training.md's dp4 ZeRO / tp / recompute
#        tables (configs/lm_train_dp4.yaml, shape-only, the row's edit as --plan / --set) and of its Llama-3-8B
#        64-chip table (configs/lm_llama3_8b_64chips.yaml, shape-only): step, compute, exposed communication,
#        tokens/s, MFU (%), per-chip training state (MB); configs/models/llama3_70b_train_256.yaml likewise
# Skipped (slow on a 2-core host, a few minutes each): configs/models/*_1024 (set ALL=1 to include them).
# Needs python3 (reads the --json report). A run that fails prints "NAME: failed: <its first error line>".
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="$(realpath "${1:-$ROOT/build/apps/shardsim}")"
ONLY="${2:-}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
source "$ROOT/scripts/mpi_env.sh"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
cd "$WORK" || exit 2

chips_of() {  # the chips of a config's topology: section (inline, or a file next to the config: topo describe)
  local t
  t=$(python3 - "$1" <<'PY'
import math, os, sys, yaml
c = yaml.safe_load(open(sys.argv[1]))
t = c.get('topology')
if t is None: print(1)
elif isinstance(t, str): print('FILE', os.path.join(os.path.dirname(sys.argv[1]), t))
elif 'chips' in t: print(t['chips'])
elif 'dims' in t: print(math.prod(t['dims']))
else: print(0)
PY
)
  case "$t" in
    FILE*) mpirun -q -np 1 "$BIN" topo describe "${t#FILE }" --json "$WORK/topo.json" >/dev/null 2>&1 </dev/null
           python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["chips"])' "$WORK/topo.json" ;;
    *) echo "$t" ;;
  esac
}

report() {  # NAME JSON MODE: one line of the report's simulated figures
  python3 - "$2" "$1" "$3" 2>/dev/null <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
name, mode = sys.argv[2], sys.argv[3]
s = r["simulated"]
if mode == "run":
  b = s.get("breakdown", s)
  f = lambda k: b[k] / 1e3
  print(f'run   {name:<58} {r.get("chips", 0):>5} {f("total_ns"):12.3f} {f("compute_ns"):12.3f} '
        f'{f("communication_ns"):12.3f} {f("exposed_comm_ns"):12.3f} {s["critical_chip"]:>5} {r["verdict"]}')
else:
  t = r["train"]
  step = t["steps"][-1] if t.get("steps") else {}
  state = t.get("memory_per_chip", {}).get("total_bytes", 0) / 1e6
  print(f'train {name:<58} {r.get("chips", 0):>5} {t["step_ns"] / 1e3:12.3f} {step.get("compute_ns", 0) / 1e3:12.3f} '
        f'{step.get("exposed_comm_ns", 0) / 1e3:12.3f} {t["tokens_per_s"]:12.6g} {100 * t["mfu"]:8.3f}% '
        f'{state:10.3f}MB')
PY
}

run_one() {  # MODE NAME CHIPS ARGS...: runs shardsim and prints the line
  local mode="$1" name="$2" chips="$3"
  shift 3
  [ -z "$ONLY" ] || printf '%s %s\n' "$mode" "$name" | grep -Eq -- "$ONLY" || return 0
  local out="$WORK/out.txt" json="$WORK/r.json" launch=(-np 1 "$BIN" --chips "$chips")
  # The fused MLP's gemm_all_reduce uses async collectives, which need one chip per rank.
  case "$name" in *mlp*fused*) launch=(-np "$chips" --oversubscribe "$BIN") ;; esac
  rm -f "$json"
  mpirun -q "${launch[@]}" "$mode" "$@" --json "$json" >"$out" 2>&1 </dev/null
  report "$name" "$json" "$mode" || echo "$mode  $name: failed: $(grep -m1 -i 'error' "$out" || tail -1 "$out")"
}

printf '%-5s %-58s %5s %12s %12s %12s %12s %5s %s\n' mode config chips "total(us)" "compute(us)" "comm(us)" \
  "exposed(us)" chip "verdict | train: tokens/s MFU state"
for cfg in "$ROOT"/configs/workloads/*.yaml; do
  run_one run "workloads/$(basename "$cfg" .yaml)" "$(chips_of "$cfg")" "$cfg" --no-checkpoint
done
for cfg in "$ROOT"/configs/blocks/*.yaml; do
  if [ "${REAL:-0}" = 1 ]; then
    run_one run "blocks/$(basename "$cfg" .yaml)" "$(chips_of "$cfg")" "$cfg" --no-checkpoint
  else
    run_one run "blocks/$(basename "$cfg" .yaml) (shape-only)" "$(chips_of "$cfg")" "$cfg" --no-checkpoint --shape-only
  fi
done
for cfg in "$ROOT"/configs/models/*.yaml; do
  case "$cfg" in *_train_*.yaml) continue ;; esac  # training configs: `train` rows below
  case "$cfg" in *_1024.yaml) [ "${ALL:-0}" = 1 ] || { [ -n "$ONLY" ] || echo "run   models/$(basename "$cfg" .yaml): skipped (slow; ALL=1)"; continue; } ;; esac
  run_one run "models/$(basename "$cfg" .yaml) (shape-only)" "$(chips_of "$cfg")" "$cfg" --no-checkpoint --shape-only
done

run_one train "lm_train (1 chip, 3 steps)" 1 "$ROOT/configs/lm_train.yaml" --steps 3
DP4="$ROOT/configs/lm_train_dp4.yaml"
while IFS='|' read -r label args; do
  # shellcheck disable=SC2086
  run_one train "lm_train_dp4 $label" 4 "$DP4" --shape-only $args
done <<'ROWS'
zero0 bucket1M|
zero0 bucket0|--set parallel.bucket_bytes=0
zero1 bucket1M|--set parallel.zero=1
zero1 bucket0|--set parallel.zero=1 --set parallel.bucket_bytes=0
zero2 bucket1M|--set parallel.zero=2
zero2 bucket0|--set parallel.zero=2 --set parallel.bucket_bytes=0
zero3|--set parallel.zero=3
zero0 recompute|--set parallel.recompute=true
dp2xtp2 zero0 bucket0|--plan dp=2,tp=2 --set parallel.bucket_bytes=0
dp2xtp2 zero0|--plan dp=2,tp=2
dp2xtp2 zero1|--plan dp=2,tp=2 --set parallel.zero=1
dp2xtp2 zero2|--plan dp=2,tp=2 --set parallel.zero=2
dp2xtp2 zero3|--plan dp=2,tp=2 --set parallel.zero=3
dp2xtp2 zero0 recompute|--plan dp=2,tp=2 --set parallel.recompute=true
dp2xtp2 zero3 recompute|--plan dp=2,tp=2 --set parallel.zero=3 --set parallel.recompute=true
tp4|--plan dp=1,tp=4
tp4 recompute|--plan dp=1,tp=4 --set parallel.recompute=true
dp2xtp2 sp bucket0|--plan dp=2,tp=2,sp=true --set parallel.bucket_bytes=0
dp2xtp2 sp zero0|--plan dp=2,tp=2,sp=true
dp2xtp2 sp zero1|--plan dp=2,tp=2,sp=true --set parallel.zero=1
tp4 sp|--plan dp=1,tp=4,sp=true
tp4 sp fused|--plan dp=1,tp=4,sp=true --set parallel.fused=true
dp2xtp2 sp zero1 fused|--plan dp=2,tp=2,sp=true --set parallel.zero=1 --set parallel.fused=true
dp2xcp2 zigzag|--plan dp=2,cp=2
dp2xcp2 contiguous|--plan dp=2,cp=2,cp_split=contiguous
dp2xulysses2|--plan dp=2,ulysses=2
cp4 zigzag|--plan dp=1,cp=4
cp4 contiguous|--plan dp=1,cp=4,cp_split=contiguous
cp2xtp2|--plan dp=1,cp=2,tp=2
ulysses4|--plan dp=1,ulysses=4
ROWS
L8B="$ROOT/configs/lm_llama3_8b_64chips.yaml"
while IFS='|' read -r label args; do
  # shellcheck disable=SC2086
  run_one train "llama3_8b_64chips $label" 64 "$L8B" --shape-only --steps 1 $args
done <<'ROWS'
config (zero1 sp)|
zero0|--set parallel.zero=0
zero3|--set parallel.zero=3
sp false|--set parallel.sp=false
recompute|--set parallel.recompute=true
fused|--set parallel.fused=true
dp4 ulysses2|--set parallel.dp=4 --set parallel.ulysses=2
dp4 ulysses2 fused|--set parallel.dp=4 --set parallel.ulysses=2 --set parallel.fused=true
dp4 cp2 zigzag|--set parallel.dp=4 --set parallel.cp=2
dp4 cp2 contiguous|--set parallel.dp=4 --set parallel.cp=2 --set parallel.cp_split=contiguous
ROWS
# The Llama-3-70B pipeline config (pp4 x dp8 x tp8, 1F1B; a row of docs/performance/training.md's plan sweep, ~1 min).
run_one train "llama3_70b_train_256 (pp4 1f1b)" 256 "$ROOT/configs/models/llama3_70b_train_256.yaml" --shape-only --steps 1

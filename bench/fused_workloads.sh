#!/usr/bin/env bash
# Fused vs unfused tensor-parallel collectives in whole workloads (issue 6), simulated: the Llama-2-7B MLP (tp 8)
# at every chunk count and auto, on the default 8-chip ring (100 GB/s, 1 us per hop) and on a lower-latency ring
# (120 GB/s, 200 ns) where the down projection and its all_reduce are balanced; and the Llama-2-7B block under tp8
# and tp4+sp. One line per run, shape-only (the fused paths are validated by the tests; `shardsim run` of the same
# configs validates). For docs/performance/workloads.md. Usage: bash bench/fused_workloads.sh
# (ONLY=REGEX runs only the lines whose label matches.)
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
source "$ROOT/scripts/mpi_env.sh"  # one host: shared memory only
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

# run LABEL NP CONFIG PARALLEL_LINES [SED]: CONFIG with its parallel: section replaced by PARALLEL_LINES.
run() {
  local label=$1 np=$2 cfg=$3 par=$4 extra=${5:-}
  if [ -n "${ONLY:-}" ] && ! [[ $label =~ $ONLY ]]; then return; fi
  awk -v par="$par" '/^parallel:/ {print "parallel:"; n = split(par, l, ";"); for (i = 1; i <= n; i++) print "  " l[i]; skip = 1; next}
       skip && /^  / {next} {skip = 0; print}' "$cfg" | sed 's/^  enabled: true/  enabled: false/' >"$WORK/c.yaml"
  [ -n "$extra" ] && sed -i "$extra" "$WORK/c.yaml"
  # Shape-only on one MPI rank hosting every chip: the real-data runs' simulated figures, in about a second each.
  mpirun -q -np 1 "$ROOT/build/apps/shardsim" --chips "$np" run "$WORK/c.yaml" --shape-only --no-checkpoint \
    --json "$WORK/r.json" >"$WORK/out" 2>&1 || { echo "$label: failed: $(tail -2 "$WORK/out")"; return; }
  python3 - "$WORK/r.json" "$label" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); s = r["simulated"]
b = s.get("breakdown", s)
total, exposed = b["total_ns"], b["exposed_comm_ns"]
f = s.get("fused")
if f:
    t = f["sum"]
    chunks = "/".join(f'{o["chunks"]}{"a" if o.get("auto_chunks") else ""}' for o in f["ops"])
    print(f'{sys.argv[2]:<34} {total/1e3:10.1f} {exposed/1e3:10.1f} {chunks:>9} {t["compute_ns"]/1e3:10.1f} {t["comm_ns"]/1e3:10.1f} '
          f'{t["fused_ns"]/1e3:10.1f} {t["unfused_ns"]/1e3:10.1f} {t["overlap_efficiency"]:8.2f} {t["fused_ns"]/max(t["compute_ns"], t["comm_ns"]):9.3f} '
          f'{f["run_speedup"]:8.3f}')
else:
    print(f'{sys.argv[2]:<34} {total/1e3:10.1f} {exposed/1e3:10.1f} {"-":>9}')
PY
}

printf '%-34s %10s %10s %9s %10s %10s %10s %10s %8s %9s %8s\n' run "total(us)" "exposed" chunks "T_comp" "T_comm" \
  "T_fused" "unfused" "overlap" "/max(c,m)" "speedup"
MLP="$ROOT/configs/workloads/llama2_7b_mlp_tp8.yaml"
for net in "default ring 100GB/s 1us|" "ring 120GB/s 200ns|s/bandwidth_gbps: 100/bandwidth_gbps: 120/; s/latency_ns: 1000/latency_ns: 200/"; do
  IFS='|' read -r nlabel nsed <<<"$net"
  run "mlp tp8 $nlabel unfused" 8 "$MLP" "tp: 8" "$nsed"
  for c in 1 2 4 8 16 32 auto; do run "mlp tp8 $nlabel fused c=$c" 8 "$MLP" "tp: 8;fused: true;chunks: $c" "$nsed"; done
done
B7=$ROOT/configs/blocks
run "block llama2-7b tp8 unfused" 8 "$B7/llama2_7b_tp8.yaml" "tp: 8"
run "block llama2-7b tp8 fused auto" 8 "$B7/llama2_7b_tp8.yaml" "tp: 8;fused: true"
run "block llama2-7b tp4+sp unfused" 4 "$B7/llama2_7b_tp4_sp.yaml" "tp: 4;sp: true"
run "block llama2-7b tp4+sp fused" 4 "$B7/llama2_7b_tp4_sp.yaml" "tp: 4;sp: true;fused: true"

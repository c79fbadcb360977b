#!/usr/bin/env bash
# Runs the default job RUNS times (default 3) and prints wall and simulated figures, for docs/performance/workloads.md.
# Usage: bash bench/default_job.sh [RUNS] [CONFIG]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RUNS="${1:-3}"
CONFIG="$(realpath "${2:-$ROOT/configs/workloads/llama2_7b_mlp_tp8.yaml}")"
NP="${NP:-8}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
source "$ROOT/scripts/mpi_env.sh"  # one host: shared memory only
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
echo "config: $CONFIG  ranks: $NP  host: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
printf '%-4s %10s %10s %10s %10s %10s | %12s %12s %12s %9s %8s\n' run wall_s init_s fwd_s ref_s ckpt_s sim_total_us sim_comp_us sim_comm_us TFLOP/s verdict
for i in $(seq 1 "$RUNS"); do
  /usr/bin/time -f "%e" -o time.txt mpirun -np "$NP" --oversubscribe "$ROOT/build/apps/shardsim" run "$CONFIG" \
    --json r.json --checkpoint ckpt.h5 > out.txt
  python3 - "$i" "$(cat time.txt)" <<'PY'
import json, sys
r = json.load(open("r.json"))
s, w = r["simulated"], r["wall"]
b = s["breakdown"]
print(f'{sys.argv[1]:<4} {float(sys.argv[2]):10.2f} {w["init_s"]:10.3f} {w["forward_s"]:10.3f} {w["reference_s"]:10.3f} {w["checkpoint_s"]:10.3f} | '
      f'{b["total_ns"]/1e3:12.3f} {b["compute_ns"]/1e3:12.3f} {b["communication_ns"]/1e3:12.3f} {s["tflops"]:9.2f} {r["verdict"]:>8}')
PY
done

#!/usr/bin/env bash
# Runs every configs/blocks/llama*.yaml (Llama-2-7B / Llama-3-8B-shaped blocks under tp8, tp4+sp, cp8 zig-zag,
# cp8 contiguous, ulysses8, tp2 x cp4 on a 2x4 torus), each validated against one device, and prints one line
# per run with the simulated figures. For docs/performance/workloads.md. Usage: bash bench/blocks.sh [PATTERN]
# SHAPE_ONLY=1: shape-only runs (the same simulated figures, in about a second each; no validation: rel.err "-").
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
source "$ROOT/scripts/mpi_env.sh"  # one host: shared memory only
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
printf '%-28s %5s %12s %12s %12s %12s %8s %10s %9s %s\n' config chips "total(us)" "compute(us)" "attn(us)" \
  "exposed(us)" balance "comm MiB" "rel.err" verdict
for cfg in "$ROOT"/configs/blocks/llama*${1:-}*.yaml; do
  np=$(python3 -c "import yaml,sys; t=yaml.safe_load(open(sys.argv[1]))['topology']; import math; print(t.get('chips') or math.prod(t['dims']))" "$cfg")
  name=$(basename "$cfg" .yaml)
  # One MPI rank hosting every chip (the simulated figures equal a rank per chip's; far lighter on a loaded host).
  mpirun -q -np 1 "$ROOT/build/apps/shardsim" --chips "$np" run "$cfg" ${SHAPE_ONLY:+--shape-only} \
    --json "$WORK/$name.json" >"$WORK/$name.out" 2>&1
  python3 - "$WORK/$name.json" "$name" "$np" <<'PY' || echo "$name: failed: $(tail -2 "$WORK/$name.out")"
import json, sys
r = json.load(open(sys.argv[1])); s = r["simulated"]
comm = sum(c["bytes_per_chip"] for c in r["communication"].values()) / 2**20
t = s["per_chip_total_ns"]
v = r["validation"]
rel = f'{v["max_abs_error"] / v["max_abs_reference"]:9.2e}' if v["enabled"] and v["max_abs_reference"] else f'{"-":>9}'
print(f'{sys.argv[2]:<28} {sys.argv[3]:>5} {s["total_ns"]/1e3:12.1f} {s["compute_ns"]/1e3:12.1f} {s["attention_ns"]/1e3:12.1f} '
      f'{s["exposed_comm_ns"]/1e3:12.1f} {min(t)/max(t):8.3f} {comm:10.2f} {rel} {r["verdict"]}')
PY
done

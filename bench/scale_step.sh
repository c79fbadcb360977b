#!/usr/bin/env bash
# Wall time and peak host memory of one Llama-3-405B-shaped training step against chips, on one rank hosting
# every chip (docs/performance/scale.md). bench/llama3_405b_train_tp8_dp.yaml with dp = chips / 8 and 2
# sequences per replica, on N/16 nodes of 16 chips (4x4 torus, 100 GB/s links) joined by a switch (50 GB/s).
# Usage: [PP=16 LAYERS=126 SEQS=16 FOLD=off] bash bench/scale_step.sh [CHIPS...]   (default: 512 1024 2048)
#   PP: pipeline stages (default 1: the pipeline folded into data parallelism; PP > 1 runs 1F1B, one sequence per
#   micro-batch), LAYERS: model layers (default the config's 2), SEQS: sequences per replica (default 2),
#   FOLD=off: every chip simulated (train --no-fold; default: the run's fold: auto, docs/performance/fold.md).
# Prints per size: chips, wall (s, /usr/bin/time), peak RSS (MiB), simulated step (us), the exit code (2 when the
# plan does not fit the HBM: the step is still simulated and printed); then the fitted growth exponent of wall and
# RSS (least squares on log-log) over the sizes that printed a step.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${SHARDSIM:-$ROOT/build/apps/shardsim}"
if [ $# -eq 0 ]; then SIZES=(512 1024 2048); else SIZES=("$@"); fi
PP=${PP:-1}
SEQS=${SEQS:-2}
EXTRA=()
[ -n "${LAYERS:-}" ] && EXTRA+=(--set model.layers="$LAYERS")
[ "$PP" -gt 1 ] && EXTRA+=(--set parallel.pp="$PP" --set parallel.schedule=1f1b)
[ "${FOLD:-auto}" = off ] && EXTRA+=(--no-fold)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
source "$ROOT/scripts/mpi_env.sh"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
printf '%7s %9s %9s %14s %3s\n' chips wall_s rss_mib sim_step_us rc
for n in "${SIZES[@]}"; do
  cat > "$WORK/topo.yaml" <<T
topology:
  kind: stacked
  dims:
    - {kind: switch, size: $((n / 16)), bandwidth_gbps: 50, latency_ns: 5000}
    - {kind: ring, size: 4, bandwidth_gbps: 100, latency_ns: 500}
    - {kind: ring, size: 4, bandwidth_gbps: 100, latency_ns: 500}
T
  /usr/bin/time -f "%e %M" -o "$WORK/time.txt" mpirun -np 1 "$BIN" --chips "$n" train \
    "$ROOT/bench/llama3_405b_train_tp8_dp.yaml" --topology "$WORK/topo.yaml" \
    --set parallel.dp=$((n / (8 * PP))) --set model.batch=$((n / (8 * PP) * SEQS)) ${EXTRA[@]+"${EXTRA[@]}"} \
    --json "$WORK/r.json" > "$WORK/out.txt" 2> "$WORK/err.txt"
  rc=$?
  read -r wall rss < <(tail -1 "$WORK/time.txt")
  step=$(python3 -c "import json; print('%.3f' % (json.load(open('$WORK/r.json'))['simulated']['breakdown']['total_ns'] / 1e3))" 2>/dev/null || echo -)
  printf '%7d %9.1f %9.0f %14s %3d\n' "$n" "$wall" "$((rss / 1024))" "$step" "$rc" | tee -a "$WORK/rows.txt"
  rm -f "$WORK/r.json"
done
python3 - "$WORK/rows.txt" <<'PY'
import math, sys
# A run that ends with a simulated step counts (exit 2 is also a plan over the device's HBM: still a timed step).
rows = [l.split() for l in open(sys.argv[1]) if l.split()[3] != '-']
if len(rows) >= 2:
    x = [math.log(float(r[0])) for r in rows]
    for col, name in ((1, 'wall'), (2, 'peak RSS')):
        y = [math.log(float(r[col])) for r in rows]
        mx, my = sum(x) / len(x), sum(y) / len(y)
        k = sum((a - mx) * (b - my) for a, b in zip(x, y)) / sum((a - mx) ** 2 for a in x)
        print(f'growth exponent of {name}: {k:.2f}')
PY

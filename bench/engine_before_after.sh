#!/usr/bin/env bash
# Runs every config in configs/workloads/ and configs/blocks/ with one shardsim binary and prints its simulated
# figures, one line per config (no wall-clock numbers: those vary). Run it with the binary of two commits and diff
# the outputs: the workload engine (issue 16) must leave every simulated number unchanged.
#   bash bench/engine_before_after.sh [SHARDSIM_BINARY] [PATTERN] > after.txt
#   diff before.txt after.txt
# Columns: total / compute / communication / exposed communication of the critical chip (us, 3 decimals), the
# critical chip, the verdict. Needs python3 (reads the --json report). One MPI rank hosts every chip (the same
# figures as a rank per chip). SHAPE_ONLY=1: shape-only runs (the same simulated figures, no validation, seconds).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="$(realpath "${1:-$ROOT/build/apps/shardsim}")"
PATTERN="${2:-}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
cd "$WORK" || exit 2
printf '%-36s %5s %12s %12s %12s %12s %5s %s\n' config chips "total(us)" "compute(us)" "comm(us)" "exposed(us)" \
  chip verdict
for cfg in "$ROOT"/configs/workloads/*${PATTERN}*.yaml "$ROOT"/configs/blocks/*${PATTERN}*.yaml; do
  [ -f "$cfg" ] || continue
  np=$(python3 -c "
import math, sys, yaml
t = yaml.safe_load(open(sys.argv[1]))['topology']
print(t.get('chips') or math.prod(t['dims']))" "$cfg")
  name="$(basename "$(dirname "$cfg")")/$(basename "$cfg" .yaml)"
  out="$WORK/out.txt" json="$WORK/r.json"
  rm -f "$json"
  mpirun -q -np 1 "$BIN" --chips "$np" run "$cfg" ${SHAPE_ONLY:+--shape-only} --json "$json" --no-checkpoint \
    >"$out" 2>&1
  python3 - "$json" "$name" "$np" 2>/dev/null <<'PY' || echo "$name: failed: $(grep -m1 'error' "$out")"
import json, sys
r = json.load(open(sys.argv[1]))
s = r["simulated"]
b = s.get("breakdown", s)  # the MLP report nests its breakdown
f = lambda k: b[k] / 1e3
print(f'{sys.argv[2]:<36} {sys.argv[3]:>5} {f("total_ns"):12.3f} {f("compute_ns"):12.3f} {f("communication_ns"):12.3f} '
      f'{f("exposed_comm_ns"):12.3f} {s["critical_chip"]:>5} {r["verdict"]}')
PY
done

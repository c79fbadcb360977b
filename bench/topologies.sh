#!/usr/bin/env bash
# Simulated all_reduce on 8 chips over every topology kind with the same link (100 GB/s per direction, 1000 ns),
# auto-selected algorithm and forced ring, 1 KiB / 256 KiB / 64 MiB. Simulated numbers only (deterministic), so the
# table is the same on every host. For docs/performance/collectives.md.
# Usage: bash bench/topologies.sh          (needs a built tree: bash scripts/build.sh)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
source "$ROOT/scripts/mpi_env.sh"  # one host: shared memory only
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
cat >"$WORK/stacked.yaml" <<'YAML'
topology:
  kind: stacked
  dims:
    - {kind: switch, size: 2, bandwidth_gbps: 100, latency_ns: 1000}
    - {kind: ring, size: 4, bandwidth_gbps: 100, latency_ns: 1000}
YAML
NAMES=("ring-8" "ring-8 one-way" "torus 2x4" "torus 2x2x2" "mesh 2x4" "fully-connected 8" "switch 8" "switch 2 x ring 4")
L="--bandwidth 100 --latency 1000"
FLAGS=("$L" "$L --unidirectional" "$L --torus 2x4" "$L --torus 2x2x2" "$L --mesh 2x4" "$L --fully-connected"
       "$L --switch" "--topology $WORK/stacked.yaml")
for i in "${!NAMES[@]}"; do
  for algo in auto ring; do
    # shellcheck disable=SC2086
    mpirun -q -np 8 --oversubscribe "$ROOT/build/apps/shardsim" bench all_reduce -b 1K -e 64M -f 256 -n 1 -w 0 -c 0 \
      -a "$algo" ${FLAGS[$i]} --json "$WORK/$i.$algo.json" >/dev/null
  done
done
python3 - "$WORK" "${NAMES[@]}" <<'PY'
import json, sys
work, names = sys.argv[1], sys.argv[2:]
print("all_reduce fp32 sum, 8 chips, 100 GB/s and 1000 ns per link, out-of-place; simulated time (us) and busbw (GB/s)")
print(f'{"topology":<20} | {"1 KiB auto":>22} | {"256 KiB auto":>22} | {"64 MiB auto":>24} | {"64 MiB ring":>10}')
for i, n in enumerate(names):
    auto = [r for r in json.load(open(f"{work}/{i}.auto.json"))["rows"] if r["placement"] == "out-of-place"]
    ring = [r for r in json.load(open(f"{work}/{i}.ring.json"))["rows"] if r["placement"] == "out-of-place"]
    cells = [f'{r["sim_time_us"]:8.2f} {r["algorithm"][:13]:>13}' for r in auto]
    print(f'{n:<20} | {cells[0]:>22} | {cells[1]:>22} | {cells[2]:>15} {auto[2]["sim_busbw_gbps"]:8.1f} | {ring[2]["sim_time_us"]:10.1f}')
PY

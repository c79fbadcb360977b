#!/usr/bin/env bash
# Checks that `shardsim sweep configs/sweeps/collectives_16.yaml` reports the same simulated times as
# `shardsim bench` for the same points (same topology, device, collective, algorithm, size; bench's out-of-place
# column, -n 1 -w 0). Points the sweep ran with real data and points it ran in shape-only mode (sizes above
# validate_max_bytes: the same schedule, timing headers only) are both compared against bench running them with
# real data; both must be bit-identical. (The last point is one where the event-free replay the sweep used before
# differed in the last bit: 169.2864 vs 169.28640000000001 us.)
# Usage: bash bench/sweep_vs_bench.sh [RESULTS_CSV]   (default out/sweeps/collectives_16/results.csv; run the sweep first)
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CSV=${1:-$ROOT/out/sweeps/collectives_16/results.csv}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
source "$ROOT/scripts/mpi_env.sh"  # one host: shared memory only
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
topo() {  # LABEL -> a topology + device file for bench --topology
  case $1 in
    ring16) t='{kind: ring, chips: 16, bandwidth_gbps: 100, latency_ns: 1000}' ;;
    torus4x4) t='{kind: torus, dims: [4, 4], bandwidth_gbps: 100, latency_ns: 1000}' ;;
    torus2x2x4) t='{kind: torus, dims: [2, 2, 4], bandwidth_gbps: 100, latency_ns: 1000}' ;;
    switch16) t='{kind: switch, chips: 16, bandwidth_gbps: 100, latency_ns: 1000}' ;;
  esac
  printf 'topology: %s\ndevice: {preset: trainium1}\n' "$t" >"$WORK/$1.yaml"
  echo "$WORK/$1.yaml"
}
fails=0
printf '%-15s %-10s %-11s %10s %7s | %16s %16s %s\n' collective algorithm topology size timing "sweep sim us" "bench sim us" verdict
while read -r coll alg label size; do
  f=$(topo "$label")
  mpirun -q -np 16 --oversubscribe "$ROOT/build/apps/shardsim" bench "$coll" --topology "$f" -a "$alg" -b "$size" -e "$size" \
    -n 1 -w 0 --json "$WORK/b.json" </dev/null >"$WORK/b.out" 2>&1 || { echo "bench failed: $(tail -3 "$WORK/b.out")"; fails=$((fails + 1)); continue; }
  python3 - "$CSV" "$WORK/b.json" "$coll" "$alg" "$label" "$size" <<'PY' || fails=$((fails + 1))
import csv, json, sys
path, bj, coll, alg, label, size = sys.argv[1:]
b = json.load(open(bj))["rows"][0]
for r in csv.DictReader(open(path)):
    if r["collective"] == coll and r["algorithm"] == alg and r["topology"] == label and r["key"].split("#")[0].split("|")[-1] == size:
        s = float(r["sim_time_us"]); w = b["sim_time_us"]
        same = s == w
        print(f'{coll:<15} {alg:<10} {label:<11} {size:>10} {r["timing"]:>7} | {s:16.6f} {w:16.6f} {"equal" if s == w else "rel. diff %.1e" % abs(s / w - 1)}{"" if same else "  MISMATCH"}')
        sys.exit(0 if same else 1)
sys.exit(f"no sweep row for {coll} {alg} {label} {size}")
PY
done <<'LIST'
all_reduce auto ring16 1024
all_reduce torus torus4x4 1048576
all_reduce auto torus2x2x4 262144
all_reduce auto switch16 65536
all_gather bidir_ring torus4x4 1048576
reduce_scatter ring switch16 16384
reduce_scatter torus torus2x2x4 1048576
all_reduce torus torus4x4 4194304
all_reduce ring ring16 16777216
all_gather auto switch16 16777216
all_reduce torus torus4x4 16777216
LIST
echo "mismatches: $fails"
exit $((fails > 0))

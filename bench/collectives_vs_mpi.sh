#!/usr/bin/env bash
# Wall-clock all_reduce bus bandwidth of shardsim's collectives against MPI_Allreduce on the same buffers, in the
# same run, at 2 and 4 ranks, 4 MiB - 256 MiB, next to this host's memcpy bandwidth. For docs/PERFORMANCE.md.
# Usage: bash bench/collectives_vs_mpi.sh [ITERS]      (needs a built tree: bash scripts/build.sh)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ITERS="${1:-10}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
source "$ROOT/scripts/mpi_env.sh"  # one host: shared memory only
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
echo "host: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); $(mpirun --version | head -1)"
if [ -x "$ROOT/build/bench/shardsim_memcpy_bench" ]; then
  "$ROOT/build/bench/shardsim_memcpy_bench" --benchmark_format=csv 2>/dev/null >"$WORK/memcpy.csv"
  python3 - "$WORK/memcpy.csv" <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if r and r[0].startswith("BM_memcpy/")]
print("memcpy: " + ", ".join(f'{int(r[0].split("/")[1]) >> 20} MiB {float(r[5]) / 1e9:.2f} GB/s' for r in rows))
PY
fi
for np in 2 4; do
  for algo in auto ring; do
    mpirun -np "$np" --oversubscribe "$ROOT/build/apps/shardsim" bench all_reduce -b 4M -e 256M -f 4 \
      -n "$ITERS" -w 2 -a "$algo" --vs-mpi --csv "$WORK/np$np.$algo.csv" >/dev/null
  done
  python3 - "$np" "$WORK/np$np.auto.csv" "$WORK/np$np.ring.csv" <<'PY'
import csv, sys
np_ = sys.argv[1]
auto = [r for r in csv.DictReader(open(sys.argv[2])) if r["placement"] == "out-of-place"]
ring = [r for r in csv.DictReader(open(sys.argv[3])) if r["placement"] == "out-of-place"]
print(f"\nall_reduce fp32 sum, {np_} ranks, out-of-place, wall busbw (GB/s; busbw = algbw x 2(n-1)/n)")
print(f'{"size":>10} {"shardsim auto":>14} {"(algorithm)":>14} {"shardsim ring":>14} {"MPI_Allreduce":>14} {"auto/MPI":>9} {"ring/MPI":>9}')
for a, r in zip(auto, ring):
    m = float(a["mpi_busbw_gbps"])
    print(f'{int(a["size_bytes"]) >> 20:>7} MiB {float(a["wall_busbw_gbps"]):>14.2f} {a["algorithm"]:>14} {float(r["wall_busbw_gbps"]):>14.2f} '
          f'{m:>14.2f} {float(a["wall_busbw_gbps"]) / m:>9.2f} {float(r["wall_busbw_gbps"]) / m:>9.2f}')
PY
done

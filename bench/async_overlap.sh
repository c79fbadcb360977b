#!/usr/bin/env bash
# Wall-clock overlap of compute and an async all_reduce (docs/performance/host.md, "Async engine").
#   bash bench/async_overlap.sh [MIB] [GEMM_N]      (defaults 128 MiB, 512)
# Needs build/bench/shardsim_async_overlap (cmake --build build --target shardsim_async_overlap).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="$ROOT/build/bench/shardsim_async_overlap"
MIB=${1:-128}
GEMM=${2:-512}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
source "$ROOT/scripts/mpi_env.sh"  # one host: shared memory only
for np in 2 4; do
  mpirun --oversubscribe -np "$np" "$BIN" --mib "$MIB" --gemm "$GEMM" --trials 3
done

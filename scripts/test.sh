#!/usr/bin/env bash
# Sets up, builds and runs every test (unit, multi-rank MPI at 1/2/3/4/8 ranks, end-to-end CLI).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/build.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
source "$ROOT/scripts/mpi_env.sh"  # one host: shared memory only (the tests set the same in CMake)
cd "$ROOT/build"
# Two tests at a time per core pair (the MPI tests declare their ranks as PROCESSORS, so ctest never oversubscribes
# past -j); JOBS=1 runs them one by one.
ctest --output-on-failure --timeout 600 -j "${JOBS:-$(nproc)}" "$@"

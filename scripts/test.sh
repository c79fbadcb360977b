#!/usr/bin/env bash
# Sets up, builds and runs every test (unit, multi-rank MPI at 1/2/3/4/8 ranks, end-to-end CLI).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/build.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
source "$ROOT/scripts/mpi_env.sh"  # one host: shared memory only (the tests set the same in CMake)
cd "$ROOT/build"
ctest --output-on-failure --timeout 600 "$@"

#!/usr/bin/env bash
# Sets up, builds and runs the default job: the Llama-2-7B MLP, tensor-parallel over an 8-chip simulated ring,
# validated against one device and checkpointed to out/llama2_7b_mlp_tp8.h5.
# Extra arguments go to `shardsim run` (e.g. a config path, --json FILE).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_TARGET=shardsim bash "$ROOT/scripts/build.sh"
NP="${NP:-8}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
source "$ROOT/scripts/mpi_env.sh"  # one host: shared memory only, no TCP listeners on the ranks
mkdir -p "$ROOT/out"
cd "$ROOT/out"
exec mpirun -q -np "$NP" --oversubscribe "$ROOT/build/apps/shardsim" run "$@"

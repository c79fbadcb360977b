#!/usr/bin/env bash
# Installs dependencies (scripts/setup.sh) and builds shardsim with CMake + Ninja (Release) into build/.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup.sh"
cmake -S "$ROOT" -B "$ROOT/build" -G Ninja -DCMAKE_BUILD_TYPE="${CMAKE_BUILD_TYPE:-Release}" >/dev/null
cmake --build "$ROOT/build" -j "${JOBS:-$(nproc)}" ${BUILD_TARGET:+--target "$BUILD_TARGET"}

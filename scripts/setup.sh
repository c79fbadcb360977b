#!/usr/bin/env bash
# Installs shardsim's build and test dependencies from Debian packages.
# Idempotent: packages already present are skipped; apt-get runs only if something is missing.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config
  openmpi-bin libopenmpi-dev
  libhdf5-openmpi-dev hdf5-tools
  libboost-dev libboost-context-dev   # Boost.Context: one fiber per chip (runtime/chips.h)
  libyaml-cpp-dev libcli11-dev nlohmann-json3-dev libfmt-dev
  libtomlplusplus-dev          # shardsim import torchtitan: TOML
  libopenblas-dev librandom123-dev
  libgtest-dev googletest libbenchmark-dev
  python3-h5py python3-numpy   # tests/e2e/ckpt.sh: an independent reader of the checkpoints
  gnuplot-nox                  # shardsim sweep: the PNG plots
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "setup: all ${#PACKAGES[@]} packages present"
  exit 0
fi

echo "setup: installing ${missing[*]}"
SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"

#!/usr/bin/env bash
# The host-speed tables in one run: shardsim's all_reduce against MPI_Allreduce at 2 and 4 ranks (4 KiB -
# 256 MiB, wall busbw ratios, bench/collectives_vs_mpi.sh) and checkpoint write/read against dd at 1 and 4 ranks
# (bench/ckpt_bandwidth.sh), every ratio the median of REPS runs. For docs/performance/host.md.
# Usage: bash bench/host_speed.sh [REPS=3] [CKPT_MIB=512] [CKPT_DIR=/tmp]
#   The two parts keep their own knobs (SHARDSIM=, ALGORITHM=, MPI_ALGORITHM=, WAIT_MODES= for the collectives).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
REPS="${1:-3}" MIB="${2:-512}" DIR="${3:-/tmp}"
bad() { echo "host_speed.sh: $*" >&2; exit 2; }
# Checked here too, so a bad checkpoint argument is not found after the collectives' minutes.
case "$REPS" in ''|*[!0-9]*|0) bad "REPS must be a positive integer, got '$REPS'" ;; esac
case "$MIB" in ''|*[!0-9]*) bad "CKPT_MIB must be a positive multiple of 4, got '$MIB'" ;; esac
[ "$MIB" -ge 4 ] && [ $((MIB % 4)) -eq 0 ] || bad "CKPT_MIB must be a positive multiple of 4, got '$MIB'"
[ -d "$DIR" ] && [ -w "$DIR" ] || bad "CKPT_DIR '$DIR' is not a writable directory"
echo "== collectives: shardsim all_reduce vs MPI_Allreduce (ratio > 1: shardsim faster)"
bash "$ROOT/bench/collectives_vs_mpi.sh" "$REPS" 2 4
echo
echo "== checkpoints: save/read vs dd (ratio > 1: checkpoint faster)"
bash "$ROOT/bench/ckpt_bandwidth.sh" "$MIB" "$REPS" "$DIR"

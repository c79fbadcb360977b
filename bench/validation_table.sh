#!/usr/bin/env bash
# Validation against published nccl-tests measurements (docs/MODEL.md, "Validation against published
# measurements"): for each cited table in tests/data/published/, shardsim's prediction at the hardware's line rate
# (before calibration) and after `shardsim calibrate` fitted on the small sizes only, next to the measured busbw,
# with the error. The rows above the fit's --max-bytes are predictions for a size range the fit never saw.
# Usage: bench/validation_table.sh [BUILD_DIR]   (prints a markdown table)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${1:-$ROOT/build}"
BIN="$BUILD/apps/shardsim"
source "$ROOT/scripts/mpi_env.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
DATA="$ROOT/tests/data/published"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

# CASE: label | log | line rate GB/s per direction | calibrate flags
run_case() {
  local label="$1" log="$2" bw="$3"; shift 3
  # Before: the line rate and shardsim's default latency (1000 ns), no fit (calibrate --predict alone replays
  # every row on the topology as given: the time `bench` simulates).
  mpirun -np 2 --oversubscribe "$BIN" calibrate --predict "$log" --collective all_reduce --bandwidth "$bw" \
    --latency 1000 | awk '/ held out$/ { print $3, $5, $8 }' >"$TMP/before"
  mpirun -np 2 --oversubscribe "$BIN" calibrate "$log" --collective all_reduce --bandwidth "$bw" --latency 1000 "$@" \
    >"$TMP/after"
  local fit
  fit=$(grep '^fit ' "$TMP/after" | sed 's/, [0-9]* Gauss-Newton.*//')
  echo
  echo "**$label** — $(basename "$log"); line rate $bw GB/s per direction; calibrate $*; $fit"
  echo
  echo "| size (B) | measured busbw (GB/s) | before: predicted busbw | time error | after: predicted busbw | time error | rows |"
  echo "|---:|---:|---:|---:|---:|---:|---|"
  awk 'NR == FNR { bt[$1] = $2; bb[$1] = $3; next }
       $NF == "fit" || / above --max-bytes$/ {
         size = $3; meas_t = $4; pred_t = $5; mb = $7; pb = $8; use = ($NF == "fit") ? "fit" : "predicted (not fitted)";
         eb = (bt[size] - meas_t) / meas_t * 100; ea = (pred_t - meas_t) / meas_t * 100;
         printf "| %s | %.2f | %.2f | %+.0f%% | %.2f | %+.1f%% | %s |\n", size, mb, bb[size], eb, pb, ea, use
       }' "$TMP/before" "$TMP/after"
}

echo "# shardsim validation table ($(date -u +%F), $(git -C "$ROOT" rev-parse --short HEAD))"
run_case "2x RTX 2080 Ti, 2-link NVLink bridge, NCCL 2.6.4 (nccl-tests#44)" \
  "$DATA/nccl_tests_44_rtx2080ti_nvlink_all_reduce.log" 51.562 --max-bytes 1M --protocols 2
run_case "2x H100 PCIe, NVLink bridges (nccl#1161)" \
  "$DATA/nccl_1161_h100pcie_nvlink_all_reduce.log" 300 --max-bytes 2G

#!/usr/bin/env bash
# Validation against published nccl-tests measurements (docs/model/calibration.md, "Validation against published
# measurements"): for each cited table in tests/data/published/, shardsim's prediction at the hardware's line rate
# (before calibration) and after `shardsim calibrate` fitted on the small sizes only, next to the measured busbw,
# with the error. The rows above the fit's --max-bytes are predictions for a size range the fit never saw; a
# held-out case fits one collective's table and predicts another collective's table of the same machine.
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

# HELD-OUT COLLECTIVE: label | fit log(s), ':'-separated | predicted log(s), ':'-separated | topology flags (line
# rate, latency, kind) -- calibrate flags. Fits the first tables only and predicts the others (collectives the fit
# never saw).
run_heldout_case() {
  local label="$1" fits=() held=() predict=() names=() fitnames=() h; shift
  IFS=: read -ra fits <<<"$1"; shift
  IFS=: read -ra held <<<"$1"; shift
  for h in "${fits[@]}"; do fitnames+=("$(basename "$h")"); done
  local fitlog="${fits[0]}"
  for h in "${held[@]}"; do predict+=(--predict "$h"); names+=("$(basename "$h")"); done
  local net=()
  while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do net+=("$1"); shift; done
  [ "$#" -gt 0 ] && shift
  local np
  np=$(grep -c '^#  *Rank  *[0-9]' "$fitlog")
  local fitpredict=()
  for h in "${fits[@]}"; do fitpredict+=(--predict "$h"); done
  mpirun -np "$np" --oversubscribe "$BIN" calibrate "${fitpredict[@]}" "${predict[@]}" "${net[@]}" |
    awk '/ held out$/ { print $2, $3, $5, $8 }' >"$TMP/before"
  mpirun -np "$np" --oversubscribe "$BIN" calibrate "${fits[@]}" "${predict[@]}" "${net[@]}" "$@" >"$TMP/after"
  local fit
  fit=$(grep '^fit ' "$TMP/after" | sed 's/, [0-9]* Gauss-Newton.*//')
  fit+=$(grep 'call overhead c = ' "$TMP/after" | sed -E 's/^ +call overhead/; call overhead/; s/ per collective call.*//' ||
    true)
  echo
  echo "**$label** — fitted on ${fitnames[*]}, predicted ${names[*]}; topology ${net[*]}; calibrate $*; $fit"
  echo
  echo "| collective | size (B) | measured busbw (GB/s) | before: predicted busbw | time error | after: predicted busbw | time error | rows |"
  echo "|---|---:|---:|---:|---:|---:|---:|---|"
  awk 'NR == FNR { bt[$1 " " $2] = $3; bb[$1 " " $2] = $4; next }
       $NF == "fit" || / held out$/ {
         key = $2 " " $3; meas_t = $4; pred_t = $5; mb = $7; pb = $8;
         use = ($NF == "fit") ? "fit" : "predicted (collective not fitted)";
         eb = (bt[key] - meas_t) / meas_t * 100; ea = (pred_t - meas_t) / meas_t * 100;
         printf "| %s | %s | %.2f | %.2f | %+.0f%% | %.2f | %+.1f%% | %s |\n", $2, $3, mb, bb[key], eb, pb, ea, use
       }' "$TMP/before" "$TMP/after"
  # The fit's summaries (markdown line breaks), then the median |time error| per collective before and after,
  # over all rows and over the rows >= 1 MiB.
  echo
  grep -E '^error rms|median [|]error[|] .*fitted' "$TMP/after" | sed -E 's/^ +//; s/$/  /'
  awk 'function med(list,   n, v, i, j, t) { n = split(list, v, " "); if (n == 0) return "-";
         for (i = 2; i <= n; i++) for (j = i; j > 1 && v[j - 1] + 0 > v[j] + 0; j--) { t = v[j]; v[j] = v[j - 1]; v[j - 1] = t }
         return sprintf("%.1f%%", (n % 2) ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2) }
       function abs(x) { return x < 0 ? -x : x }
       NR == FNR { bt[$1 " " $2] = $3; next }
       / held out$/ || $NF == "fit" {
         c = $2; key = $2 " " $3; meas = $4; if (!(c in seen)) { seen[c] = 1; order[++nc] = c }
         eb = abs(bt[key] - meas) / meas * 100; ea = abs($5 - meas) / meas * 100;
         allb[c] = allb[c] " " eb; alla[c] = alla[c] " " ea;
         if ($3 >= 1048576) { bigb[c] = bigb[c] " " eb; biga[c] = biga[c] " " ea }
       }
       END { for (i = 1; i <= nc; i++) { c = order[i];
               printf "%s: median |time error| before %s, after %s over all rows; before %s, after %s over rows >= 1 MiB  \n",
                      c, med(allb[c]), med(alla[c]), med(bigb[c]), med(biga[c]) } }' "$TMP/before" "$TMP/after"
}

echo "# shardsim validation table ($(date -u +%F), $(git -C "$ROOT" rev-parse --short HEAD))"
run_case "2x RTX 2080 Ti, 2-link NVLink bridge, NCCL 2.6.4 (nccl-tests#44)" \
  "$DATA/nccl_tests_44_rtx2080ti_nvlink_all_reduce.log" 51.562 --max-bytes 1M --protocols 2
run_case "2x H100 PCIe, NVLink bridges (nccl#1161)" \
  "$DATA/nccl_1161_h100pcie_nvlink_all_reduce.log" 300 --max-bytes 2G
run_heldout_case "2x RTX 2080 Ti behind one PCIe Gen3 switch, no peer-to-peer (AutoDL blog post, 2025-06-05)" \
  "$DATA/autodl_2080ti_pcie_all_reduce.log" "$DATA/autodl_2080ti_pcie_all_gather.log" \
  --switch --bandwidth 15.754 --latency 1000 -- --protocols 2
run_heldout_case "8x H100 SXM on one NVSwitch board, NCCL 2.26.2, NCCL_ALGO=RING (Together AI's nccl-tests results, 2026-03-05)" \
  "$DATA/together_h100x8_ring_all_reduce.log" \
  "$DATA/together_h100x8_ring_reduce_scatter.log:$DATA/together_h100x8_ring_all_gather.log" \
  --switch --bandwidth 450 --latency 1000 -- --protocols 2
run_heldout_case "4x H100 SXM of an NVSwitch host, NCCL 2.29.2, NCCL's own algorithm choice (nccl-collectives-bench)" \
  "$DATA/ncclbench_h100x4_all_reduce.log" \
  "$DATA/ncclbench_h100x4_reduce_scatter.log:$DATA/ncclbench_h100x4_all_gather.log" \
  --switch --bandwidth 450 --latency 1000 -- --protocols 2
# The per-call overhead c (docs/model/calibration.md, "Per-call overhead"): fitted with all_reduce and ONE other collective of
# the same session (two step counts make c identifiable), the third collective held out.
for board in "8x H100 SXM, NCCL_ALGO=RING (Together AI)|together_h100x8_ring" \
             "4x H100 SXM, NCCL's own choice (nccl-collectives-bench)|ncclbench_h100x4"; do
  name="${board%%|*}" stem="${board##*|}"
  run_heldout_case "$name, with a per-call overhead: reduce_scatter held out" \
    "$DATA/${stem}_all_reduce.log:$DATA/${stem}_all_gather.log" "$DATA/${stem}_reduce_scatter.log" \
    --switch --bandwidth 450 --latency 1000 -- --protocols 2 --fit-call-overhead
  run_heldout_case "$name, with a per-call overhead: all_gather held out" \
    "$DATA/${stem}_all_reduce.log:$DATA/${stem}_reduce_scatter.log" "$DATA/${stem}_all_gather.log" \
    --switch --bandwidth 450 --latency 1000 -- --protocols 2 --fit-call-overhead
done

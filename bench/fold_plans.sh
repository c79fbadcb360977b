#!/usr/bin/env bash
# Wall time and peak host memory of the published plans at full size, one MPI rank hosting every chip, default
# settings (fold: auto, parallel.algorithm: auto): the table of docs/performance/fold.md ("The published plans").
# Usage: bash bench/fold_plans.sh [ROW...]   (default: every row; rows: 70b_768 405b_6144 405b_8192 405b_16384
#        175b_1024 175b_12288 1t_full 1t_sel; the 1T rows are not folded (dp 1) and take long: give them by name)
# Prints per row: the row, chips, wall (s, /usr/bin/time), peak RSS (MiB), simulated step (ms), chips simulated,
# the exit code; then the load average before and after (this host is shared: say the load with the figures).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${SHARDSIM:-$ROOT/build/apps/shardsim}"
V="$ROOT/configs/validation"
if [ $# -eq 0 ]; then ROWS=(70b_768 405b_6144 405b_8192 405b_16384 175b_1024 175b_12288); else ROWS=("$@"); fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
source "$ROOT/scripts/mpi_env.sh"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

dgx() {  # NODES: NODES DGX-H100-shaped nodes (NVSwitch 450 GB/s inside, a 50 GB/s rail switch across; latencies: assumption)
  cat > "$WORK/dgx.yaml" <<T
topology:
  kind: stacked
  dims:
    - {kind: switch, size: $1, bandwidth_gbps: 50, latency_ns: 5000}
    - {kind: switch, size: 8, bandwidth_gbps: 450, latency_ns: 1000}
T
}
a100() {  # CONFIG NODES: the validation config with NODES nodes in its first topology dimension
  sed "s/^    - {kind: switch, size: [0-9]*, bandwidth_gbps: 25,/    - {kind: switch, size: $2, bandwidth_gbps: 25,/" "$1" > "$WORK/cfg.yaml"
}

echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-11s %6s %8s %8s %14s %16s %3s\n' row chips wall_s rss_mib sim_step_ms chips_simulated rc
for row in "${ROWS[@]}"; do
  args=()
  case "$row" in
    70b_768) n=768; args=(train "$ROOT/bench/llama3_70b_dgx_zero1.yaml") ;;
    405b_*)
      n=${row#405b_}; d=$((n / 128)); dgx $((n / 8))
      args=(train "$ROOT/bench/llama3_405b_train_tp8_dp.yaml" --topology "$WORK/dgx.yaml" --set model.layers=126
            --set parallel.pp=16 --set parallel.schedule=1f1b --set parallel.dp=$d --set parallel.zero=1
            --set model.batch=$((16 * d)))
      [ "$n" -gt 6144 ] && args+=(--set parallel.overlap_grad_reduce=true --set parallel.overlap_param_gather=true)
      # 133 GiB per chip at ZeRO-1 (state + activations of 16 sequences): past the 80 GiB the run exits 2 (one memory
      # rule); the capacity does not enter the step's timing, so the host cost is measured with it lifted.
      args+=(--set device.hbm_gib=1000000) ;;
    175b_1024) n=1024; a100 "$V/korthikanti22_175b_tp8_pp8_sp_selective.yaml" 128
      args=(train "$WORK/cfg.yaml" --set parallel.dp=16 --set model.batch=1024) ;;
    175b_12288) n=12288; a100 "$V/korthikanti22_175b_tp8_pp8_sp_selective.yaml" 1536
      args=(train "$WORK/cfg.yaml" --set parallel.dp=192 --set model.batch=12288 --set parallel.bucket_bytes=0) ;;
    1t_full) n=512; args=(train "$V/slow/korthikanti22_1t_tp8_pp64_full_recompute.yaml") ;;
    1t_sel) n=512; args=(train "$V/slow/korthikanti22_1t_tp8_pp64_sp_selective.yaml") ;;
    *) echo "bench/fold_plans.sh: unknown row '$row'" >&2; exit 2 ;;
  esac
  /usr/bin/time -f "%e %M" -o "$WORK/time.txt" mpirun -np 1 "$BIN" --chips "$n" "${args[@]}" --json "$WORK/r.json" \
    > "$WORK/out.txt" 2> "$WORK/err.txt"
  rc=$?
  read -r wall rss < <(tail -1 "$WORK/time.txt")
  step=$(python3 -c "import json; print('%.3f' % (json.load(open('$WORK/r.json'))['train']['step_ns'] / 1e6))" 2>/dev/null || echo -)
  sim=$(grep -oE 'chips simulated [0-9]+ of [0-9]+' "$WORK/out.txt" | grep -oE '[0-9]+ of [0-9]+' || echo -)
  printf '%-11s %6d %8.1f %8.0f %14s %16s %3d\n' "$row" "$n" "$wall" "$((rss / 1024))" "$step" "$sim" "$rc"
  [ "$rc" -ne 0 ] && grep -m1 '^shardsim: error' "$WORK/err.txt" >&2
  rm -f "$WORK/r.json"
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"

#!/usr/bin/env bash
# Checkpoint write/read wall bandwidth at 1 and 4 ranks against a plain sequential file of the same bytes (dd),
# for docs/PERFORMANCE.md. Writes: save_checkpoint (checksums + collective HDF5 + fsync + rename + dir fsync) vs
# `dd conv=fsync`. Reads: CheckpointReader open + every rank reading its hyperslab vs `dd of=/dev/null`, both
# after dropping the page cache when allowed (cold), else from the page cache (said in the output).
# Usage: bash bench/ckpt_bandwidth.sh [MIB=512] [REPS=3] [DIR=/tmp]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MIB="${1:-512}" REPS="${2:-3}" DIR="${3:-/tmp}"
BENCH="$ROOT/build/bench/shardsim_ckpt_bench"
[ -x "$BENCH" ] || { echo "build first: bash scripts/build.sh" >&2; exit 2; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
source "$ROOT/scripts/mpi_env.sh"  # one host: shared memory only
cold=no
if sync && echo 3 >/proc/sys/vm/drop_caches 2>/dev/null; then cold=yes; fi
echo "host: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); dir $DIR ($(df -T "$DIR" | awk 'NR==2{print $2}')); $MIB MiB; page cache dropped before reads: $cold"
dd_write() { dd if=/dev/zero of="$DIR/ckpt_bench_dd.bin" bs=4M count=$((MIB / 4)) conv=fsync 2>&1 | awk -F', ' '/copied/{print $3}' | awk '{print $1}'; }
dd_read() {
  [ $cold = yes ] && sync && echo 3 >/proc/sys/vm/drop_caches
  dd if="$DIR/ckpt_bench_dd.bin" of=/dev/null bs=4M 2>&1 | awk -F', ' '/copied/{print $3}' | awk '{print $1}'
}
median() { sort -g | awk '{a[NR]=$1} END{print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
ddw=(); ddr=()
for i in $(seq "$REPS"); do ddw+=("$(dd_write)"); ddr+=("$(dd_read)"); done
rm -f "$DIR/ckpt_bench_dd.bin"
# dd prints s; bandwidth = bytes / s
bytes=$((MIB * 1048576))
ddw_s=$(printf '%s\n' "${ddw[@]}" | median); ddr_s=$(printf '%s\n' "${ddr[@]}" | median)
printf 'dd          write %.3f GB/s (conv=fsync)   read %.3f GB/s\n' "$(echo "$bytes / $ddw_s / 1000000000" | bc -l)" "$(echo "$bytes / $ddr_s / 1000000000" | bc -l)"
for np in 1 4; do
  out=$(mpirun -q -np "$np" --oversubscribe -x SHARDSIM_BENCH_DROP_CACHES="$cold" "$BENCH" --mib "$MIB" --reps "$REPS" --dir "$DIR")
  echo "$out" | sed 's/^/    /'
  w=$(echo "$out" | awk '/^[0-9]/{print $3}' | median)
  r=$(echo "$out" | awk '/^[0-9]/{print $5}' | median)
  v=$(echo "$out" | awk '/^[0-9]/{print $7}' | median)
  printf 'ckpt np=%d  write %.3f GB/s = %.2f x dd   read %.3f GB/s = %.2f x dd   verify %.3f GB/s (median of %d)\n' \
    "$np" "$w" "$(echo "$w / ($bytes / $ddw_s / 1000000000)" | bc -l)" "$r" "$(echo "$r / ($bytes / $ddr_s / 1000000000)" | bc -l)" "$v" "$REPS"
done

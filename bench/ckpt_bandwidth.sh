#!/usr/bin/env bash
# Checkpoint write/read wall bandwidth at 1 and 4 ranks against a plain sequential file of the same bytes (dd),
# for docs/performance/host.md. Writes: save_checkpoint (space reservation, checksums, HDF5 through MPI-IO, fsync,
# rename, directory fsync) vs `dd conv=fsync`. Reads: CheckpointReader open + every rank reading its hyperslab vs
# `dd of=/dev/null`, both after dropping the page cache when allowed (cold), else from the page cache (said in the
# output). The disk of a shared VM drifts by several times within minutes, so each repetition runs dd and the
# checkpoint at 1 and 4 ranks back to back, and the ratios are per repetition (median of REPS).
# Usage: bash bench/ckpt_bandwidth.sh [MIB=512] [REPS=3] [DIR=/tmp] [extra shardsim_ckpt_bench flags...]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MIB="${1:-512}" REPS="${2:-3}" DIR="${3:-/tmp}"
shift $(($# < 3 ? $# : 3))
bad() { echo "ckpt_bandwidth.sh: $*" >&2; exit 2; }
case "$MIB" in ''|*[!0-9]*) bad "MIB must be a positive multiple of 4, got '$MIB'" ;; esac
[ "$MIB" -ge 4 ] && [ $((MIB % 4)) -eq 0 ] || bad "MIB must be a positive multiple of 4, got '$MIB'"
case "$REPS" in ''|*[!0-9]*|0) bad "REPS must be a positive integer, got '$REPS'" ;; esac
[ -d "$DIR" ] && [ -w "$DIR" ] || bad "DIR '$DIR' is not a writable directory"
BENCH="$ROOT/build/bench/shardsim_ckpt_bench"
[ -x "$BENCH" ] || { echo "build first: bash scripts/build.sh" >&2; exit 2; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
source "$ROOT/scripts/mpi_env.sh"  # one host: shared memory only
cold=no
if sync && echo 3 >/proc/sys/vm/drop_caches 2>/dev/null; then cold=yes; fi
echo "host: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), load $(cut -d' ' -f1 /proc/loadavg); dir $DIR ($(df -T "$DIR" | awk 'NR==2{print $2}')); $MIB MiB; page cache dropped before reads: $cold; bench flags: ${*:-none}"
bytes=$((MIB * 1048576))
secs() { awk -F', ' '/copied/{print $3}' | awk '{print $1}'; }
dd_write() { dd if=/dev/zero of="$DIR/ckpt_bench_dd.bin" bs=4M count=$((MIB / 4)) conv=fsync 2>&1 | secs; }
dd_read() {
  if [ $cold = yes ]; then sync && echo 3 >/proc/sys/vm/drop_caches; fi
  dd if="$DIR/ckpt_bench_dd.bin" of=/dev/null bs=4M 2>&1 | secs
}
median() { sort -g | awk '{a[NR]=$1} END{print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
gbs() { echo "$bytes / $1 / 1000000000" | bc -l; }
declare -A W R V RW RR
ddw=() ddr=()
for rep in $(seq "$REPS"); do
  ws=$(dd_write); rs=$(dd_read)
  rm -f "$DIR/ckpt_bench_dd.bin"
  ddw+=("$(gbs "$ws")"); ddr+=("$(gbs "$rs")")
  for np in 1 4; do
    line=$(mpirun -q -np "$np" --oversubscribe --mca btl self,vader -x SHARDSIM_BENCH_DROP_CACHES="$cold" "$BENCH" \
      --mib "$MIB" --reps 1 --dir "$DIR" "$@" | awk '/^[0-9]/')
    w=$(echo "$line" | awk '{print $3}'); r=$(echo "$line" | awk '{print $5}'); v=$(echo "$line" | awk '{print $7}')
    W[$np]+="$w "; R[$np]+="$r "; V[$np]+="$v "
    RW[$np]+="$(echo "$w / ${ddw[-1]}" | bc -l) "; RR[$np]+="$(echo "$r / ${ddr[-1]}" | bc -l) "
    printf 'rep %d  dd write %.3f read %.3f GB/s | ckpt np=%d write %.3f read %.3f verify %.3f GB/s\n' "$rep" \
      "${ddw[-1]}" "${ddr[-1]}" "$np" "$w" "$r" "$v"
  done
done
med() { tr ' ' '\n' | grep . | median; }
printf 'dd          write %.3f GB/s (conv=fsync)   read %.3f GB/s   (median of %d)\n' \
  "$(printf '%s\n' "${ddw[@]}" | median)" "$(printf '%s\n' "${ddr[@]}" | median)" "$REPS"
for np in 1 4; do
  printf 'ckpt np=%d  write %.3f GB/s = %.2f x dd   read %.3f GB/s = %.2f x dd   verify %.3f GB/s (medians of %d; ratios per repetition)\n' \
    "$np" "$(echo "${W[$np]}" | med)" "$(echo "${RW[$np]}" | med)" "$(echo "${R[$np]}" | med)" \
    "$(echo "${RR[$np]}" | med)" "$(echo "${V[$np]}" | med)" "$REPS"
done

#!/usr/bin/env bash
# Wall-clock all_reduce bus bandwidth of shardsim's collectives against MPI_Allreduce on the same buffers, in the
# same process and run (the ratio is measured side by side, so host load shared by both cancels), at 2 and 4
# ranks (4 ranks are oversubscribed on a 2-core host), 4 KiB - 256 MiB, fp32 sum, out of place, algorithm auto.
# Each configuration runs REPS times; the table prints the median shardsim/MPI busbw ratio and the median busbw
# of each. For docs/performance/host.md.
# Usage: bash bench/collectives_vs_mpi.sh [REPS] [RANKS...]     e.g. bash bench/collectives_vs_mpi.sh 3 2 4
#   SHARDSIM=path/to/shardsim (default build/apps/shardsim); needs a built tree (bash scripts/build.sh).
#   SHARDSIM="before=/path/a after=/path/b" compares builds: their runs interleave (rep 1 of each, rep 2 of
#   each, ...) so both see the same host load, and each gets its own table.
#   Small sizes (4 KiB - 256 KiB) run -n 200 -w 10 iterations, large ones (1 MiB - 256 MiB) -n 5 -w 1.
#   ALGORITHM=ring (default auto) picks shardsim's algorithm; MPI_ALGORITHM=ring (default: Open MPI's own choice,
#   recursive doubling at small sizes) locks MPI_Allreduce to one of Open MPI's coll/tuned algorithms
#   (recursive_doubling, ring, segmented_ring, rabenseifner, ...), so both sides can run the same schedule.
#   WAIT_MODES="spin yield" runs every build once per SHARDSIM_WAIT mode (runtime/transport.h), interleaved like
#   builds, each with its own table named BUILD.MODE.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
REPS="${1:-3}"
shift || true
RANKS=("$@")
[ ${#RANKS[@]} -gt 0 ] || RANKS=(2 4)
bad() { echo "collectives_vs_mpi.sh: $*" >&2; exit 2; }
case "$REPS" in ''|*[!0-9]*|0) bad "REPS must be a positive integer, got '$REPS'" ;; esac
for np in "${RANKS[@]}"; do case "$np" in ''|*[!0-9]*|0) bad "RANKS must be positive integers, got '$np'" ;; esac; done
read -r -a SPECS <<<"${SHARDSIM:-now=$ROOT/build/apps/shardsim}"
read -r -a MODES <<<"${WAIT_MODES:-}"
BINS=()  # name=binary or name.mode=binary
for spec in "${SPECS[@]}"; do
  if [ ${#MODES[@]} -eq 0 ]; then BINS+=("$spec"); continue; fi
  for mode in "${MODES[@]}"; do
    case "$mode" in spin|yield|sleep|auto) ;;
      *) bad "WAIT_MODES: '$mode' is not spin, yield, sleep or auto" ;;
    esac
    BINS+=("${spec%%=*}.$mode=${spec#*=}")
  done
done
ALGORITHM="${ALGORITHM:-auto}"
case "$ALGORITHM" in ''|*[!a-z0-9_]*) bad "ALGORITHM must be one algorithm name (shardsim bench --list), got '$ALGORITHM'" ;; esac
MPI_ALGO_ARGS=()
if [ -n "${MPI_ALGORITHM:-}" ]; then
  case "$MPI_ALGORITHM" in
    basic_linear|nonoverlapping|recursive_doubling|ring|segmented_ring|rabenseifner) ;;
    *) echo "collectives_vs_mpi.sh: MPI_ALGORITHM='$MPI_ALGORITHM' is not one of Open MPI's allreduce algorithms" >&2
       exit 2 ;;
  esac
  MPI_ALGO_ARGS=(--mca coll_tuned_use_dynamic_rules 1 --mca coll_tuned_allreduce_algorithm "$MPI_ALGORITHM")
fi
for spec in "${BINS[@]}"; do
  [ -x "${spec#*=}" ] && [ -f "${spec#*=}" ] || bad "${spec#*=} is not an executable (build first: bash scripts/build.sh)"
done
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
source "$ROOT/scripts/mpi_env.sh"  # one host: shared memory only
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
echo "host: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); $(mpirun --version | head -1)"
echo "checkout $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?'); $REPS runs per configuration; ${BINS[*]}"
echo "shardsim algorithm: $ALGORITHM; MPI_Allreduce algorithm: ${MPI_ALGORITHM:-Open MPI default}"
for np in "${RANKS[@]}"; do
  for rep in $(seq 1 "$REPS"); do
    for spec in "${BINS[@]}"; do
      name=${spec%%=*} bin=${spec#*=}
      wait_env=()
      case "$name" in *.*) wait_env=(-x "SHARDSIM_WAIT=${name##*.}") ;; esac
      # --mca btl self,vader: shared memory only (no TCP listener); the same transport MPI_Allreduce uses.
      mpirun -q -np "$np" --oversubscribe --mca btl self,vader "${MPI_ALGO_ARGS[@]}" "${wait_env[@]}" "$bin" bench all_reduce -b 4K -e 256K -f 4 \
        -a "$ALGORITHM" -n 200 -w 10 --vs-mpi --csv "$WORK/$name.np$np.small.$rep.csv" >/dev/null
      mpirun -q -np "$np" --oversubscribe --mca btl self,vader "${MPI_ALGO_ARGS[@]}" "${wait_env[@]}" "$bin" bench all_reduce -b 1M -e 256M -f 4 \
        -a "$ALGORITHM" -n 5 -w 1 --vs-mpi --csv "$WORK/$name.np$np.large.$rep.csv" >/dev/null
    done
  done
done
for spec in "${BINS[@]}"; do
  ALGORITHM="$ALGORITHM" MPI_ALGORITHM="${MPI_ALGORITHM:-Open MPI default}" python3 - "$WORK/${spec%%=*}" "$REPS" "${spec%%=*}" "${RANKS[@]}" <<'PY'
import csv, os, statistics, sys
algo = f"{os.environ['ALGORITHM']} (MPI: {os.environ['MPI_ALGORITHM']})"
work, reps, name, ranks = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
def size(b):
    b = int(b)
    return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"
for np_ in ranks:
    rows = {}  # size -> list of (shardsim busbw, mpi busbw, algorithm)
    for rep in range(1, reps + 1):
        for part in ("small", "large"):
            for r in csv.DictReader(open(f"{work}.np{np_}.{part}.{rep}.csv")):
                if r["placement"] != "out-of-place":
                    continue
                rows.setdefault(int(r["size_bytes"]), []).append(
                    (float(r["wall_busbw_gbps"]), float(r["mpi_busbw_gbps"]), r["algorithm"]))
    print(f"\n[{name}] all_reduce fp32 sum, {np_} ranks, out-of-place, algorithm {algo}: wall busbw (GB/s), "
          f"median of {reps}")
    print(f'{"size":>8} {"algorithm":>12} {"shardsim":>9} {"MPI":>9} {"ratio":>7}  {"ratios of each run":<24}')
    for b in sorted(rows):
        v = rows[b]
        ratios = [s / m for s, m, _ in v]
        print(f'{size(b):>8} {v[0][2]:>12} {statistics.median(s for s, _, _ in v):>9.3f} '
              f'{statistics.median(m for _, m, _ in v):>9.3f} {statistics.median(ratios):>6.2f}x  '
              + " ".join(f"{x:.2f}" for x in ratios))
PY
done

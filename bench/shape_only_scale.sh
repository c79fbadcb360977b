#!/usr/bin/env bash
# Host cost of shape-only collectives at scale (issue 17): a 1 GiB fp32 all_reduce, shape-only, all chips on ONE
# MPI rank (fibers), ring of N chips (100 GB/s, 1000 ns per link), for N in CHIPS. Per point: wall time of the
# whole process and of the collective alone (bench's wall column, one timed call), peak RSS (/usr/bin/time -v),
# messages (ring: 2 N (N-1) per lane). Fits wall = a + b * messages (least squares) and plots wall against chips
# with gnuplot; the data reach gnuplot as a file, never as program text. For docs/performance/scale.md.
# Usage: bash bench/shape_only_scale.sh [OUT_DIR] [ALGO] [CHIPS...]
#        defaults: OUT_DIR=bench-out/shape_only_scale, ALGO=ring, CHIPS="8 64 256 1024"
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
source "$ROOT/scripts/mpi_env.sh"  # one host: shared memory only
OUT="${1:-bench-out/shape_only_scale}"
ALGO="${2:-ring}"
shift $(( $# >= 2 ? 2 : $# ))
CHIPS=("$@")
[ ${#CHIPS[@]} -gt 0 ] || CHIPS=(8 64 256 1024)
mkdir -p "$OUT"
DATA="$OUT/scale.tsv"
printf '# chips\tmessages\twall_total_s\twall_collective_s\trss_kib\tsim_us\talgorithm\n' >"$DATA"
for n in "${CHIPS[@]}"; do
  /usr/bin/time -v -o "$OUT/time.$n.txt" mpirun -q -np 1 "$ROOT/build/apps/shardsim" --chips "$n" \
    bench all_reduce -b 1G -e 1G -n 1 -w 0 -a "$ALGO" --bandwidth 100 --latency 1000 --shape-only \
    --json "$OUT/bench.$n.json" >"$OUT/bench.$n.txt"
  python3 - "$n" "$OUT/time.$n.txt" "$OUT/bench.$n.json" >>"$DATA" <<'PY'
import json, re, sys
n, tfile, jfile = int(sys.argv[1]), sys.argv[2], sys.argv[3]
t = open(tfile).read()
wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\S+)", t).group(1).split(":")
secs = sum(float(x) * 60 ** i for i, x in enumerate(reversed(wall)))
rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", t).group(1))
row = json.load(open(jfile))["rows"][0]
lanes = 2 if row["algorithm"] == "bidir_ring" else 1
print(f'{n}\t{2 * n * (n - 1) * lanes}\t{secs:.2f}\t{row["wall_time_us"] / 1e6:.3f}\t{rss}\t{row["sim_time_us"]:.2f}\t{row["algorithm"]}')
PY
  tail -n 1 "$DATA"
done
python3 - "$DATA" <<'PY'
import sys
rows = [l.split("\t") for l in open(sys.argv[1]) if not l.startswith("#")]
x = [float(r[1]) for r in rows]; y = [float(r[3]) for r in rows]; c = [float(r[0]) for r in rows]
m = [float(r[4]) for r in rows]
k = len(x); mx = sum(x) / k; my = sum(y) / k
b = sum((a - mx) * (v - my) for a, v in zip(x, y)) / max(sum((a - mx) ** 2 for a in x), 1e-30)
print(f"fit: collective wall = {my - b * mx:.3f} s + {b * 1e9:.1f} ns x messages")
if k > 1:
    per_chip = (m[-1] - m[0]) / (c[-1] - c[0])
    print(f"RSS per simulated chip between {int(c[0])} and {int(c[-1])} chips: {per_chip:.0f} KiB")
PY
if command -v gnuplot >/dev/null; then
  (cd "$OUT" && gnuplot -e "datafile='scale.tsv'; outfile='scale.png'" "$ROOT/bench/shape_only_scale.gp") &&
    echo "plot: $OUT/scale.png"
fi

#!/usr/bin/env python3
"""Request-rate sweep of `shardsim serve` (docs/SERVING.md): runs CONFIG at each rate (serve.trace.rate) and writes
one CSV row per rate with the TTFT / TPOT percentiles, throughput and goodput read from the run's --json, then
prints the knee: the first rate whose TTFT p99 exceeds KNEE_FACTOR times the lowest rate's.

  python3 scripts/serve_sweep.py --binary build/apps/shardsim --config configs/serve/llama3_70b_h100_tp8.yaml \
      --chips 8 --rates 1,2,4,6,8,10,12 --count 500 --out docs/serving/rate_sweep_continuous.csv

The plot (docs/serving/rate_sweep.gp, gnuplot) reads the CSV files as data.
"""
import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile

COLUMNS = ["rate", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms", "e2e_p50_s", "e2e_p99_s",
           "requests_per_s", "output_tokens_per_s", "goodput_requests_per_s", "batch_mean", "kv_occupancy_peak"]


def run(args, rate):
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "serve.json")
        cmd = [args.binary]
        if args.chips > 1:
            cmd += ["--chips", str(args.chips)]
        cmd += ["serve", args.config, "--set", f"serve.trace.rate={rate}", "--set", f"serve.trace.count={args.count}",
                "--json", out]
        for s in args.set:
            cmd += ["--set", s]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        with open(out) as f:
            m = json.load(f)["metrics"]
    return [rate, 1e3 * m["ttft_s"]["p50"], 1e3 * m["ttft_s"]["p99"], 1e3 * m["tpot_s"]["p50"],
            1e3 * m["tpot_s"]["p99"], m["e2e_s"]["p50"], m["e2e_s"]["p99"], m["requests_per_s"],
            m["output_tokens_per_s"], m["goodput_requests_per_s"], m["batch_mean"], m["kv_occupancy_peak"]]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--binary", required=True)
    p.add_argument("--config", required=True)
    p.add_argument("--chips", type=int, default=1)
    p.add_argument("--rates", required=True, help="comma-separated requests/s")
    p.add_argument("--count", type=int, default=500)
    p.add_argument("--set", action="append", default=[], help="extra --set overrides")
    p.add_argument("--out", required=True)
    p.add_argument("--knee-factor", type=float, default=2.0)
    args = p.parse_args()
    rows = [run(args, float(r)) for r in args.rates.split(",")]
    tmp = args.out + ".tmp"
    with open(tmp, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(COLUMNS)
        for r in rows:
            w.writerow([f"{x:.6g}" for x in r])
    os.replace(tmp, args.out)
    base = rows[0][2]
    knee = next((r[0] for r in rows if r[2] > args.knee_factor * base), None)
    for r in rows:
        print(f"rate {r[0]:6.2f}/s  TTFT p50 {r[1]:9.1f} p99 {r[2]:9.1f} ms  TPOT p50 {r[3]:7.2f} p99 {r[4]:7.2f} ms  "
              f"{r[7]:6.2f} req/s  {r[8]:8.1f} tok/s  batch {r[10]:6.1f}")
    print(f"knee: TTFT p99 above {args.knee_factor:g}x the lowest rate's ({base:.1f} ms) from "
          f"{knee if knee is not None else 'no rate swept'} requests/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

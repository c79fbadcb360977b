#!/usr/bin/env python3
"""The serving validation table (docs/SERVING.md, "Validation"): runs every configs/serve/validation/*.yaml with
`shardsim serve --json` and compares the published figure its header quotes ("# published: METRIC VALUE";
METRIC output_tokens_per_s or ttft_ms) with the simulated one. Errors as they come: nothing is fitted.

  python3 scripts/serve_validation.py --binary build/apps/shardsim [--dir configs/serve/validation]

Prints a Markdown table. The configs are read as text (the two header fields and parallel.tp), never executed.
"""
import argparse
import glob
import json
import os
import re
import subprocess
import sys
import tempfile


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--binary", required=True)
    p.add_argument("--dir", default="configs/serve/validation")
    args = p.parse_args()
    print("| config | published | simulated | error | simulated per chip | error per chip |")
    print("|---|---:|---:|---:|---:|---:|")
    errors = []
    for path in sorted(glob.glob(os.path.join(args.dir, "*.yaml"))):
        text = open(path).read()
        pub = re.search(r"^# published: (output_tokens_per_s|ttft_ms) ([0-9.]+)$", text, re.M)
        tp = re.search(r"^  tp: ([0-9]+)$", text, re.M)
        if not pub or not tp:
            print(f"| {os.path.basename(path)} | (no '# published:' line or parallel.tp) | | |")
            continue
        metric, value = pub.group(1), float(pub.group(2))
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "s.json")
            cmd = [args.binary] + (["--chips", tp.group(1)] if int(tp.group(1)) > 1 else []) + \
                  ["serve", path, "--json", out]
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            m = json.load(open(out))["metrics"]
        tput = metric == "output_tokens_per_s"
        sim = m["output_tokens_per_s"] if tput else 1e3 * m["ttft_s"]["p50"]
        unit = "out tok/s" if tput else "ms TTFT"
        err = (sim - value) / value
        errors.append(abs(err))
        per_chip = f"{m['output_tokens_per_s_per_chip']:,.1f} | {100 * (m['output_tokens_per_s_per_chip'] - value) / value:+.1f} %" \
            if tput and int(tp.group(1)) > 1 else " | "
        print(f"| {os.path.basename(path)[:-5]} | {value:,.0f} {unit} | {sim:,.1f} | {100 * err:+.1f} % | {per_chip} |")
    if errors:
        errors.sort()
        print(f"\nmedian |error| {100 * errors[len(errors) // 2]:.1f} %, max {100 * errors[-1]:.1f} % over {len(errors)} rows")
    return 0


if __name__ == "__main__":
    sys.exit(main())

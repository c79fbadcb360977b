#!/usr/bin/env python3
"""Re-runs the published tables of docs/SERVING.md with a shardsim binary and prints each as Markdown, in the
page's layout, so that a change to the model is one command away from its tables. Every run is the command quoted
beside its table in docs/SERVING.md (shape-only `shardsim serve` / `shardsim sweep`); nothing is fitted or edited.

  python3 scripts/serve_tables.py --binary build/apps/shardsim [--out out/serve_tables] [TABLE ...]

TABLE: configs, moe, rate, plans, disagg, phases, balance, whatif, validation (default: all, in the page's order; rate and
plans run sweeps of 16 and 12 points, a few minutes each). `configs` runs every configs/serve/*.yaml as it is. `rate` also copies results.csv / serve_latency.png to
docs/serving/rate_sweep.{csv,png}, `plans` results.csv to docs/serving/tp4_pp2_sweep.csv, and `disagg` writes
docs/serving/disagg_{colocated,disaggregated}.csv and redraws disagg.png when gnuplot is installed (--no-copy: leave
docs/serving/ alone). --reuse: a `serve` run whose --json already exists in --out is read, not run again (to
assemble the tables from runs made beforehand, e.g. in parallel with the same names). `validation` compares every configs/serve/validation/*.yaml's quoted published figure
("# published: METRIC VALUE", METRIC output_tokens_per_s or ttft_ms) with the simulated one, errors as they come.
Exit 0, or the failing command's own exit code with its command line on stderr.
"""
import argparse
import csv
import glob
import json
import os
import re
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Runner:
    def __init__(self, binary, out, reuse=False):
        self.binary, self.out, self.reuse = binary, out, reuse
        os.makedirs(out, exist_ok=True)

    def run(self, args, chips=1):
        cmd = [self.binary] + (["--chips", str(chips)] if chips > 1 else []) + args
        p = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if p.returncode != 0:
            sys.stderr.write("failed (exit %d): %s\n%s" % (p.returncode, " ".join(cmd), p.stderr))
            sys.exit(p.returncode)
        return p.stdout

    def serve(self, name, config, chips, sets=()):
        """One `serve CONFIG --json`: returns (json, text)."""
        path = os.path.join(self.out, name + ".json")
        args = ["serve", config, "--json", path]
        for s in sets:
            args += ["--set", s]
        if self.reuse and os.path.exists(path):
            with open(path) as f:
                return json.load(f), ""
        text = self.run(args, chips)
        with open(path) as f:
            return json.load(f), text


def ms(x):
    return f"{1e3 * x:,.1f}"


def ms2(x):
    return f"{1e3 * x:,.2f}"


def pair(m, key, fmt):
    return f"{fmt(m[key]['p50'])} / {fmt(m[key]['p99'])}"


def chips_of(text):
    """The chip count of a serve config: the product of its parallel: block's sizes (read as text); with per-phase
    plans (serve.disaggregation.prefill / decode: {parallel: {tp: T, dp: D}}, flow style) the sum of the groups'."""
    groups = re.findall(r"^ +parallel: \{([^}]*)\}$", text, re.M)
    if groups:
        total = 0
        for g in groups:
            n = 1
            for v in re.findall(r"(?:tp|pp|dp|ep): ([0-9]+)", g):
                n *= int(v)
            total += n
        return total
    block = re.search(r"^parallel:\n((?:  .*\n)*)", text, re.M)
    n = 1
    for v in re.findall(r"^  (?:tp|pp|dp|ep): ([0-9]+)$", block.group(1) if block else "", re.M):
        n *= int(v)
    return n


def plan_of(j):
    """A serve JSON's plan ("tp 8 x dp 2", per-phase "prefill tp 4 x dp 2 + decode tp 8")."""
    def axes(o):
        return " x ".join(f"{k} {o[k]}" for k in ("tp", "pp", "ep", "dp") if o[k] > 1) or "1 chip"
    d = j.get("disaggregation", {})
    if d.get("per_phase"):
        return f"prefill {axes(d['prefill'])} + decode {axes(d['decode'])}"
    return axes(j)


def cache_tokens(j):
    """The KV cache per chip in tokens (per phase: each group's)."""
    d = j.get("disaggregation", {})
    if d.get("per_phase"):
        return f"{d['prefill']['kv_cache']['tokens']:,} (prefill; decode {d['decode']['kv_cache']['tokens']:,})"
    return f"{j['kv_cache']['tokens']:,}"


def table_configs(r, _):
    print("| config | chips | plan | TTFT p50 / p99 (ms) | TPOT p50 / p99 (ms) | served (req/s) | output tok/s per chip "
          "| KV cache per chip (tokens) |")
    print("|---|---:|---|---:|---:|---:|---:|---:|")
    for path in sorted(glob.glob(os.path.join(ROOT, "configs/serve/*.yaml"))):
        name = os.path.basename(path)[:-5]
        chips = chips_of(open(path).read())
        j, _ = r.serve("config_" + name, os.path.relpath(path, ROOT), chips)
        m = j["metrics"]
        plan = plan_of(j)
        if "disaggregation" in j:
            plan += " (disaggregated)"
        print(f"| {name} | {chips} | {plan} | {pair(m, 'ttft_s', ms)} | {pair(m, 'tpot_s', ms2)} | "
              f"{m['requests_per_s']:.2f} | {m['output_tokens_per_s_per_chip']:,.1f} | {cache_tokens(j)} |")


def table_moe(r, _):
    cfg = "configs/serve/mixtral_8x7b_h100_ep8.yaml"
    plans = [("ep 8", []), ("ep 4 x tp 2, etp 2", ["parallel.ep=4", "parallel.tp=2", "parallel.etp=2"]),
             ("tp 8, etp 8", ["parallel.ep=1", "parallel.tp=8", "parallel.etp=8"])]
    print("| plan | weights per chip | 8 req/s: TTFT p50 / p99 (ms) | TPOT p50 / p99 (ms) | 32 req/s: TTFT p50 / p99 (ms) "
          "| TPOT p50 / p99 (ms) | served at 32 (req/s) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for i, (label, sets) in enumerate(plans):
        j8, _ = r.serve(f"moe{i}_8", cfg, 8, sets)
        j32, _ = r.serve(f"moe{i}_32", cfg, 8, sets + ["serve.trace.rate=32"])
        a, b = j8["metrics"], j32["metrics"]
        gib = j8["kv_cache"]["weights_bytes"] / 2**30
        print(f"| {label} | {gib:.1f} GiB | {pair(a, 'ttft_s', ms)} | {pair(a, 'tpot_s', ms2)} | {pair(b, 'ttft_s', ms)} "
              f"| {pair(b, 'tpot_s', ms2)} | {b['requests_per_s']:.1f} |")


def sweep_rows(r, config):
    name = os.path.splitext(os.path.basename(config))[0]
    r.run(["sweep", config, "--force"], chips=8)  # every point again (not results.csv's rows)
    path = os.path.join(ROOT, "out", "sweeps", name, "results.csv")
    with open(path) as f:
        return path, list(csv.DictReader(f))


def fms(row, key):
    return f"{float(row[key]):,.1f}" if float(row[key]) >= 100 else f"{float(row[key]):.1f}"


def fms2(row, key):
    return f"{float(row[key]):,.2f}"


def lat(row):
    return (f"{fms(row, 'ttft_p50_ms')} / {fms(row, 'ttft_p99_ms')} | "
            f"{fms2(row, 'tpot_p50_ms')} / {fms2(row, 'tpot_p99_ms')}")


def by_rate(rows, pick):
    out = {}
    for row in rows:
        if pick(row):
            out[float(row["rate"])] = row
    return out


def table_rate(r, copy):
    path, rows = sweep_rows(r, "configs/sweeps/serve_llama3_70b_rate.yaml")
    cont = by_rate(rows, lambda x: x["batching"] == "continuous")
    chunk = by_rate(rows, lambda x: x["batching"] == "chunked")
    print("| rate (req/s) | continuous TTFT p50 / p99 (ms) | TPOT p50 / p99 (ms) | chunked TTFT p50 / p99 (ms) | "
          "TPOT p50 / p99 (ms) | served (req/s, continuous / chunked) |")
    print("|---:|---:|---:|---:|---:|---:|")
    for rate in sorted(cont):
        a, b = cont[rate], chunk[rate]
        print(f"| {rate:g} | {lat(a)} | {lat(b)} | {float(a['requests_per_s']):.2f} / {float(b['requests_per_s']):.2f} |")
    if copy:
        shutil.copy(path, os.path.join(ROOT, "docs/serving/rate_sweep.csv"))
        png = os.path.join(os.path.dirname(path), "serve_latency.png")
        if os.path.exists(png):
            shutil.copy(png, os.path.join(ROOT, "docs/serving/rate_sweep.png"))


def table_plans(r, copy):
    path, rows = sweep_rows(r, "configs/sweeps/serve_llama3_70b_plans.yaml")
    tp8 = by_rate(rows, lambda x: x["plan"] == "tp8")
    tp4 = by_rate(rows, lambda x: x["plan"] != "tp8")
    print("| rate (req/s) | TP8 TTFT p50 / p99 (ms) | TPOT p50 / p99 (ms) | TP4 x PP2 TTFT p50 / p99 (ms) | "
          "TPOT p50 / p99 (ms) | served (req/s, TP8 / TP4 x PP2) |")
    print("|---:|---:|---:|---:|---:|---:|")
    for rate in sorted(tp8):
        a, b = tp8[rate], tp4[rate]
        print(f"| {rate:g} | {lat(a)} | {lat(b)} | {float(a['requests_per_s']):.2f} / {float(b['requests_per_s']):.2f} |")
    if copy:
        shutil.copy(path, os.path.join(ROOT, "docs/serving/tp4_pp2_sweep.csv"))


def per_request_csv(j, path):
    with open(path, "w") as f:
        f.write("ttft_ms,tpot_ms,e2e_s\n")
        for q in j["requests"]:
            tpot = (q[2] - q[1]) / (q[4] - 1) * 1e3 if q[4] > 1 else 0
            f.write("%.3f,%.4f,%.4f\n" % (q[1] * 1e3, tpot, q[2]))


def table_disagg(r, copy):
    cfg = "configs/serve/llama3_70b_h100_disagg.yaml"
    dis, text = r.serve("disagg", cfg, 16)
    col, _ = r.serve("colocated", cfg, 16, ["serve.disaggregation.prefill_replicas=0"])
    print("| 8 requests/s | TTFT p50 / p99 (ms) | TPOT p50 / p99 (ms) | ITL p99 (ms) | e2e p50 / p99 (s) | served (req/s) |")
    print("|---|---:|---:|---:|---:|---:|")
    for label, j in (("colocated (2 x TP8)", col), ("disaggregated (TP8 prefill + TP8 decode)", dis)):
        m = j["metrics"]
        print(f"| {label} | {pair(m, 'ttft_s', ms)} | {pair(m, 'tpot_s', ms2)} | {ms(m['itl_s']['p99'])} | "
              f"{m['e2e_s']['p50']:.2f} / {m['e2e_s']['p99']:.2f} | {m['requests_per_s']:.2f} |")
    line = [x for x in text.splitlines() if "KV cache transfers" in x]
    print("\n" + (line[0].strip() if line else "(no transfer line)"))
    if copy:
        d = os.path.join(ROOT, "docs/serving")
        per_request_csv(dis, os.path.join(d, "disagg_disaggregated.csv"))
        per_request_csv(col, os.path.join(d, "disagg_colocated.csv"))
        if shutil.which("gnuplot"):
            subprocess.run(["gnuplot", "disagg.gp"], cwd=d, check=True)


def table_phases(r, _):
    """Per-phase plans on two DGX H100 nodes: the same-plan twin and two per-phase splits, at 8 and 12 requests/s,
    goodput under a tight SLO (TTFT 500 ms, TPOT 10 ms)."""
    same = "configs/serve/llama3_70b_h100_disagg.yaml"
    per = "configs/serve/llama3_70b_h100_disagg_per_phase.yaml"
    slo = ["serve.slo.ttft_ms=500", "serve.slo.tpot_ms=10"]
    plans = [("TP8 prefill + TP8 decode", same, []),
             ("2 x TP4 prefill + TP8 decode", per, []),
             ("TP8 prefill + 2 x TP4 decode", per, ["serve.disaggregation.prefill.parallel={tp: 8}",
                                                     "serve.disaggregation.decode.parallel={tp: 4, dp: 2}"])]
    print("| plan | rate (req/s) | TTFT p50 / p99 (ms) | TPOT p50 / p99 (ms) | goodput (req/s) | served (req/s) "
          "| transfer mean / max (ms) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for i, (label, cfg, sets) in enumerate(plans):
        for rate in (8, 12):
            j, _ = r.serve(f"phases{i}_{rate}", cfg, 16, sets + slo + [f"serve.trace.rate={rate}"])
            m, t = j["metrics"], j["disaggregation"]["transfer_s"]
            print(f"| {label} | {rate} | {pair(m, 'ttft_s', ms)} | {pair(m, 'tpot_s', ms2)} | "
                  f"{m['goodput_requests_per_s']:.2f} | {m['requests_per_s']:.2f} | "
                  f"{ms2(sum(t) / len(t))} / {ms2(max(t))} |")


def table_balance(r, _):
    sets = ["parallel.dp=4", "serve.trace.rate=24", "serve.trace.count=1000",
            "serve.trace.prompt={kind: uniform, min: 64, max: 4096}", "serve.trace.output={kind: uniform, min: 8, max: 2048}"]
    print("| balancer | TTFT p50 / p99 (ms) | TPOT p50 / p99 (ms) | e2e p50 / p99 (s) | peak KV cache |")
    print("|---|---:|---:|---:|---:|")
    for lb in ("round_robin", "least_tokens"):
        j, _ = r.serve("balance_" + lb, "configs/serve/llama3_8b_h100.yaml", 4, sets + ["serve.load_balance=" + lb])
        m = j["metrics"]
        print(f"| {lb} | {pair(m, 'ttft_s', ms)} | {pair(m, 'tpot_s', ms2)} | "
              f"{m['e2e_s']['p50']:.2f} / {m['e2e_s']['p99']:.2f} | {100 * m['kv_occupancy_peak']:.1f} % |")


def table_whatif(r, _):
    text = r.run(["serve", "configs/serve/llama3_8b_h100.yaml", "--set", "parallel.tp=2", "--set", "serve.trace.count=20",
                  "--set", "serve.trace.rate=8", "--what-if", "hbm_bw=2x,peak=2x,parallel.tp=1"], chips=2)
    lines = text.splitlines()
    start = next((i for i, x in enumerate(lines) if x.strip().startswith("change")), None)
    print("```")
    print("\n".join(lines[start:] if start is not None else lines))
    print("```")


def table_validation(r, _):
    print("| config | published | simulated | error | simulated per chip | error per chip |")
    print("|---|---:|---:|---:|---:|---:|")
    errors = []
    for path in sorted(glob.glob(os.path.join(ROOT, "configs/serve/validation/*.yaml"))):
        text = open(path).read()
        pub = re.search(r"^# published: (output_tokens_per_s|ttft_ms) ([0-9.]+)$", text, re.M)
        tp = re.search(r"^  tp: ([0-9]+)$", text, re.M)
        name = os.path.basename(path)[:-5]
        if not pub or not tp:
            print(f"| {name} | (no '# published:' line or parallel.tp) | | | | |")
            continue
        metric, value, chips = pub.group(1), float(pub.group(2)), int(tp.group(1))
        m = r.serve("validation_" + name, os.path.relpath(path, ROOT), chips)[0]["metrics"]
        tput = metric == "output_tokens_per_s"
        sim = m["output_tokens_per_s"] if tput else 1e3 * m["ttft_s"]["p50"]
        err = (sim - value) / value
        errors.append(abs(err))
        per_chip = " | "
        if tput and chips > 1:
            pc = m["output_tokens_per_s_per_chip"]
            per_chip = f"{pc:,.1f} | {100 * (pc - value) / value:+.1f} %"
        unit = "out tok/s" if tput else "ms TTFT"
        print(f"| {name} | {value:,.0f} {unit} | {sim:,.1f} | {100 * err:+.1f} % | {per_chip} |")
    if errors:
        errors.sort()
        print(f"\nMedian |error| {100 * errors[len(errors) // 2]:.1f} %, max {100 * errors[-1]:.1f} % over {len(errors)} rows")


TABLES = {"configs": table_configs, "moe": table_moe, "rate": table_rate, "plans": table_plans, "disagg": table_disagg,
          "phases": table_phases, "balance": table_balance, "whatif": table_whatif, "validation": table_validation}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--binary", required=True)
    p.add_argument("--out", default="out/serve_tables")
    p.add_argument("--no-copy", action="store_true")
    p.add_argument("--reuse", action="store_true")
    p.add_argument("tables", nargs="*", metavar="TABLE")
    a = p.parse_args()
    bad = [t for t in a.tables if t not in TABLES]
    if bad:
        sys.stderr.write(f"serve_tables.py: unknown table '{bad[0]}' (one of: {', '.join(TABLES)})\n")
        return 2
    binary = os.path.abspath(a.binary)
    if not os.access(binary, os.X_OK):
        sys.stderr.write(f"serve_tables.py: --binary {a.binary}: not an executable file\n")
        return 2
    r = Runner(binary, os.path.join(ROOT, a.out), a.reuse)
    for t in a.tables or list(TABLES):
        print(f"## {t}\n", flush=True)
        TABLES[t](r, not a.no_copy)
        print(flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

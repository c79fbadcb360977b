#!/usr/bin/env python3
"""Regenerates docs/VALIDATION.md: shardsim's predicted step time for each published training run in
configs/validation/ (shaped kernel model, and the same config with kernels at peak beside it), against the
published figure. Run from the repository root after building:

    python3 scripts/validation_table.py            # writes docs/VALIDATION.md
    python3 scripts/validation_table.py --check    # prints the table, writes nothing
    python3 scripts/validation_table.py --jobs=3   # three runs at once

Each config states its source, the published step time (`# published_step_s: X`), what it expresses and what
it cannot express yet. Simulated numbers are deterministic; the runs take a few minutes on one small host.
"""
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "build", "apps", "shardsim")
CFG_DIR = os.path.join(ROOT, "configs", "validation")


def header_field(text, name):
    m = re.search(r"^# " + re.escape(name) + r":\s*(.*)$", text, re.M)
    return m.group(1).strip() if m else ""


def chips_of(text):
    tp = int(re.search(r"^\s+tp:\s*(\d+)", text, re.M).group(1))
    dp = int(re.search(r"^\s+dp:\s*(\d+)", text, re.M).group(1))
    pp = re.search(r"^\s+pp:\s*(\d+)", text, re.M)
    return tp * dp * (int(pp.group(1)) if pp else 1)


def run(cfg, chips, extra):
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_pml="ob1",
               OMPI_MCA_btl="self,vader", OMPI_MCA_oob_tcp_if_include="lo")
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "r.json")
        cmd = ["mpirun", "-q", "-np", "1", BIN, "--chips", str(chips), "train", cfg, "--json", out] + extra
        p = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit("validation_table: %s failed (exit %d): %s" % (" ".join(cmd), p.returncode, p.stderr.strip()))
        with open(out) as f:
            return json.load(f)["train"]


def main():
    check = "--check" in sys.argv[1:]
    jobs = 1
    for a in sys.argv[1:]:
        if a.startswith("--jobs="):
            jobs = max(1, int(a.split("=", 1)[1]))
    tasks = []
    for name in sorted(os.listdir(CFG_DIR)):
        if not name.endswith(".yaml"):
            continue
        cfg = os.path.join(CFG_DIR, name)
        with open(cfg) as f:
            text = f.read()
        tasks.append((name, cfg, text, chips_of(text)))
    # Every row twice (the shaped kernel model, and kernels at peak); --jobs=N runs N of these at once.
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        shaped = [pool.submit(run, cfg, chips, []) for (_, cfg, _, chips) in tasks]
        peak = [pool.submit(run, cfg, chips, ["--set", "device.kernel_model=peak"]) for (_, cfg, _, chips) in tasks]
        rows = []
        for (name, cfg, text, chips), s, p in zip(tasks, shaped, peak):
            s, p = s.result(), p.result()
            rows.append(dict(config="configs/validation/" + name, chips=chips,
                             published=float(header_field(text, "published_step_s")),
                             shaped_s=s["step_ns"] / 1e9, shaped_mfu=s["mfu"],
                             peak_s=p["step_ns"] / 1e9, peak_mfu=p["mfu"],
                             missing=header_field(text, "Not expressible yet")))
    lines = ["| config | chips | published s | shardsim s (kernel model) | error | MFU | shardsim s (kernels at peak) | error | not expressible yet |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    errs, errs_peak = [], []
    for r in rows:
        e = (r["shaped_s"] - r["published"]) / r["published"]
        ep = (r["peak_s"] - r["published"]) / r["published"]
        errs.append(e)
        errs_peak.append(ep)
        lines.append("| %s | %d | %.2f | %.3f | %+.1f%% | %.1f%% | %.3f | %+.1f%% | %s |" % (
            r["config"], r["chips"], r["published"], r["shaped_s"], 100 * e, 100 * r["shaped_mfu"], r["peak_s"],
            100 * ep, r["missing"]))
    def stats(v):
        a = sorted(abs(x) for x in v)
        med = a[len(a) // 2] if len(a) % 2 else 0.5 * (a[len(a) // 2 - 1] + a[len(a) // 2])
        return "median |error| %.1f%%, max |error| %.1f%%, mean signed error %+.1f%%" % (
            100 * med, 100 * max(a), 100 * sum(v) / len(v))
    table = "\n".join(lines) + "\n\nKernel model: " + stats(errs) + ". Kernels at peak: " + stats(errs_peak) + ".\n"
    if check:
        print(table)
        return
    doc_path = os.path.join(ROOT, "docs", "VALIDATION.md")
    with open(doc_path) as f:
        doc = f.read()
    begin, end = "<!-- table: scripts/validation_table.py -->", "<!-- end table -->"
    i, j = doc.index(begin) + len(begin), doc.index(end)
    doc = doc[:i] + "\n" + table + doc[j:]
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(doc_path), prefix=".VALIDATION.md.")
    with os.fdopen(fd, "w") as f:
        f.write(doc)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, doc_path)
    print(table)


if __name__ == "__main__":
    main()

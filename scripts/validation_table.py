#!/usr/bin/env python3
"""Regenerates docs/VALIDATION.md: shardsim's predicted step time for each published training run in
configs/validation/ (shaped kernel model, and the same config with kernels at peak beside it), against the
published figure. Run from the repository root after building:

    python3 scripts/validation_table.py            # writes docs/VALIDATION.md
    python3 scripts/validation_table.py --check    # prints the table, writes nothing
    python3 scripts/validation_table.py --jobs=3   # three runs at once
    SHARDSIM_BIN=/path/to/shardsim python3 scripts/validation_table.py   # another build's binary

Rows: every config at the folder's top level; configs/validation/slow/ and configs whose header has a
`# cannot_run: why` line are listed under the table with their published figure and why, not run; so is a row
whose plan shardsim finds does not fit its device's memory (train exits 2), with the figures it printed. The family of a
row is its file name's first part (its source), its device the config's preset; the summary is split by family,
device and scale, and each family's errors are set beside the other families' (nothing is fitted).

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
BIN = os.environ.get("SHARDSIM_BIN", os.path.join(ROOT, "build", "apps", "shardsim"))  # SHARDSIM_BIN: another build
CFG_DIR = os.path.join(ROOT, "configs", "validation")


def header_field(text, name):
    m = re.search(r"^# " + re.escape(name) + r":\s*(.*)$", text, re.M)
    return m.group(1).strip() if m else ""


def chips_of(text):
    tp = int(re.search(r"^\s+tp:\s*(\d+)", text, re.M).group(1))
    dp = int(re.search(r"^\s+dp:\s*(\d+)", text, re.M).group(1))
    pp = re.search(r"^\s+pp:\s*(\d+)", text, re.M)
    cp = re.search(r"^\s+cp:\s*(\d+)", text, re.M)
    return tp * dp * (int(pp.group(1)) if pp else 1) * (int(cp.group(1)) if cp else 1)


def family_of(name):
    """The source a row comes from: the config name's first part (korthikanti22, narayanan21, torchtitan24...)."""
    return os.path.basename(name).split("_")[0]


def device_of(text):
    m = re.search(r"^device:\s*\{?\s*(?:preset:\s*)?([A-Za-z0-9_]+)", text, re.M)
    return m.group(1) if m else "?"


def preset_peaks():
    """{preset: (bf16, fp8)} dense TFLOP/s from `shardsim help devices` (fp8 '-': the bf16 rate)."""
    out = subprocess.run([BIN, "help", "devices"], capture_output=True, text=True, check=True).stdout
    peaks = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 11 and re.match(r"^[0-9.]+$", cells[1]):
            peaks[cells[0]] = (float(cells[1]), float(cells[3]) if cells[3] != "-" else float(cells[1]))
    return peaks


def gemm_peak_ratio(text, peaks):
    """The row's MFU is against the peak of the precision its GEMMs run at: the fp8 peak for configs with
    `model.fp8` (their linear layers' GEMMs in FP8), the bf16 one otherwise. Returns bf16 peak / that peak."""
    if not re.search(r"^\s+fp8:\s*(tensor|block)\b", text, re.M):
        return 1.0
    bf16, fp8 = peaks.get(device_of(text), (1.0, 1.0))
    m = re.search(r"peak_tflops_bf16:\s*([0-9.]+)", text)
    bf16 = float(m.group(1)) if m else bf16
    m = re.search(r"peak_tflops_fp8:\s*([0-9.]+)", text)
    fp8 = float(m.group(1)) if m else fp8
    return bf16 / fp8


def run(cfg, chips, extra):
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_pml="ob1",
               OMPI_MCA_btl="self,vader", OMPI_MCA_oob_tcp_if_include="lo")
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "r.json")
        cmd = ["mpirun", "-q", "-np", "1", BIN, "--chips", str(chips), "train", cfg, "--json", out] + extra
        p = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if p.returncode == 2 and "simulated out of memory" in p.stderr:  # listed under the table, not dropped
            line = next(l for l in p.stderr.splitlines() if "simulated out of memory" in l)
            return {"does_not_fit": line[line.index("simulated out of memory"):].split("; use ")[0]}
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
    tasks, skipped = [], []
    for folder in (CFG_DIR, os.path.join(CFG_DIR, "slow")):
        for name in sorted(os.listdir(folder)):
            if not name.endswith(".yaml"):
                continue
            cfg = os.path.join(folder, name)
            with open(cfg) as f:
                text = f.read()
            rel = os.path.relpath(cfg, os.path.join(ROOT, "configs", "validation"))
            why = header_field(text, "cannot_run")
            if folder != CFG_DIR and not why:
                why = "slower to simulate than this table's budget on one small host (configs/validation/slow/)"
            if why:
                skipped.append(dict(config="configs/validation/" + rel, family=family_of(name), chips=chips_of(text),
                                    published=float(header_field(text, "published_step_s")), why=why))
                continue
            tasks.append((rel, cfg, text, chips_of(text)))
    # Every row twice (the shaped kernel model, and kernels at peak); --jobs=N runs N of these at once.
    peaks = preset_peaks()
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        shaped = [pool.submit(run, cfg, chips, []) for (_, cfg, _, chips) in tasks]
        peak = [pool.submit(run, cfg, chips, ["--set", "device.kernel_model=peak"]) for (_, cfg, _, chips) in tasks]
        rows = []
        for (name, cfg, text, chips), s, p in zip(tasks, shaped, peak):
            s, p = s.result(), p.result()
            if "does_not_fit" in s:
                skipped.append(dict(config="configs/validation/" + name, family=family_of(name), chips=chips,
                                    published=float(header_field(text, "published_step_s")),
                                    why="shardsim's memory model: " + s["does_not_fit"] + " (train exits 2)"))
                continue
            rows.append(dict(config="configs/validation/" + name, chips=chips, family=family_of(name),
                             device=device_of(text),
                             published=float(header_field(text, "published_step_s")),
                             shaped_s=s["step_ns"] / 1e9, shaped_mfu=s["mfu"] * gemm_peak_ratio(text, peaks),
                             peak_s=p["step_ns"] / 1e9, peak_mfu=p["mfu"],
                             missing=header_field(text, "Assumed") or header_field(text, "Not expressible yet")))
    lines = ["| config | family | device | chips | published s | shardsim s (kernel model) | error | MFU (of the GEMMs' precision's peak) | shardsim s (kernels at peak) | error | assumed / not expressible |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    errs, errs_peak = [], []
    for r in rows:
        e = (r["shaped_s"] - r["published"]) / r["published"]
        ep = (r["peak_s"] - r["published"]) / r["published"]
        r["err"] = e
        errs.append(e)
        errs_peak.append(ep)
        lines.append("| %s | %s | %s | %d | %.2f | %.3f | %+.1f%% | %.1f%% | %.3f | %+.1f%% | %s |" % (
            r["config"], r["family"], r["device"], r["chips"], r["published"], r["shaped_s"], 100 * e,
            100 * r["shaped_mfu"], r["peak_s"], 100 * ep, r["missing"]))

    def stats(v):
        a = sorted(abs(x) for x in v)
        med = a[len(a) // 2] if len(a) % 2 else 0.5 * (a[len(a) // 2 - 1] + a[len(a) // 2])
        return "median |error| %.1f%%, max |error| %.1f%%, mean signed error %+.1f%%" % (
            100 * med, 100 * max(a), 100 * sum(v) / len(v))

    def scale(chips):
        return "1-8 chips" if chips <= 8 else "9-128 chips" if chips <= 128 else "129-1024 chips" if chips <= 1024 \
            else "over 1024 chips"

    def split(title, key):
        out = ["", "| %s | rows | kernel model |" % title, "|---|---:|---|"]
        groups = {}
        for r in rows:
            groups.setdefault(key(r), []).append(r["err"])
        for g in sorted(groups):
            out.append("| %s | %d | %s |" % (g, len(groups[g]), stats(groups[g])))
        return out

    table = "\n".join(lines) + "\n\nKernel model: " + stats(errs) + ". Kernels at peak: " + stats(errs_peak) + ".\n"
    by = split("family", lambda r: r["family"]) + split("device", lambda r: r["device"]) + \
        split("scale", lambda r: scale(r["chips"]))
    # Leave one family out: nothing is fitted, so this only sets each family's errors beside the others'.
    loo = ["", "| family left out | its rows | its errors | the other families' errors |", "|---|---:|---|---|"]
    fams = sorted({r["family"] for r in rows})
    for f in fams:
        inside = [r["err"] for r in rows if r["family"] == f]
        rest = [r["err"] for r in rows if r["family"] != f]
        loo.append("| %s | %d | %s | %s |" % (f, len(inside), stats(inside), stats(rest) if rest else "(none)"))
    table += "\n".join(by) + "\n\nLeave one family out (nothing is fitted: each family's errors beside the others'):\n" + \
        "\n".join(loo) + "\n"
    if skipped:
        table += "\nNot run (listed, not dropped):\n\n| config | family | chips | published s | why not |\n|---|---|---:|---:|---|\n"
        for r in skipped:
            table += "| %s | %s | %d | %.2f | %s |\n" % (r["config"], r["family"], r["chips"], r["published"], r["why"])
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

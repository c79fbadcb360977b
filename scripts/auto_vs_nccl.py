#!/usr/bin/env python3
"""What `parallel.algorithm: auto` picks against what NCCL's tuning model picks, for all_reduce, reduce_scatter,
all_gather and broadcast at 8 to 16,384 chips on a switch, DGX-shaped rail nodes and a 2D torus; prints the
Markdown table of docs/performance/collectives.md ("auto against NCCL").

    python3 scripts/auto_vs_nccl.py [--bin build/apps/shardsim] [--chips 8,64,...] > table.md

auto's choice: `shardsim bench C --choose-only` (the cost model's replay of every applicable algorithm on the
group's routes, collectives/algorithms.h; nothing runs). NCCL's choice: NCCL's own tuning model (NCCL
src/graph/tuning.cc, ncclTopoTuneModel and ncclTopoGetAlgoTime, 2.19-2.22: time = latency + bytes / algorithm
bandwidth for each algorithm x protocol, the lowest wins), transcribed below as a model of the rule, not of NCCL's
topology search: the bandwidth of all channels together (nChannels x bw) is the topology's per chip (its link inside
one node; across DGX-shaped nodes one rail-aligned channel per NIC, 8 x 50 GB/s), the per-channel caps are taken
as not binding (16 channels), and NVLS / CollNet are off (none of these switches reduces in the network) as is PAT (NCCL 2.23+
runs it only with one GPU per node). Sizes: 64 KiB, 8 MiB, 1 GiB per chip's buffer (fp32).
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

SIZES = [64 << 10, 8 << 20, 1 << 30]
COLLECTIVES = ["all_reduce", "reduce_scatter", "all_gather", "broadcast"]
MAX_PER_RANK = 4096  # chips one MPI rank may host (apps/main.cpp)

# NCCL's constants (tuning.cc; latencies in us, bandwidths in GB/s). Protocols LL, LL128, Simple.
PROTOS = ["LL", "LL128", "Simple"]
BASE_LAT = {"Tree": [6.8, 14.0, 0.0], "Ring": [6.6, 14.0, 8.4]}
HW_LAT = {"nvlink": {"Tree": [0.6, 1.25, 28.0], "Ring": [0.6, 1.9, 3.4]},
          "net": {"Tree": [5.0, 8.5, 28.0], "Ring": [2.7, 4.0, 14.0]}}
LL_MAX_BW = {1: 87.7, 2: 39.0, 4: 20.4}  # Hopper one node; Intel hosts at 2 and at more nodes
TREE_CORRECTION = [  # powers of two of bytes / 64, from 64 B (index 0) up
    [1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0],
    [1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0],
    [.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9]]
NET_OVERHEAD_US = 1.0  # Intel x86 hosts (getNetOverhead); x3 for Simple


def log2i(x):
    return max(int(x).bit_length() - 1, 0)


def nccl_choice(coll, size, ranks, nodes, bw_intra, bw_inter):
    """NCCL's (algorithm, protocol) for COLL of SIZE bytes on RANKS GPUs in NODES nodes; BW_*: GB/s per GPU."""
    if coll == "broadcast":
        return "Ring", "any"  # broadcast and reduce: Ring only (tuning.cc skips every other algorithm)
    nsteps = 2 * (ranks - 1) if coll == "all_reduce" else ranks - 1
    inter_steps = (2 * nodes if nodes > 1 else 0) if coll == "all_reduce" else nodes - 1
    ll_max = LL_MAX_BW[1 if nodes == 1 else 2 if nodes == 2 else 4]
    best = None
    for algo in (["Ring", "Tree"] if coll == "all_reduce" else ["Ring"]):
        for p, proto in enumerate(PROTOS):
            bus = bw_intra if nodes <= 2 else bw_inter
            if algo == "Ring" and proto == "LL":
                bus = min(ll_max, bus * (1 / 4 if nodes > 1 or coll == "all_reduce" else 1 / 3))
            if algo == "Ring" and proto == "LL128":
                bus = bus * (0.7 if ranks / nodes < 2 else 0.92)
            if algo == "Tree":
                bus = bus * 0.92
                if proto == "LL":
                    bus = min(bus / 3.8, ll_max)
                if proto == "LL128":
                    bus = bus * (7 / 9 if nodes == 1 else 120 / 128)
            bw = bus * (ranks / nsteps if algo == "Ring" else 0.5)
            intra = HW_LAT["nvlink"][algo][p]
            inter = HW_LAT["net"][algo][p]
            lat = BASE_LAT[algo][p]
            if algo == "Ring":
                if nodes > 1:
                    intra = max(intra, NET_OVERHEAD_US * (3 if proto == "Simple" else 1))
                lat += (nsteps - inter_steps) * intra + inter_steps * inter
            else:
                lat += 2 * ((ranks // nodes - 1) * intra + log2i(nodes) * inter)
            if algo == "Tree" and log2i(size >> 6) < 23:
                bw *= TREE_CORRECTION[p][log2i(size >> 6)]
            if algo == "Ring" and proto == "Simple" and nodes > 1 and coll == "all_reduce" and size / (16 * ranks) >= 64:
                lat *= 1.4  # the ring's plateau (Ampere and later; 16 channels assumed)
            t = lat + size / (1000 * bw)
            if best is None or t < best[0]:
                best = (t, algo, proto)
    return best[1], best[2]


# shardsim's algorithms as NCCL's: the ring and its channels are NCCL's Ring, double_binary_tree its Tree.
FAMILY = {"ring": "Ring", "bidir_ring": "Ring", "multi_ring": "Ring", "rail_ring": "Ring",
          "double_binary_tree": "Tree", "in_switch": "NVLS", "torus": "-", "torus_concurrent": "-"}


def topologies(n):
    """(name, yaml text or CLI flags, nodes, GB/s per chip inside a node, across nodes) for N chips."""
    out = [("switch", ["--switch", "--bandwidth", "450", "--latency", "1000"], 1, 450.0, 450.0)]
    if n >= 16:
        out.append(("rails", "topology:\n  kind: stacked\n  dims:\n"
                    f"    - {{kind: switch, size: {n // 8}, bandwidth_gbps: 50, latency_ns: 5000}}\n"
                    "    - {kind: switch, size: 8, bandwidth_gbps: 450, latency_ns: 1000}\n", n // 8, 450.0, 400.0))
    a = 2 ** (int(math.log2(n)) // 2)
    out.append((f"torus {a}x{n // a}", ["--torus", f"{a}x{n // a}", "--bandwidth", "100", "--latency", "1000"],
                1, 100.0, 100.0))
    return out


def auto_choices(binary, n, coll, topo, work, cache):
    key = f"{n}\t{coll}\t{topo if isinstance(topo, str) else ' '.join(topo)}"
    if key in cache:
        return cache[key]
    ranks = -(-n // MAX_PER_RANK)
    if isinstance(topo, str):
        path = os.path.join(work, f"topo_{n}.yaml")
        with open(path, "w") as f:
            f.write(topo)
        flags = ["--topology", path]
    else:
        flags = topo
    cmd = ["mpirun", "-q", "--oversubscribe", "-np", str(ranks), binary, "--chips", str(n), "bench", coll, *flags,
           "-b", str(SIZES[0]), "-e", str(SIZES[-1]), "-f", "128", "--shape-only", "--choose-only"]
    # Rank 0 alone estimates, for minutes at 16,384 chips: the watchdog's 300 s would take that for a hang.
    env = dict(os.environ, SHARDSIM_WATCHDOG_S="0")
    run = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if run.returncode != 0:
        sys.exit(f"auto_vs_nccl.py: {' '.join(cmd)}: exit {run.returncode}: {run.stderr.strip()[-300:]}")
    out = run.stdout
    rows = [l.split() for l in out.splitlines() if l and not l.startswith("#")]
    cache[key] = {int(r[0]): (r[2], float(r[3])) for r in rows}
    return cache[key]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default=os.path.join(os.path.dirname(__file__), "..", "build", "apps", "shardsim"))
    ap.add_argument("--chips", default="8,64,512,4096,16384")
    ap.add_argument("--cache", help="keep auto's choices in this file (JSON) and reuse them: the NCCL side re-evaluated "
                                    "without running shardsim again")
    args = ap.parse_args()
    cache = {}
    if args.cache and os.path.exists(args.cache):
        with open(args.cache) as f:
            cache = {k: {int(s): tuple(v) for s, v in d.items()} for k, d in json.load(f).items()}
    binary = os.path.realpath(args.bin)
    print("| chips | topology | collective | auto at 64 KiB / 8 MiB / 1 GiB | NCCL's rule | departs |")
    print("|---:|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as work:
        for n in (int(x) for x in args.chips.split(",")):
            for name, topo, nodes, bw_intra, bw_inter in topologies(n):
                for coll in COLLECTIVES:
                    got = auto_choices(binary, n, coll, topo, work, cache)
                    if args.cache:
                        with open(args.cache, "w") as f:
                            json.dump(cache, f)
                    autos, ncc, departs = [], [], []
                    for s in SIZES:
                        a = got[s][0]
                        algo, proto = nccl_choice(coll, s, n, nodes, bw_intra, bw_inter)
                        autos.append(a)
                        ncc.append(algo if proto == "any" else f"{algo}/{proto}")
                        if FAMILY.get(a, a) != algo:
                            departs.append(s)
                    mark = ", ".join({64 << 10: "64 KiB", 8 << 20: "8 MiB", 1 << 30: "1 GiB"}[s] for s in departs)
                    print(f"| {n:,} | {name} | {coll} | {' / '.join(autos)} | {' / '.join(ncc)} | {mark or 'no'} |")
                    sys.stdout.flush()


if __name__ == "__main__":
    main()

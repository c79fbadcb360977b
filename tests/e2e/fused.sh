#!/usr/bin/env bash
# e2e: `parallel.fused: true` (issue 6). The fused MLP and transformer block validate against one device like the
# unfused ones; the report's per-op T_compute / T_comm / T_fused / unfused / overlap / speedup lines are there and
# consistent (T_fused >= max(T_compute, T_comm) - rounding; unfused = the unfused run's time: the run's
# "run_unfused_ns" equals the total of the same config with fused: false); bytes equal the unfused formulas;
# chunks: auto never picks worse than the unfused path (1 piece is among the candidates); bad settings exit 2.
# Usage: fused.sh SHARDSIM_BINARY CONFIG_DIR [MPIEXEC]
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
e2e_init "$@"
E2E_TIMEOUT=${E2E_TIMEOUT_FUSED:-180}
BLOCK="$CONFIGS/blocks/small_block.yaml"

# block NAME PLAN: the small block made larger (GEMMs worth overlapping) on a 4-chip ring of Trainium-class chips
# with 25 GB/s links, PLAN as parallel:.
block() {
  sed "s/^  tp: 4/$2/; s/hidden: 128/hidden: 512/; s/ffn: 344/ffn: 1376/; s/seq: 64/seq: 256/;
       s/preset: generic/preset: trainium1/; s/bandwidth_gbps: 100/bandwidth_gbps: 25/" "$BLOCK" >"$1.yaml"
}

# consistent FUSED.json UNFUSED.json: the fused report against the unfused run of the same config.
consistent() {
  if python3 - "$1" "$2" <<'PY'; then pass "$1: fused report consistent with the unfused run"; else fail "$1 vs $2"; fi
import json, sys
f, u = (json.load(open(p)) for p in sys.argv[1:3])
fs, us = f["simulated"], u["simulated"]
fu = fs["fused"]
total = lambda s: s.get("total_ns", s.get("breakdown", {}).get("total_ns"))
bad = []
if not fu["ops"]:
    bad.append("no fused ops")
for o in fu["ops"]:
    for k in ("compute_ns", "comm_ns", "fused_ns", "unfused_ns", "overlap_efficiency", "speedup", "chunks", "cut"):
        if k not in o: bad.append(f"{o.get('name')}: no {k}")
    if o["fused_ns"] < max(o["compute_ns"], o["comm_ns"]) * (1 - 1e-9):
        bad.append(f"{o['name']}: T_fused {o['fused_ns']} below max(T_compute, T_comm)")
    eff = (o["compute_ns"] + o["comm_ns"] - o["fused_ns"]) / min(o["compute_ns"], o["comm_ns"])
    if abs(eff - o["overlap_efficiency"]) > 1e-9: bad.append(f"{o['name']}: overlap efficiency {o['overlap_efficiency']} != {eff}")
    if abs(o["speedup"] - o["unfused_ns"] / o["fused_ns"]) > 1e-9: bad.append(f"{o['name']}: speedup")
# The run with the fused ops replaced by their unfused time is the unfused run (T_comm is the replay estimate:
# exact when chunks divide evenly, as here).
if abs(fu["run_unfused_ns"] - total(us)) > 1e-6 * total(us):
    bad.append(f"run_unfused_ns {fu['run_unfused_ns']} != unfused total {total(us)}")
print(f"fused {total(fs)/1e3:.3f} us, unfused {total(us)/1e3:.3f} us, speedup {fu['run_speedup']:.3f}x;",
      ", ".join(f"{o['name']} {o['chunks']}{' auto' if o.get('auto_chunks') else ''} eff {o['overlap_efficiency']:.2f}" for o in fu["ops"]))
if bad:
    sys.exit("; ".join(bad))
PY
}

e2e_case "transformer block: tp and tp+sp, fused vs unfused"
block tp "  tp: 4"
block tpf "  tp: 4\n  fused: true"
block tpf4 "  tp: 4\n  fused: true\n  chunks: 4"
block sp "  tp: 4\n  sp: true\n  algorithm: ring"  # the fused ops are ring-based: compare with ring
block spf "  tp: 4\n  sp: true\n  fused: true\n  algorithm: ring"
for n in tp tpf tpf4 sp spf; do
  expect_exit 0 '^PASS$' -- shardsim_mpi 4 run "$n.yaml" --json "$n.json" || continue
  case $n in
    tpf|tpf4) assert_out 'gemm\.o \+ tp all_reduce +[0-9]+' "per-op line for Wo"
              assert_out 'gemm\.down \+ tp all_reduce' "per-op line for W_down"
              assert_out 'run with these ops unfused' "run-level unfused line" ;;
    spf) assert_out 'sp all_gather \+ gemm\.q/k/v +4 ring shards' "all_gather feeding Q/K/V"
         assert_out 'gemm\.down \+ sp reduce_scatter' "GEMM + reduce_scatter" ;;
  esac
done
consistent tpf.json tp.json
consistent tpf4.json tp.json
consistent spf.json sp.json
if python3 - tpf.json tp.json spf.json sp.json <<'PY'; then pass "bytes = formula, auto never worse than unfused"; else fail "bytes or auto"; fi
import json, sys
tpf, tp, spf, sp = (json.load(open(p)) for p in sys.argv[1:5])
bad = []
for r in (tpf, spf):
    for k, c in r["communication"].items():
        if abs(c["bytes_per_chip"] - c["formula_bytes"]) > 1e-9 * c["formula_bytes"]: bad.append(k)
if tpf["simulated"]["total_ns"] > tp["simulated"]["total_ns"] * (1 + 1e-9): bad.append("auto chunks slower than unfused")
if spf["simulated"]["exposed_comm_ns"] >= sp["simulated"]["exposed_comm_ns"]: bad.append("sp fused hides nothing")
if bad:
    sys.exit(", ".join(bad))
PY

e2e_case "MLP: down projection + all_reduce fused"
{ cat "$CONFIGS/workloads/small_mlp.yaml"; printf 'parallel:\n  tp: 4\n  fused: true\n  chunks: 3\n'; } >mlpf.yaml
grep -q 'fused: true' mlpf.yaml || fail "test bug: could not add fused to small_mlp.yaml"
if expect_exit 0 'validation PASS' -- shardsim_mpi 4 run mlpf.yaml --json mlpf.json --no-checkpoint; then
  assert_out 'gemm\.down \+ tp all_reduce +3 ' "MLP per-op line with 3 pieces"
  if expect_exit 0 'validation PASS' -- shardsim_mpi 4 run "$CONFIGS/workloads/small_mlp.yaml" --plan tp=4 --json mlp.json --no-checkpoint; then
    consistent mlpf.json mlp.json
  fi
fi

e2e_case "bad fused settings"
block b1 "  tp: 4\n  chunks: 4"
expect_exit 2 'b1\.yaml:[0-9]+: parallel\.chunks: only used with fused: true' -- shardsim_mpi 4 run b1.yaml
block b2 "  cp: 4\n  fused: true"
expect_exit 2 'b2\.yaml:[0-9]+: parallel\.fused: needs tp > 1' -- shardsim_mpi 4 run b2.yaml
block b3 "  tp: 4\n  fused: true\n  chunks: many"
expect_exit 2 "b3\.yaml:[0-9]+: parallel\.chunks: 'many' \(auto, or a piece count 1\.\.4096\)" -- shardsim_mpi 4 run b3.yaml
block b4 "  tp: 4\n  sp: true\n  fused: true\n  chunks: 2"
expect_exit 2 'b4\.yaml:[0-9]+: parallel\.chunks: with sp the fused ops are rings' -- shardsim_mpi 4 run b4.yaml
block b5 "  tp: 4\n  fused: true\n  chunks: 100000"
expect_exit 2 'parallel\.chunks' -- shardsim_mpi 4 run b5.yaml
{ cat "$CONFIGS/workloads/small_mlp.yaml"; printf 'parallel:\n  tp: 4\n  fused: true\n  chunks: 65\n'; } >m65.yaml
expect_exit 2 'm65\.yaml:[0-9]+: parallel\.chunks: 65 pieces of an output \[16, 64\] cut along its longer side \(at most 64\)' \
  -- shardsim_mpi 4 run m65.yaml --no-checkpoint

e2e_finish

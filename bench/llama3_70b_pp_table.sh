#!/usr/bin/env bash
# docs/performance/training.md's Llama-3-70B 256-chip pipeline table (and README's subset), point by point with
# `train`: the 28 plans of configs/sweeps/llama3_70b_pp.yaml that run, on its two topologies, each one folded
# shape-only step of configs/models/llama3_70b_train_256.yaml (a few seconds a point on a 2-core host; the sweep's
# points give the same simulated figures, this prints them as the table's rows and the prose's splits).
#   bash bench/llama3_70b_pp_table.sh [SHARDSIM_BINARY [OUT_DIR]] > table.md
# Prints the table's markdown rows (plan, m, then step ms, tokens/s, MFU and bubble on the 4x4-torus nodes and on
# the DGX nodes, GiB per chip); OUT_DIR (default: a temporary directory) keeps every point's --json report and
# points.tsv: step, compute, exposed communication, the pipeline's mean bubble over its stages and the exposed
# communication less that bubble (ms), the figures the table's prose quotes. EXTRA="--set k=v ..." adds options to
# every run (e.g. to see what one device parameter moves). A point that fails prints its first error line and the
# script exits 3 at the end.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="$(realpath "${1:-$ROOT/build/apps/shardsim}")"
OUT="${2:-$(mktemp -d)}"
mkdir -p "$OUT" || exit 2
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
source "$ROOT/scripts/mpi_env.sh"
CFG="$ROOT/configs/models/llama3_70b_train_256.yaml"
# The sweep's two machines: its torus file, and its DGX stacked topology written as a file for --topology.
TORUS="$ROOT/configs/topologies/nodes16_torus4x4_switch.yaml"
DGX="$OUT/dgx_h100_x32.yaml"
cat >"$DGX" <<'YAML'
# configs/sweeps/llama3_70b_pp.yaml's dgx_h100_x32: 32 nodes of 8 GPUs on NVSwitch, one 50 GB/s NIC per GPU
topology:
  kind: stacked
  dims:
    - {kind: switch, size: 32, bandwidth_gbps: 50, latency_ns: 5000}
    - {kind: switch, size: 8, bandwidth_gbps: 450, latency_ns: 1000}
YAML
# The sweep's plans that run (label: pp, schedule, virtual stages, micro-batch size); tp 8 + sp, ZeRO 1, dp fills.
PLANS="pp1xtp8xdp32+sp-mb1-z1 1 - - 1
pp2xtp8xdp16+sp-1f1b-mb1-z1 2 1f1b - 1
pp2xtp8xdp16+sp-1f1b-mb2-z1 2 1f1b - 2
pp2xtp8xdp16+sp-interleaved-v2-mb1-z1 2 interleaved 2 1
pp2xtp8xdp16+sp-gpipe-mb1-z1 2 gpipe - 1
pp2xtp8xdp16+sp-gpipe-mb2-z1 2 gpipe - 2
pp2xtp8xdp16+sp-zb_h1-mb1-z1 2 zb_h1 - 1
pp2xtp8xdp16+sp-zb_h1-mb2-z1 2 zb_h1 - 2
pp4xtp8xdp8+sp-1f1b-mb1-z1 4 1f1b - 1
pp4xtp8xdp8+sp-1f1b-mb2-z1 4 1f1b - 2
pp4xtp8xdp8+sp-interleaved-v2-mb1-z1 4 interleaved 2 1
pp4xtp8xdp8+sp-gpipe-mb1-z1 4 gpipe - 1
pp4xtp8xdp8+sp-gpipe-mb2-z1 4 gpipe - 2
pp4xtp8xdp8+sp-zb_h1-mb1-z1 4 zb_h1 - 1
pp4xtp8xdp8+sp-zb_h1-mb2-z1 4 zb_h1 - 2
pp8xtp8xdp4+sp-1f1b-mb1-z1 8 1f1b - 1
pp8xtp8xdp4+sp-1f1b-mb2-z1 8 1f1b - 2
pp8xtp8xdp4+sp-interleaved-v2-mb1-z1 8 interleaved 2 1
pp8xtp8xdp4+sp-gpipe-mb1-z1 8 gpipe - 1
pp8xtp8xdp4+sp-gpipe-mb2-z1 8 gpipe - 2
pp8xtp8xdp4+sp-zb_h1-mb1-z1 8 zb_h1 - 1
pp8xtp8xdp4+sp-zb_h1-mb2-z1 8 zb_h1 - 2
pp16xtp8xdp2+sp-1f1b-mb1-z1 16 1f1b - 1
pp16xtp8xdp2+sp-1f1b-mb2-z1 16 1f1b - 2
pp16xtp8xdp2+sp-gpipe-mb1-z1 16 gpipe - 1
pp16xtp8xdp2+sp-gpipe-mb2-z1 16 gpipe - 2
pp16xtp8xdp2+sp-zb_h1-mb1-z1 16 zb_h1 - 1
pp16xtp8xdp2+sp-zb_h1-mb2-z1 16 zb_h1 - 2"

printf 'plan\ttopology\tstep_ms\tcompute_ms\texposed_ms\tbubble_ms\tother_comm_ms\n' >"$OUT/points.tsv"
failed=0
while read -r label pp sched v mb; do
  plan="tp=8,sp=true,pp=$pp,dp=$((256 / (8 * pp)))"
  [ "$sched" = - ] || plan+=",schedule=$sched"
  [ "$v" = - ] || plan+=",virtual_stages=$v"
  for topo in torus dgx; do
    file="$TORUS"; [ "$topo" = dgx ] && file="$DGX"
    json="$OUT/$label.$topo.json"
    # shellcheck disable=SC2086
    if ! mpirun -q -np 1 "$BIN" --chips 256 train "$CFG" --shape-only --steps 1 --topology "$file" --plan "$plan" \
        --set model.micro_batch="$mb" ${EXTRA:-} --json "$json" >"$OUT/$label.$topo.txt" 2>&1 </dev/null; then
      echo "$label $topo: failed: $(grep -m1 -i error "$OUT/$label.$topo.txt" || tail -1 "$OUT/$label.$topo.txt")" >&2
      failed=1
    fi
  done
  python3 - "$label" "$OUT" <<'PY' || failed=1
import json, sys
label, out = sys.argv[1], sys.argv[2]
cells, gib, m = [], set(), 1
for topo in ("torus", "dgx"):
    r = json.load(open(f"{out}/{label}.{topo}.json"))
    t = r["train"]
    step = t["steps"][-1]
    p = t.get("pipeline") or {}
    m = p.get("micro_batches", 1)
    stages = p.get("stages", [])
    bubble_ms = sum(s["bubble_ns"] for s in stages) / len(stages) / 1e6 if stages else 0.0
    gib.add(round(t["memory_per_chip"]["chip_bytes"] / 2**30, 2))
    cells += [f'{t["step_ns"] / 1e6:.1f}', f'{t["tokens_per_s"]:,.0f}', f'{100 * t["mfu"]:.1f}%',
              f'{100 * p.get("bubble_fraction", 0.0):.1f}%']
    exposed = step["exposed_comm_ns"] / 1e6
    with open(f"{out}/points.tsv", "a") as f:
        f.write(f'{label}\t{topo}\t{t["step_ns"] / 1e6:.3f}\t{step["compute_ns"] / 1e6:.3f}\t{exposed:.3f}\t'
                f'{bubble_ms:.3f}\t{exposed - bubble_ms:.3f}\n')
mem = " / ".join(f"{g:.2f}" for g in sorted(gib))  # one figure: memory does not depend on the topology
print(f"| {label} | {m} | " + " | ".join(cells) + f" | {mem} |")
PY
done <<<"$PLANS"
echo "points: $OUT/points.tsv" >&2
[ "$failed" = 0 ] || exit 3

#!/usr/bin/env bash
# e2e: the transformer block workload (`run`: the executor's forward mode) under every parallel plan, its output
# rows validated against the single-device block; per-collective bytes equal their formulas; zig-zag ring attention beats the
# contiguous split where attention dominates; bad plans exit 2 naming the field.
# Usage: block.sh SHARDSIM_BINARY CONFIG_DIR [MPIEXEC]
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
e2e_init "$@"
E2E_TIMEOUT=${E2E_TIMEOUT_BLOCK:-240}
BASE="$CONFIGS/blocks/small_block.yaml"

# make NAME CHIPS PLAN [SED]: a copy of the small block with CHIPS chips and PLAN (YAML lines) as parallel:.
make() {
  local name=$1 chips=$2 plan=$3 extra=${4:-}
  sed "s/  chips: 4/  chips: $chips/; s/^  tp: 4/$plan/" "$BASE" >"$name.yaml"
  if [ -n "$extra" ]; then sed -i "$extra" "$name.yaml"; fi
}

# formulas NAME: every collective's bytes per chip equal its formula (JSON report).
formulas() {
  if python3 - "$1.json" <<'PY'; then pass "$1: bytes per collective = formula"; else fail "$1: bytes differ from the formula"; fi
import json, sys
r = json.load(open(sys.argv[1]))
bad = [f"{k}: {c['bytes_per_chip']} vs {c['formula_bytes']}" for k, c in r["communication"].items()
       if abs(c["bytes_per_chip"] - c["formula_bytes"]) > 1e-9 * max(1.0, c["formula_bytes"])]
if not r["communication"] or bad:
    sys.exit("; ".join(bad) or "no communication recorded")
PY
}

e2e_case "every plan PASSes against one device"
for spec in "tp4|4|  tp: 4" "tp4sp|4|  tp: 4\n  sp: true" "tp2gqa|2|  tp: 2" "tp8rep|8|  tp: 8" \
            "cp4|4|  cp: 4" "cp4c|4|  cp: 4\n  cp_split: contiguous" "ul2|2|  ulysses: 2" \
            "tp2sp|2|  tp: 2\n  sp: true" "tpspcp|4|  tp: 2\n  sp: true\n  cp: 2"; do
  IFS='|' read -r name chips plan <<<"$spec"
  make "$name" "$chips" "$plan"
  if expect_exit 0 '^PASS$' -- shardsim_mpi "$chips" run "$name.yaml" --json "$name.json"; then formulas "$name"; fi
done
make ul4 4 "  ulysses: 4" "s/kv_heads: 2/kv_heads: 4/"
if expect_exit 0 '^PASS$' -- shardsim_mpi 4 run ul4.yaml --json ul4.json; then formulas ul4; fi
make tpcp 8 "  tp: 2\n  cp: 4" 's/kind: ring/kind: torus\n  dims: [2, 4]/; /  chips: 8/d'
if expect_exit 0 '^PASS$' -- shardsim_mpi 8 run tpcp.yaml --json tpcp.json; then
  formulas tpcp
  assert_out 'torus 2x4' "tp x cp on a 2x4 torus"
fi
make bf16 4 "  cp: 4" "s/dtype: fp32/dtype: bf16/"
if expect_exit 0 '^PASS$' -- shardsim_mpi 4 run bf16.yaml; then assert_out 'tolerance 0.03' "bf16 tolerance"; fi
make mha 4 "  tp: 4" "s/kv_heads: 2/kv_heads: 8/; s/rope: true/rope: false/; s/causal: true/causal: false/"
expect_exit 0 '^PASS$' -- shardsim_mpi 4 run mha.yaml

e2e_case "zig-zag ring attention beats the contiguous split when attention dominates"
long="s/hidden: 128/hidden: 512/; s/heads: 8/heads: 4/; s/kv_heads: 2/kv_heads: 1/; s/ffn: 344/ffn: 64/; s/seq: 64/seq: 4096/"
make zz 4 "  cp: 4" "$long"
make ct 4 "  cp: 4\n  cp_split: contiguous" "$long"
if expect_exit 0 '^PASS$' -- shardsim_mpi 4 run zz.yaml --json zz.json &&
   expect_exit 0 '^PASS$' -- shardsim_mpi 4 run ct.yaml --json ct.json; then
  if python3 - zz.json ct.json <<'PY'; then pass "zig-zag total < contiguous total, balance better"; else fail "zig-zag not faster"; fi
import json, sys
z, c = (json.load(open(f))["simulated"] for f in sys.argv[1:3])
bal = lambda s: min(s["per_chip_total_ns"]) / max(s["per_chip_total_ns"])
print(f"zig-zag {z['total_ns']/1e3:.1f} us (balance {bal(z):.3f}), contiguous {c['total_ns']/1e3:.1f} us (balance {bal(c):.3f})")
sys.exit(0 if z["total_ns"] < 0.9 * c["total_ns"] and bal(z) > bal(c) else 1)
PY
fi

e2e_case "bad plans"
make badtp 3 "  tp: 3"
expect_exit 2 'badtp\.yaml:[0-9]+: parallel\.tp: 8 query heads are not divisible by tp 3' -- shardsim_mpi 3 run badtp.yaml
make badcp 4 "  cp: 4" "s/seq: 64/seq: 60/"
expect_exit 2 'badcp\.yaml:[0-9]+: parallel\.cp: seq 60 is not divisible by 2\*cp = 8 \(zig-zag split\)' -- shardsim_mpi 4 run badcp.yaml
make badmesh 4 "  tp: 2\n  cp: 4"
expect_exit 2 'badmesh\.yaml:[0-9]+: parallel: tp 2 x cp 4 x ulysses 1 = 8 does not match the job.s 4 chips' -- shardsim_mpi 4 run badmesh.yaml
# Ulysses above the KV heads: each KV head replicated to the chips of its GQA group (the executor's Ulysses unit).
make ul4rep 4 "  ulysses: 4"
expect_exit 0 '^PASS$' -- shardsim_mpi 4 run ul4rep.yaml
make badkv 4 "  tp: 4" "s/kv_heads: 2/kv_heads: 3/"
expect_exit 2 '(model|workload)\.kv_heads: 8 query heads are not a multiple of 3 KV heads' -- shardsim_mpi 4 run badkv.yaml
make badsplit 4 "  tp: 4\n  cp_split: contiguous"
expect_exit 2 'badsplit\.yaml:[0-9]+: parallel\.cp_split: only used with context parallelism' -- shardsim_mpi 4 run badsplit.yaml
make badsp 4 "  sp: true"
expect_exit 2 'badsp\.yaml:[0-9]+: parallel\.sp: sequence parallelism needs tp > 1' -- shardsim_mpi 4 run badsp.yaml
make oom 4 "  tp: 4" "s/preset: generic/preset: generic\n  hbm_gib: 0.0001/"
# The executor's memory model (parameters + the forward's tensors) against the usable HBM: the one memory rule.
expect_exit 2 'oom\.yaml: simulated out of memory: [0-9.e-]+ GiB per chip \(state \+ activations\) does not fit' -- \
  shardsim_mpi 4 run oom.yaml
make hostmem 4 "  tp: 4" "s/preset: generic/preset: generic\n  hbm_gib: 100000/; s/hidden: 128/hidden: 8192/; s/heads: 8/heads: 64/; s/kv_heads: 2/kv_heads: 8/; s/ffn: 344/ffn: 28672/; s/seq: 64/seq: 262144/"
expect_exit 3 'hostmem\.yaml: model: needs at least [0-9.]+ GiB of host memory per rank .* but only [0-9.]+ GiB is available' -- shardsim_mpi 4 run hostmem.yaml
make badnp 4 "  tp: 4"
expect_exit 2 'the topology has 4 chips but the job has 2 ranks' -- shardsim_mpi 2 run badnp.yaml

e2e_finish

#!/usr/bin/env bash
# e2e: shape-only WORKLOADS (issue 17, the executor's forward mode). For every config in configs/workloads and configs/blocks
# (shrunk with --set so each point takes well under a second), plus the plans no config covers (fused block, dp,
# several layers), `run --shape-only` must give a --json report whose every simulated field (everything but wall
# clock, validation, mode and checkpoint) is identical to the real-data run's, on 1 rank hosting all the chips.
# Also: mode: shape_only in the config does the same; --checkpoint and --resume are refused (exit 2); a shape-only
# out-of-memory is the same error as with real data.
# Usage: shape_only_models.sh SHARDSIM_BINARY CONFIG_DIR [MPIEXEC]
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
e2e_init "$@"

command -v python3 >/dev/null 2>&1 || { echo "[$E2E_NAME] python3 needed for the JSON comparison"; exit 77; }

# Small shapes that every plan of the shipped configs divides: head_dim 8 (256/32), KV heads kept, seq 64
# (zig-zag over cp 4 and 8, sp over tp 2 and 4, ulysses 8), two layers.
BLOCK_SMALL=(--set model.hidden=256 --set model.ffn=512 --set model.seq=64 --set model.layers=2)
MLP_SMALL=(--set model.hidden=128 --set model.ffn=344 --set model.tokens=32)

compare() {  # REAL.json SHAPE.json: every simulated field equal
  python3 - "$1" "$2" <<'PY'
import json, sys
real, shape = (json.load(open(p)) for p in sys.argv[1:3])
assert real["mode"] == "real" and shape["mode"] == "shape_only", (real["mode"], shape["mode"])
assert shape["validated"] is False and shape["validation"]["enabled"] is False, "shape-only must not be validated"
assert real["validated"] is True and real["validation"]["passed"] is True, "the real-data run must validate"
for j in (real, shape):
    for k in ("wall", "validation", "validated", "mode", "checkpoint", "config"):
        j.pop(k, None)
    t = j.get("train")
    if t:  # the executor's forward mode: the loss and the single-device reference come with the data
        for k in ("reference_loss", "rows_validated"):
            t.pop(k, None)
        for st in t.get("steps", []):
            st.pop("loss", None)
        for k in ("single_device_ns", "speedup_vs_single_device"):
            j["simulated"].pop(k, None)
def diff(a, b, path=""):
    if type(a) != type(b):
        return [f"{path}: {a!r} != {b!r}"]
    if isinstance(a, dict):
        out = [f"{path}.{k}: only in one" for k in set(a) ^ set(b)]
        for k in set(a) & set(b):
            out += diff(a[k], b[k], f"{path}.{k}")
        return out
    if isinstance(a, list):
        if len(a) != len(b):
            return [f"{path}: lengths {len(a)} != {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in diff(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]
d = diff(real, shape)
assert not d, "\n".join(d[:10])
sim = real["simulated"]
assert sim["breakdown"]["total_ns"] > 0 and sim["total_flops"] > 0, "trivially zero"
print("identical:", sim["breakdown"]["total_ns"], "ns,", len(sim["per_chip"]), "chips")
PY
}

# One case: the real-data run (must PASS validation) and the --shape-only run (must say "not validated"), then the
# comparison; the verdict goes to case$N.verdict. Cases run 4 at a time (each is mostly MPI start-up waiting), and
# the verdicts are reported in order afterwards.
run_pair() {  # N LABEL CONFIG CHIPS ARGS...
  local n=$1 label=$2 cfg=$3 chips=$4
  shift 4
  {
    if ! shardsim_mpi 1 --chips "$chips" run "$cfg" "$@" --no-checkpoint --json "r$n.json" >"r$n.out" 2>&1 ||
       ! grep -q '^PASS$' "r$n.out"; then
      echo "FAIL real-data run did not PASS (exit and output in r$n.out):"; tail -5 "r$n.out"
    elif ! shardsim_mpi 1 --chips "$chips" run "$cfg" "$@" --shape-only --json "s$n.json" >"s$n.out" 2>&1 ||
         ! grep -q 'not validated (shape-only' "s$n.out"; then
      echo "FAIL shape-only run failed or did not say 'not validated':"; tail -5 "s$n.out"
    elif out=$(compare "r$n.json" "s$n.json" 2>&1); then
      echo "ok every simulated field identical ($out)"
    else
      echo "FAIL shape-only report differs from real data: $out"
    fi
  } >"case$n.verdict"
}

n=0
labels=()
check_config() {  # LABEL CONFIG CHIPS ARGS...: queued; at most 4 cases at once
  n=$((n + 1))
  labels[$n]=$1
  while [ "$(jobs -rp | wc -l)" -ge 4 ]; do wait -n; done
  run_pair "$n" "$@" &
}

chips_of() {  # CONFIG: the chip count of its parallel plan (the product of the axes; the MLP: the topology's)
  python3 - "$1" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
par = re.search(r"^parallel:\n((?:[ \t]+.*\n?)*)", text, re.M)
prod = 1
if par and re.search(r"kind: transformer_block", text):
    for axis in ("tp", "cp", "ulysses", "dp"):
        m = re.search(rf"^\s+{axis}:\s*(\d+)", par.group(1), re.M)
        prod *= int(m.group(1)) if m else 1
    print(prod)
else:
    m = re.search(r"^\s+chips:\s*(\d+)", text, re.M) or re.search(r"dims:\s*\[(\d+),\s*(\d+)\]", text)
    print(int(m.group(1)) * (int(m.group(2)) if m.lastindex == 2 else 1))
PY
}

for cfg in "$CONFIGS"/workloads/*.yaml; do
  check_config "workloads/$(basename "$cfg")" "$cfg" "$(chips_of "$cfg")" "${MLP_SMALL[@]}"
done
for cfg in "$CONFIGS"/blocks/*.yaml; do
  check_config "blocks/$(basename "$cfg")" "$cfg" "$(chips_of "$cfg")" "${BLOCK_SMALL[@]}"
done
small_block_case=$(( $(ls "$CONFIGS"/workloads/*.yaml | wc -l) + $(ls "$CONFIGS"/blocks/*.yaml | grep -n small_block.yaml | cut -d: -f1) ))
# Plans no shipped block config uses.
check_config "block tp=8 fused" "$CONFIGS/blocks/llama3_8b_tp8.yaml" 8 "${BLOCK_SMALL[@]}" --set parallel.fused=true
check_config "block tp=4 + sp fused" "$CONFIGS/blocks/llama3_8b_tp4_sp.yaml" 4 "${BLOCK_SMALL[@]}" \
  --set parallel.fused=true
check_config "block tp=2 x dp=4" "$CONFIGS/blocks/small_block.yaml" 8 --plan tp=2,dp=4 --ring 8 \
  --set model.layers=3
wait
for i in $(seq 1 "$n"); do
  e2e_case "${labels[$i]}"
  verdict=$(cat "case$i.verdict" 2>/dev/null || echo "FAIL no verdict")
  case $verdict in
    ok*) pass "${verdict#ok }" ;;
    *) fail "$verdict" ;;
  esac
done

e2e_case "mode: shape_only in the config = --shape-only"
sed -e 's/^validate:/mode: shape_only\nvalidate:/' "$CONFIGS/blocks/small_block.yaml" > mode.yaml
if expect_exit 0 'not validated \(shape-only' -- shardsim_mpi 1 --chips 4 run mode.yaml "${BLOCK_SMALL[@]}" --json m.json; then
  # the same report as the small_block case above (its --shape-only run), but for the config's name and wall clock
  if python3 -c 'import json,sys; a,b=(json.load(open(p)) for p in sys.argv[1:]); [(x.pop("wall"), x.pop("config")) for x in (a,b)]; assert a==b' m.json "s$small_block_case.json"
  then pass "the same report as --shape-only"
  else fail "mode: shape_only and --shape-only differ"
  fi
fi

e2e_case "no checkpoint in shape-only mode"
expect_exit 2 '^shardsim: error: --checkpoint: a shape-only run has no training state \(no data\)' -- \
  shardsim_mpi 1 --chips 4 run "$CONFIGS/blocks/small_block.yaml" --shape-only --checkpoint x.h5
expect_exit 2 '--checkpoint: a shape-only run has no training state \(no data\); drop the flag or mode: shape_only' -- \
  shardsim_mpi 1 --chips 4 run mode.yaml --checkpoint x.h5
[ ! -e x.h5 ] && pass "no file written" || fail "x.h5 was written"
expect_exit 2 '^shardsim: error: --resume: a shape-only run' -- \
  shardsim_mpi 1 --chips 4 run "$CONFIGS/blocks/small_block.yaml" --shape-only --resume mode.yaml
# The MLP's config-default checkpoint is simply not written (no data); the run still succeeds.
expect_exit 0 'not validated' -- shardsim_mpi 1 --chips 4 run "$SMALL" --shape-only
[ ! -e small_mlp.h5 ] && pass "no default checkpoint in shape-only mode" || fail "small_mlp.h5 written"

e2e_case "bad mode value"
sed -e 's/^validate:/mode: meta\nvalidate:/' "$CONFIGS/blocks/small_block.yaml" > badmode.yaml
expect_exit 2 'badmode.yaml:[0-9]+.*mode: .meta. \(real \| shape_only\)' -- shardsim_mpi 1 --chips 4 run badmode.yaml

e2e_case "simulated out of memory in shape-only mode (the executor's memory model against the HBM)"
expect_exit 2 'simulated out of memory: [0-9.e+-]+ GiB per chip \(state \+ activations\) does not fit' -- \
  shardsim_mpi 1 --chips 4 run "$CONFIGS/blocks/small_block.yaml" --set model.hidden=16384 --set model.ffn=53248 \
  --set model.layers=126 --shape-only

e2e_finish

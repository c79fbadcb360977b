#!/usr/bin/env bash
# e2e: the workload engine (issue 16): run's overrides (--plan, --torus, --ring, --device, --set, --topology), the
# new config schema (model:, topology: PATH, device: NAME) next to the old one, the device mesh and its placement
# on the topology (the report's mesh line; two mappings of one plan on a torus with a fast and a slow dimension
# give different simulated times), compositions (tp x ulysses, tp+sp x cp) validated against one device.
# Usage: engine.sh SHARDSIM_BINARY CONFIG_DIR [MPIEXEC]
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
e2e_init "$@"
E2E_TIMEOUT=${E2E_TIMEOUT_ENGINE:-240}
BASE="$CONFIGS/blocks/small_block.yaml"

# total NAME.json: the simulated total in ns.
total() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['simulated']['total_ns'])" "$1"; }

e2e_case "overrides: --plan and --torus turn the 4-chip tp4 block into tp2 x ulysses2 and tp2+sp x cp2"
if expect_exit 0 '^PASS$' -- shardsim_mpi 4 run "$BASE" --plan tp=2,ulysses=2 --set model.kv_heads=4; then
  assert_out '^  plan +tensor parallel tp=2 .*; Ulysses ulysses=2 ' "plan line names the composition"
  assert_out '^  mesh +tp=2 x cp=2: tp -> 2 of dim 0' "mesh line: tp pairs are ring neighbours"
  assert_out 'with command-line overrides' "the report says the config was overridden"
fi
if expect_exit 0 '^PASS$' -- shardsim_mpi 4 run "$BASE" --torus 2x2 --plan tp=2,sp=true,cp=2 --device h100; then
  assert_out '^  topology +torus 2x2' "--torus replaced the ring"
  assert_out '^  device +h100' "--device replaced the device"
  assert_out '^  mesh +tp=2 x cp=2: tp -> dim 1 \(2 chips' "mesh on the torus: whole dimensions"
fi

e2e_case "the new schema: model:, topology: PATH, device: NAME (and no device: means generic)"
cp "$CONFIGS/topologies/mesh_2x4.yaml" topo.yaml
sed '/^topology:/,/^model:/{/^model:/!d}' "$BASE" >new.yaml
printf 'topology: topo.yaml\ndevice: trainium1\n' >>new.yaml
sed -i 's/  tp: 4/  tp: 8/' new.yaml
if expect_exit 0 '^PASS$' -- shardsim_mpi 8 run new.yaml; then
  assert_out '^  topology +mesh 2x4' "topology read from the file next to the config"
  assert_out '^  device +trainium1' "device by preset name"
fi
sed '/^device:/,/^model:/{/^model:/!d}' "$BASE" >nodevice.yaml
if expect_exit 0 '^PASS$' -- shardsim_mpi 4 run nodevice.yaml; then
  assert_out '^  device +generic' "the default device is generic and printed"
fi
# The older name of the model: section still loads (configs/ use model:).
sed 's/^model:/workload:/' "$BASE" >old.yaml
grep -q '^workload:' old.yaml || fail "test bug: no model: section in $BASE"
expect_exit 0 '^PASS$' -- shardsim_mpi 4 run old.yaml

e2e_case "a plan's mesh on a torus with a fast and a slow dimension: two mappings, two times"
cat >boards.yaml <<'EOF'
name: boards
topology: {kind: torus, dims: [2, 4], bandwidth_gbps: [10, 200], latency_ns: 1000}
device: generic
model: {kind: transformer_block, hidden: 256, heads: 8, kv_heads: 4, ffn: 512, seq: 64}
parallel: {tp: 4, cp: 2}
EOF
if expect_exit 0 '^PASS$' -- shardsim_mpi 8 run boards.yaml --json fast.json; then
  assert_out '^  mesh +tp=4 x cp=2: tp -> dim 1 \(4 chips, 200 GB/s links\), cp -> dim 0 \(2 chips, 10 GB/s' \
    "default: tp on the fast dimension"
fi
if expect_exit 0 '^PASS$' -- shardsim_mpi 8 run boards.yaml --set 'parallel.mesh_dims=[0, 1]' --json slow.json; then
  assert_out '^  mesh +tp=4 x cp=2: tp -> dim 0 \(2 chips, 10 GB/s links\) x 2 of dim 1' "mesh_dims: tp on the slow one"
  if python3 -c "import sys; sys.exit(0 if $(total fast.json) < $(total slow.json) else 1)"; then
    pass "tp on the fast dimension is faster ($(total fast.json) ns < $(total slow.json) ns)"
  else
    fail "tp on the fast dimension is not faster: $(total fast.json) vs $(total slow.json) ns"
  fi
fi

e2e_case "block checkpoints: saved under tp4+sp, loaded under cp8 and tp2 x cp4 with bit-identical weights"
# The forward mode's checkpoint is the weights part of a training state (models/lm_checkpoint.h: master/<name>).
# err NAME.json: the validation's max |out - ref| over the output rows (equal weights give equal outputs).
err() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['validation']['max_abs_error'])" "$1"; }
BIG="$BASE"
if expect_exit 0 'validation: PASS' -- shardsim_mpi 4 run "$BIG" --plan tp=4,sp=true --checkpoint sp.h5; then
  expect_exit 0 'master/layers\.0\.wq +fp32 +\[128, 128\]' -- "$SHARDSIM" ckpt inspect sp.h5
fi
ok=1
for spec in "cp8|8|cp=8|--ring 8" "tp2cp4|8|tp=2,cp=4|--torus 2x4"; do
  IFS='|' read -r name np plan net <<<"$spec"
  # shellcheck disable=SC2086  # NET is empty or two words
  expect_exit 0 'validation: PASS' -- shardsim_mpi "$np" run "$BIG" $net --plan "$plan" --json "fresh_$name.json" || ok=0
  # shellcheck disable=SC2086
  if expect_exit 0 '^resumed: sp\.h5 at step 0' -- shardsim_mpi "$np" run "$BIG" $net --plan "$plan" --resume sp.h5 \
       --checkpoint "$name.h5" --json "resumed_$name.json"; then
    if [ "$(err "fresh_$name.json")" = "$(err "resumed_$name.json")" ]; then
      pass "$name: resumed output = fresh output (max error $(err "fresh_$name.json") both)"
    else
      fail "$name: resumed and fresh runs differ: $(err "fresh_$name.json") vs $(err "resumed_$name.json")"
    fi
    # Every weight bit-identical to the tp4+sp checkpoint's (h5dump -b writes the raw little-endian values).
    for ds in attn_norm wq wk wv wo mlp_norm w_gate w_up w_down; do
      h5dump -d "/master/layers.0.$ds" -b LE -o a.bin sp.h5 >/dev/null 2>&1
      h5dump -d "/master/layers.0.$ds" -b LE -o b.bin "$name.h5" >/dev/null 2>&1
      if ! [ -s a.bin ] || ! cmp -s a.bin b.bin; then
        fail "$name: layers.0.$ds differs from the tp4+sp checkpoint's"
        ok=0
      fi
      rm -f a.bin b.bin
    done
  else
    ok=0
  fi
done
[ "$ok" = 1 ] && pass "cp8 and tp2 x cp4 read the tp4+sp checkpoint: all nine weights bit-identical"
expect_exit 2 'sp\.h5' -- shardsim_mpi 4 run "$BIG" --set model.hidden=256 --set model.ffn=512 --resume sp.h5
# A forward checkpoint continues as a training state.
expect_exit 0 'validation: PASS' -- shardsim_mpi 4 train "$BIG" --plan tp=2,dp=2 --resume sp.h5 --steps 2

e2e_case "bad overrides: exit 2 with one line"
expect_exit 2 '--plan tp: expected key=value items' -- shardsim_mpi 4 run "$BASE" --plan tp
expect_exit 2 '--device: unknown device preset .tpu_v9.' -- shardsim_mpi 4 run "$BASE" --device tpu_v9
expect_exit 2 'exclude each other' -- shardsim_mpi 4 run "$BASE" --ring 4 --torus 2x2
expect_exit 2 'parallel\.mesh_dims: .*must list each topology dimension' -- \
  shardsim_mpi 4 run "$BASE" --torus 2x2 --set 'parallel.mesh_dims=[0]'
expect_exit 2 'parallel: tp 3 x cp 1 x ulysses 1 = 3 does not match the job.s 4 chips' -- \
  shardsim_mpi 4 run "$BASE" --plan tp=3
expect_exit 2 'parallel\.ulysses: ulysses and cp both shard the sequence' -- shardsim_mpi 4 run "$BASE" --plan cp=2,ulysses=2

e2e_finish

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
  assert_out '^  plan +tp=2 x ulysses=2' "plan line names the composition"
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
sed '/^topology:/,/^workload:/{/^workload:/!d}; s/^workload:/model:/' "$BASE" >new.yaml
printf 'topology: topo.yaml\ndevice: trainium1\n' >>new.yaml
sed -i 's/  tp: 4/  tp: 8/' new.yaml
if expect_exit 0 '^PASS$' -- shardsim_mpi 8 run new.yaml; then
  assert_out '^  topology +mesh 2x4' "topology read from the file next to the config"
  assert_out '^  device +trainium1' "device by preset name"
fi
sed '/^device:/,/^workload:/{/^workload:/!d}' "$BASE" >nodevice.yaml
if expect_exit 0 '^PASS$' -- shardsim_mpi 4 run nodevice.yaml; then
  assert_out '^  device +generic' "the default device is generic and printed"
fi

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

e2e_case "bad overrides: exit 2 with one line"
expect_exit 2 '--plan tp: expected key=value items' -- shardsim_mpi 4 run "$BASE" --plan tp
expect_exit 2 '--device: unknown device preset .tpu_v9.' -- shardsim_mpi 4 run "$BASE" --device tpu_v9
expect_exit 2 'exclude each other' -- shardsim_mpi 4 run "$BASE" --ring 4 --torus 2x2
expect_exit 2 'parallel\.mesh_dims: .*must list each topology dimension' -- \
  shardsim_mpi 4 run "$BASE" --torus 2x2 --set 'parallel.mesh_dims=[0]'
expect_exit 2 'parallel: tp 2 x cp 1 x ulysses 1 = 2 does not match the topology.s 4 chips' -- \
  shardsim_mpi 4 run "$BASE" --plan tp=2
expect_exit 2 'parallel\.ulysses: ulysses and cp both shard the sequence' -- shardsim_mpi 4 run "$BASE" --plan cp=2,ulysses=2

e2e_finish

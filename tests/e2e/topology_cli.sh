#!/usr/bin/env bash
# e2e: topologies as users bring them.
#  - ASTRA-sim analytical network.yml files (4x4 torus at 16 ranks, 8-chip switch, ring x switch) load unchanged
#    and simulate all_reduce with the closed-form time;
#  - every topology kind (mesh, switch, fully_connected, stacked, graph, placement) validates 0 wrong;
#  - `shardsim topo describe` prints diameter / average hops / bisection and writes Graphviz and JSON;
#  - bad topologies exit 2 with one FILE:LINE message naming the field, no hang.
# Usage: topology_cli.sh SHARDSIM_BINARY CONFIG_DIR [MPIEXEC]
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
e2e_init "$@"
E2E_TIMEOUT=${E2E_TIMEOUT_TOPOLOGY:-240}
TOPO="$CONFIGS/topologies"

e2e_case "ASTRA-sim 8-chip switch: ring all_reduce = 2(p-1)(2a + S/(pB))"
# B = 50 GiB/s = 53.687 GB/s, a = 500 ns per link (two links per step): 14 x (1000 + 131072 / 53.687) = 48.18 us
if expect_exit 0 'Avg bus bandwidth' -- shardsim_mpi 8 bench all_reduce --topology "$TOPO/astra_switch_8.yml" \
  -b 1M -e 1M -n 1 -w 0 -a ring; then
  assert_out 'switch 8 chips \(one switch\), 53.6871 GB/s, 500 ns per link' "loaded as a switch, GB converted"
  assert_out '^ +1048576 +262144 +fp32 +sum +-1 +ring +\| +48\.18 ' "closed form 48.18 us"
fi
if expect_exit 0 ' 0 wrong: PASS$' -- shardsim_mpi 8 validate --topology "$TOPO/astra_switch_8.yml" \
  -c all_reduce,all_to_all,broadcast -d fp32,bf16 --counts 1,1031 -o sum; then
  assert_out "^  all_reduce +halving_doubling" "halving-doubling ran on the switch"
fi
expect_exit 2 "bidir_ring. cannot run here.*same link" -- shardsim_mpi 8 bench all_reduce \
  --topology "$TOPO/astra_switch_8.yml" -b 1K -e 1K -n 1 -w 0 -a bidir_ring

e2e_case "ASTRA-sim 4x4 torus on 16 ranks: torus all_reduce"
# 2 dims x 2 passes x 3 steps of 500 ns + bandwidth terms: 1 KiB -> 6.02 us (bidirectional rings per dim)
if expect_exit 0 'Avg bus bandwidth' -- shardsim_mpi 16 bench all_reduce --topology "$TOPO/astra_torus_4x4.yml" \
  -b 1K -e 1K -n 1 -w 0 -a torus; then
  assert_out 'torus 4x4 \(16 chips\), 53.6871 GB/s' "loaded as a 4x4 torus"
  assert_out '^ +1024 +256 +fp32 +sum +-1 +torus +\| +6\.0[0-9] ' "12 latency steps of 500 ns + 1 KiB terms"
fi

e2e_case "ASTRA-sim ring 4 x switch 2: the torus all_reduce reduce-scatters the fast ring first"
# 1 MiB, ring 200 GiB/s 100 ns (bidirectional, 4 chips), switch 25 GiB/s 1000 ns (2 links per step):
# ring first 2[3(100 + S/(8 x 214.748)) + (2000 + (S/4)/(2 x 26.8435))] = 18.03 us; switch first would be 45.49 us.
if expect_exit 0 'Avg bus bandwidth' -- shardsim_mpi 8 bench all_reduce --topology "$TOPO/astra_ring4_switch2.yml" \
  -b 1M -e 1M -n 1 -w 0 -a hierarchical; then
  assert_out 'stacked switch 2 x ring 4 \(8 chips, 4 switches\)' "loaded outermost first"
  assert_out '^ +1048576 +262144 +fp32 +sum +-1 +torus +\| +18\.03 ' "fast ring first: 18.03 us (not 45.49)"
fi

e2e_case "every kind validates"
for spec in "4 --mesh 2x2" "5 --switch" "4 --fully-connected" "8 --topology $TOPO/stacked_switch2_ring4.yaml" \
            "4 --topology $TOPO/graph_4.yaml" "8 --topology $TOPO/mesh_2x4.yaml" "3 --mesh 3"; do
  # shellcheck disable=SC2086
  set -- $spec
  np=$1
  shift
  expect_exit 0 ' 0 wrong: PASS$' -- shardsim_mpi "$np" validate "$@" -c all_reduce,reduce_scatter,all_gather \
    -d fp32 --counts 7,1031 -o sum
done
# torus (hierarchical per-dimension rings) on the stacked switch x ring, and its estimate = simulated time.
if expect_exit 0 ' 0 wrong: PASS$' -- shardsim_mpi 8 validate --topology "$TOPO/stacked_switch2_ring4.yaml" \
  -c all_reduce -a torus -d fp32 --counts 1031 -o sum; then
  assert_out "^  all_reduce +torus" "torus algorithm ran on the stack"
fi
printf 'topology:\n  kind: ring\n  chips: 4\n  bandwidth_gbps: 100\n  latency_ns: 500\n  placement: [3, 1, 0, 2]\n' >placed.yaml
if expect_exit 0 ' 0 wrong: PASS$' -- shardsim_mpi 4 validate --topology placed.yaml -c all_reduce,broadcast -d fp32 \
  --counts 1031 -o sum; then
  assert_out "^  all_reduce +torus" "torus runs on a permuted placement (rings follow chip coordinates)"
fi

e2e_case "the MLP workload on a switch with a permuted placement"
sed 's/  latency_ns: 500/  latency_ns: 500\n  placement: [2, 0, 3, 1]/; s/kind: ring/kind: switch/' \
  "$CONFIGS/workloads/small_mlp.yaml" >placed_mlp.yaml
if expect_exit 0 '^PASS$' -- shardsim_mpi 4 run placed_mlp.yaml --no-checkpoint --json placed.json; then
  assert_out 'topology +switch 4 chips' "switch topology from the workload"
  if python3 -c "import json,sys; d=json.load(open('placed.json')); sys.exit([c['chip'] for c in d['simulated']['per_chip']] != [2,0,3,1])"; then
    pass "report names each rank's chip from the placement"
  else
    fail "report chips do not follow the placement"
  fi
fi

e2e_case "topo describe"
if expect_exit 0 'bisection' -- "$SHARDSIM" topo describe "$TOPO/astra_ring4_switch8.yml" --dot g.dot --json g.json; then
  assert_out 'chips +32 \(\+ 4 switches\)' "chips and switches"
  assert_out 'diameter +4 hops' "switch (2) + ring of 4 (2)"
  assert_out 'bisection +429\.497 GB/s' "4 lines x 4 uplinks x 26.84 GB/s"
  assert_out '^  0 +switch +8 +4 ' "dimension 0 row"
  if grep -q '^graph shardsim {' g.dot && grep -q 'c0 -- s0' g.dot; then pass "dot file written"; else fail "dot file"; fi
  check_json g.json chips=32 switches=4 diameter_hops=4
fi
if expect_exit 0 'average hop count  2\.000' -- "$SHARDSIM" topo describe "$TOPO/mesh_2x4.yaml"; then
  assert_out 'bisection +200 GB/s' "cut the 4-line dimension: 2 lines x 1 link x 100 GB/s"
  assert_out 'diameter +4 hops' "mesh 2x4 diameter 1 + 3"
fi
# Thousands of chips: hops in closed form on grids, one BFS per node on graphs (all-pairs routes took 42 s on the
# 64x64 torus and 291 s on a 4096-chip graph; now well under a second). A generous timeout, not a benchmark.
printf 'topology:\n  kind: torus\n  dims: [64, 64]\n  bandwidth_gbps: 100\n' >t4096.yaml
{ printf 'topology:\n  kind: graph\n  chips: 4096\n  bandwidth_gbps: 100\n  links:\n'
  for ((i = 0; i < 4096; i++)); do printf '    - [%d, %d]\n' "$i" $(((i + 1) % 4096)); done; } >g4096.yaml
if expect_exit 0 'average hop count  32\.008' -- timeout -k 5 30 "$SHARDSIM" topo describe t4096.yaml; then
  assert_out 'diameter +64 hops' "64x64 torus: 32 + 32"
fi
if expect_exit 0 'average hop count  1024\.250' -- timeout -k 5 30 "$SHARDSIM" topo describe g4096.yaml; then
  assert_out 'diameter +2048 hops' "ring of 4096 as a graph"
  assert_out 'bisection +not computed: exact search skipped above 22 nodes' "the exponential search is capped, and says so"
fi
if command -v dot >/dev/null 2>&1; then
  if dot -Tsvg g.dot -o g.svg 2>dot.err; then pass "Graphviz renders the dot file"; else fail "dot: $(cat dot.err)"; fi
fi

e2e_case "bad topologies"
bad() {  # NAME YAML REGEX
  printf '%b' "$2" >"$1.yaml"
  expect_exit 2 "$3" -- "$SHARDSIM" topo describe "$1.yaml"
  expect_exit 2 "$3" -- shardsim_mpi 2 validate --topology "$1.yaml" -c all_reduce --counts 7
}
bad dims 'topology:\n  kind: torus\n  dims: [2, 3]\n  chips: 8\n  bandwidth_gbps: 10\n' \
  'dims\.yaml:4: topology\.chips: 8 chips, but dims 2x3 make 6'
bad missing 'topology:\n  kind: graph\n  chips: 2\n  bandwidth_gbps: 10\n  links:\n    - [0, 2]\n' \
  'missing\.yaml:6: topology\.links\[0\]\[1\]: chip 2 does not exist'
bad disconnected 'topology:\n  kind: graph\n  chips: 2\n  switches: 1\n  bandwidth_gbps: 10\n  links:\n    - [0, s0]\n' \
  'disconnected\.yaml:2: topology: the graph is disconnected: chip 0 cannot reach chip 1'
bad zero 'topology:\n  kind: ring\n  chips: 2\n  bandwidth_gbps: 0\n' 'zero\.yaml:4: topology\.bandwidth_gbps: must be a finite number > 0 within 0\.001\.\.1e\+06 GB/s'
bad negative 'topology:\n  kind: mesh\n  dims: [2]\n  bandwidth_gbps: -3\n' 'negative\.yaml:4: topology\.bandwidth_gbps: must be a finite number > 0 within 0\.001\.\.1e\+06 GB/s'
bad nan 'topology:\n  kind: switch\n  chips: 2\n  bandwidth_gbps: 10\n  latency_ns: .nan\n' \
  'nan\.yaml:5: topology\.latency_ns: must be a finite number'
bad nanastra 'topology: [ Switch ]\nnpus_count: [ 2 ]\nbandwidth: [ .nan ]\nlatency: [ 1 ]\n' \
  'nanastra\.yaml:3: bandwidth\[0\]: must be a finite number'
bad placement 'topology:\n  kind: ring\n  chips: 2\n  bandwidth_gbps: 1\n  placement: [0, 0]\n' \
  'placement\.yaml:5: topology\.placement\[1\]: chip 0 is already used by rank 0'
expect_exit 2 'the topology has 8 chips but the job has 4 ranks' -- shardsim_mpi 4 validate \
  --topology "$TOPO/mesh_2x4.yaml" -c all_reduce --counts 7
expect_exit 2 'give at most one of --torus, --mesh, --switch, --fully-connected' -- shardsim_mpi 2 validate --switch --mesh 2

e2e_finish

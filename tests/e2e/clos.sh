#!/usr/bin/env bash
# e2e: Clos / fat-tree topologies (topology/clos.h). topo describe prints the closed forms; an all_reduce across
# pods joined 1:7 takes exactly its closed form, and 7x the cross-pod term of the same Clos at 1:1.
# Usage: clos.sh SHARDSIM_BINARY CONFIG_DIR [MPIEXEC]
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
e2e_init "$@"

CLOS="$CONFIGS/topologies/clos_2pods_1to7.yaml"
e2e_case "topo describe: a 2-pod Clos at 1:7 with its closed-form diameter and bisection"
# Bisection: one pod's up-link, 8 x 50 / 7 GB/s; diameter 6 hops (chip, leaf, pod, core, pod, leaf, chip).
expect_exit 0 'bisection          57.1429 GB/s per direction .*closed form: half the pods' -- \
  shardsim_mpi 1 topo describe "$CLOS" && expect_exit 0 'diameter           6 hops' -- shardsim_mpi 1 topo describe "$CLOS" &&
  pass "closed forms printed"

e2e_case "all_reduce (halving-doubling) across 2 pods at 1:7 = its closed form; at 1:1 the cross-pod step is 7x faster"
sed 's/pod_oversubscription: 7/pod_oversubscription: 1/' "$CLOS" > clos_1to1.yaml
B=(bench all_reduce -b 1G -e 1G -n 1 -w 0 --shape-only -a halving_doubling)
if expect_exit 0 'halving_doubling' -- shardsim_mpi 1 --chips-per-rank 16 "${B[@]}" --topology "$CLOS" --json o7.json &&
  expect_exit 0 'halving_doubling' -- shardsim_mpi 1 --chips-per-rank 16 "${B[@]}" --topology clos_1to1.yaml --json o1.json; then
  if out=$(python3 - o7.json o1.json <<'PY'
import json, sys
t7, t1 = [json.load(open(f))["rows"][0]["sim_time_us"] * 1e3 for f in sys.argv[1:]]
S, B, a = 2**30, 50.0, 1000.0
# Reduce-scatter at XOR distance 8 (across the pods: 8 flows share each pod's up-link of 8 B / o), 4 (across the
# two leaves of a pod: 4 flows on a leaf up-link of 4 B), 2 and 1 (on one leaf); the all-gather mirrors it.
def closed(o):
    return 2 * ((6 * a + o * (S / 2) / B) + (4 * a + (S / 4) / B) + (2 * a + (S / 8) / B) + (2 * a + (S / 16) / B))
w7, w1 = closed(7), closed(1)
print(f"1:7 {t7/1e3:.3f} us (closed form {w7/1e3:.3f}); 1:1 {t1/1e3:.3f} us (closed form {w1/1e3:.3f})")
sys.exit(0 if abs(t7 - w7) <= 1e-9 * w7 and abs(t1 - w1) <= 1e-9 * w1 else 1)
PY
  ); then pass "$out"
  else fail "$out"
  fi
fi

e2e_case "bad clos: an oversubscription below 1 is exit 2 naming FILE:LINE and the key"
sed 's/pod_oversubscription: 7/pod_oversubscription: 0.5/' "$CLOS" > bad.yaml
expect_exit 2 'bad.yaml:[0-9]*: topology.pod_oversubscription: must be a finite number >= 1' -- \
  shardsim_mpi 1 topo describe bad.yaml && pass "one line, exit 2"

e2e_case "crafted clos values: exit 2, one line naming FILE:LINE and the key"
clos_bad() {  # KEY VALUE REGEX: the key's line of the file is named
  sed -E "s/^(  $1:).*/\1 $2/" "$CLOS" >crafted.yaml
  local line
  line=$(grep -n "^  $1:" crafted.yaml | cut -d: -f1)
  if expect_exit 2 "^shardsim: error: crafted\.yaml:$line: topology\.$1: $3" -- shardsim_mpi 1 topo describe crafted.yaml; then
    assert_out_count '^shardsim' 1 "$1: $2: one line"; fi
}
clos_bad chips_per_leaf 0 'must be > 0'
clos_bad leaves_per_pod -3 'must be > 0'
clos_bad pods 99999999999 'at most 4096'
clos_bad pods 1e30 'expected an integer'
clos_bad leaf_oversubscription 0 'must be a finite number >= 1'
clos_bad leaf_oversubscription .nan 'must be a finite number'
clos_bad pod_oversubscription 1e400 'expected a number'
# An oversubscription so large that the up-link falls below the bandwidth range: named by its key and line (the
# message said "topology.an up-link would carry ..." at the line of kind:).
clos_bad leaf_oversubscription 1e30 'the up-link \(chips_per_leaf x bandwidth_gbps / leaf_oversubscription\) would carry 2e-28 GB/s'
clos_bad pod_oversubscription 1e30 'the up-link \(leaves_per_pod x the leaf up-link / pod_oversubscription\) would carry'
clos_bad bandwidth_gbps 1e30 'must be a finite number > 0 within'
sed -E "s/^(  chips_per_leaf:).*/\1 4096/; s/^(  leaves_per_pod:).*/\1 4096/; s/^(  pods:).*/\1 4096/" "$CLOS" >huge.yaml
expect_exit 2 'huge\.yaml:[0-9]+: topology\.chips: 68719476736 chips, at most 4096 in a clos' -- shardsim_mpi 1 topo describe huge.yaml

e2e_finish

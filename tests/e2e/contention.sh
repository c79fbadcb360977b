#!/usr/bin/env bash
# e2e: contention between chips (docs/MODEL.md "Receive side"). 8 chips on one switch (100 GB/s, 1000 ns):
# gather of 64 KiB blocks to chip 0 is incast on chip 0's down-link, so it takes 2 alpha + 7 S/B (7 transfers, not
# one); all_to_all's shifted order puts one flow per step on each down-link, so it keeps (p-1) S/B + 2 alpha. Every
# simulated time is the same at 1 chip per rank (8 ranks) and 8 chips per rank (1 rank), and over 5 repeated runs.
# all_to_all on a 2x4 mesh and a line of 4 (crossing flows of different senders to different receivers) meets the
# full-contention closed form.
# Usage: contention.sh SHARDSIM_BINARY CONFIG_DIR [MPIEXEC]
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
e2e_init "$@"

sim_us() {  # JSON -> the out-of-place row's simulated time (us), full precision
  python3 -c 'import json,sys; print(repr([r["sim_time_us"] for r in json.load(open(sys.argv[1]))["rows"] if r["placement"] == "out-of-place"][0]))' "$1"
}
close() {  # A B -> success if |A - B| <= 1e-9 |B|
  python3 -c 'import sys; a, b = map(float, sys.argv[1:]); sys.exit(0 if abs(a - b) <= 1e-9 * abs(b) else 1)' "$1" "$2"
}
B=(-b 512K -e 512K -n 1 -w 0 -c 0 --switch --bandwidth 100 --latency 1000)
S=65536
for coll in gather all_to_all; do
  if [ "$coll" = gather ]; then want=$(python3 -c "print(2000 / 1e3 + 7 * $S / 100 / 1e3)"); what="2a + 7 S/B (incast)"
  else want=$(python3 -c "print(2000 / 1e3 + 7 * $S / 100 / 1e3)"); what="(p-1) S/B + 2a (no incast)"; fi
  e2e_case "$coll on a switch of 8: $what, 8 ranks x 1 chip and 1 rank x 8 chips (gather: 5 runs)"
  expect_exit 0 'Avg bus bandwidth' -- shardsim_mpi 8 bench "$coll" "${B[@]}" --json "${coll}_k1.json" || continue
  ref=$(sim_us "${coll}_k1.json")
  if close "$ref" "$want"; then pass "K=1: $ref us = $want us"; else fail "K=1: $ref us, want $want us"; fi
  runs="1 2 3 4 5"; [ "$coll" = gather ] || runs=1
  for i in $runs; do
    expect_exit 0 'Avg bus bandwidth' -- shardsim_mpi 1 --chips 8 bench "$coll" "${B[@]}" --json "${coll}_k8_$i.json" || continue
    got=$(sim_us "${coll}_k8_$i.json")
    if [ "$got" = "$ref" ]; then pass "K=8 run $i: $got us, identical to K=1"; else fail "K=8 run $i: $got us, K=1 $ref us"; fi
  done
done

# Crossing flows (per-step link sharing from the all-pairs pattern): on the 2x4 mesh link (0,1)->(0,2) carries 8 of
# the 56 flows, so all_to_all takes the full-contention closed form 8 S/B + 4 alpha (S = 1 MiB: 87.886 us; 45.94 us
# with the send side only, 66.91 us with the receive side); on a line of 4, link 1->2 carries 4 flows
# ({0,1} -> {2,3}): 4 S/B + 3 alpha. Identical at K=1 and K=8 and over 5 runs.
for topo in "mesh 2x4" "mesh 4"; do
  read -r kind dims <<<"$topo"
  n=$(python3 -c "import math; print(math.prod(int(x) for x in '$dims'.split('x')))")
  if [ "$dims" = 2x4 ]; then want=$(python3 -c "print((8 * 2**20 / 100 + 4000) / 1e3)"); what="8 S/B + 4a"
  else want=$(python3 -c "print((4 * 2**20 / 100 + 3000) / 1e3)"); what="4 S/B + 3a"; fi
  e2e_case "all_to_all on a $kind $dims, 1 MiB per peer: $what (crossing flows), K=1 and K=8 x 5 runs"
  M=(-b "$((n))M" -e "$((n))M" -n 1 -w 0 -c 0 --mesh "$dims" --bandwidth 100 --latency 1000)
  expect_exit 0 'Avg bus bandwidth' -- shardsim_mpi "$n" bench all_to_all "${M[@]}" --json "m1_$dims.json" || continue
  a=$(sim_us "m1_$dims.json")
  if close "$a" "$want"; then pass "K=1: $a us = $want us"; else fail "K=1: $a us, want $want us"; fi
  for i in 1 2 3 4 5; do
    expect_exit 0 'Avg bus bandwidth' -- shardsim_mpi 1 --chips "$n" bench all_to_all "${M[@]}" --json "m8_${dims}_$i.json" || continue
    b=$(sim_us "m8_${dims}_$i.json")
    if [ "$a" = "$b" ]; then pass "K=$n run $i: $b us, identical to K=1"; else fail "K=$n run $i: $b us, K=1 $a us"; fi
  done
done

# Crossing flows of a binomial tree level and of Thakur's fold (FlowPattern::binomial, halving_doubling(0, ...)):
# they only cross where the placement is not monotone. A line of 4 with ranks on chips 0 2 1 3: broadcast from 0
# (one piece) sends 0 -> v2 (one hop), then level 1 runs chip 0 -> 2 and 1 -> 3, both over link 1 -> 2: 3 S/B + 3a
# (the identity placement: 2 S/B + 3a). A line of 6 with ranks on chips 0 2 1 3 4 5: recursive_doubling's fold
# (0 -> 2 and 1 -> 3) and unfold (2 -> 0 and 3 -> 1) cross (each send 2 S/B: asserted per send by the MPI test
# TopologiesCrossing.FoldAndUnfoldShareTheLinkTheyCross; here only: slower than the identity placement, which the
# longer routes alone would also give). Both identical at K=1, one rank holding every chip (5 runs) and 2 ranks
# holding half the chips each.
printf 'topology:\n  kind: mesh\n  dims: [4]\n  bandwidth_gbps: 100\n  latency_ns: 1000\n  placement: [0, 2, 1, 3]\n' >line4_crossed.yaml
printf 'topology:\n  kind: mesh\n  dims: [6]\n  bandwidth_gbps: 100\n  latency_ns: 1000\n  placement: [0, 2, 1, 3, 4, 5]\n' >line6_crossed.yaml
for c in "broadcast binomial_tree 4 line4_crossed.yaml" "all_reduce recursive_doubling 6 line6_crossed.yaml"; do
  read -r coll algo n file <<<"$c"
  T=(-b 4M -e 4M -n 1 -w 0 -c 0 -a "$algo")
  e2e_case "$coll $algo on a line of $n with a crossing placement: K=1 and K=$n x 5 runs"
  expect_exit 0 'Avg bus bandwidth' -- shardsim_mpi "$n" bench "$coll" --mesh "$n" --bandwidth 100 --latency 1000 "${T[@]}" \
    --json "id_$coll.json" || continue
  expect_exit 0 'Avg bus bandwidth' -- shardsim_mpi "$n" bench "$coll" --topology "$file" "${T[@]}" --json "x1_$coll.json" || continue
  id=$(sim_us "id_$coll.json")
  a=$(sim_us "x1_$coll.json")
  if [ "$coll" = broadcast ]; then
    want=$(python3 -c "print((3 * 4 * 2**20 / 100 + 3000) / 1e3)")
    if close "$a" "$want"; then pass "K=1: $a us = 3 S/B + 3a = $want us"; else fail "K=1: $a us, want $want us"; fi
    want=$(python3 -c "print((2 * 4 * 2**20 / 100 + 3000) / 1e3)")
    if close "$id" "$want"; then pass "identity: $id us = 2 S/B + 3a"; else fail "identity: $id us, want $want us"; fi
  elif python3 -c "import sys; sys.exit(0 if float('$a') > float('$id') else 1)"; then
    pass "K=1: $a us > $id us on the identity placement (fold and unfold cross)"
  else
    fail "K=1: $a us, not above $id us on the identity placement"
  fi
  for i in 1 2 3 4 5; do
    expect_exit 0 'Avg bus bandwidth' -- shardsim_mpi 1 --chips "$n" bench "$coll" --topology "$file" "${T[@]}" \
      --json "xk_${coll}_$i.json" || continue
    b=$(sim_us "xk_${coll}_$i.json")
    if [ "$a" = "$b" ]; then pass "K=$n run $i: $b us, identical to K=1"; else fail "K=$n run $i: $b us, K=1 $a us"; fi
  done
  # Two ranks of n/2 chips: some of the crossing flows stay inside a rank, some go through MPI.
  expect_exit 0 'Avg bus bandwidth' -- shardsim_mpi 2 --chips-per-rank "$((n / 2))" bench "$coll" --topology "$file" "${T[@]}" \
    --json "x2_$coll.json" || continue
  b=$(sim_us "x2_$coll.json")
  if [ "$a" = "$b" ]; then pass "2 ranks x K=$((n / 2)): $b us, identical to K=1"; else fail "2 x K=$((n / 2)): $b us, K=1 $a us"; fi
done
e2e_finish

#!/usr/bin/env bash
# e2e: shape-only collectives (issue 17, runtime/transport.h). Buffers without storage, messages that carry only
# their timing header: every collective x algorithm at 8 chips (a 2x4 torus), K = 1 and K = 8 chips per rank,
# must give exactly the simulated time and bytes sent of the same case with real data (validate
# --shape-only-check counts any difference as wrong); bench --shape-only prints the same simulated times as bench
# with real data, and a 1 GiB all_reduce in shape-only mode needs no host memory per byte.
# Usage: shape_only.sh SHARDSIM_BINARY CONFIG_DIR [MPIEXEC]
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
e2e_init "$@"

# Counts: empty, odd, and one above the 4 KiB packing threshold (the MPI path's separate payload messages).
V=(validate -c all -a all -d fp32 -o sum,avg --counts 0,7,1031,4099 --torus 2x4 --no-random --shape-only-check)
for k in 1 8; do
  e2e_case "validate --shape-only-check: every collective x algorithm, 8 chips as $((8 / k)) rank(s) x $k"
  if expect_exit 0 ' 0 wrong: PASS$' -- shardsim_mpi $((8 / k)) --chips-per-rank $k "${V[@]}" --json "v$k.json"; then
    if python3 - "v$k.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
rows = j["rows"]
algos = {(r["collective"], r["algorithm"]) for r in rows}
bad = [r for r in rows if r["shape_only_sim_ns"] != r["sim_ns"]]
assert not bad, f"shape-only != real: {bad[:2]}"
assert sum(r["sim_ns"] > 0 for r in rows) >= len(rows) - 2, "simulated times are trivially zero"
need = {("all_reduce", a) for a in ("ring", "bidir_ring", "torus", "torus_concurrent", "halving_doubling")} | \
       {(c, "torus_concurrent") for c in ("reduce_scatter", "all_gather", "all_gatherv")} | \
       {("broadcast", "binomial_tree"), ("broadcast", "ring"), ("reduce", "binomial_tree"), ("reduce", "ring"),
        ("all_to_all", "direct"), ("all_to_allv", "direct"), ("gather", "direct"), ("scatter", "direct"),
        ("reduce_scatter", "torus"), ("all_gather", "halving_doubling"), ("all_gatherv", "bidir_ring"),
        ("send_recv", "direct"), ("barrier", "dissemination")}
assert need <= algos, f"missing: {sorted(need - algos)}"
print(f"{len(rows)} rows, {len(algos)} collective x algorithm pairs")
PY
    then pass "K=$k: shape_only_sim_ns == sim_ns in every row, every collective x algorithm covered"
    else fail "K=$k: JSON check failed"
    fi
  fi
done

e2e_case "bench --shape-only: the same simulated times as bench with real data"
B=(bench all_reduce -b 1K -e 1M -f 8 -n 1 -w 0 --torus 2x4 --chunk-bytes 64K)
expect_exit 0 'Out of bounds values : 0 OK' -- shardsim_mpi 1 --chips-per-rank 8 "${B[@]}" --json real.json
if expect_exit 0 'Out of bounds values : N/A \(not validated: shape-only\)' -- \
  shardsim_mpi 1 --chips-per-rank 8 "${B[@]}" --shape-only --json shape.json; then
  assert_out 'shape-only: buffers carry no data' "the header says shape-only"
  if python3 - real.json shape.json <<'PY'
import json, sys
real = {r["size_bytes"]: r["sim_time_us"] for r in json.load(open(sys.argv[1]))["rows"] if r["placement"] == "out-of-place"}
shape = {r["size_bytes"]: r["sim_time_us"] for r in json.load(open(sys.argv[2]))["rows"]}
assert real and real == shape, (real, shape)
PY
  then pass "per size: shape-only sim_time_us == real-data sim_time_us"
  else fail "bench sim times differ between real data and shape-only"
  fi
fi
expect_exit 2 '^shardsim: error: --shape-only moves no data' -- shardsim_mpi 1 bench all_reduce --shape-only --vs-mpi

e2e_case "bench --shape-only -e 1G at 8 chips on 1 rank: no host memory per byte"
if [ -x /usr/bin/time ]; then
  if expect_exit 0 'N/A \(not validated: shape-only\)' -- /usr/bin/time -v timeout -k 10 "$(e2e_timeout)" "$MPIEXEC" ${MPI_FLAGS[@]+"${MPI_FLAGS[@]}"} -np 1 "$SHARDSIM" \
    --chips-per-rank 8 bench all_reduce -b 1G -e 1G -n 1 -w 0 --shape-only; then
    rss_kb=$(grep -o "Maximum resident set size (kbytes): [0-9]*" "$E2E_OUT" | grep -o '[0-9]*$' | sort -n | tail -n 1)
    if [ -n "$rss_kb" ] && [ "$rss_kb" -lt 262144 ]; then
      pass "peak RSS ${rss_kb} KiB < 256 MiB for 8 chips x 1 GiB buffers"
    else
      fail "peak RSS '${rss_kb}' KiB: shape-only allocated per byte?"
    fi
  fi
else
  pass "(no /usr/bin/time: RSS check skipped)"
fi

e2e_case "4x4 torus all_reduce at 1 GiB (torus_concurrent, auto): >= 1.9x the 16-chip ring's busbw at the same link rate"
# Issue 33's figure: the concurrent-dimension torus drives all four links of a chip (collectives/torus_concurrent.h).
T1=(bench all_reduce -b 1G -e 1G -n 1 -w 0 --shape-only --bandwidth 100 --latency 1000)
if expect_exit 0 ' torus_concurrent ' -- shardsim_mpi 1 --chips-per-rank 16 "${T1[@]}" --torus 4x4 --json t44.json &&
  expect_exit 0 ' bidir_ring ' -- shardsim_mpi 1 --chips-per-rank 16 "${T1[@]}" --json r16.json; then
  if ratio=$(python3 - t44.json r16.json <<'PY'
import json, sys
bw = [json.load(open(f))["rows"][0]["sim_busbw_gbps"] for f in sys.argv[1:]]
r = bw[0] / bw[1]
print(f"{bw[0]:.2f} / {bw[1]:.2f} GB/s = {r:.3f}x")
sys.exit(0 if r >= 1.9 else 1)
PY
  ); then pass "busbw $ratio"
  else fail "busbw ratio below 1.9: $ratio"
  fi
fi

e2e_case "2 DGX H100 nodes, rail-optimized: the hierarchical all_reduce crosses the nodes on all eight rails at once"
# configs/topologies/dgx_h100_2nodes_rails.yaml: [switch 2 per rail, 50 GB/s, 5 us] x [NVSwitch 8, 450 GB/s, 1 us],
# efficiency 0.822. torus (hierarchical): reduce-scatter in the node (one-way ring over the NVSwitch), all-reduce of
# S/8 across the nodes on every rail, all-gather in the node:
#   T = 2 [7 (2 x 1000 + (S/8)/(450 x 0.822)) + (2 x 5000 + (S/16)/(50 x 0.822))]
# one rail would carry all of it (8x the rail term); a flat ring crosses the nodes on one rail each way.
TR=(bench all_reduce -b 1G -e 1G -n 1 -w 0 --shape-only --topology "$CONFIGS/topologies/dgx_h100_2nodes_rails.yaml")
if expect_exit 0 ' torus ' -- shardsim_mpi 1 --chips-per-rank 16 "${TR[@]}" -a hierarchical --json rails.json &&
  expect_exit 0 ' ring ' -- shardsim_mpi 1 --chips-per-rank 16 "${TR[@]}" -a ring --json flat.json; then
  if out=$(python3 - rails.json flat.json <<'PY'
import json, sys
t, flat = [json.load(open(f))["rows"][0]["sim_time_us"] * 1e3 for f in sys.argv[1:]]
S = 2**30
want = 2 * (7 * (2000 + (S / 8) / (450 * 0.822)) + (10000 + (S / 16) / (50 * 0.822)))
one_rail = want + 2 * 7 * (S / 16) / (50 * 0.822)
print(f"hierarchical {t/1e3:.1f} us (closed form, every rail: {want/1e3:.1f} us; one rail: {one_rail/1e3:.1f} us); "
      f"flat ring {flat/1e3:.1f} us")
sys.exit(0 if abs(t - want) <= 0.01 * want and flat > 4 * t else 1)
PY
  ); then pass "$out"
  else fail "$out"
  fi
fi

e2e_case "2 DGX H100 nodes, rail-optimized: rail_ring stripes the ring over all eight NICs"
# rail_ring (collectives/rail_ring.h): 8 rings at once, each crossing the nodes on other rails, so every NIC sends
# one piece of S/(8 x 16) per step: T = 2(p-1) S/(g p B_nic) plus a few hop latencies, B_nic = 50 x 0.822 GB/s;
# the flat ring (flat.json, above) crosses on one rail each way: about 8x slower. auto picks rail_ring here.
if expect_exit 0 ' rail_ring ' -- shardsim_mpi 1 --chips-per-rank 16 "${TR[@]}" --json striped.json; then
  if out=$(python3 - striped.json flat.json <<'PY'
import json, sys
rows = [json.load(open(f))["rows"][0] for f in sys.argv[1:]]
t, flat = (r["sim_time_us"] * 1e3 for r in rows)
bw, flat_bw = (r["sim_busbw_gbps"] for r in rows)
S, p, g = 2**30, 16, 8
bound = 2 * (p - 1) * S / (g * p * 50 * 0.822)
print(f"rail_ring {t/1e3:.1f} us, {bw:.1f} GB/s busbw (NIC bound {bound/1e3:.1f} us); one rail {flat_bw:.1f} GB/s: "
      f"{bw/flat_bw:.2f}x")
sys.exit(0 if bound <= t <= 1.01 * bound and bw >= 7.5 * flat_bw else 1)
PY
  ); then pass "$out"
  else fail "$out"
  fi
fi

e2e_finish

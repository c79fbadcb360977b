#!/usr/bin/env bash
# e2e: `shardsim validate` and `shardsim bench` as users run them.
#  - validate reports 0 wrong on rings of 1, 2, 3, 5, 8 chips, on 2x4 and 2x2x2 tori and in sub-groups, for a
#    representative slice (every collective and algorithm; a few dtypes and counts); the full matrix is the
#    documented command in docs/performance/collectives.md;
#  - a wrong result makes validate exit 1 and say where; bad input exits 2 with one clear message, no hang;
#  - bench prints nccl-tests columns, busbw = algbw x the nccl-tests factor, simulated numbers repeat exactly.
# Usage: collectives_cli.sh SHARDSIM_BINARY CONFIG_DIR [MPIEXEC]
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
e2e_init "$@"
E2E_TIMEOUT=${E2E_TIMEOUT_COLLECTIVES:-240}  # 8 oversubscribed ranks on 2 cores are slow; a hang still ends

SLICE=(-d fp32,bf16,int8,fp8_e5m2 --counts 0,1,7,1031 -o sum,prod,avg)

e2e_case "validate on rings"
for np in 1 2 3 5 8; do
  if expect_exit 0 ' 0 wrong: PASS$' -- shardsim_mpi "$np" validate "${SLICE[@]}"; then
    assert_out "^  all_to_allv +direct" "np $np: all_to_allv ran"
    assert_out "^  all_reduce +halving_doubling" "np $np: halving-doubling ran"
    assert_out "^  broadcast +ring" "np $np: pipelined broadcast ran"
  fi
done

e2e_case "validate on tori and sub-groups"
expect_exit 0 ' 0 wrong: PASS$' -- shardsim_mpi 8 validate --torus 2x4 "${SLICE[@]}" && assert_out "^  all_reduce +torus" \
  && assert_out "^  all_reduce +torus_concurrent" "the concurrent-dimension torus ran"
expect_exit 0 ' 0 wrong: PASS$' -- shardsim_mpi 8 validate --torus 2x2x2 -c all_reduce,reduce_scatter,all_gather "${SLICE[@]}" \
  && assert_out "^  reduce_scatter +torus" && assert_out "^  all_gather +torus_concurrent"
expect_exit 0 ' 0 wrong: PASS$' -- shardsim_mpi 8 validate --torus 2x4 --group dim:1 -c all_reduce,broadcast,all_to_all "${SLICE[@]}" \
  && assert_out 'group lines along dimension 1: 2 groups of 4'
expect_exit 0 ' 0 wrong: PASS$' -- shardsim_mpi 6 validate --group mod:2 -c all_reduce,reduce,all_gatherv "${SLICE[@]}" \
  && assert_out '# skipped all_reduce torus: the group has 3 of the topology.s 6 chips'

e2e_case "validate JSON"
if expect_exit 0 'PASS' -- shardsim_mpi 3 validate -c all_reduce -d fp16 --counts 5,100 --json v.json; then
  check_json v.json wrong=0
fi

e2e_case "a wrong result is caught"
if expect_exit 1 ' wrong: FAIL$' -- shardsim_mpi 4 validate -c all_reduce -d fp32 -o sum --counts 100 --inject-wrong-result; then
  assert_out '^# WRONG all_reduce .* first: chip 0 element 0: got' "names the chip and element"
fi

e2e_case "bad input"
expect_exit 2 "^shardsim: error: -d/--dtype: unknown dtype 'fp12' \(known: int8, " -- shardsim_mpi 2 validate -d fp12
expect_exit 2 "unknown reduction op 'mean'" -- shardsim_mpi 2 validate -o mean
expect_exit 2 "unknown algorithm 'warp'" -- shardsim_mpi 2 validate --algo warp
expect_exit 2 "unknown algorithm 'warp' \(known: ring, bidir_ring, multi_ring, rail_ring, torus, torus_concurrent, in_switch, halving_doubling, recursive_doubling, double_binary_tree, auto\)" -- \
  shardsim_mpi 2 bench all_reduce -a warp
expect_exit 2 "unknown collective 'allreduce'" -- shardsim_mpi 2 bench allreduce
expect_exit 2 "root 7 is outside the group of 4 ranks" -- shardsim_mpi 4 bench broadcast -r 7 -b 8 -e 8
expect_exit 2 "algorithm 'torus' cannot run here: the group has 2 of the topology's 4 chips" -- \
  shardsim_mpi 4 bench all_reduce -a torus --group mod:2 -b 8 -e 8
expect_exit 2 "algorithm 'bidir_ring' cannot run here: .*same link" -- \
  shardsim_mpi 4 validate -a bidir_ring --unidirectional -c all_reduce
expect_exit 2 "topology has 8 chips but the job has 4 ranks" -- shardsim_mpi 4 validate --torus 2x4
if expect_exit 2 '^shardsim: error: all_reduce: ranks disagree on count: chip 0 999, chip 1 1000' -- \
  shardsim_mpi 4 validate -c all_reduce -d fp32 -o sum --counts 1000 --inject-count-mismatch; then
  assert_out_count '^shardsim: error' 1 "exactly one error line"
fi

e2e_case "workload all_reduce algorithm"
cp "$SMALL" algo.yaml
printf 'parallel:\n  tp: 4\n  algorithm: halving_doubling\n' >>algo.yaml
expect_exit 0 'tp all_reduce .* in 1 call\(s\) \(halving_doubling\)' -- shardsim_mpi 4 run algo.yaml --no-checkpoint
sed 's/algorithm: halving_doubling/all_reduce: warp/' algo.yaml >warp.yaml
expect_exit 2 "^shardsim: error: .*warp\.yaml:[0-9]+: parallel\.all_reduce: unknown algorithm 'warp'" -- \
  shardsim_mpi 4 run warp.yaml --no-checkpoint
sed 's/algorithm: halving_doubling/all_reduce: tree/' algo.yaml >tree.yaml
expect_exit 2 "parallel\.all_reduce: algorithm 'tree' is not applicable to all_reduce \(it is an algorithm of broadcast, reduce\); all_reduce takes: ring, bidir_ring, multi_ring, rail_ring, torus, torus_concurrent, in_switch, halving_doubling, recursive_doubling, double_binary_tree, auto" -- \
  shardsim_mpi 4 run tree.yaml --no-checkpoint
# A valid name too: run and train refuse the key alike (parallel.algorithm sets the tp all_reduce's algorithm).
sed 's/algorithm: halving_doubling/all_reduce: ring/' algo.yaml >ring_ar.yaml
expect_exit 2 "ring_ar\.yaml:[0-9]+: parallel\.all_reduce: the tp all_reduce has no algorithm of its own in run or train .*parallel\.algorithm sets" -- \
  shardsim_mpi 4 run ring_ar.yaml --no-checkpoint
expect_exit 2 "ring_ar\.yaml:[0-9]+: parallel\.all_reduce: the tp all_reduce has no algorithm of its own in run or train" -- \
  shardsim_mpi 4 train ring_ar.yaml --steps 1

e2e_case "algorithm catalogue (bench --list, from the registry)"
if expect_exit 0 'bidir_ring \(aliases: bidirectional_ring\)' -- shardsim_mpi 4 bench --list --unidirectional -e 1M; then
  assert_out '^  all_reduce      n/a \(.*same link' "bidir_ring is not applicable on a one-way ring, with the reason"
  assert_out '^  all_reduce: ring bidir_ring multi_ring rail_ring torus torus_concurrent in_switch double_binary_tree auto \(opt-in only: halving_doubling recursive_doubling\)$' "auto's tie-break order per collective, opt-in algorithms (NCCL runs none of them) apart"
  assert_out '^  broadcast: ring auto \(opt-in only: binomial_tree\)$' "rooted: NCCL's ring only, the binomial tree opt-in"
fi
# The estimates follow --chunk-bytes (pipelined pieces), and a run's header names the algorithm an alias stands for.
if expect_exit 0 'chunk 65536 B' -- shardsim_mpi 1 --chips-per-rank 4 bench --list -e 16M --chunk-bytes 64K; then
  piped=$(grep -A3 '^ring (aliases' "$E2E_OUT" | grep -m1 '^  all_reduce' || true)
  expect_exit 0 'chunk 0 B' -- shardsim_mpi 1 --chips-per-rank 4 bench --list -e 16M
  plain=$(grep -A3 '^ring (aliases' "$E2E_OUT" | grep -m1 '^  all_reduce' || true)
  if [ -n "$piped" ] && [ "$piped" != "$plain" ]; then pass "ring's all_reduce estimate: '$plain' unpipelined, '$piped' in 64 KiB pieces"
  else fail "the --list estimate did not change with --chunk-bytes: '$plain' / '$piped'"
  fi
fi
expect_exit 0 '^# algorithm double_binary_tree, chunk' -- shardsim_mpi 1 --chips-per-rank 4 bench all_reduce -a dbt -b 1K -e 1K -n 1 -w 0
# auto against NCCL (docs/performance/collectives.md): inside one node NCCL's Tree is a chain, so auto does not weigh
# the binary tree there (--choose-only: the choice without running); across eight nodes on rails it picks it at 64 KiB.
if expect_exit 0 '^ +65536 +16384 ring ' -- shardsim_mpi 1 --chips 8 bench all_reduce --switch -b 64K -e 64K \
    --choose-only --explain; then
  assert_out 'double_binary_tree not weighed \(the group is inside one node' "no binary tree inside one switch"
fi
cat > rails64.yaml <<'T'
topology:
  kind: stacked
  dims:
    - {kind: switch, size: 8, bandwidth_gbps: 50, latency_ns: 5000}
    - {kind: switch, size: 8, bandwidth_gbps: 450, latency_ns: 1000}
T
expect_exit 0 '^ +65536 +16384 double_binary_tree ' -- shardsim_mpi 1 --chips 64 bench all_reduce --topology rails64.yaml \
  -b 64K -e 64K --choose-only

e2e_case "sub-group verdicts and resource checks"
if expect_exit 1 ' wrong: FAIL$' -- shardsim_mpi 8 validate --group div:4 -c all_reduce -d fp32 -o sum --counts 7 \
  --no-random -a ring --inject-wrong-result; then
  assert_out '^# 2 cases, 112 elements checked, 4 wrong: FAIL$' "both groups' elements counted (2 x 4 ranks x 7, twice)"
fi
expect_exit 2 'simulated out of memory on chip 0: needs [0-9.]+ GiB, has 16.00 GiB' -- shardsim_mpi 2 bench -b 16G -e 16G
expect_exit 2 "directory '/nonexistent': No such file or directory" -- shardsim_mpi 2 bench --csv /nonexistent/x.csv
expect_exit 2 "nothing to validate" -- shardsim_mpi 2 validate -b 1M -e 2M --counts 7
expect_exit 2 "already defines the network" -- shardsim_mpi 4 validate --topology "$SMALL" --torus 2x2
expect_exit 0 'Avg bus bandwidth' -- shardsim_mpi 2 bench reduce -b 4K -e 64K -f 16 -n 1 -w 0 --vs-mpi

e2e_case "ASTRA-sim network.yml"
printf 'topology: [ Ring, Ring ]\nnpus_count: [ 2, 2 ]\nbandwidth: [ 50.0, 50.0 ]\nlatency: [ 500.0, 500.0 ]\n' >net.yml
if expect_exit 0 'Avg bus bandwidth' -- shardsim_mpi 4 bench --topology net.yml -b 1K -e 1K -n 1 -w 0 -a torus; then
  assert_out 'torus 2x2 \(4 chips\), 53.6871 GB/s, 500 ns per link' "ASTRA-sim's GB = 2^30 B converted"
  assert_out '^ +1024 +256 +fp32 +sum +-1 +torus +\| +2\.0[0-9] ' "2 latency steps of 500 ns each way plus 1 KiB/4 over the links"
fi
printf 'topology: [ Ring, Torus ]\nnpus_count: [ 2, 2 ]\nbandwidth: [ 50.0, 50.0 ]\nlatency: [ 500.0, 500.0 ]\n' >bad.yml
expect_exit 2 "bad\.yml:1.*unknown ASTRA-sim topology 'Torus'" -- shardsim_mpi 4 validate --topology bad.yml

e2e_case "bench"
if expect_exit 0 'Avg bus bandwidth' -- shardsim_mpi 4 bench all_reduce -b 1K -e 1M -f 32 -n 2 -w 1 --csv b1.csv --vs-mpi; then
  assert_out '^#  +size +count +type +redop +root +algorithm'
  python3 - b1.csv <<'PY' && pass "busbw = algbw * 2(n-1)/n and #wrong 0 in every row" || fail "bench CSV check"
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
assert len(rows) == 2 * 3, len(rows)  # 1K, 32K, 1M x out-of-place, in-place
for r in rows:
    n = int(r["ranks"])
    assert abs(float(r["sim_busbw_gbps"]) - float(r["sim_algbw_gbps"]) * 2 * (n - 1) / n) < 1e-9 * float(r["sim_busbw_gbps"]) + 1e-12, r
    assert float(r["sim_algbw_gbps"]) > 0 and abs(float(r["size_bytes"]) / (float(r["sim_time_us"]) * 1e3) - float(r["sim_algbw_gbps"])) < 1e-6, r
    assert r["wrong"] == "0", r
assert rows[0]["mpi_time_us"] != "", "no MPI timing"
PY
fi
shardsim_mpi 4 bench all_reduce -b 1K -e 1M -f 32 -n 2 -w 1 --csv b2.csv >/dev/null 2>&1
if cmp -s <(cut -d, -f1-12 b1.csv) <(cut -d, -f1-12 b2.csv); then pass "simulated columns identical across runs"; else
  fail "simulated columns differ between two runs"; fi
expect_exit 0 'Avg bus bandwidth' -- shardsim_mpi 3 bench reduce_scatter -b 12 -e 12K -f 8 -d all -n 1 -w 0
expect_exit 0 'Avg bus bandwidth' -- shardsim_mpi 4 bench all_to_all -b 64 -e 64K -f 32 -n 1 -w 0 --json a.json && check_json a.json
expect_exit 0 'ring' -- shardsim_mpi 4 bench broadcast -b 4M -e 4M -n 1 -w 0 -r 3 --explain && \
  assert_out 'auto for 4194304 B on 4 chips: binomial_tree .* ring .* \(chosen\)' "--explain lists the estimates"

e2e_case "watchdog on synchronous collectives: rank 2 of 4 stalls (test hook), 3 s limit"
ulimit -c unlimited 2>/dev/null || true
if SHARDSIM_WATCHDOG_S=3 SHARDSIM_TEST_STALL_SYNC_RANK=2 \
   expect_exit 3 'watchdog' -- shardsim_mpi 4 bench all_reduce -b 1K -e 1K -n 1 -w 0; then
  assert_out 'watchdog: chip [013] \(rank [013]\): all_reduce(: argument check|\.[a-z_]+\.step[0-9]) made no progress for 3 s \(limit SHARDSIM_WATCHDOG_S=3\); stalled: chip 2 \(rank 2\)' "names the op, the limit and the stalled chip"
  assert_out_count '^shardsim: watchdog' 1 "one watchdog line for the job"
  assert_out 'rank 2 stalls in all_reduce' "the test hook fired on rank 2"
fi
if compgen -G "core*" >/dev/null; then fail "core file left: $(ls core*)"; else pass "no core file"; fi
e2e_case "mixed agreed/new signatures: ranks that skipped the argument check are told (exit 2, no watchdog)"
# SHARDSIM_TEST_NEW_SIGNATURE (collectives/algorithms.h): the listed ranks make argument check N (0-based) with a
# never-agreed signature (count + 1) while the others skip it; a 30 s watchdog (exit 3) would mean the hang is back.
for spec in "2 1@2" "3 2@3" "3 0@3" "4 2,3@2" "4 0,1,2@3" "5 4@2" "5 0,1,2,3@3"; do
  np=${spec%% *}; ranks=${spec#* }
  if SHARDSIM_WATCHDOG_S=30 SHARDSIM_TEST_NEW_SIGNATURE="$ranks" \
     expect_exit 2 'ranks disagree on' -- shardsim_mpi "$np" bench all_reduce -b 4K -e 4K -n 4 -w 1 -a ring; then
    assert_out 'ranks disagree on count: chip [0-9]+ 1024 \(agreed before\), chip [0-9]+ 1025 \(new\)' \
      "np $np, new signature on ranks $ranks: names the field and both values"
    assert_out_count "watchdog" 0 "np $np: not the watchdog"
  fi
done

# Several chips per rank: every call is agreed (no skipping), so a chip's changed signature is a plain
# disagreement; the hook then names chips. 2 ranks x 4 chips: chip 5 (on rank 1) and chip 2 (on rank 0).
for spec in "5@2" "2@3"; do
  if SHARDSIM_WATCHDOG_S=30 SHARDSIM_TEST_NEW_SIGNATURE="$spec" \
     expect_exit 2 'ranks disagree on' -- shardsim_mpi 2 --chips 8 bench all_reduce -b 4K -e 4K -n 4 -w 1 -a ring; then
    assert_out "ranks disagree on count: .*chip ${spec%@*} 1025" "chips per rank 4, new signature on chip ${spec%@*}: named with its value"
    assert_out_count "watchdog" 0 "chips per rank 4, chip ${spec%@*}: not the watchdog"
  fi
done

SHARDSIM_WATCHDOG_S=2s expect_exit 2 "SHARDSIM_WATCHDOG_S='2s': expected seconds" -- shardsim_mpi 2 bench all_reduce -b 1K -e 1K -n 1 -w 0 \
  && assert_out_count "SHARDSIM_WATCHDOG_S" 1 "one message, up front"

e2e_finish

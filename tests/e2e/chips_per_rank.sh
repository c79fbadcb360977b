#!/usr/bin/env bash
# e2e: several chips per rank (issue 17, runtime/chips.h). At 8 chips, K = 1, 2, 4, 8 chips per rank (8/K ranks)
# must give bit-identical collective outputs (validate's output digests) and identical simulated times for
# all_reduce, all_gather, reduce_scatter, all_to_all and broadcast over every algorithm; the small MLP run gives
# the same report (checkpoints and traces at K > 1: ckpt_chips.sh); bad chip flags, count mismatches and a stalled chip fail with one clear line.
# Usage: chips_per_rank.sh SHARDSIM_BINARY CONFIG_DIR [MPIEXEC]
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
e2e_init "$@"

# Every simulated and data field of a JSON report, without the wall-clock ones.
strip_wall() {
  python3 - "$1" <<'PY'
import json, sys
def strip(x):
    if isinstance(x, dict): return {k: strip(v) for k, v in sorted(x.items()) if not k.startswith("wall")}
    if isinstance(x, list): return [strip(v) for v in x]
    return x
print(json.dumps(strip(json.load(open(sys.argv[1]))), sort_keys=True))
PY
}

V=(validate -c all_reduce,all_gather,reduce_scatter,all_to_all,broadcast -a all -d fp32,bf16 -o sum
   --counts 0,7,1031,4099 --torus 2x4 --special)
for k in 1 2 4 8; do
  e2e_case "validate, 8 chips as $((8 / k)) rank(s) x $k"
  if expect_exit 0 ' 0 wrong: PASS$' -- shardsim_mpi $((8 / k)) --chips-per-rank $k "${V[@]}" --json "v$k.json"; then
    assert_out "torus 2x4 \(8 chips\)" "an 8-chip torus"
    if [ "$k" != 1 ]; then
      if [ "$(strip_wall "v$k.json")" = "$(strip_wall v1.json)" ]; then
        pass "K=$k: JSON identical to K=1 (per row: cases, output digest, simulated time)"
      else
        fail "K=$k: validate JSON differs from K=1: $(diff <(strip_wall v1.json | tr ',' '\n') <(strip_wall "v$k.json" | tr ',' '\n') | head -n 6)"
      fi
    fi
  fi
done
if grep -q '"output_digest": [1-9]' v1.json && grep -q '"sim_ns": [1-9]' v1.json; then
  pass "the digests and simulated times compared are not trivially zero"
else
  fail "v1.json has no non-zero output_digest/sim_ns: $(head -c 300 v1.json)"
fi

e2e_case "run: the small MLP on 8 chips, 1 x 8, 2 x 4 and 8 x 1"
with_chips "$SMALL" 8 small8.yaml
for spec in "8 1" "2 4" "1 8"; do
  set -- $spec
  expect_exit 0 'validation PASS' -- shardsim_mpi "$1" run small8.yaml --chips $(( $1 * $2 )) --no-checkpoint \
    --json "run_$2.json" || continue
done
for k in 4 8; do
  if [ -f "run_$k.json" ] && [ "$(strip_wall "run_$k.json")" = "$(strip_wall run_1.json)" ]; then
    pass "K=$k: run report identical to K=1 apart from wall times"
  else
    fail "K=$k: run report differs from K=1"
  fi
done

e2e_case "bad chip flags and what chip mode refuses"
expect_exit 2 '^shardsim: error: --chips 7: must be a multiple of the 2 MPI ranks' -- \
  shardsim_mpi 2 --chips 7 validate -c all_reduce
expect_exit 2 '^shardsim: error: --chips-per-rank: .x. is not a positive chip count' -- \
  shardsim_mpi 1 validate --chips-per-rank x
if expect_exit 2 '^shardsim: error: all_reduce: ranks disagree on count: chip 0 999, chip 1 1000' -- \
  shardsim_mpi 2 --chips 8 validate -c all_reduce -d fp32 -o sum --counts 1000 --inject-count-mismatch; then
  assert_out_count '^shardsim: error' 1 "exactly one error line"
fi

e2e_case "watchdog: chip 5 (rank 1 of 2, 4 chips each) stalls outside communication, 2 s watchdog"
if SHARDSIM_WATCHDOG_S=2 SHARDSIM_TEST_STALL_CHIP=5 expect_exit 3 'watchdog' -- \
  shardsim_mpi 2 --chips 8 validate -c all_reduce -d fp32 -o sum --counts 1000; then
  assert_out_count '^shardsim: watchdog' 1 "exactly one watchdog line for the whole job"
  assert_out '^shardsim: watchdog: .* made no progress for 2 s \(limit SHARDSIM_WATCHDOG_S=2\); stalled: chip 5 \(rank 1\), not waiting for any message' \
    "names the stalled chip 5"
  assert_out_count '^shardsim: (error|terminated|interrupted)' 0 "no second line"
fi

e2e_finish

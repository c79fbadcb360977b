#!/usr/bin/env bash
# The async engine's watchdog: one rank stalls (test hook) before an async all_reduce; every rank must exit within
# the watchdog time plus start-up (the timeout catches hangs: no timing assertion beyond "did not hang"), with exit
# code 3, a message naming the op, its sequence number and the stalled rank, and no core file. The same for the
# synchronous collectives' watchdog (SHARDSIM_TEST_STALL_SYNC_RANK), which must print exactly one line.
# Runs the benchmark program bench/async_overlap.cpp (a plain MPI program using all_reduce_async) with tiny sizes.
#   bash tests/e2e/watchdog.sh build/bench/shardsim_async_overlap configs mpiexec
source "$(dirname "$0")/lib.sh"
e2e_init "$@"
E2E_TIMEOUT=${E2E_TIMEOUT_WATCHDOG:-60}
ulimit -c unlimited 2>/dev/null || true  # so a crash would leave a core file here for the check below

e2e_case "rank 3 of 4 stalls, 3 s watchdog"
export SHARDSIM_WATCHDOG_S=3 SHARDSIM_TEST_STALL_RANK=3
if expect_exit 3 "watchdog" -- shardsim_mpi 4 --mib 1 --gemm 32 --reps 1 --trials 1; then
  assert_out "watchdog: chip [0-2] \(rank [0-2]\): async all_reduce #0 made no progress" "names the op and its sequence number"
  assert_out "(not reached this op|waiting on ranks): ([0-9]+, )*3" "names the stalled rank 3"
  assert_out "rank 3 stalls before async all_reduce #0" "the test hook fired on rank 3"
fi
if compgen -G "core*" >/dev/null; then fail "core file left: $(ls core*)"; else pass "no core file"; fi
unset SHARDSIM_TEST_STALL_RANK

e2e_case "synchronous watchdog: rank 3 of 4 stalls before its first synchronous wait, 3 s watchdog"
# Every waiting rank's watchdog fires at about the same time; the job must print ONE line, naming the stalled chip
# (the one not waiting on any message) rather than each rank's ring neighbour.
export SHARDSIM_WATCHDOG_S=3 SHARDSIM_TEST_STALL_SYNC_RANK=3
if expect_exit 3 "watchdog" -- shardsim_mpi 4 --mib 1 --gemm 32 --reps 1 --trials 1; then
  assert_out_count "^shardsim: watchdog" 1 "exactly one watchdog line for the whole job"
  assert_out "^shardsim: watchdog: chip [0-2] \(rank [0-2]\): [a-z_.0-9: ]+ made no progress for 3 s \(limit SHARDSIM_WATCHDOG_S=3\); stalled: chip 3 \(rank 3\), not waiting for any message" \
    "names the stalled chip 3"
  assert_out "waiting on it: chip\(s\) ([0-9], )*[0-2]$" "names the waiting chips"
  assert_out "rank 3 stalls in " "the test hook fired on rank 3"
fi
unset SHARDSIM_TEST_STALL_SYNC_RANK SHARDSIM_WATCHDOG_S

e2e_case "synchronous watchdog, 8 ranks, rank 5 stalls"
export SHARDSIM_WATCHDOG_S=3 SHARDSIM_TEST_STALL_SYNC_RANK=5
if expect_exit 3 "watchdog" -- shardsim_mpi 8 --mib 1 --gemm 32 --reps 1 --trials 1; then
  assert_out_count "^shardsim: watchdog" 1 "exactly one watchdog line for the whole job"
  assert_out "stalled: chip 5 \(rank 5\), not waiting for any message" "names the stalled chip 5"
fi
unset SHARDSIM_TEST_STALL_SYNC_RANK SHARDSIM_WATCHDOG_S

e2e_case "bad SHARDSIM_WATCHDOG_S"
export SHARDSIM_WATCHDOG_S=soon
expect_exit 2 "SHARDSIM_WATCHDOG_S='soon'" -- shardsim_mpi 2 --mib 1 --gemm 32 --reps 1 --trials 1
unset SHARDSIM_WATCHDOG_S

e2e_case "no stall: the same run succeeds under a 3 s watchdog"
export SHARDSIM_WATCHDOG_S=3
expect_exit 0 "overlapped" -- shardsim_mpi 4 --mib 1 --gemm 32 --reps 1 --trials 1
unset SHARDSIM_WATCHDOG_S

e2e_finish

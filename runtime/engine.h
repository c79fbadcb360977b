// The chip's asynchronous communication engine: one progress thread per rank that runs communication jobs
// (e.g. collectives::all_reduce_async) while the main thread computes, plus a watchdog.
//
// MPI thread level: the engine needs MPI_THREAD_MULTIPLE. MpiSession requests it; the engine's thread and the main
// thread may both be inside MPI at once (the main thread keeps running synchronous collectives, agreement and
// HDF5 on its own communicators while an async op is in flight). SERIALIZED would force every MPI call of the
// main thread through one lock shared with the engine, i.e. touch every call site, and would stall the main
// thread's MPI for the length of a 256 MiB transfer. The constructor checks MPI_Query_thread and throws
// RuntimeFault (exit 3) naming the level provided when it is lower; synchronous code needs only FUNNELED.
//
// Isolation: jobs run on a Transport over a *duplicate* of the parent's communicator (MPI_Comm_dup, made once,
// collectively, on first use), with its own scratch buffers and byte counter, so async messages never match the
// main thread's. Jobs run one at a time in submission order; every rank must submit the same jobs in the same
// order (as with any collective). Before each job the ranks exchange its sequence number (one small message to
// every peer, non-blocking): a rank that has not reached the op is named by the watchdog, and ranks that issue
// async ops in different orders get a RuntimeFault.
//
// Simulated time (deterministic, never from the host clock): a job runs on the engine's own copy of the chip's
// Timeline, taken when it is submitted, plus the bookings of the earlier async ops not yet waited for (replayed in
// issue order). So an async op computes exactly the span the synchronous op would have computed had it been
// issued at that point. wait() then books the op's sends and regions on the chip's Timeline (in issue order,
// earlier unwaited ops first) so the trace and the breakdown see them. Link bookings the main thread makes while
// an op is in flight do not delay that op's span; they can delay its committed trace events.
//
// Watchdog: if the running job has made no progress (no MPI request completed) for watchdog_s seconds, a
// watchdog thread prints "shardsim: watchdog: chip C (rank R): async OP #SEQ made no progress for S s ..."
// naming the ranks that have not reached the op and the ranks of the pending MPI requests, and aborts the job
// with exit code 3 (World::abort -> MPI_Abort; no core dump). watchdog_s: EngineOptions, else the environment
// variable SHARDSIM_WATCHDOG_S, else 300; 0 disables it. Both threads are driven by Boost.Asio io_contexts (kept
// out of this header).
//
// Test hook: SHARDSIM_TEST_STALL_RANK=R makes world rank R sleep forever when it submits its first async op.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "runtime/transport.h"

namespace shardsim::runtime {

struct EngineOptions {
  double watchdog_s = -1;  // < 0: SHARDSIM_WATCHDOG_S or 300 s; 0: no watchdog
};

class Engine;

// One submitted job. Move-only. Destroying an op that was never waited for waits for it (errors are printed).
class AsyncOp {
 public:
  AsyncOp() = default;
  AsyncOp(AsyncOp&&) noexcept = default;
  AsyncOp& operator=(AsyncOp&&) noexcept;
  ~AsyncOp();

  const std::string& name() const;
  std::uint64_t seq() const;  // 0, 1, 2, ... per engine, the same on every rank
  // True once the job has finished (successfully or not). Never blocks, never throws.
  bool test() const;
  // Blocks until the job has finished, commits its simulated bookings (see Engine), and rethrows an error the
  // job raised as the same kind of shardsim::Error (same exit code) prefixed "async NAME #SEQ: ". Once only.
  void wait();

 private:
  friend class Engine;
  struct State;
  Engine* engine_ = nullptr;
  std::shared_ptr<State> state_;
};

class Engine {
 public:
  // Collective over PARENT's communicator. Throws RuntimeFault without MPI_THREAD_MULTIPLE, UsageError for a bad
  // SHARDSIM_WATCHDOG_S. PARENT's Timeline must outlive the engine (it is the chip's timeline).
  explicit Engine(Transport& parent, EngineOptions options = {});
  ~Engine();  // finishes queued jobs, then stops both threads
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // A job: runs on the progress thread with the engine's Transport (duplicated communicator, engine timeline).
  using Job = std::function<void(Transport& tp)>;
  // Queues JOB under NAME (used in errors and the watchdog message). Main thread only.
  AsyncOp submit(const std::string& name, Job job);

  double watchdog_seconds() const;

 private:
  friend class AsyncOp;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// SHARDSIM_WATCHDOG_S parsed (UsageError if not a number >= 0), or FALLBACK when unset.
double watchdog_seconds_from_env(double fallback);

}  // namespace shardsim::runtime

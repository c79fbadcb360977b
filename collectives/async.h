// Asynchronous collectives (all_reduce, reduce_scatter, all_gather, broadcast, reduce, all_to_all): the same algorithms, run on the chip's communication engine (runtime/engine.h) so the
// calling thread can compute while the data moves.
//
//   auto h = collectives::all_reduce_async(tp, send, recv, count, dtype, op, ready, options);
//   ... compute ...
//   CollectiveResult r = h.wait();
//
// Semantics are all_reduce's (collectives/all_reduce.h: buffers, algorithms, errors), with:
// - SENDBUF/RECVBUF must stay alive and untouched until wait() returns.
// - Every rank issues the same async ops in the same order. Several may be in flight; they run one after the other
//   on the engine, over a duplicate of TP's communicator, so they never match the main thread's messages.
// - Simulated time: the result's span is bit-identical to the span the synchronous call would have returned if
//   issued at the same point (see runtime/engine.h for how the engine's bookings reach the chip's timeline).
// - Errors raised on the engine (argument mismatches between ranks, size mismatches naming the peer chip, MPI
//   faults) are rethrown by wait() as the same error kind (same exit code), prefixed "async all_reduce #SEQ: ".
// - The first async call on a transport starts its engine: collective (MPI_Comm_dup) and needs
//   MPI_THREAD_MULTIPLE. A job that makes no progress for SHARDSIM_WATCHDOG_S (default 300) s aborts the job.
#pragma once

#include <memory>

#include "collectives/types.h"
#include "runtime/engine.h"
#include "runtime/transport.h"

namespace shardsim::collectives {

// A collective in flight. Move-only; destroying it without wait() waits (and prints an error if there was one).
class AsyncHandle {
 public:
  AsyncHandle() = default;
  AsyncHandle(runtime::AsyncOp op, std::shared_ptr<CollectiveResult> result)
      : op_(std::move(op)), result_(std::move(result)) {}
  // True once the collective has finished on this rank (then wait() does not block). Never throws.
  bool test() const { return op_.test(); }
  // Blocks until finished; returns what the synchronous call returns, or rethrows its error. Call once.
  CollectiveResult wait() {
    op_.wait();
    return *result_;
  }
  std::uint64_t seq() const { return op_.seq(); }

 private:
  runtime::AsyncOp op_;
  std::shared_ptr<CollectiveResult> result_;
};

AsyncHandle all_reduce_async(runtime::Transport& tp, const void* sendbuf, void* recvbuf, size_t count, DType dtype,
                             ReduceOp op, sim::TimeNs ready, const CollectiveOptions& options = {});
// The same for the other collectives: arguments, sizes, algorithms and errors as in their headers
// (reduce_scatter.h, all_gather.h, broadcast.h, reduce.h, all_to_all.h); semantics as above.
AsyncHandle reduce_scatter_async(runtime::Transport& tp, const void* sendbuf, void* recvbuf, size_t count,
                                 DType dtype, ReduceOp op, sim::TimeNs ready, const CollectiveOptions& options = {});
AsyncHandle all_gather_async(runtime::Transport& tp, const void* sendbuf, void* recvbuf, size_t count, DType dtype,
                             sim::TimeNs ready, const CollectiveOptions& options = {});
AsyncHandle broadcast_async(runtime::Transport& tp, const void* sendbuf, void* recvbuf, size_t count, DType dtype,
                            sim::TimeNs ready, const CollectiveOptions& options = {});
AsyncHandle reduce_async(runtime::Transport& tp, const void* sendbuf, void* recvbuf, size_t count, DType dtype,
                         ReduceOp op, sim::TimeNs ready, const CollectiveOptions& options = {});
AsyncHandle all_to_all_async(runtime::Transport& tp, const void* sendbuf, void* recvbuf, size_t count, DType dtype,
                             sim::TimeNs ready, const CollectiveOptions& options = {});

}  // namespace shardsim::collectives

// all_reduce: every rank ends with the element-wise reduction of all ranks' buffers (ncclAllReduce).
//
// Buffers: SENDBUF and RECVBUF hold COUNT elements of DTYPE on every rank; SENDBUF == RECVBUF is in-place.
// COUNT may be anything from 0 up (not a multiple of the rank count, smaller than it, beyond 2^31).
// Algorithms (options.algorithm; "auto" picks by estimated simulated time, see algorithms.h):
//   ring              reduce-scatter + all-gather around the ring:  2(p-1)(alpha + S/(pB))       (ring.h)
//   bidir_ring        half the data each way:                       2(p-1)(alpha + S/(2pB))      (ring.h)
//   torus             per-dimension rings: 2 sum_d (k_d-1)(alpha_d + S_d/(w_d k_d B_d))          (torus.h)
//   halving_doubling  Rabenseifner: 2 log2(p) alpha + 2 (p-1)/p S/B for power-of-two p (halving_doubling.h)
// Time: the result's span runs from READY (when the input is ready on this chip) to when the output is here.
// Errors: UsageError for an unknown or inapplicable algorithm and for counts that differ across ranks;
// RuntimeFault on transport failures.
#pragma once

#include "collectives/types.h"
#include "runtime/transport.h"

namespace shardsim::collectives {

using AllReduceOptions = CollectiveOptions;

CollectiveResult all_reduce(runtime::Transport& tp, const void* sendbuf, void* recvbuf, size_t count, DType dtype,
                            ReduceOp op, sim::TimeNs ready, const CollectiveOptions& options = {});

}  // namespace shardsim::collectives

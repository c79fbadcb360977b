// all_reduce: every rank ends with the element-wise reduction of all ranks' buffers.
//
// Buffers: SENDBUF and RECVBUF hold COUNT elements of DTYPE on every rank; SENDBUF == RECVBUF is in-place.
// COUNT may be anything from 0 up (not a multiple of the rank count, smaller than it, beyond 2^31).
// Time: the result's span runs from READY (when the input is ready on this chip) to the time the reduced
// output is complete here. Algorithm "ring" = ring reduce-scatter then ring all-gather (see ring.h):
// 2(p-1)(alpha + S/(p*B)) on a ring topology.
// Errors: std::invalid_argument for an unknown algorithm; RuntimeFault on transport failures.
#pragma once

#include <string>

#include "collectives/types.h"
#include "runtime/transport.h"

namespace shardsim::collectives {

struct AllReduceOptions {
  std::string algorithm = "ring";  // only "ring" so far
  std::string name = "all_reduce";  // event name prefix on the timeline
};

CollectiveResult all_reduce(runtime::Transport& tp, const void* sendbuf, void* recvbuf, size_t count, DType dtype,
                            ReduceOp op, sim::TimeNs ready, const AllReduceOptions& options = {});

}  // namespace shardsim::collectives

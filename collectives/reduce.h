// reduce (ncclReduce): the element-wise reduction of every rank's SENDBUF (COUNT elements) lands in ROOT's
// RECVBUF; RECVBUF is not touched on other ranks (may be null there). SENDBUF == RECVBUF is in-place.
// Algorithms: binomial_tree, ring (pipelined chain towards the root); costs mirror broadcast.h.
// Errors: as broadcast.
#pragma once

#include "collectives/types.h"
#include "runtime/transport.h"

namespace shardsim::collectives {

CollectiveResult reduce(runtime::Transport& tp, const void* sendbuf, void* recvbuf, size_t count, DType dtype,
                        ReduceOp op, sim::TimeNs ready, const CollectiveOptions& options = {});

}  // namespace shardsim::collectives

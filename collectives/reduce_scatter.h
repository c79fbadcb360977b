// reduce_scatter: the element-wise reduction of all ranks' buffers, split so rank r keeps chunk r.
//
// Buffers: SENDBUF holds COUNT elements on every rank. RECVBUF receives Partition{COUNT, p}.size(rank)
// elements (COUNT need not divide by p: the first COUNT % p ranks get one extra element). In-place when
// RECVBUF == SENDBUF + Partition.offset(rank) elements (NCCL's convention).
// Algorithm "ring" (see ring.h): (p-1)(alpha + S/(p*B)) on a ring topology.
#pragma once

#include <string>

#include "collectives/types.h"
#include "runtime/transport.h"

namespace shardsim::collectives {

struct ReduceScatterOptions {
  std::string algorithm = "ring";
  std::string name = "reduce_scatter";
};

CollectiveResult reduce_scatter(runtime::Transport& tp, const void* sendbuf, void* recvbuf, size_t count,
                                DType dtype, ReduceOp op, sim::TimeNs ready, const ReduceScatterOptions& options = {});

}  // namespace shardsim::collectives

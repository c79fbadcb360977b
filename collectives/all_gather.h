// all_gather: every rank ends with the concatenation of all ranks' chunks, in rank order.
//
// Buffers: rank r contributes Partition{COUNT, p}.size(r) elements from SENDBUF; RECVBUF holds COUNT elements.
// In-place when SENDBUF == RECVBUF + Partition.offset(rank) elements (NCCL's convention).
// Algorithm "ring" (see ring.h): (p-1)(alpha + S/(p*B)) on a ring topology.
#pragma once

#include <string>

#include "collectives/types.h"
#include "runtime/transport.h"

namespace shardsim::collectives {

struct AllGatherOptions {
  std::string algorithm = "ring";
  std::string name = "all_gather";
};

CollectiveResult all_gather(runtime::Transport& tp, const void* sendbuf, void* recvbuf, size_t count, DType dtype,
                            sim::TimeNs ready, const AllGatherOptions& options = {});

}  // namespace shardsim::collectives

// reduce_scatter: the element-wise reduction of all ranks' COUNT-element SENDBUF, of which rank r keeps chunk r
// of Partition{COUNT, p} (ncclReduceScatter with uneven counts allowed: the first COUNT % p ranks get one more).
//
// RECVBUF holds Partition{COUNT,p}.size(rank) elements. In-place: RECVBUF == SENDBUF + offset(rank) elements.
// SENDBUF is not modified. Algorithms: ring, bidir_ring, torus, halving_doubling (see all_reduce.h; each
// is half of the corresponding all_reduce: (p-1)(alpha + S/(pB)) for the ring).
// Errors: as all_reduce.
#pragma once

#include "collectives/types.h"
#include "runtime/transport.h"

namespace shardsim::collectives {

using ReduceScatterOptions = CollectiveOptions;

CollectiveResult reduce_scatter(runtime::Transport& tp, const void* sendbuf, void* recvbuf, size_t count,
                                DType dtype, ReduceOp op, sim::TimeNs ready, const CollectiveOptions& options = {});

}  // namespace shardsim::collectives

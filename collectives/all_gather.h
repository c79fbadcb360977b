// all_gather: every rank contributes a chunk and ends with all chunks concatenated in rank order.
//
// all_gather (ncclAllGather, uneven counts allowed): SENDBUF holds Partition{COUNT,p}.size(rank) elements,
//   RECVBUF holds COUNT. In-place: SENDBUF == RECVBUF + offset(rank) elements.
// all_gatherv (MPI_Allgatherv): rank r contributes COUNTS[r] elements (every rank passes the same COUNTS);
//   RECVBUF holds sum(COUNTS) elements packed in rank order. In-place: SENDBUF == RECVBUF + sum(COUNTS[<rank]).
// Algorithms: ring, bidir_ring, torus, halving_doubling: (p-1)(alpha + S/(pB)) for the ring, S the output.
// Errors: as all_reduce; COUNTS of the wrong length is a UsageError.
#pragma once

#include <vector>

#include "collectives/types.h"
#include "runtime/transport.h"

namespace shardsim::collectives {

using AllGatherOptions = CollectiveOptions;

CollectiveResult all_gather(runtime::Transport& tp, const void* sendbuf, void* recvbuf, size_t count, DType dtype,
                            sim::TimeNs ready, const CollectiveOptions& options = {});
CollectiveResult all_gatherv(runtime::Transport& tp, const void* sendbuf, void* recvbuf,
                             const std::vector<size_t>& counts, DType dtype, sim::TimeNs ready,
                             const CollectiveOptions& options = {});

}  // namespace shardsim::collectives

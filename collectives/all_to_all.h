// all_to_all: rank r sends block j of its SENDBUF to rank j, which stores it as block r of its RECVBUF.
//
// all_to_all (like ncclAlltoAll in nccl-tests): COUNT is the total elements per rank; every block has COUNT/p
//   elements (COUNT must be a multiple of p; UsageError otherwise). In-place (SENDBUF == RECVBUF) is allowed.
// all_to_allv (MPI_Alltoallv with element counts and displacements): SENDCOUNTS[j] elements at SDISPLS[j]
//   go to rank j; RECVCOUNTS[j] elements from rank j land at RDISPLS[j]. A sender/receiver count mismatch is a
//   UsageError naming both chips. Out-of-place only.
// Algorithm "direct" (pairwise exchange): at step s = 1..p-1 rank r sends to r+s and receives from r-s, so each
// pair talks once. Simulated, every block is injected at READY and blocks sharing a first link serialize:
//   T = max over chips and ports (bytes through the port / B) + route latency     (S/p per peer)
#pragma once

#include <vector>

#include "collectives/types.h"
#include "runtime/transport.h"

namespace shardsim::collectives {

CollectiveResult all_to_all(runtime::Transport& tp, const void* sendbuf, void* recvbuf, size_t count, DType dtype,
                            sim::TimeNs ready, const CollectiveOptions& options = {});
CollectiveResult all_to_allv(runtime::Transport& tp, const void* sendbuf, const std::vector<size_t>& sendcounts,
                             const std::vector<size_t>& sdispls, void* recvbuf,
                             const std::vector<size_t>& recvcounts, const std::vector<size_t>& rdispls, DType dtype,
                             sim::TimeNs ready, const CollectiveOptions& options = {});

}  // namespace shardsim::collectives

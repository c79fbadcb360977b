// broadcast (ncclBroadcast): ROOT's SENDBUF (COUNT elements) ends up in every rank's RECVBUF.
// SENDBUF is read only on the root; SENDBUF == RECVBUF is in-place. options.root is the root's rank.
// Algorithms: binomial_tree (ceil(log2 p)(alpha + S/B)), ring (pipelined chain,
// (p-1)(alpha + c/B) + (m-1)c/B with pieces of c = chunk_bytes, default 1 MiB); see tree.h.
// Errors: UsageError for a root outside the group or an unknown algorithm; as all_reduce otherwise.
#pragma once

#include "collectives/types.h"
#include "runtime/transport.h"

namespace shardsim::collectives {

CollectiveResult broadcast(runtime::Transport& tp, const void* sendbuf, void* recvbuf, size_t count, DType dtype,
                           sim::TimeNs ready, const CollectiveOptions& options = {});

// Throws UsageError "OP: root R is outside the group of P ranks" unless 0 <= root < tp.size().
void check_root(const runtime::Transport& tp, int root, const std::string& op);

}  // namespace shardsim::collectives

// Point-to-point send/recv between two ranks of a group (ncclSend/ncclRecv), and barrier.
//
// send: COUNT elements at BUF to rank PEER, ready at READY. The arrival time is known only to the receiver,
//       so the sender's span is empty (it only books its link port).
// recv: COUNT elements into BUF from rank PEER; span.end is the simulated arrival time.
// A count mismatch between the two sides is a UsageError naming both chips. Cost: alpha + S/B along the route.
// barrier: dissemination barrier (Hensgen, Finkel & Manber, "Two algorithms for barrier synchronization",
// IJPP 1988): ceil(log2 p) rounds of zero-byte messages to rank r + 2^k; span.end is when every rank has
// arrived as far as this chip can know (simulated).
#pragma once

#include "collectives/types.h"
#include "runtime/transport.h"

namespace shardsim::collectives {

CollectiveResult send(runtime::Transport& tp, const void* buf, size_t count, DType dtype, int peer,
                      sim::TimeNs ready, const CollectiveOptions& options = {});
CollectiveResult recv(runtime::Transport& tp, void* buf, size_t count, DType dtype, int peer, sim::TimeNs ready,
                      const CollectiveOptions& options = {});
CollectiveResult barrier(runtime::Transport& tp, sim::TimeNs ready, const CollectiveOptions& options = {});

}  // namespace shardsim::collectives

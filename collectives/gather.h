// gather (MPI_Gather) and scatter (MPI_Scatter), algorithm "direct".
//
// gather:  every rank's SENDBUF (COUNT elements) lands at block r of ROOT's RECVBUF (p*COUNT elements);
//          RECVBUF is ignored on other ranks. In-place on the root: SENDBUF == RECVBUF + root*COUNT.
// scatter: block r of ROOT's SENDBUF (p*COUNT elements) lands in rank r's RECVBUF (COUNT elements);
//          SENDBUF is ignored on other ranks. In-place on the root: RECVBUF == SENDBUF + root*COUNT.
// Direct: every non-root rank exchanges one message with the root. Simulated, scatter serializes the root's
// sends on its ports; gather injects from every chip at once and the model does not see the root's ingress
// link as a bottleneck (a known gap, docs/MODEL.md): T_gather = max route (alpha + S/(pB)).
// Errors: UsageError for a root outside the group; as all_reduce otherwise.
#pragma once

#include "collectives/types.h"
#include "runtime/transport.h"

namespace shardsim::collectives {

CollectiveResult gather(runtime::Transport& tp, const void* sendbuf, void* recvbuf, size_t count, DType dtype,
                        sim::TimeNs ready, const CollectiveOptions& options = {});
CollectiveResult scatter(runtime::Transport& tp, const void* sendbuf, void* recvbuf, size_t count, DType dtype,
                         sim::TimeNs ready, const CollectiveOptions& options = {});

}  // namespace shardsim::collectives

// Ring algorithms (internal building blocks of all_reduce, reduce_scatter, all_gather).
//
// Ranks form a ring in communicator order: rank r sends to r+1 and receives from r-1 (mod p). The buffer of
// COUNT elements is split by Partition(COUNT, p); chunk i ends up owned by rank i.
//   reduce-scatter: p-1 steps; at step s rank r sends chunk (r-s-1) mod p, receives chunk (r-s-2) mod p and
//                   reduces it into its copy. After the last step chunk r on rank r is fully reduced.
//   all-gather:     p-1 steps; at step s rank r sends chunk (r-s) mod p and receives chunk (r-s-1) mod p.
// Each step moves one chunk over one link, so on a ring topology with bandwidth B and latency alpha:
//   T_rs = T_ag = (p-1) * (alpha + S/(p*B)),   T_all_reduce = 2(p-1) * (alpha + S/(p*B))
// (Patarasuk & Yuan, "Bandwidth optimal all-reduce algorithms for clusters of workstations", JPDC 2009.)
// The reduction arithmetic is assumed fused into the data movement (as NCCL's kernels do) and not charged.
#pragma once

#include <string>

#include "collectives/types.h"
#include "runtime/transport.h"

namespace shardsim::collectives::ring {

// In place on WORK (COUNT elements). Returns the simulated time the last chunk is reduced/gathered.
sim::TimeNs reduce_scatter_inplace(runtime::Transport& tp, void* work, size_t count, DType t, ReduceOp op,
                                   sim::TimeNs ready, const std::string& name);
sim::TimeNs all_gather_inplace(runtime::Transport& tp, void* work, size_t count, DType t, sim::TimeNs ready,
                               const std::string& name);

}  // namespace shardsim::collectives::ring

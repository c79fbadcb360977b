// Multi-dimensional torus algorithms: reduce-scatter along each dimension in turn, then all-gather back in
// reverse order, so every dimension's links carry traffic (the scheme TPU pods use; see Ying et al., "Image
// Classification at Supercomputer Scale", 2018, and Jouppi et al., "TPU v4", ISCA 2023).
//
// Needs a torus (or ring) topology whose chips are all in the group, rank r on chip r (row-major order).
// Along dimension d (size k_d) the chips sharing every other coordinate form a ring; it runs a bidirectional
// ring when the dimension has k_d > 2 and links both ways, else a one-way ring. With S_d the data entering
// dimension d (S_0 = S, S_{d+1} = S_d / k_d), dimensions in order 0, 1, ...:
//   T_rs = sum_d (k_d - 1)(alpha_d + S_d/(w_d k_d B_d)),   T_all_reduce = 2 T_rs,   w_d = 2 if bidirectional else 1
// e.g. an X x Y torus has 2(X-1) + 2(Y-1) latency steps instead of a flat ring's 2(XY-1).
// The layout must be packed in rank order; rank r ends with chunk r exactly as the ring algorithm leaves it.
#pragma once

#include <string>

#include "collectives/types.h"
#include "runtime/transport.h"

namespace shardsim::collectives::torus {

// Why the torus algorithm cannot run on TP (empty when it can).
std::string obstacle(const runtime::Transport& tp);

sim::TimeNs reduce_scatter(runtime::Transport& tp, void* base, const Layout& layout, DType t, ReduceOp op,
                           sim::TimeNs ready, size_t chunk_bytes, const std::string& name);
sim::TimeNs all_gather(runtime::Transport& tp, void* base, const Layout& layout, DType t, sim::TimeNs ready,
                       size_t chunk_bytes, const std::string& name);

}  // namespace shardsim::collectives::torus

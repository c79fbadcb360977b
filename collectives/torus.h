// Multi-dimensional torus algorithms: reduce-scatter along each dimension in turn, then all-gather back in
// reverse order, so every dimension's links carry traffic (the scheme TPU pods use; see Ying et al., "Image
// Classification at Supercomputer Scale", 2018, and Jouppi et al., "TPU v4", ISCA 2023).
//
// Needs a grid topology (torus, ring, mesh, switch, fully-connected or any stack of their dimensions, not an
// edge-list graph) whose chips are all in the group, rank r on chip r (row-major order). On non-torus stacks
// this is ASTRA-sim's multi-dimensional hierarchical collective (alias "hierarchical").
// Along dimension d (size k_d) the chips sharing every other coordinate form a ring; it runs a bidirectional
// ring when the two ring neighbours are reached over different first links (k_d > 2), else a one-way ring.
// With S_d the data entering dimension d (S_0 = S, S_{d+1} = S_d / k_d), dimensions in order 0, 1, ...:
//   ring / fully-connected dimension:  (k_d - 1)(alpha_d + S_d/(w_d k_d B_d)),  w_d = 2 if bidirectional else 1
//   switch dimension (one uplink):     (k_d - 1)(2 alpha_d + S_d/(k_d B_d))     (each step crosses up + down)
//   line (mesh) dimension, k_d > 2:    (k_d - 1) S_d/(k_d B_d) + (2 k_d - 3) alpha_d   (the wrap-around step
//                                       crosses k_d - 1 hops; see tests/mpi/topologies_test.cpp)
//   T_rs = sum over dimensions,  T_all_reduce = 2 T_rs
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

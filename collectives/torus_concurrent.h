// Concurrent-dimension torus algorithm: the data is split into D parts (D = the grid's dimensions of size > 1) and
// part j runs the torus algorithm (torus.h) with the dimension order rotated by j, so in every phase each part
// uses another dimension and all dimensions are busy at once, each bidirectional where its ring allows (TPU-style
// multi-dimensional all-reduce: Ying et al., "Image Classification at Supercomputer Scale", 2018; Jouppi et al.,
// "TPU v4", ISCA 2023; Google's "2-D all-reduce" in Kumar et al., "Exploring the limits of concurrency in ML
// training on Google TPUs", MLSys 2021). The plain torus algorithm visits the dimensions one after the other, so
// a chip uses the two links of one dimension of its 2D links at a time.
//
// Needs what torus.h needs (a grid, one rank on every chip) and at least two dimensions of size > 1.
//
// Schedule. Order o_0 = dim_order() (ring bandwidth descending), o_j = o_0 rotated left by j. Part j (elements
// [off_j, off_j + n_j) of a Partition of the buffer into D parts) reduce-scatters along o_j[0], o_j[1], ... and
// all-gathers back in reverse, exactly as torus.h on its own S/D bytes; phase i of every part runs from the time
// that part's previous phase ended. Parts of one phase use distinct dimensions, hence disjoint links.
// Closed form (contention-free: every dimension's phases take equal time, e.g. a k x k torus or a k^D cube), with
// S_0 = S/D, S_{i+1} = S_i / k_i and the per-dimension ring times of torus.h:
//   T_rs = sum over i of T_dim(o_0[i], S_i),   T_all_reduce = 2 T_rs
// e.g. a k x k torus, bidirectional rings, links of bandwidth B and latency alpha:
//   T_all_reduce = 2 (k-1) [2 alpha + (S/2)(1 + 1/k) / (2 k B)]
// which on a 4 x 4 torus is 15/16 S / (2B) against the 16-chip bidirectional ring's 30/16 S / (2B): twice the
// busbw (every chip drives its 4 links instead of 2). When the dimensions differ, a part waits for the dimension
// the other part still holds (the simulation and the estimate charge that wait).
// Physical lower bound (all_reduce, any algorithm without in-network reduction): every chip must send at least
// 2(p-1)/p x S bytes over its outgoing links (collectives/cost/cost_model.h, lower_bound_ns).
//
// Chunks. all_reduce runs in place: part j's elements are laid out in o_j's position order (torus::layout).
// reduce_scatter / all_gather split every rank's chunk into D sub-pieces, part j carrying sub-piece j of every
// chunk; the sub-pieces are packed per part in position order into scratch slot 4 and copied back (host copies
// only, no simulated time), so rank r ends with chunk r of LAYOUT as every other algorithm leaves it.
#pragma once

#include <string>

#include "collectives/types.h"
#include "runtime/transport.h"

namespace shardsim::collectives::torus_concurrent {

// Why the algorithm cannot run on TP (empty when it can).
std::string obstacle(const runtime::Transport& tp);

sim::TimeNs all_reduce(runtime::Transport& tp, const void* sendbuf, void* recvbuf, size_t count, DType t, ReduceOp op,
                       size_t chunk_bytes, sim::TimeNs ready, const std::string& name);
sim::TimeNs reduce_scatter(runtime::Transport& tp, void* base, const Layout& layout, DType t, ReduceOp op,
                           size_t chunk_bytes, sim::TimeNs ready, const std::string& name);
sim::TimeNs all_gather(runtime::Transport& tp, void* base, const Layout& layout, DType t, size_t chunk_bytes,
                       sim::TimeNs ready, const std::string& name);

}  // namespace shardsim::collectives::torus_concurrent

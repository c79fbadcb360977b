// Multi-dimensional torus algorithms: reduce-scatter along each dimension in turn, then all-gather back in
// reverse order, so every dimension's links carry traffic (the scheme TPU pods use; see Ying et al., "Image
// Classification at Supercomputer Scale", 2018, and Jouppi et al., "TPU v4", ISCA 2023).
//
// Needs a grid topology (torus, ring, mesh, switch, fully-connected or any stack of their dimensions, not an
// edge-list graph) whose chips are all in the group, one rank per chip. On non-torus stacks this is ASTRA-sim's
// multi-dimensional hierarchical collective (alias "hierarchical").
// Along dimension d (size k_d) the chips sharing every other coordinate form a ring, ordered by their coordinate
// d, so ring neighbours are physical neighbours whatever the rank -> chip placement; it runs a bidirectional ring
// when the two ring neighbours are reached over different first links (k_d > 2), else a one-way ring.
//
// Dimension order. The reduce-scatter visits the dimensions in dim_order() below; the all-gather visits them in
// the reverse order. A dimension visited later carries less data: with S_i the data entering the i-th dimension
// visited (S_0 = S, S_{i+1} = S_i / k_i), the time is
//   ring / fully-connected dimension:  (k - 1)(alpha + S_i/(w k B)),  w = 2 if bidirectional else 1
//   switch dimension (one uplink):     (k - 1)(2 alpha + S_i/(k B))     (each step crosses up + down)
//   line (mesh) dimension, k > 2:      (k - 1) S_i/(k B) + (2k - 3) alpha   (the wrap-around step crosses k - 1
//                                       hops; see tests/mpi/topologies_test.cpp)
//   T_rs = sum over the dimensions in that order,  T_all_reduce = 2 T_rs
// The latency terms do not depend on the order; the bandwidth terms do. Swapping two dimensions a, b visited
// one after the other (data S_i entering the first) changes the time by
//   S_i (k_a - 1)(k_b - 1) / (k_a k_b) * (1/c_a - 1/c_b),   c = w B (the ring bandwidth of one chip, GB/s)
// so visiting the dimension with the larger c first is never slower, and the order sorted by c descending is the
// fastest of all orders (bubble-sort argument). dim_order() is that order; ties (equal c, where the order does
// not change the time) go innermost first, i.e. the last-listed shardsim dimension first, which is the first
// dimension of an ASTRA-sim network.yml: ASTRA-sim's default ("ascending") order. On an ASTRA-style stack
// [Ring 4 fast, Switch 8 slow] this reduce-scatters over the fast ring first, so the slow switch links carry
// only 1/4 of the data (see docs/MODEL.md).
// e.g. an X x Y torus has 2(X-1) + 2(Y-1) latency steps instead of a flat ring's 2(XY-1).
//
// Chunks. The chunks are split hierarchically in dim_order(): a chip's *position* is its coordinates read as a
// mixed-radix number, the first dimension visited most significant; the chip at position q ends the
// reduce-scatter holding chunk q of the position-ordered buffer. When LAYOUT (indexed by rank) is packed in
// that position order (layout() below, which all_reduce uses) the passes run in place. Otherwise (reduce_scatter
// and all_gather(v), whose layouts are packed in rank order, when the placement or the dimension order is not the
// identity) the chunks are first packed in position order into scratch slot 4 and copied back afterwards (a host
// copy only: like every local copy of the collectives it costs no simulated time). Either way rank r ends with
// chunk r of LAYOUT exactly as the ring algorithm leaves it.
#pragma once

#include <string>
#include <vector>

#include "collectives/types.h"
#include "runtime/transport.h"

namespace shardsim::collectives::torus {

// Why the torus algorithm cannot run on TP (empty when it can).
std::string obstacle(const runtime::Transport& tp);

// One dimension's ring as the algorithm runs it, measured on the line through chip 0.
struct DimRing {
  int dim = 0;                 // index into topology.dims() (shardsim order: outermost first)
  int k = 0;                   // its size (> 1)
  bool bidirectional = false;  // k > 2 and chip 0 reaches its two ring neighbours over different first links
  double bandwidth_gbps = 0;   // c = w B: 2 x the slower direction's bottleneck when bidirectional, else forward
  std::vector<int> line;       // the chips of the line through chip 0, by coordinate
};
// The dimensions of size > 1 of grid TOPO in reduce-scatter order: bandwidth_gbps descending, ties innermost
// (highest index) first. The all-gather runs them in reverse. Deterministic: depends on TOPO only.
std::vector<DimRing> dim_order(const topology::Topology& topo);

// PART laid out in position order: rank r's chunk is PART's chunk number position(chip of r). all_reduce uses it
// so the passes run in place.
Layout layout(const runtime::Transport& tp, const Partition& part);

// Building blocks shared with the concurrent-dimension algorithm (torus_concurrent.h), which runs several
// reduce-scatter orders at once.
// Position of CHIP for reduce-scatter ORDER: its coordinates as a mixed-radix number, ORDER's first dimension
// most significant.
size_t position(const topology::Topology& topo, const std::vector<DimRing>& order, int chip);
// PART laid out in ORDER's position order (layout() above is this with dim_order()).
Layout layout(const runtime::Transport& tp, const Partition& part, const std::vector<DimRing>& order);
// One dimension's ring as this chip runs it.
struct DimStep {
  runtime::Transport* group;  // the ring along this dimension through this chip
  int dim;                    // topology dimension
  size_t lo, stride, k;       // position range [lo, lo + k*stride) split into k blocks of STRIDE positions
  bool bidirectional;
};
struct Plan {
  std::vector<DimStep> steps;    // in reduce-scatter order
  std::vector<size_t> rank_at;   // position -> rank
};
// The per-dimension rings this chip takes part in for reduce-scatter ORDER (a permutation of dim_order()'s
// entries), with the position blocks they split. Collective over TP (sub-groups "torus.dim<d>").
Plan plan(runtime::Transport& tp, const std::vector<DimRing>& order);
// LAYOUT (indexed by rank) re-indexed by position.
Layout by_position(const Layout& layout, const Plan& pl);
// One dimension's reduce-scatter / all-gather pass over POS (position-ordered and packed), from READY.
sim::TimeNs rs_pass(const DimStep& s, void* base, const Layout& pos, DType t, ReduceOp op, sim::TimeNs ready,
                    size_t chunk_bytes, const std::string& name);
sim::TimeNs ag_pass(const DimStep& s, void* base, const Layout& pos, DType t, sim::TimeNs ready, size_t chunk_bytes,
                    const std::string& name);

sim::TimeNs reduce_scatter(runtime::Transport& tp, void* base, const Layout& layout, DType t, ReduceOp op,
                           sim::TimeNs ready, size_t chunk_bytes, const std::string& name);
sim::TimeNs all_gather(runtime::Transport& tp, void* base, const Layout& layout, DType t, sim::TimeNs ready,
                       size_t chunk_bytes, const std::string& name);

}  // namespace shardsim::collectives::torus

// Ring algorithms (building blocks of all_reduce, reduce_scatter, all_gather and the torus algorithm).
//
// Ranks form a ring in communicator order. A *lane* is one ring pass over a set of chunks (one chunk per rank,
// described by a Layout) in one direction: dir = +1 means rank r sends to r+1 and receives from r-1.
//   reduce-scatter: p-1 steps; at step s rank r sends chunk (r - dir(s+1)) mod p, receives chunk
//                   (r - dir(s+2)) mod p and reduces it into its copy. Afterwards chunk r on rank r is reduced.
//   all-gather:     p-1 steps; at step s rank r sends chunk (r - dir*s) mod p, receives chunk (r - dir(s+1)).
// (Patarasuk & Yuan, "Bandwidth optimal all-reduce algorithms for clusters of workstations", JPDC 2009.)
// All lanes advance together, one exchange per step, each with its own simulated clock, so:
//   - uni-directional ring: one lane per piece, dir +1. On a ring topology with bandwidth B and latency alpha
//       T_rs = T_ag = (p-1)(alpha + S/(pB)),   T_all_reduce = 2(p-1)(alpha + S/(pB))
//   - bidirectional ring: half of every chunk travels each way on its own link (needs r->r-1 links):
//       T_all_reduce = 2(p-1)(alpha + S/(2pB))
//   - pipelining (chunk_bytes > 0): every chunk is cut into m pieces, each its own lane. Pieces of one step
//     queue on the same port, and piece j of step s+1 leaves as soon as piece j of step s has arrived, so the
//     per-step latencies overlap with transfers: T ~ (p-1) S/(pB) + m-independent alpha terms (see MODEL.md).
// The reduction arithmetic is assumed fused into the data movement (as NCCL's kernels do) and not charged.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "collectives/types.h"
#include "runtime/transport.h"

namespace shardsim::collectives::ring {

// A directed Hamiltonian cycle over the P ranks of a group: rank r sends to at(r, 1) and receives from at(r, -1).
// Either a rank stride (r -> r + STRIDE; a cycle when gcd(STRIDE, p) = 1; +1 / -1 are the ring's two ways) or an
// explicit ring order (rail_ring.h: one channel of a rail-optimised network). With position q of rank r in the
// order, the passes below use chunk at(r, -k) where the stride form uses (r - k STRIDE) mod p: the same schedule.
struct Cycle {
  int stride = 1;                                 // used when ORDER is null
  std::shared_ptr<const std::vector<int>> order;  // ORDER[q]: the rank at position q (a permutation of 0..p-1)
  std::shared_ptr<const std::vector<int>> pos;    // its inverse: POS[r] = the position of rank r
  // The rank K positions after R (K < 0: before) on P ranks.
  int at(int r, long k, int p) const {
    if (!order) return static_cast<int>((((r + stride * k) % p) + p) % p);
    const long q = ((((*pos)[static_cast<size_t>(r)] + k) % p) + p) % p;
    return (*order)[static_cast<size_t>(q)];
  }
  // A stride of +-1: its steps are the shift pattern r -> r +- 1 (runtime::FlowPattern::shift).
  bool unit() const { return !order && (stride == 1 || stride == -1); }
  static Cycle from_order(std::vector<int> order);  // ORDER: a permutation of 0..p-1
};

struct Lane {
  Layout layout;      // chunk r of this lane, in elements relative to the buffer base
  Cycle ring;         // the cycle this lane's data travels
  sim::TimeNs t = 0;  // simulated time this lane's data is ready on this chip
};

// Lanes covering LAYOUT: 1 or 2 directions (bidirectional: +1 gets the first half of every chunk, -1 the
// second), each cut into pieces of at most CHUNK_BYTES (0 = one piece; at most 64 pieces per direction, so
// the pieces of very large buffers are larger). Lanes with no data are left out.
std::vector<Lane> make_lanes(const Layout& layout, size_t elem_size, bool bidirectional, size_t chunk_bytes,
                             sim::TimeNs ready);
// Lanes over the directions DIRS (each a rank stride: +1 / -1 the ring's two ways, +-s the ring r -> r + s, a
// Hamiltonian cycle when gcd(s, p) = 1): direction i gets the i-th of |DIRS| equal parts of every chunk, cut into
// pieces as above. make_lanes(bidirectional) is DIRS = {1} or {1, -1}. Passes over lanes with a stride other than
// +-1 declare no flow pattern: they are meant for groups where each such flow has a link of its own (multi_ring.h).
std::vector<Lane> make_lanes(const Layout& layout, size_t elem_size, const std::vector<int>& dirs, size_t chunk_bytes,
                             sim::TimeNs ready);
// Lanes over the cycles CYCLES (general ring orders, e.g. rail_ring.h's channels), split and cut as above. Passes
// over cycles that are not unit strides declare no flow pattern either.
std::vector<Lane> make_lanes(const Layout& layout, size_t elem_size, const std::vector<Cycle>& cycles,
                             size_t chunk_bytes, sim::TimeNs ready);
// The stride cycles of DIRS.
std::vector<Cycle> stride_cycles(const std::vector<int>& dirs);
// Whether the rank map IMAGE (rank r -> IMAGE[r], a permutation of 0..p-1) maps every directed cycle of CYCLES onto
// itself: at(IMAGE[r], 1) == IMAGE[at(r, 1)] for every rank and cycle, so every rank's program is the image of its
// preimage's (a folded run's replica shift: algorithms.cpp, choose). O(p x cycles).
bool maps_onto_itself(const std::vector<Cycle>& cycles, const std::vector<int>& image);

// Run the passes on BASE in place. Return the time the last lane finished (lanes' t are updated).
// SRC (optional, same layout as BASE): read this rank's contribution from SRC instead of BASE, so an
// out-of-place all_reduce needs no initial copy: step 0 sends from SRC and every reduction writes
// BASE[chunk] = SRC[chunk] op incoming (each chunk is received once per rank).
sim::TimeNs reduce_scatter(runtime::Transport& tp, void* base, std::vector<Lane>& lanes, DType t, ReduceOp op,
                           const std::string& name, const void* src = nullptr);
sim::TimeNs all_gather(runtime::Transport& tp, void* base, std::vector<Lane>& lanes, DType t, const std::string& name);

// Whether a bidirectional ring can run: every rank must have a distinct first link towards r+1 and r-1.
// Returns the reason it cannot (empty when it can).
std::string bidirectional_obstacle(const runtime::Transport& tp);

}  // namespace shardsim::collectives::ring

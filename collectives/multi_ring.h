// Multi-channel ring (NCCL's channels; the "k rings over disjoint link sets" of Patarasuk & Yuan's bandwidth-optimal
// ring, JPDC 2009, run on several edge-disjoint Hamiltonian cycles at once): on a group whose chips are directly
// linked to each other (a fully connected node such as an 8-GPU MI300X or HGX board's mesh of links), a ring in
// rank order uses 2 of each chip's p - 1 links. This algorithm runs one ring per stride s with gcd(s, p) = 1 and
// s < p/2, in both directions (rank r sends to r + s and to r - s): the circulant Hamiltonian cycles, which share
// no link. Every chunk is split equally over the 2k directed rings, and all of them advance together, one
// exchange per step (collectives/ring.h, lanes with stride +-s).
//   rings:  p = 8: strides 1, 3 -> 4 directed rings over 4 of 7 links per chip; p prime: all p - 1 links;
//           p = 3, 4, 6: stride 1 only (the bidirectional ring)
//   closed form (each directed ring on its own links, bandwidth B, latency alpha, k' = 2k directed rings):
//           T_all_reduce = 2(p-1)(alpha + S/(k' p B)),  reduce_scatter / all_gather half of it
// so busbw = k' B (4 B on 8 chips, against the bidirectional ring's 2 B).
// Applies where every chip's route to its ring neighbours r +- s is one link (obstacle() says which pair is not).
// `auto` considers it after bidir_ring (registry.cpp).
#pragma once

#include <string>
#include <vector>

#include "runtime/transport.h"

namespace shardsim::collectives::multi_ring {

// The rank strides of the directed rings on P ranks: +s, -s for every s < p/2 with gcd(s, p) = 1; {1} for p <= 2.
std::vector<int> directions(int p);
// Why the multi-ring cannot run on TP's group ("" when it can).
std::string obstacle(const runtime::Transport& tp);

}  // namespace shardsim::collectives::multi_ring

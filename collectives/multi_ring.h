// Multi-channel ring (NCCL's channels; the "k rings over disjoint link sets" of Patarasuk & Yuan's bandwidth-optimal
// ring, JPDC 2009, run on several edge-disjoint Hamiltonian cycles at once): on a group whose chips are directly
// linked to each other (a fully connected node such as an 8-GPU MI300X or HGX board's mesh of links), a ring in
// rank order uses 2 of each chip's p - 1 links. This algorithm runs Walecki's decomposition of the complete graph
// into edge-disjoint Hamiltonian cycles (Lucas 1892; Alspach, "The wonderful Walecki construction", 2008), each in
// both directions: every chunk is split equally over the directed rings, and all of them advance together, one
// exchange per step (collectives/ring.h, lanes over ring::Cycle orders).
//   cycles: p odd: (p - 1)/2 cycles, every link of every chip used; p even: p/2 - 1 cycles (the p/2 links of one
//           perfect matching left idle), so p - 2 of p - 1 links per chip; p = 8: 6 directed rings over 6 of 7 links
//           (the rank strides s coprime with p used before gave 4); p <= 3: the ring itself
//   construction: ranks 0..q-1 on a circle (q = p - 1 for even p, p - 1 for odd p too) plus rank p - 1 as the hub:
//           cycle k = hub, k, k+1, k-1, k+2, k-2, ... (the zigzag through all q circle ranks, mod q), hub;
//           the zigzag of k uses exactly the circle edges {a, b} with a + b = 2k or 2k + 1 (mod q), so the cycles
//           share no link; k = 0 .. floor(q/2) - 1
//   closed form (each directed ring on its own links, bandwidth B, latency alpha, k' directed rings):
//           T_all_reduce = 2(p-1)(alpha + S/(k' p B)),  reduce_scatter / all_gather half of it
// so busbw = k' B (6 B on 8 chips, against the bidirectional ring's 2 B).
// Applies where every chip's route to each of its ring neighbours is one link (obstacle() says which pair is not).
// `auto` considers it after bidir_ring (registry.cpp).
#pragma once

#include <string>
#include <vector>

#include "collectives/ring.h"
#include "runtime/transport.h"

namespace shardsim::collectives::multi_ring {

// The directed rings on P ranks (each Walecki cycle and its reverse; the one ring for p <= 3).
std::vector<ring::Cycle> cycles(int p);
// Why the multi-ring cannot run on TP's group ("" when it can).
std::string obstacle(const runtime::Transport& tp);

}  // namespace shardsim::collectives::multi_ring

// Symmetries of grid topologies: whether a map of chips onto chips keeps the simulated network, so that a program
// run on the images of some chips is the image of the program run on them (folded runs: docs/performance/fold.md;
// folded cost-model replays: collectives/cost/cost_model.cpp).
#pragma once

#include <span>
#include <string>

#include "topology/topology.h"

namespace shardsim::topology {

// Whether the chip map FROM[i] -> TO[i] (chip ids of TOPO; only the listed chips need be mapped) extends to an
// automorphism of TOPO whose routes are the images of the routes: route(s(a), s(b)) = s(route(a, b)) link by
// link, with the same bandwidths and latencies. Sufficient rule (grid topologies only): the map sends every
// coordinate x_d to f_d(x_d), one injective map per dimension independent of the other coordinates, each of a
// kind that keeps that dimension's links and routes: a translation along a ring (its routes depend on the
// coordinate difference only), any permutation of a fully connected or switch dimension (every pair is one hop,
// or up and down the line's switch), the identity along a line (its ends differ). Returns "" when it holds, else
// why not (one phrase). WHAT names the map in the reason ("the shift of dp"). O(|FROM| x dimensions).
std::string chip_map_obstacle(const Topology& topo, std::span<const int> from, std::span<const int> to,
                              const std::string& what);

}  // namespace shardsim::topology

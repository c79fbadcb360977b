// Rail-striped rings (NCCL's channels across a rail-optimised network; the "NIC striping" of a multi-node ring):
// on n nodes of g chips, where chip x of every node reaches chip x of the others on its own NIC and rail switch
// (configs/topologies/dgx_h100_2nodes_rails.yaml), one ring in node order crosses the nodes on a single rail in
// each direction and leaves the other g - 1 NICs of every node idle. This algorithm runs g rings at once, the data
// split equally over them, each crossing the nodes on other rails: ring c visits the chips of an even node in the
// order c, c+1, ..., c+g-1 (mod g) and those of an odd node in the order c-1, c-2, ..., c-g, so it leaves an even
// node from chip c-1 over rail c-1 and an odd node from chip c over rail c. Over the g rings every NIC sends one
// flow and receives one per step (rail x carries ring x+1 one way and ring x the other), and inside a node every
// chip sends g - 1 flows through its intra-node port.
//   needs: a grid topology with at least two dimensions, the group = all of its chips; the outermost dimension
//          (size n) joins the nodes, the inner ones form a node of g >= 2 chips, chip = node * g + index (rails:
//          the lines of the outermost dimension); an even n >= 2 (an odd one could not close the rings on rails)
//   closed form (the rail the bottleneck: B_nic per NIC and direction, alpha_nic per crossing, p = n g):
//          T_all_reduce ~ 2(p-1)(alpha + S/(g p B_nic)),  reduce_scatter / all_gather half of it,
//          so busbw ~ g B_nic against B_nic for one ring; the intra-node hops, g - 1 flows per port at B_node each
//          step, bound it instead when (g - 1)/B_node > 1/B_nic (exact time: the estimate replays the schedule).
// Reference: NCCL's ring channels (one channel per NIC pair, "NCCL_CROSS_NIC"); Patarasuk & Yuan, JPDC 2009.
#pragma once

#include <string>
#include <vector>

#include "collectives/ring.h"
#include "runtime/transport.h"
#include "topology/topology.h"

namespace shardsim::collectives::rail_ring {

// The g rings (ring::Cycle in rank order) on TP's group; call only when obstacle(tp) is empty.
std::vector<ring::Cycle> cycles(const runtime::Transport& tp);
// Why the rail rings cannot run on TP's group ("" when they can).
std::string obstacle(const runtime::Transport& tp);
// The same for a group given by its rank -> chip map on TOPO (before the run: the fold's period,
// apps/train_setup.cpp). The rings depend on the chips only: a shift of the chips maps them onto themselves or not
// whatever the ranks' order.
std::vector<ring::Cycle> cycles(const topology::Topology& topo, const std::vector<int>& rank_to_chip);
std::string obstacle(const topology::Topology& topo, const std::vector<int>& rank_to_chip);

}  // namespace shardsim::collectives::rail_ring

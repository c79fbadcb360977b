// Closed-form costs of one op. Pure functions, no state. Time in simulated ns.
//
// Compute (roofline, Williams, Waterman & Patterson, CACM 2009):
//     t = launch_overhead + max(flops / peak_flops(precision), bytes / hbm_bandwidth)
// Transfer over a route of links l_1..l_h, cut-through (the message is pipelined through the hops):
//     occupancy of the first link  = S / min_i B_i
//     arrival after injection start = sum_i alpha_i + S / min_i B_i
// Bandwidth B in GB/s = bytes per ns, so S / B is directly in ns.
#pragma once

#include <cstdint>
#include <vector>

#include "sim/device_spec.h"
#include "topology/topology.h"

namespace shardsim::sim {

double compute_time_ns(const DeviceSpec& dev, double flops, double bytes, Precision p);

struct TransferCost {
  double occupancy_ns = 0;  // how long the injection port is busy (S / bottleneck bandwidth)
  double latency_ns = 0;    // sum of per-hop latencies
  double total_ns() const { return occupancy_ns + latency_ns; }
};

TransferCost transfer_cost(const topology::Topology& topo, const std::vector<int>& route, double bytes);

}  // namespace shardsim::sim

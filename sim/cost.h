// Closed-form costs of one op. Pure functions, no state. Time in simulated ns.
//
// Compute (roofline, Williams, Waterman & Patterson, CACM 2009):
//     t = launch_overhead + max(flops / peak_flops(precision), bytes / hbm_bandwidth)
// where peak_flops(precision) is DeviceSpec::peak_tflops after the precision fallback (device_spec.h: an unset
// fp16 runs at the bf16 rate, fp8 at fp16's, int8 at fp8's, fp64 at fp32's).
// Transfer over a route of links l_1..l_h, cut-through (the message is pipelined through the hops):
//     occupancy of the first link  = S / min_i B_i
//     arrival after injection start = sum_i alpha_i + S / min_i B_i
// Bandwidth B in GB/s = bytes per ns, so S / B is directly in ns. The topology's message protocol (topology.h,
// Protocol) scales B by its efficiency and, for low-latency messages, the latencies by its factor, and charges its
// per-message overhead o once at the sender (arrival = o + sum_i alpha_i + S / min_i B_i); the default protocol
// changes nothing.
#pragma once

#include <cstdint>
#include <vector>

#include "sim/device_spec.h"
#include "topology/topology.h"

namespace shardsim::sim {

// A vector-class kernel (no shape) through the device's kernel model (sim/kernel_model.h): the roofline above
// with the peak model; with the shaped model the HBM term runs at the achievable bandwidth.
double compute_time_ns(const DeviceSpec& dev, double flops, double bytes, Precision p);

struct TransferCost {
  double occupancy_ns = 0;  // how long the link is busy (S / bottleneck bandwidth); the port: overhead + this
  double latency_ns = 0;    // sum of per-hop latencies
  double overhead_ns = 0;   // the protocol's per-message overhead, once at the sender (0 to self)
  double total_ns() const { return overhead_ns + latency_ns + occupancy_ns; }
};

TransferCost transfer_cost(const topology::Topology& topo, const std::vector<int>& route, double bytes);

}  // namespace shardsim::sim

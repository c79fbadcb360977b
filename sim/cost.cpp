#include "sim/cost.h"

#include <algorithm>
#include <limits>

namespace shardsim::sim {

double compute_time_ns(const DeviceSpec& dev, double flops, double bytes, Precision p) {
  const double t_flops = flops / dev.peak_flops_per_ns(p);
  const double t_bytes = bytes / dev.hbm_gbps;  // GB/s == bytes per ns
  return dev.launch_overhead_ns + std::max(t_flops, t_bytes);
}

TransferCost transfer_cost(const topology::Topology& topo, const std::vector<int>& route, double bytes) {
  TransferCost c;
  if (route.empty()) return c;  // to self: free
  double bottleneck = std::numeric_limits<double>::infinity();
  for (int id : route) {
    const auto& l = topo.link(id);
    c.latency_ns += l.latency_ns;
    bottleneck = std::min(bottleneck, l.bandwidth_gbps);
  }
  const auto& proto = topo.protocol();
  const bool ll = proto.low_latency(bytes);
  c.occupancy_ns = bytes / (bottleneck * (ll ? proto.low_latency_efficiency : proto.efficiency));
  if (ll) c.latency_ns *= proto.low_latency_latency_factor;
  return c;
}

}  // namespace shardsim::sim

#include "sim/cost.h"

#include "sim/kernel_model.h"

#include <algorithm>
#include <limits>

namespace shardsim::sim {

double compute_time_ns(const DeviceSpec& dev, double flops, double bytes, Precision p) {
  return kernel_time_ns(dev, flops, bytes, p, KernelShape{});
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
  c.occupancy_ns = bytes / (bottleneck * topo.protocol().efficiency_for(bytes));
  c.latency_ns *= topo.protocol().latency_factor_for(bytes);
  c.overhead_ns = topo.protocol().message_overhead_ns;
  return c;
}

}  // namespace shardsim::sim

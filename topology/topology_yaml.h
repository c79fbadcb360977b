// Building a Topology from the `topology:` section of a config.
//
//   topology:
//     kind: ring            # ring | torus
//     chips: 8              # ring only
//     dims: [2, 4]          # torus only (2-D or 3-D; any N-d works)
//     bidirectional: true   # ring only, default true
//     bandwidth_gbps: 100   # per link per direction, GB = 1e9 B; or a list, one per torus dimension
//     latency_ns: 500       # per hop; or a list, one per torus dimension
//
// Errors: ConfigError "FILE:LINE: topology.KEY: ..." (exit code 2).
#pragma once

#include "common/config.h"
#include "topology/topology.h"

namespace shardsim::topology {

Topology load_topology(const ConfigNode& node);

// ASTRA-sim's analytical network.yml, so users can bring their configs unchanged:
//   topology: [ Ring, Ring ]     # one entry per dimension (dimension 0 innermost: NPU id = x0 + k0 x1 + ...)
//   npus_count: [ 4, 4 ]
//   bandwidth: [ 50.0, 50.0 ]    # GB/s per link and direction, ASTRA-sim's GB = 2^30 bytes (converted here)
//   latency: [ 500.0, 500.0 ]    # ns per link
// A stack of Rings becomes a torus (ours lists dimensions outermost first, so the order is reversed; chip ids
// are the same). FullyConnected and Switch dimensions are not modelled yet: ConfigError naming the entry.
bool is_astra_network(const ConfigNode& root);
Topology load_astra_network(const ConfigNode& root);

}  // namespace shardsim::topology

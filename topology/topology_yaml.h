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

}  // namespace shardsim::topology

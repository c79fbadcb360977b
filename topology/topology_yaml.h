// Building a Topology from the `topology:` section of a config.
//
//   topology:
//     kind: ring            # ring | torus | mesh | fully_connected | switch | stacked | graph
//     chips: 8              # ring, fully_connected, switch, graph (torus/mesh: optional, must equal the product)
//     dims: [2, 4]          # torus, mesh: any number of dimensions, outermost first
//     bidirectional: true   # ring only, default true
//     bandwidth_gbps: 100   # per link per direction, GB = 1e9 B, 0.001..1e6; torus/mesh: or a list, one per dim
//     latency_ns: 500       # per hop, 0..1e9 (default 0); torus/mesh: or a list, one per dimension
//                           # (every bandwidth/latency in any topology file, ASTRA-sim's too, must lie in these
//                           #  ranges: ConfigError naming FILE:LINE, the field and the range)
//     placement: [0, 1, ...]   # optional: rank r runs on chip placement[r] (a permutation; default identity)
//     protocol:             # optional, any kind: how messages use the line rate (topology.h, Protocol)
//       efficiency: 0.82                  # bandwidth protocol: fraction of the line rate, (0, 1]; default 1
//       low_latency_max_bytes: 65536      # messages up to this size use the low-latency protocol; default 0 (none)
//       low_latency_efficiency: 0.5       # its fraction of the line rate, (0, 1]; default 1
//       low_latency_latency_factor: 0.3   # its per-hop latency as a multiple of the link's, >= 0; default 1
//       message_overhead_ns: 2000         # per message at the sender, once (not per hop), 0..1e9; default 0
//       call_overhead_ns: 6000            # per collective call, once on every chip (not send/recv, barrier),
//                                         # 0..1e9; default 0
//
//   kind: switch            # optional keys of a switch (kind switch, or a switch entry of a stack's dims):
//     reduction: true                 # the switch reduces in the network (NVLS / SHARP; collectives/in_switch.h)
//     reduction_bandwidth_gbps: 274   # its reduction rate, GB/s of result (default: the link bandwidth)
//     reduction_latency_ns: 500       # added once per piece it reduces (default 0)
//
//   kind: stacked           # dimensions of any kind, outermost first, e.g. 8 nodes on a switch x a ring of 4
//     dims:
//       - {kind: switch, size: 8, bandwidth_gbps: 50, latency_ns: 1000}
//       - {kind: ring, size: 4, bandwidth_gbps: 200, latency_ns: 300, bidirectional: true}
//     (dimension kinds: ring | line | fully_connected | switch)
//
//   kind: graph             # an explicit edge list
//     chips: 4
//     switches: 1           # optional; switch i is named "s<i>" in links
//     bandwidth_gbps: 100   # default for links that give none
//     latency_ns: 500
//     links:
//       - [0, 1]                                            # full duplex, default bandwidth/latency
//       - {from: 2, to: s0, bandwidth_gbps: 25, latency_ns: 800, bidirectional: false}
//
// Errors: ConfigError "FILE:LINE: topology.KEY: ..." (exit code 2): unknown kind or key, a non-finite,
// zero or negative bandwidth, negative or non-finite latency, dims whose product is not `chips`, a link to a
// missing chip or switch, a disconnected graph, a placement that is not a permutation.
#pragma once

#include "common/config.h"
#include "topology/topology.h"

namespace shardsim::topology {

Topology load_topology(const ConfigNode& node);
// The keys each kind of topology section accepts (docs/CONFIG.md documents each; tests/unit/config_doc_test.cpp
// checks): ring / fully_connected / switch, torus / mesh, stacked and its dims[] entries, graph and its links[]
// entries, protocol:, and an ASTRA-sim network.yml.
inline constexpr std::string_view kTopologySimpleKeys[] = {"kind",       "chips",     "bidirectional", "bandwidth_gbps",
                                                           "latency_ns", "placement", "protocol"};
inline constexpr std::string_view kTopologySwitchKeys[] = {
    "kind",      "chips",    "bandwidth_gbps", "latency_ns", "placement", "protocol", "reduction",
    "reduction_bandwidth_gbps", "reduction_latency_ns"};
inline constexpr std::string_view kTopologyGridKeys[] = {"kind",       "chips",     "dims",    "bandwidth_gbps",
                                                         "latency_ns", "placement", "protocol"};
inline constexpr std::string_view kTopologyStackedKeys[] = {"kind", "chips", "dims", "placement", "protocol"};
inline constexpr std::string_view kTopologyDimKeys[] = {"kind",          "size",      "bandwidth_gbps",
                                                        "latency_ns",    "bidirectional", "reduction",
                                                        "reduction_bandwidth_gbps", "reduction_latency_ns"};
inline constexpr std::string_view kTopologyGraphKeys[] = {"kind",       "chips", "switches",  "bandwidth_gbps",
                                                          "latency_ns", "links", "placement", "protocol"};
inline constexpr std::string_view kTopologyLinkKeys[] = {"from", "to", "bandwidth_gbps", "latency_ns",
                                                         "bidirectional"};
inline constexpr std::string_view kTopologyProtocolKeys[] = {"efficiency", "low_latency_max_bytes",
                                                             "low_latency_efficiency", "low_latency_latency_factor",
                                                             "message_overhead_ns", "call_overhead_ns"};
inline constexpr std::string_view kAstraNetworkKeys[] = {"topology", "npus_count", "bandwidth", "latency"};

// The one rule for a topology *document* (a whole YAML file or text), used by run, bench, validate, calibrate,
// sweep and topo describe alike: an ASTRA-sim network.yml (below), a map with a `topology:` section (a workload
// config or a topology file), or a bare topology map (`kind: ...`). ConfigError naming FILE:LINE otherwise.
Topology load_topology_document(const ConfigNode& root);
// load_topology_document of the file at PATH; ConfigError when PATH is a directory or cannot be read.
Topology load_topology_file(const std::string& path);

// ASTRA-sim's analytical network.yml, so users can bring their configs unchanged:
//   topology: [ Ring, Switch ]   # one entry per dimension, dimension 0 innermost: NPU id = x0 + k0 x1 + ...
//   npus_count: [ 4, 8 ]         # Ring | FullyConnected | Switch
//   bandwidth: [ 50.0, 25.0 ]    # GB/s per link and direction, ASTRA-sim's GB = 2^30 bytes (converted here)
//   latency: [ 500.0, 700.0 ]    # ns per link
// ours lists dimensions outermost first, so the order is reversed; chip ids are the same as ASTRA-sim's NPU ids.
// A stack of Rings becomes a torus. A Switch dimension crosses two links (chip -> switch -> chip), each with
// the given bandwidth and latency, as ASTRA-sim's Switch does.
bool is_astra_network(const ConfigNode& root);
Topology load_astra_network(const ConfigNode& root);

}  // namespace shardsim::topology

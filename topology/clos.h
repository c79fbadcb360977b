// A multi-tier Clos (fat-tree) cluster network as a topology kind, with its closed-form metrics.
//
// Three tiers, as in Meta's Llama 3 cluster (Llama 3 paper, arXiv 2407.21783, section 3.3.1: 16 GPUs per rack
// (ToR) switch, 192 racks = 3,072 GPUs per pod with full bisection, 8 pods joined by aggregation switches
// oversubscribed 1:7, 400 Gb/s per GPU):
//   leaf (rack / ToR) switch   chips_per_leaf chips, each with its own link (the chip's NIC) to the leaf;
//   pod (spine) switch         leaves_per_pod leaves, each with one up-link;
//   core (aggregation) switch  pods pods, each with one up-link (only when pods > 1).
// A tier's switches are modelled as one logical switch per group, and the parallel up-links of a group (ECMP over
// many spine / core switches in a real fabric) as one link of their summed bandwidth (a fluid model of perfectly
// balanced ECMP):
//   chip <-> leaf     bandwidth_gbps (B)
//   leaf <-> pod      C x B / o_leaf                    (C chips per leaf, o_leaf = leaf_oversubscription)
//   pod  <-> core     L x C x B / (o_leaf x o_pod)      (L leaves per pod, o_pod = pod_oversubscription)
// every link full duplex with latency_ns per hop. Oversubscription is a tier's down : up bandwidth, >= 1 (1: full
// bisection). One flow alone gets min(B, up-links) (a single NIC flow is never slowed by a fat up-link); the flows
// of one collective step that share an up-link split it (sim/timeline.h, "Crossing flows"), which is where the
// oversubscription shows: k flows through a pod's up-link get (L C B / (o_leaf o_pod)) / k each.
//
// Chips are numbered pod-major: chip c sits on leaf c / C, in pod c / (C L). The result is a graph topology
// (Topology::graph: leaf switch i = switch i, pod switch p = switch P L + p, the core = switch P L + P); routes are
// unique (a tree): up to the lowest common switch, then down. Graph routes are tabled per node pair, so a Clos is
// limited to kMaxClosChips chips.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "common/config.h"
#include "topology/topology.h"

namespace shardsim::topology {

inline constexpr int kMaxClosChips = 4096;

struct ClosSpec {
  int chips_per_leaf = 1;
  int leaves_per_pod = 1;
  int pods = 1;
  LinkSpec link;                      // each chip's link to its leaf; latency_ns is every hop's
  double leaf_oversubscription = 1;   // a leaf's down : up bandwidth, >= 1
  double pod_oversubscription = 1;    // a pod's down : up bandwidth, >= 1
  int chips() const { return chips_per_leaf * leaves_per_pod * pods; }
  double leaf_uplink_gbps() const { return chips_per_leaf * link.bandwidth_gbps / leaf_oversubscription; }
  double pod_uplink_gbps() const { return leaves_per_pod * leaf_uplink_gbps() / pod_oversubscription; }
  bool has_pod_switches() const { return leaves_per_pod > 1 || pods > 1; }
  bool has_core() const { return pods > 1; }
  // std::invalid_argument naming the field when a count is < 1, the chips exceed kMaxClosChips, a link is outside
  // its range (topology.h) or an oversubscription is not a finite number >= 1.
  void check() const;
  // "clos 32 chips: 2 pods x 2 leaves x 8 chips, 50 GB/s per chip, 1 us per hop, leaf 1:1, pod 1:7".
  std::string describe() const;
};

// The topology of SPEC (a graph, see above); std::invalid_argument as ClosSpec::check.
Topology clos(const ClosSpec& spec);

// Closed forms (each equals what the graph's own tables give: tests/unit/topology_kinds_test.cpp).
struct ClosMetrics {
  int diameter_hops = 0;   // 6 across pods, 4 across leaves of a pod, 2 on one leaf, 0 for one chip
  double average_hops = 0; // (2 (C-1) + 4 C (L-1) + 6 C L (P-1)) / (N-1) over ordered pairs of distinct chips
  // Per direction, GB/s: the top tier cut into halves, (P/2) x pod up-link (P even), else (L/2) x leaf up-link
  // (one pod, L even), else (C/2) x B (one leaf, C even): with every oversubscription >= 1 no lower cut is
  // cheaper. nullopt when the top tier's count is odd (no balanced cut along it).
  std::optional<double> bisection_gbps;
  std::string bisection_method;
};
ClosMetrics clos_metrics(const ClosSpec& spec);

// `kind: clos` keys (docs/CONFIG.md, section `topology`): the counts, bandwidth_gbps, latency_ns, the two
// oversubscriptions, placement and protocol (applied by load_topology).
inline constexpr std::string_view kTopologyClosKeys[] = {
    "kind",      "chips",    "chips_per_leaf",       "leaves_per_pod",       "pods", "bandwidth_gbps",
    "latency_ns", "placement", "leaf_oversubscription", "pod_oversubscription", "protocol"};
// The spec of a `kind: clos` topology section NODE; ConfigError "FILE:LINE: topology.KEY: ..." for unknown keys,
// bad counts or values, and a `chips:` that differs from the product.
ClosSpec load_clos_spec(const ConfigNode& node);
// The Clos spec of a topology document (load_topology_document's forms) when its topology is `kind: clos`.
std::optional<ClosSpec> clos_spec_of_document(const ConfigNode& root);

}  // namespace shardsim::topology

#include "topology/clos.h"

#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <tuple>
#include <vector>

#include "common/error.h"

namespace shardsim::topology {

namespace {

std::string num(double v) {
  char b[48];
  std::snprintf(b, sizeof b, "%.6g", v);
  return b;
}

std::string ratio(double o) { return "1:" + num(o); }

}  // namespace

void ClosSpec::check() const {
  for (const auto& [v, name] : {std::pair{chips_per_leaf, "chips_per_leaf"}, std::pair{leaves_per_pod, "leaves_per_pod"},
                                std::pair{pods, "pods"}})
    if (v < 1) throw std::invalid_argument(std::string(name) + ": must be >= 1 (got " + std::to_string(v) + ")");
  const long long n = static_cast<long long>(chips_per_leaf) * leaves_per_pod * pods;
  if (n > kMaxClosChips)
    throw std::invalid_argument("chips: " + std::to_string(n) + " chips, at most " + std::to_string(kMaxClosChips) +
                                " in a clos (its routes are tabled per pair of nodes)");
  if (!(link.bandwidth_gbps >= kMinBandwidthGbps && link.bandwidth_gbps <= kMaxBandwidthGbps))
    throw std::invalid_argument("bandwidth_gbps: must be " + bandwidth_range_text() + " (got " +
                                num(link.bandwidth_gbps) + ")");
  if (!(link.latency_ns >= 0 && link.latency_ns <= kMaxLatencyNs))
    throw std::invalid_argument("latency_ns: must be " + latency_range_text() + " (got " + num(link.latency_ns) + ")");
  for (const auto& [o, name] : {std::pair{leaf_oversubscription, "leaf_oversubscription"},
                                std::pair{pod_oversubscription, "pod_oversubscription"}})
    if (!(std::isfinite(o) && o >= 1))
      throw std::invalid_argument(std::string(name) + ": must be a finite number >= 1 (down : up bandwidth; 1 = full "
                                  "bisection) (got " + num(o) + ")");
  // Named by the key that sets the up-link's rate, so the message points at a line of the file.
  for (const auto& [up, name, rule] : {std::tuple{leaf_uplink_gbps(), "leaf_oversubscription",
                                                  "chips_per_leaf x bandwidth_gbps / leaf_oversubscription"},
                                       std::tuple{pod_uplink_gbps(), "pod_oversubscription",
                                                  "leaves_per_pod x the leaf up-link / pod_oversubscription"}})
    if (!(up >= kMinBandwidthGbps && up <= kMaxBandwidthGbps))
      throw std::invalid_argument(std::string(name) + ": the up-link (" + rule + ") would carry " + num(up) +
                                  " GB/s, outside " + bandwidth_range_text());
}

std::string ClosSpec::describe() const {
  return "clos " + std::to_string(chips()) + " chips: " + std::to_string(pods) + " pod" + (pods == 1 ? "" : "s") +
         " x " + std::to_string(leaves_per_pod) + " lea" + (leaves_per_pod == 1 ? "f" : "ves") + " x " +
         std::to_string(chips_per_leaf) + " chips, " + num(link.bandwidth_gbps) + " GB/s per chip, " +
         num(link.latency_ns) + " ns per hop, leaf " + ratio(leaf_oversubscription) + " (up-link " +
         num(leaf_uplink_gbps()) + " GB/s), pod " + ratio(pod_oversubscription) + " (up-link " +
         num(pod_uplink_gbps()) + " GB/s)";
}

Topology clos(const ClosSpec& s) {
  s.check();
  const int n = s.chips(), leaves = s.leaves_per_pod * s.pods;
  const int pod_base = leaves;                      // switch index of pod 0's switch
  const int core = pod_base + s.pods;               // switch index of the core
  const int switches = leaves + (s.has_pod_switches() ? s.pods : 0) + (s.has_core() ? 1 : 0);
  const double lat = s.link.latency_ns;
  std::vector<Edge> edges;
  edges.reserve(static_cast<size_t>(n + leaves + s.pods));
  for (int c = 0; c < n; ++c) edges.push_back(Edge{c, n + c / s.chips_per_leaf, s.link, true});
  if (s.has_pod_switches())
    for (int l = 0; l < leaves; ++l)
      edges.push_back(Edge{n + l, n + pod_base + l / s.leaves_per_pod, LinkSpec{s.leaf_uplink_gbps(), lat}, true});
  if (s.has_core())
    for (int p = 0; p < s.pods; ++p) edges.push_back(Edge{n + pod_base + p, n + core, LinkSpec{s.pod_uplink_gbps(), lat}, true});
  return Topology::graph(n, switches, edges);
}

ClosMetrics clos_metrics(const ClosSpec& s) {
  ClosMetrics m;
  const double c = s.chips_per_leaf, l = s.leaves_per_pod, p = s.pods, n = s.chips();
  m.diameter_hops = s.pods > 1 ? 6 : s.leaves_per_pod > 1 ? 4 : s.chips_per_leaf > 1 ? 2 : 0;
  m.average_hops = n > 1 ? (2 * (c - 1) + 4 * c * (l - 1) + 6 * c * l * (p - 1)) / (n - 1) : 0;
  if (s.chips() < 2) {
    m.bisection_method = "one chip";
  } else if (s.pods > 1) {
    if (s.pods % 2 == 0) {
      m.bisection_gbps = p / 2 * s.pod_uplink_gbps();
      m.bisection_method = "closed form: half the pods' up-links to the core";
    } else {
      m.bisection_method = "not in closed form: an odd number of pods";
    }
  } else if (s.leaves_per_pod > 1) {
    if (s.leaves_per_pod % 2 == 0) {
      m.bisection_gbps = l / 2 * s.leaf_uplink_gbps();
      m.bisection_method = "closed form: half the leaves' up-links to the pod switch";
    } else {
      m.bisection_method = "not in closed form: an odd number of leaves in the one pod";
    }
  } else if (s.chips_per_leaf % 2 == 0) {
    m.bisection_gbps = c / 2 * s.link.bandwidth_gbps;
    m.bisection_method = "closed form: half the chips' links to the one leaf";
  } else {
    m.bisection_method = "not in closed form: an odd number of chips on the one leaf";
  }
  return m;
}

ClosSpec load_clos_spec(const ConfigNode& node) {
  node.expect_keys(kTopologyClosKeys);
  ClosSpec s;
  auto count = [&](std::string_view key) {
    const int64_t v = node.get_positive_int(key);
    if (v > kMaxClosChips) node.child(key).fail(node.child(key).path() + ": at most " + std::to_string(kMaxClosChips));
    return static_cast<int>(v);
  };
  s.chips_per_leaf = count("chips_per_leaf");
  s.leaves_per_pod = node.has("leaves_per_pod") ? count("leaves_per_pod") : 1;
  s.pods = node.has("pods") ? count("pods") : 1;
  s.link.bandwidth_gbps = node.get_double("bandwidth_gbps");
  s.link.latency_ns = node.get_double("latency_ns", 0.0);
  s.leaf_oversubscription = node.get_double("leaf_oversubscription", 1.0);
  s.pod_oversubscription = node.get_double("pod_oversubscription", 1.0);
  try {
    s.check();
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    const std::string key = what.substr(0, what.find(':'));
    (node.has(key) ? node.child(key) : node).fail(node.path() + "." + what);
  }
  if (node.has("chips") && node.get_int("chips") != s.chips())
    node.child("chips").fail(node.path() + ".chips: " + std::to_string(node.get_int("chips")) +
                             " chips, but pods x leaves_per_pod x chips_per_leaf make " + std::to_string(s.chips()));
  return s;
}

std::optional<ClosSpec> clos_spec_of_document(const ConfigNode& root) {
  if (!root.is_map()) return std::nullopt;
  const ConfigNode t = root.has("topology") && root.child("topology").is_map() ? root.child("topology") : root;
  if (!t.has("kind") || !t.child("kind").yaml().IsScalar() || t.child("kind").yaml().Scalar() != "clos")
    return std::nullopt;
  return load_clos_spec(t);
}

}  // namespace shardsim::topology

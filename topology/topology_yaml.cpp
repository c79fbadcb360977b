#include "topology/topology_yaml.h"

#include <stdexcept>

#include "common/error.h"

namespace shardsim::topology {

namespace {

std::vector<double> numbers(const ConfigNode& node, std::string_view key, size_t ndims, bool positive) {
  std::vector<double> out;
  auto c = node.child(key);
  if (c.yaml().IsSequence()) {
    if (c.yaml().size() != ndims)
      c.fail(c.path() + ": give one value per dimension (" + std::to_string(ndims) + "), got " +
             std::to_string(c.yaml().size()));
    for (size_t i = 0; i < c.yaml().size(); ++i) {
      ConfigNode item(c.yaml()[i], c.file(), c.path() + "[" + std::to_string(i) + "]");
      double v = 0;
      try {
        v = c.yaml()[i].as<double>();
      } catch (const YAML::Exception&) {
        item.fail(item.path() + ": expected a number");
      }
      if (positive ? !(v > 0) : v < 0)
        item.fail(item.path() + (positive ? ": must be > 0" : ": must be >= 0") + " (got " + c.yaml()[i].Scalar() + ")");
      out.push_back(v);
    }
  } else {
    out.push_back(positive ? node.get_positive_double(key) : node.get_nonnegative_double(key, 0.0));
  }
  return out;
}

}  // namespace

Topology load_topology(const ConfigNode& node) {
  node.expect_keys({"kind", "chips", "dims", "bidirectional", "bandwidth_gbps", "latency_ns"});
  const std::string kind = node.get_string("kind");
  try {
    if (kind == "ring") {
      if (node.has("dims")) node.child("dims").fail("topology.dims: not used by kind 'ring' (use chips)");
      int chips = static_cast<int>(node.get_positive_int("chips"));
      auto bw = numbers(node, "bandwidth_gbps", 1, true);
      auto lat = node.has("latency_ns") ? numbers(node, "latency_ns", 1, false) : std::vector<double>{0.0};
      return Topology::ring(chips, LinkSpec{bw[0], lat[0]}, node.get_bool("bidirectional", true));
    }
    if (kind == "torus") {
      if (node.has("bidirectional")) node.child("bidirectional").fail("topology.bidirectional: only for kind 'ring'");
      auto dims64 = node.get_int_list("dims");
      if (dims64.empty()) node.child("dims").fail("topology.dims: needs at least one dimension");
      std::vector<int> dims;
      int64_t product = 1;
      for (auto d : dims64) {
        if (d < 1) node.child("dims").fail("topology.dims: every dimension must be >= 1");
        dims.push_back(static_cast<int>(d));
        product *= d;
      }
      if (node.has("chips") && node.get_int("chips") != product)
        node.child("chips").fail("topology.chips: " + std::to_string(node.get_int("chips")) +
                                 " does not equal the product of dims (" + std::to_string(product) + ")");
      auto bw = numbers(node, "bandwidth_gbps", dims.size(), true);
      auto lat = node.has("latency_ns") ? numbers(node, "latency_ns", dims.size(), false)
                                        : std::vector<double>{0.0};
      std::vector<LinkSpec> specs;
      const size_t n = std::max(bw.size(), lat.size());
      for (size_t i = 0; i < n; ++i)
        specs.push_back(LinkSpec{bw[bw.size() == 1 ? 0 : i], lat[lat.size() == 1 ? 0 : i]});
      return Topology::torus(dims, specs);
    }
  } catch (const std::invalid_argument& e) {
    node.fail(std::string("topology: ") + e.what());
  }
  node.child("kind").fail("topology.kind: unknown kind '" + kind + "' (known: ring, torus)");
}

bool is_astra_network(const ConfigNode& root) {
  return root.yaml().IsMap() && root.has("npus_count") && root.has("topology") && root.yaml()["topology"].IsSequence();
}

Topology load_astra_network(const ConfigNode& root) {
  root.expect_keys({"topology", "npus_count", "bandwidth", "latency"});
  const auto kinds = root.child("topology");
  const size_t n = kinds.yaml().size();
  if (n == 0) kinds.fail("topology: needs at least one dimension");
  const auto npus = root.get_int_list("npus_count");
  if (npus.size() != n)
    root.child("npus_count").fail("npus_count: " + std::to_string(npus.size()) + " entries for " + std::to_string(n) +
                                  " topology dimensions");
  const auto bw = numbers(root, "bandwidth", n, true);
  const auto lat = numbers(root, "latency", n, false);
  constexpr double kAstraGB = 1073741824.0 / 1e9;  // ASTRA-sim's GB/s in shardsim's (1e9 B) GB/s
  std::vector<int> dims(n);
  std::vector<LinkSpec> specs(n);
  for (size_t i = 0; i < n; ++i) {
    ConfigNode item(kinds.yaml()[i], kinds.file(), "topology[" + std::to_string(i) + "]");
    const std::string kind = kinds.yaml()[i].IsScalar() ? kinds.yaml()[i].Scalar() : "";
    if (kind == "FullyConnected" || kind == "Switch")
      item.fail("topology[" + std::to_string(i) + "]: ASTRA-sim '" + kind +
                "' dimensions are not modelled yet (only Ring; stacks of Rings become a torus)");
    if (kind != "Ring") item.fail("topology[" + std::to_string(i) + "]: unknown ASTRA-sim topology '" + kind +
                                  "' (known: Ring, FullyConnected, Switch)");
    if (npus[i] < 1) root.child("npus_count").fail("npus_count: every entry must be >= 1");
    const size_t d = n - 1 - i;  // ASTRA-sim's dimension 0 is our last (fastest-varying) one
    dims[d] = static_cast<int>(npus[i]);
    specs[d] = LinkSpec{bw[bw.size() == 1 ? 0 : i] * kAstraGB, lat[lat.size() == 1 ? 0 : i]};
  }
  try {
    return n == 1 ? Topology::ring(dims[0], specs[0], true) : Topology::torus(dims, specs);
  } catch (const std::invalid_argument& e) {
    root.fail(std::string("ASTRA-sim network: ") + e.what());
  }
}

}  // namespace shardsim::topology

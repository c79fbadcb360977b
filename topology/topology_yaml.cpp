#include "topology/topology_yaml.h"

#include <filesystem>

#include <cmath>
#include <stdexcept>

#include "common/error.h"
#include "common/number.h"
#include "topology/clos.h"

namespace shardsim::topology {

namespace {

// bandwidth: kMinBandwidthGbps..kMaxBandwidthGbps; latency: 0..kMaxLatencyNs (topology.h).
enum class Range { bandwidth, latency };

// One finite number at NODE (named PATH in errors) within RANGE.
double number(const ConfigNode& node, Range range) {
  double v = 0;
  if (!node.yaml().IsScalar()) node.fail(node.path() + ": expected a number");
  // Decimal text only (common/number.h): yaml-cpp took '0x10', '+2' and a blank-padded quoted value. YAML's
  // .nan/.inf read as NaN, for the range check below to name them.
  const std::string& text = node.yaml().Scalar();
  if (const auto d = decimal_double(text)) v = *d;
  else if (yaml_nonfinite(text)) v = std::nan("");
  else node.fail(node.path() + ": expected a number, got '" + text + "'");
  const bool ok = range == Range::bandwidth ? v >= kMinBandwidthGbps && v <= kMaxBandwidthGbps
                                            : v >= 0 && v <= kMaxLatencyNs;  // false for NaN
  if (!ok)
    node.fail(node.path() + ": must be " + (range == Range::bandwidth ? bandwidth_range_text() : latency_range_text()) +
              " (got " + node.yaml().Scalar() + ")");
  return v;
}

// KEY as one number or a list of NDIMS numbers. Missing: {fallback} when given, else an error.
std::vector<double> numbers(const ConfigNode& node, std::string_view key, size_t ndims, Range range,
                            std::optional<double> fallback = std::nullopt) {
  if (!node.has(key)) {
    if (fallback) return {*fallback};
    node.fail(node.path() + (node.path().empty() ? "" : ".") + std::string(key) + ": required");
  }
  auto c = node.child(key);
  std::vector<double> out;
  if (c.yaml().IsSequence()) {
    if (c.yaml().size() != ndims)
      c.fail(c.path() + ": give one value per dimension (" + std::to_string(ndims) + "), got " +
             std::to_string(c.yaml().size()));
    for (size_t i = 0; i < c.yaml().size(); ++i)
      out.push_back(number(ConfigNode(c.yaml()[i], c.file(), c.path() + "[" + std::to_string(i) + "]"), range));
  } else {
    out.push_back(number(c, range));
  }
  return out;
}

std::vector<LinkSpec> link_specs(const ConfigNode& node, size_t ndims) {
  const auto bw = numbers(node, "bandwidth_gbps", ndims, Range::bandwidth);
  const auto lat = numbers(node, "latency_ns", ndims, Range::latency, 0.0);
  std::vector<LinkSpec> specs;
  const size_t n = std::max(bw.size(), lat.size());
  for (size_t i = 0; i < n; ++i) specs.push_back(LinkSpec{bw[bw.size() == 1 ? 0 : i], lat[lat.size() == 1 ? 0 : i]});
  return specs;
}

int positive_int(const ConfigNode& node, std::string_view key) {
  const int64_t v = node.get_positive_int(key);
  if (v > (int64_t{1} << 24)) node.child(key).fail(node.child(key).path() + ": at most 2^24");
  return static_cast<int>(v);
}

std::vector<int> dims_of(const ConfigNode& node) {
  // Each dimension in [1, 2^24] on its own, so the running product (<= 2^24 before each step) cannot wrap.
  const auto dims64 = node.get_int_list_in("dims", 1, int64_t{1} << 24);
  std::vector<int> dims;
  int64_t product = 1;
  for (auto d : dims64) {
    product *= d;
    if (product > (int64_t{1} << 24)) node.child("dims").fail(node.child("dims").path() + ": more than 2^24 chips");
    dims.push_back(static_cast<int>(d));
  }
  if (node.has("chips") && node.get_int("chips") != product) {
    std::string shape;
    for (size_t i = 0; i < dims.size(); ++i) shape += std::string(i ? "x" : "") + std::to_string(dims[i]);
    node.child("chips").fail(node.child("chips").path() + ": " + std::to_string(node.get_int("chips")) +
                             " chips, but dims " + shape + " make " + std::to_string(product));
  }
  return dims;
}

DimKind dim_kind(const ConfigNode& node) {
  const std::string k = node.get_string("kind");
  if (k == "ring") return DimKind::ring;
  if (k == "line" || k == "mesh") return DimKind::line;
  if (k == "fully_connected" || k == "full") return DimKind::fully_connected;
  if (k == "switch") return DimKind::switch_;
  node.child("kind").fail(node.child("kind").path() + ": unknown dimension kind '" + k +
                          "' (known: ring, line, fully_connected, switch)");
}

// A graph node: a chip id (integer) or "s<i>" for switch i.
int graph_node(const ConfigNode& node, int chips, int switches) {
  if (!node.yaml().IsScalar()) node.fail(node.path() + ": expected a chip id or s<switch>");
  const std::string s = node.yaml().Scalar();
  try {
    size_t pos = 0;
    const bool sw = !s.empty() && s[0] == 's';
    const int v = std::stoi(sw ? s.substr(1) : s, &pos);
    if (pos != s.size() - (sw ? 1 : 0) || v < 0) throw std::invalid_argument("");
    if (sw && v >= switches)
      node.fail(node.path() + ": switch s" + std::to_string(v) + " does not exist (" + std::to_string(switches) +
                " switches)");
    if (!sw && v >= chips)
      node.fail(node.path() + ": chip " + std::to_string(v) + " does not exist (chips 0.." + std::to_string(chips - 1) +
                ")");
    return sw ? chips + v : v;
  } catch (const std::logic_error&) {
    node.fail(node.path() + ": '" + s + "' is not a chip id or s<switch>");
  }
}

Topology load_graph(const ConfigNode& node) {
  node.expect_keys(kTopologyGraphKeys);
  const int chips = positive_int(node, "chips");
  const int switches = node.has("switches") ? static_cast<int>(node.get_int("switches")) : 0;
  if (switches < 0 || switches > (1 << 20)) node.child("switches").fail(node.child("switches").path() + ": must be >= 0");
  const std::optional<LinkSpec> fallback =
      node.has("bandwidth_gbps") ? std::optional<LinkSpec>(link_specs(node, 1)[0]) : std::nullopt;
  const auto links = node.child("links");
  if (!links.yaml().IsSequence()) links.fail(links.path() + ": expected a list of links");
  std::vector<Edge> edges;
  for (size_t i = 0; i < links.yaml().size(); ++i) {
    ConfigNode item(links.yaml()[i], links.file(), links.path() + "[" + std::to_string(i) + "]");
    Edge e;
    if (item.yaml().IsSequence()) {
      if (item.yaml().size() != 2) item.fail(item.path() + ": expected [from, to]");
      e.a = graph_node(ConfigNode(item.yaml()[0], item.file(), item.path() + "[0]"), chips, switches);
      e.b = graph_node(ConfigNode(item.yaml()[1], item.file(), item.path() + "[1]"), chips, switches);
      if (!fallback) item.fail(item.path() + ": no bandwidth_gbps here and no default topology.bandwidth_gbps");
      e.link = *fallback;
    } else if (item.yaml().IsMap()) {
      item.expect_keys(kTopologyLinkKeys);
      e.a = graph_node(item.child("from"), chips, switches);
      e.b = graph_node(item.child("to"), chips, switches);
      if (!item.has("bandwidth_gbps") && !fallback)
        item.fail(item.path() + ": no bandwidth_gbps here and no default topology.bandwidth_gbps");
      e.link.bandwidth_gbps = item.has("bandwidth_gbps") ? number(item.child("bandwidth_gbps"), Range::bandwidth)
                                                         : fallback->bandwidth_gbps;
      e.link.latency_ns = item.has("latency_ns") ? number(item.child("latency_ns"), Range::latency)
                                                 : (fallback ? fallback->latency_ns : 0.0);
      e.bidirectional = item.get_bool("bidirectional", true);
    } else {
      item.fail(item.path() + ": expected [from, to] or {from, to, bandwidth_gbps, latency_ns, bidirectional}");
    }
    edges.push_back(e);
  }
  try {
    return Topology::graph(chips, switches, edges);
  } catch (const std::invalid_argument& e) {
    // "link N: ..." names the item; point at its line when there is one.
    const std::string what = e.what();
    if (what.rfind("link ", 0) == 0) {
      const size_t i = std::stoul(what.substr(5));
      if (i < links.yaml().size())
        ConfigNode(links.yaml()[i], links.file(), links.path() + "[" + std::to_string(i) + "]")
            .fail(links.path() + "[" + std::to_string(i) + "]: " + what.substr(what.find(':') + 2));
    }
    node.fail(node.path() + ": " + what);
  }
}

void apply_placement(const ConfigNode& node, Topology& t) {
  if (!node.has("placement")) return;
  const auto p64 = node.get_int_list("placement");
  std::vector<int> p;
  for (auto v : p64) p.push_back(v < 0 || v > (int64_t{1} << 24) ? -1 : static_cast<int>(v));
  try {
    t.set_placement(p);
  } catch (const std::invalid_argument& e) {
    node.child("placement").fail(node.path() + "." + e.what());
  }
}

void apply_protocol(const ConfigNode& node, Topology& t) {
  const auto pn = node.maybe_child("protocol");
  if (!pn) return;
  if (!pn->is_map()) pn->fail(pn->path() + ": expected a map {efficiency, low_latency_max_bytes, ...}");
  pn->expect_keys(kTopologyProtocolKeys);
  Protocol p;
  p.efficiency = pn->get_double("efficiency", 1.0);
  p.low_latency_max_bytes = pn->get_double("low_latency_max_bytes", 0.0);
  p.low_latency_efficiency = pn->get_double("low_latency_efficiency", 1.0);
  p.low_latency_latency_factor = pn->get_double("low_latency_latency_factor", 1.0);
  p.message_overhead_ns = pn->get_double("message_overhead_ns", 0.0);
  p.call_overhead_ns = pn->get_double("call_overhead_ns", 0.0);
  try {
    t.set_protocol(p);
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    const std::string key = what.substr(0, what.find(' '));
    (pn->has(key) ? pn->child(key) : *pn).fail(pn->path() + "." + what);
  }
}

// A switch's in-switch reduction keys (reduction, reduction_bandwidth_gbps, reduction_latency_ns) of NODE, for a
// dimension of KIND with link LINK; ConfigError naming the key when given to another kind or out of range.
SwitchReduction switch_reduction(const ConfigNode& node, DimKind kind, const LinkSpec& link) {
  SwitchReduction r;
  for (const char* key : {"reduction", "reduction_bandwidth_gbps", "reduction_latency_ns"})
    if (node.has(key) && kind != DimKind::switch_)
      node.child(key).fail(node.path() + "." + key + ": only for switches (in-switch reduction)");
  r.enabled = node.get_bool("reduction", false);
  for (const char* key : {"reduction_bandwidth_gbps", "reduction_latency_ns"})
    if (node.has(key) && !r.enabled)
      node.child(key).fail(node.path() + "." + key + ": needs 'reduction: true'");
  r.rate.bandwidth_gbps = node.get_double("reduction_bandwidth_gbps", link.bandwidth_gbps);
  r.rate.latency_ns = node.get_double("reduction_latency_ns", 0.0);
  if (!(r.rate.bandwidth_gbps >= kMinBandwidthGbps && r.rate.bandwidth_gbps <= kMaxBandwidthGbps))
    node.child("reduction_bandwidth_gbps").fail(node.path() + ".reduction_bandwidth_gbps: must be " + bandwidth_range_text());
  if (!(r.rate.latency_ns >= 0 && r.rate.latency_ns <= kMaxLatencyNs))
    node.child("reduction_latency_ns").fail(node.path() + ".reduction_latency_ns: must be " + latency_range_text());
  return r;
}

Topology load_grid(const ConfigNode& node, const std::string& kind) {
  try {
    if (kind == "switch") {
      if (node.has("bidirectional"))
        node.child("bidirectional").fail(node.path() + ".bidirectional: only for kind 'ring' (links are full duplex)");
      node.expect_keys(kTopologySwitchKeys);
      const LinkSpec link = link_specs(node, 1)[0];
      Dim dim{DimKind::switch_, positive_int(node, "chips"), link, true, {}};
      dim.reduction = switch_reduction(node, DimKind::switch_, link);
      return Topology::stacked({dim});
    }
    if (kind == "ring" || kind == "fully_connected") {
      node.expect_keys(kTopologySimpleKeys);
      if (kind != "ring" && node.has("bidirectional"))
        node.child("bidirectional").fail(node.path() + ".bidirectional: only for kind 'ring' (links are full duplex)");
      const int chips = positive_int(node, "chips");
      const LinkSpec link = link_specs(node, 1)[0];
      if (kind == "ring") return Topology::ring(chips, link, node.get_bool("bidirectional", true));
      return Topology::fully_connected(chips, link);
    }
    if (kind == "torus" || kind == "mesh") {
      node.expect_keys(kTopologyGridKeys);
      const auto dims = dims_of(node);
      const auto specs = link_specs(node, dims.size());
      return kind == "torus" ? Topology::torus(dims, specs) : Topology::mesh(dims, specs);
    }
    if (kind == "stacked") {
      node.expect_keys(kTopologyStackedKeys);
      const auto list = node.child("dims");
      if (!list.yaml().IsSequence() || list.yaml().size() == 0)
        list.fail(list.path() + ": expected a list of dimensions {kind, size, bandwidth_gbps, latency_ns}");
      std::vector<Dim> dims;
      int64_t product = 1;
      for (size_t i = 0; i < list.yaml().size(); ++i) {
        ConfigNode d(list.yaml()[i], list.file(), list.path() + "[" + std::to_string(i) + "]");
        if (!d.is_map()) d.fail(d.path() + ": expected {kind, size, bandwidth_gbps, latency_ns}");
        d.expect_keys(kTopologyDimKeys);
        Dim dim;
        dim.kind = dim_kind(d);
        dim.size = positive_int(d, "size");
        dim.link = link_specs(d, 1)[0];
        if (d.has("bidirectional") && dim.kind != DimKind::ring)
          d.child("bidirectional").fail(d.path() + ".bidirectional: only for ring dimensions");
        dim.bidirectional = d.get_bool("bidirectional", true);
        dim.reduction = switch_reduction(d, dim.kind, dim.link);
        product *= dim.size;
        if (product > (int64_t{1} << 24)) d.fail(d.path() + ": more than 2^24 chips");
        dims.push_back(dim);
      }
      if (node.has("chips") && node.get_int("chips") != product)
        node.child("chips").fail(node.path() + ".chips: " + std::to_string(node.get_int("chips")) +
                                 " chips, but the dimensions make " + std::to_string(product));
      return Topology::stacked(dims);
    }
  } catch (const std::invalid_argument& e) {
    node.fail(node.path() + ": " + e.what());
  }
  node.child("kind").fail(node.path() + ".kind: unknown kind '" + kind +
                          "' (known: ring, torus, mesh, fully_connected, switch, stacked, graph, clos)");
}

}  // namespace

Topology load_topology(const ConfigNode& node) {
  if (!node.is_map()) node.fail(node.path() + ": expected a map with 'kind'");
  const std::string kind = node.get_string("kind");
  Topology t = kind == "graph"  ? load_graph(node)
               : kind == "clos" ? clos(load_clos_spec(node))  // topology/clos.h: a graph with its closed forms
                                : load_grid(node, kind);
  apply_placement(node, t);
  apply_protocol(node, t);
  return t;
}

Topology load_topology_document(const ConfigNode& root) {
  if (is_astra_network(root)) return load_astra_network(root);
  if (root.is_map() && root.has("topology")) return load_topology(root.child("topology"));
  if (root.is_map() && root.has("kind")) return load_topology(root);
  root.fail("no 'topology:' section, bare topology (kind: ...) or ASTRA-sim network (topology: [..])");
}

Topology load_topology_file(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) throw ConfigError(path + ": is a directory, need a YAML file");
  return load_topology_document(ConfigNode::load_file(path));
}

bool is_astra_network(const ConfigNode& root) {
  return root.yaml().IsMap() && root.has("npus_count") && root.has("topology") && root.yaml()["topology"].IsSequence();
}

Topology load_astra_network(const ConfigNode& root) {
  root.expect_keys(kAstraNetworkKeys);
  const auto kinds = root.child("topology");
  const size_t n = kinds.yaml().size();
  if (n == 0) kinds.fail("topology: needs at least one dimension");
  const auto npus = root.get_int_list_in("npus_count", 1, int64_t{1} << 24);
  if (npus.size() != n)
    root.child("npus_count").fail("npus_count: " + std::to_string(npus.size()) + " entries for " + std::to_string(n) +
                                  " topology dimensions");
  const auto bw = numbers(root, "bandwidth", n, Range::bandwidth);
  const auto lat = numbers(root, "latency", n, Range::latency);
  constexpr double kAstraGB = 1073741824.0 / 1e9;  // ASTRA-sim's GB/s in shardsim's (1e9 B) GB/s
  std::vector<Dim> dims(n);
  int64_t product = 1;
  for (size_t i = 0; i < n; ++i) {
    ConfigNode item(kinds.yaml()[i], kinds.file(), "topology[" + std::to_string(i) + "]");
    const std::string kind = kinds.yaml()[i].IsScalar() ? kinds.yaml()[i].Scalar() : "";
    DimKind k = DimKind::ring;
    if (kind == "Ring") k = DimKind::ring;
    else if (kind == "FullyConnected") k = DimKind::fully_connected;
    else if (kind == "Switch") k = DimKind::switch_;
    else item.fail("topology[" + std::to_string(i) + "]: unknown ASTRA-sim topology '" + kind +
                   "' (known: Ring, FullyConnected, Switch)");
    product *= npus[i];  // each entry in [1, 2^24] (get_int_list_in), the product <= 2^24 before: no wrap
    if (product > (int64_t{1} << 24)) root.child("npus_count").fail("npus_count: more than 2^24 NPUs");
    const size_t d = n - 1 - i;  // ASTRA-sim's dimension 0 is our last (fastest-varying) one
    dims[d] = Dim{k, static_cast<int>(npus[i]),
                  LinkSpec{bw[bw.size() == 1 ? 0 : i] * kAstraGB, lat[lat.size() == 1 ? 0 : i]}, true, {}};
  }
  try {
    return Topology::stacked(dims);
  } catch (const std::invalid_argument& e) {
    root.fail(std::string("ASTRA-sim network: ") + e.what());
  }
}

}  // namespace shardsim::topology

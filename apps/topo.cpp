// `shardsim topo describe CONFIG [--dot FILE] [--json FILE]`: what a topology is, before anything runs on it.
//
// CONFIG is a YAML file with a `topology:` section (a workload config works), a bare topology map, or an
// ASTRA-sim analytical network.yml. No communication but the agreement on errors: rank 0 (chip 0 with several chips
// per rank) loads, describes and prints; the other ranks and chips only learn its verdict.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "apps/cli_common.h"
#include "apps/commands.h"
#include "common/config.h"
#include "common/error.h"
#include "common/text.h"
#include "topology/clos.h"
#include "topology/topology_yaml.h"

namespace shardsim::apps {

namespace {

struct TopoFlags {
  std::string config, dot_path, json_path;
};

std::string num(double v, int prec = 3) {
  char b[64];
  std::snprintf(b, sizeof b, "%.*g", prec + 3, v);
  return b;
}

// Per-dimension rows: kind, size, lines, per-link bandwidth/latency, links per chip, hops across.
nlohmann::json dimensions(const topology::Topology& t) {
  nlohmann::json dims = nlohmann::json::array();
  if (!t.is_grid()) return dims;
  for (size_t d = 0; d < t.dims().size(); ++d) {
    const auto& s = t.dim_specs()[d];
    const int k = s.size;
    int links = 0, per_chip = 0;
    for (const auto& l : t.links())
      if (l.dim == static_cast<int>(d)) {
        ++links;
        if (!t.is_switch(l.src) && l.src == 0) ++per_chip;
      }
    // Hops between chip 0 and every other chip of its line along d.
    int worst = 0;
    std::vector<int> xyz(t.dims().size(), 0);
    for (int x = 1; x < k; ++x) {
      xyz[d] = x;
      worst = std::max(worst, std::max(t.hop_count(0, t.chip_at(xyz)), t.hop_count(t.chip_at(xyz), 0)));
    }
    dims.push_back({{"dim", d},
                    {"kind", topology::dim_kind_name(s.kind)},
                    {"size", k},
                    {"lines", t.num_chips() / k},
                    {"bandwidth_gbps", s.link.bandwidth_gbps},
                    {"latency_ns", s.link.latency_ns},
                    {"bidirectional", s.kind != topology::DimKind::ring || s.bidirectional},
                    {"directed_links", links},
                    {"links_out_of_chip0", per_chip},
                    {"max_hops_in_line", worst}});
  }
  return dims;
}

nlohmann::json summary(const topology::Topology& t, const std::string& path) {
  double bw_out = 0;  // injection bandwidth of chip 0
  for (int id : t.out_links(0)) bw_out += t.link(id).bandwidth_gbps;
  const auto bis = t.bisection_bandwidth_gbps();
  // How the bisection was found (topology.h: bisection_bandwidth_gbps); the exact search is exponential.
  std::string method;
  const bool any_even = std::any_of(t.dims().begin(), t.dims().end(), [](int k) { return k % 2 == 0; });
  if (t.num_chips() < 2) method = "one chip";
  else if (t.is_grid() && any_even) method = "closed form: cheapest cut of an even dimension into halves";
  else if (t.num_nodes() <= 22) method = "exact search over balanced cuts";
  else if (t.is_grid())
    method = "estimate: no even dimension, cheapest cut between lines (halves differ by one line); exact search "
             "skipped above 22 nodes (" + std::to_string(t.num_nodes()) + " here)";
  else
    method = "not computed: exact search skipped above 22 nodes (" + std::to_string(t.num_nodes()) + " here)";
  nlohmann::json j = {{"config", path},
                      {"description", t.describe()},
                      {"kind", t.kind_name()},
                      {"chips", t.num_chips()},
                      {"switches", t.num_nodes() - t.num_chips()},
                      {"directed_links", t.links().size()},
                      {"diameter_hops", t.diameter()},
                      {"average_hops", t.average_hop_count()},
                      {"bisection_bandwidth_gbps", bis ? nlohmann::json(*bis) : nlohmann::json(nullptr)},
                      {"bisection_method", method},
                      {"injection_bandwidth_gbps_chip0", bw_out},
                      {"dimensions", dimensions(t)}};
  if (!t.identity_placement()) j["placement"] = t.placement();
  return j;
}

// A Clos (topology/clos.h): its tiers and closed-form metrics. The bisection is the closed form (the graph's exact
// search stops at 22 nodes); the diameter and average hops are the graph's own, equal to the closed forms.
void add_clos(nlohmann::json& j, const topology::ClosSpec& s) {
  const auto m = topology::clos_metrics(s);
  j["clos"] = {{"description", s.describe()},
               {"chips_per_leaf", s.chips_per_leaf},
               {"leaves_per_pod", s.leaves_per_pod},
               {"pods", s.pods},
               {"leaf_uplink_gbps", s.leaf_uplink_gbps()},
               {"pod_uplink_gbps", s.pod_uplink_gbps()},
               {"diameter_hops_closed_form", m.diameter_hops},
               {"average_hops_closed_form", m.average_hops}};
  j["bisection_bandwidth_gbps"] = m.bisection_gbps ? nlohmann::json(*m.bisection_gbps) : nlohmann::json(nullptr);
  j["bisection_method"] = m.bisection_method;
}

void print(const nlohmann::json& j) {
  std::printf("topology   %s\n", j["description"].get<std::string>().c_str());
  if (j.contains("clos"))
    std::printf("  %s\n  closed forms       diameter %d hops, average %.3f hops\n",
                j["clos"]["description"].get<std::string>().c_str(), j["clos"]["diameter_hops_closed_form"].get<int>(),
                j["clos"]["average_hops_closed_form"].get<double>());
  std::printf("  config             %s\n", escape_control(j["config"].get<std::string>()).c_str());
  std::printf("  chips              %d", j["chips"].get<int>());
  if (j["switches"].get<int>() > 0)
    std::printf(" (+ %d switch%s)", j["switches"].get<int>(), j["switches"].get<int>() == 1 ? "" : "es");
  std::printf("\n  directed links     %zu (each full bandwidth in its direction)\n", j["directed_links"].get<size_t>());
  std::printf("  diameter           %d hop%s\n", j["diameter_hops"].get<int>(), j["diameter_hops"].get<int>() == 1 ? "" : "s");
  std::printf("  average hop count  %.3f (over ordered pairs of distinct chips, routes as simulated)\n",
              j["average_hops"].get<double>());
  if (j["bisection_bandwidth_gbps"].is_null())
    std::printf("  bisection          %s\n", j["bisection_method"].get<std::string>().c_str());
  else
    std::printf("  bisection          %s GB/s per direction (GB = 1e9 B; %s)\n",
                num(j["bisection_bandwidth_gbps"].get<double>()).c_str(),
                j["bisection_method"].get<std::string>().c_str());
  std::printf("  injection chip 0   %s GB/s (sum of its outgoing links)\n",
              num(j["injection_bandwidth_gbps_chip0"].get<double>()).c_str());
  if (j.contains("placement")) {
    std::string p;
    for (const auto& v : j["placement"]) p += (p.empty() ? "" : " ") + std::to_string(v.get<int>());
    std::printf("  placement          rank -> chip: %s\n", p.c_str());
  }
  if (!j["dimensions"].empty()) {
    std::printf("  %-4s %-16s %5s %6s %12s %10s %6s %11s %9s\n", "dim", "kind", "size", "lines", "GB/s/link",
                "ns/hop", "bidir", "links/chip", "max hops");
    for (const auto& d : j["dimensions"])
      std::printf("  %-4d %-16s %5d %6d %12s %10s %6s %11d %9d\n", d["dim"].get<int>(),
                  d["kind"].get<std::string>().c_str(), d["size"].get<int>(), d["lines"].get<int>(),
                  num(d["bandwidth_gbps"].get<double>()).c_str(), num(d["latency_ns"].get<double>()).c_str(),
                  d["bidirectional"].get<bool>() ? "yes" : "no", d["links_out_of_chip0"].get<int>(),
                  d["max_hops_in_line"].get<int>());
  }
}

}  // namespace

Command add_topo(CLI::App& app, const runtime::World& world) {
  auto* topo = app.add_subcommand("topo", "inspect a topology without running anything");
  topo->require_subcommand(1);
  auto* describe = topo->add_subcommand(
      "describe", "chips, links, diameter, average hops, bisection bandwidth, per-dimension summary");
  auto flags = std::make_shared<TopoFlags>();
  describe->add_option("config", flags->config,
                       "YAML with a topology: section (e.g. a workload), a bare topology, or an ASTRA-sim network.yml")
      ->required();
  describe->add_option("--dot", flags->dot_path, "also write the graph as Graphviz dot to this file");
  describe->add_option("--json", flags->json_path, "also write the summary as JSON to this file");
  Command c;
  c.app = topo;
  c.run = [flags, &world]() -> int {
    topology::Topology t;
    nlohmann::json j;
    world.agree([&] {
      // Rank 0 alone reads and describes (the agreement gives every rank its error): with several chips per rank
      // a copy per chip would cost O(chips) each (the metrics of a graph: O(chips^2) each).
      if (world.rank() != 0) return;
      std::vector<std::pair<std::string, std::string>> outputs;
      if (!flags->dot_path.empty()) outputs.emplace_back("--dot", flags->dot_path);
      if (!flags->json_path.empty()) outputs.emplace_back("--json", flags->json_path);
      check_outputs(outputs);
      t = topology::load_topology_file(flags->config);
      j = summary(t, flags->config);
      if (const auto clos = topology::clos_spec_of_document(ConfigNode::load_file(flags->config))) add_clos(j, *clos);
    });
    if (world.rank() == 0) print(j);
    // Agreed, so a failed write (e.g. a full disk) is one line and exit 3 on every rank, not an abort.
    world.agree([&] {
      if (world.rank() != 0) return;
      if (!flags->dot_path.empty()) {
        write_file(flags->dot_path, t.to_dot());
        const std::string dot = escape_control(flags->dot_path);
        std::printf("dot        %s (render: dot -Tsvg %s -o topology.svg)\n", dot.c_str(), dot.c_str());
      }
      if (!flags->json_path.empty()) write_file(flags->json_path, j.dump(2) + "\n");
    });
    return kExitOk;
  };
  return c;
}

}  // namespace shardsim::apps

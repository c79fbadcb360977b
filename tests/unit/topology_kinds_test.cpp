// Mesh, fully-connected, switch, stacked and graph topologies; metrics (hops, bisection); the loader's errors;
// and the link model's contention claims (sim::Timeline).
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <algorithm>

#include "common/config.h"
#include "common/error.h"
#include "runtime/transport.h"
#include "sim/timeline.h"
#include "topology/topology.h"
#include "topology/topology_yaml.h"

using namespace shardsim;
using topology::Dim;
using topology::DimKind;
using topology::Edge;
using topology::Kind;
using topology::LinkSpec;
using topology::Topology;

namespace {

Topology load(const std::string& yaml) {
  return topology::load_topology(ConfigNode::load_string(yaml, "topo.yaml").child("topology"));
}

std::string error_of(const std::string& yaml) {
  try {
    load(yaml);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

// Sum of the latencies of a route.
double latency(const Topology& t, int a, int b) {
  double s = 0;
  for (int id : t.route(a, b)) s += t.link(id).latency_ns;
  return s;
}

}  // namespace

TEST(Mesh, NoWrapAroundAndDimensionOrderRoutes) {
  auto t = Topology::mesh({2, 3}, {LinkSpec{100, 10}});
  EXPECT_EQ(t.kind(), Kind::mesh);
  EXPECT_EQ(t.num_chips(), 6);
  // 2x3 mesh: 2 rows of a 3-line (2 links each way) + 3 columns of a 2-line (1 each way) = (2*2 + 3*1) * 2
  EXPECT_EQ(t.links().size(), 14u);
  EXPECT_FALSE(t.link_between(0, 2).has_value());  // no wrap-around from (0,0) to (0,2)
  EXPECT_EQ(t.hop_count(0, 2), 2);
  EXPECT_EQ(t.hop_count(2, 3), 3);  // (0,2) -> (1,0): dimension 0 first, then back along dimension 1
  EXPECT_EQ(t.link(t.route(2, 3).front()).dim, 0);
  EXPECT_EQ(t.diameter(), 3);
  // Average hops on a 1x3 line: pairs at distance 1,1,2 both ways -> 8/6.
  EXPECT_NEAR(Topology::mesh({3}, {LinkSpec{1, 0}}).average_hop_count(), 8.0 / 6.0, 1e-12);
}

TEST(FullyConnected, OneHopEverywhere) {
  auto t = Topology::fully_connected(5, LinkSpec{50, 300});
  EXPECT_EQ(t.kind(), Kind::fully_connected);
  EXPECT_EQ(t.links().size(), 20u);
  EXPECT_EQ(t.diameter(), 1);
  EXPECT_DOUBLE_EQ(t.average_hop_count(), 1.0);
  EXPECT_EQ(t.neighbors(3), (std::vector<int>{0, 1, 2, 4}));
}

TEST(Switch, TwoHopsThroughTheSwitchNode) {
  auto t = Topology::switched(8, LinkSpec{100, 250});
  EXPECT_EQ(t.kind(), Kind::switch_);
  EXPECT_EQ(t.num_chips(), 8);
  EXPECT_EQ(t.num_nodes(), 9);
  EXPECT_TRUE(t.is_switch(8));
  EXPECT_EQ(t.out_links(0).size(), 1u);  // one uplink: every flow a chip sends shares it
  const auto r = t.route(2, 5);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(t.link(r[0]).dst, 8);
  EXPECT_EQ(t.link(r[1]).src, 8);
  EXPECT_EQ(t.link(r[1]).dst, 5);
  EXPECT_DOUBLE_EQ(latency(t, 2, 5), 500.0);
  EXPECT_TRUE(t.neighbors(0).empty());  // no direct chip neighbours
  EXPECT_EQ(t.diameter(), 2);
}

TEST(Stacked, RingInsideANodeTimesASwitchAcrossNodes) {
  // 8 nodes on a switch (dimension 0, outermost) x a ring of 4 chips inside each node (dimension 1).
  auto t = Topology::stacked({Dim{DimKind::switch_, 8, LinkSpec{50, 1000}, true},
                              Dim{DimKind::ring, 4, LinkSpec{200, 100}, true}});
  EXPECT_EQ(t.kind(), Kind::stacked);
  EXPECT_EQ(t.num_chips(), 32);
  EXPECT_EQ(t.num_nodes(), 32 + 4);  // one switch per line of dimension 0: 4 switches
  // Chip 1 = (node 0, position 1) -> chip 6 = (node 1, position 2): switch first, then one ring hop.
  const auto r = t.route(1, 6);
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(t.link(r[0]).dim, 0);
  EXPECT_TRUE(t.is_switch(t.link(r[0]).dst));
  EXPECT_EQ(t.link(r[2]).dim, 1);
  EXPECT_DOUBLE_EQ(latency(t, 1, 6), 1000.0 + 1000.0 + 100.0);
  // Chips of one position share a switch; other positions use other switches.
  EXPECT_EQ(t.link(t.route(0, 4).front()).dst, t.link(t.route(8, 12).front()).dst);
  EXPECT_NE(t.link(t.route(0, 4).front()).dst, t.link(t.route(1, 5).front()).dst);
  EXPECT_NE(t.describe().find("stacked switch 8 x ring 4"), std::string::npos) << t.describe();
}

TEST(Torus, OneDimensionAndSizeOneDimensionsWork) {
  auto one = Topology::torus({5}, {LinkSpec{10, 1}});
  EXPECT_EQ(one.kind(), Kind::torus);
  EXPECT_EQ(one.diameter(), 2);
  auto flat = Topology::torus({1, 4, 1}, {LinkSpec{10, 1}});
  EXPECT_EQ(flat.num_chips(), 4);
  EXPECT_EQ(flat.links().size(), 8u);
}

TEST(Graph, ShortestPathsThroughChipsAndSwitches) {
  // Chips 0-1-2 in a line plus a switch s0 linking 0 and 3.
  auto t = Topology::graph(4, 1,
                           {Edge{0, 1, LinkSpec{100, 10}, true}, Edge{1, 2, LinkSpec{100, 10}, true},
                            Edge{0, 4, LinkSpec{50, 20}, true}, Edge{4, 3, LinkSpec{50, 20}, true}});
  EXPECT_EQ(t.kind(), Kind::graph);
  EXPECT_EQ(t.hop_count(2, 3), 4);  // 2 -> 1 -> 0 -> s0 -> 3
  EXPECT_EQ(t.hop_count(3, 1), 3);
  EXPECT_EQ(t.diameter(), 4);
  EXPECT_DOUBLE_EQ(latency(t, 2, 3), 60.0);
  EXPECT_FALSE(t.bisection_bandwidth_gbps() == std::nullopt);
  EXPECT_DOUBLE_EQ(*t.bisection_bandwidth_gbps(), 100.0);  // {0,3,s0} | {1,2}: only the link 0-1 crosses
}

TEST(Graph, BadEdgesAreRejected) {
  EXPECT_THROW(Topology::graph(3, 0, {Edge{0, 3, LinkSpec{1, 0}, true}}), std::invalid_argument);  // no chip 3
  EXPECT_THROW(Topology::graph(3, 0, {Edge{0, 1, LinkSpec{1, 0}, true}}), std::invalid_argument);  // 2 unreachable
  EXPECT_THROW(Topology::graph(2, 0, {Edge{0, 0, LinkSpec{1, 0}, true}}), std::invalid_argument);
  EXPECT_THROW(Topology::graph(2, 0, {Edge{0, 1, LinkSpec{0, 0}, true}}), std::invalid_argument);
  EXPECT_THROW(Topology::graph(2, 0, {Edge{0, 1, LinkSpec{NAN, 0}, true}}), std::invalid_argument);
  EXPECT_THROW(Topology::ring(2, LinkSpec{1e308, 0}), std::invalid_argument);   // outside 1e-3..1e6 GB/s
  EXPECT_THROW(Topology::ring(2, LinkSpec{1e-300, 0}), std::invalid_argument);
  EXPECT_THROW(Topology::ring(2, LinkSpec{1, 2e9}), std::invalid_argument);     // outside 0..1e9 ns
  EXPECT_NO_THROW(Topology::ring(2, LinkSpec{1e6, 1e9}));
  EXPECT_NO_THROW(Topology::ring(2, LinkSpec{1e-3, 0}));
  // One-way links must still connect every chip to every other.
  EXPECT_THROW(Topology::graph(2, 0, {Edge{0, 1, LinkSpec{1, 0}, false}}), std::invalid_argument);
  EXPECT_NO_THROW(Topology::graph(2, 0, {Edge{0, 1, LinkSpec{1, 0}, false}, Edge{1, 0, LinkSpec{1, 0}, false}}));
}

TEST(Bisection, GridFormulaMatchesTheExactSearch) {
  const LinkSpec l{10, 0};
  const std::vector<Topology> cases = {
      Topology::ring(8, l),
      Topology::ring(8, l, false),
      Topology::torus({4, 4}, {l}),
      Topology::torus({2, 4}, {l}),
      Topology::mesh({4, 4}, {l}),
      Topology::mesh({2, 3}, {l}),
      Topology::ring(5, l),
      Topology::torus({3, 3}, {l}),
      Topology::fully_connected(6, l),
      Topology::switched(8, l),
      Topology::stacked({Dim{DimKind::switch_, 4, l, true}, Dim{DimKind::ring, 4, LinkSpec{20, 0}, true}}),
  };
  for (const auto& t : cases) {
    const auto formula = t.bisection_bandwidth_gbps(), exact = t.bisection_bandwidth_exact_gbps();
    ASSERT_TRUE(formula && exact) << t.describe();
    EXPECT_DOUBLE_EQ(*formula, *exact) << t.describe();
  }
  EXPECT_DOUBLE_EQ(*Topology::torus({4, 4}, {l}).bisection_bandwidth_gbps(), 4 * 2 * 10.0);
  EXPECT_DOUBLE_EQ(*Topology::fully_connected(6, l).bisection_bandwidth_gbps(), 9 * 10.0);
  EXPECT_DOUBLE_EQ(*Topology::switched(8, l).bisection_bandwidth_gbps(), 4 * 10.0);
}

// hop_count, diameter and average_hop_count use closed forms on grids and the distance table on graphs
// (topo describe must scale to thousands of chips); they must equal what the routes the simulator uses give.
TEST(Metrics, ClosedFormsEqualRouteLengths) {
  const LinkSpec l{10, 0};
  const std::vector<Topology> cases = {
      Topology::ring(1, l), Topology::ring(2, l), Topology::ring(7, l), Topology::ring(8, l), Topology::ring(6, l, false),
      Topology::ring(2, l, false), Topology::torus({3, 4}, {l}), Topology::torus({2, 1, 5}, {l}),
      Topology::mesh({4, 3}, {l}), Topology::mesh({1, 6}, {l}), Topology::fully_connected(5, l),
      Topology::switched(6, l),
      Topology::stacked({Dim{DimKind::switch_, 3, l, true}, Dim{DimKind::ring, 5, l, false},
                         Dim{DimKind::line, 3, l, true}, Dim{DimKind::fully_connected, 2, l, true}}),
      Topology::graph(4, 1, {Edge{0, 1, l, true}, Edge{1, 2, l, true}, Edge{0, 4, l, true}, Edge{4, 3, l, true}}),
      Topology::graph(3, 0, {Edge{0, 1, l, false}, Edge{1, 2, l, false}, Edge{2, 0, l, false}}),
  };
  for (const auto& t : cases) {
    int diameter = 0;
    double sum = 0;
    for (int a = 0; a < t.num_chips(); ++a)
      for (int b = 0; b < t.num_chips(); ++b) {
        const int hops = static_cast<int>(t.route(a, b).size());
        ASSERT_EQ(t.hop_count(a, b), hops) << t.describe() << " " << a << " -> " << b;
        diameter = std::max(diameter, hops);
        sum += hops;
      }
    const double n = t.num_chips();
    EXPECT_EQ(t.diameter(), diameter) << t.describe();
    EXPECT_NEAR(t.average_hop_count(), n > 1 ? sum / (n * (n - 1)) : 0.0, 1e-12) << t.describe();
  }
}

TEST(Placement, MustBeAPermutation) {
  auto t = Topology::ring(4, LinkSpec{1, 0});
  EXPECT_TRUE(t.identity_placement());
  t.set_placement({3, 2, 1, 0});
  EXPECT_EQ(t.placement()[0], 3);
  EXPECT_FALSE(t.identity_placement());
  EXPECT_THROW(t.set_placement({0, 1, 2}), std::invalid_argument);
  EXPECT_THROW(t.set_placement({0, 1, 1, 2}), std::invalid_argument);
  EXPECT_THROW(t.set_placement({0, 1, 2, 4}), std::invalid_argument);
}

TEST(Dot, ListsEveryNodeAndLink) {
  auto t = Topology::switched(3, LinkSpec{25, 100});
  const std::string dot = t.to_dot();
  EXPECT_EQ(dot.rfind("graph shardsim {", 0), 0u) << dot;  // full duplex, equal specs: undirected
  for (const char* s : {"c0 [", "c1 [", "c2 [", "s0 [", "c0 -- s0", "c2 -- s0", "25 GB/s"})
    EXPECT_NE(dot.find(s), std::string::npos) << s << "\n" << dot;
  const std::string one_way = Topology::ring(3, LinkSpec{1, 0}, false).to_dot();
  EXPECT_EQ(one_way.rfind("digraph", 0), 0u);
  EXPECT_NE(one_way.find("c2 -> c0"), std::string::npos);
}

// ---- the YAML loader ----

TEST(TopologyYaml, EveryKindLoads) {
  EXPECT_EQ(load("topology:\n  kind: mesh\n  dims: [2, 2]\n  bandwidth_gbps: 10\n").kind(), Kind::mesh);
  EXPECT_EQ(load("topology:\n  kind: switch\n  chips: 8\n  bandwidth_gbps: 10\n  latency_ns: 5\n").num_nodes(), 9);
  EXPECT_EQ(load("topology:\n  kind: fully_connected\n  chips: 4\n  bandwidth_gbps: 10\n").diameter(), 1);
  const auto st = load(
      "topology:\n  kind: stacked\n  dims:\n    - {kind: switch, size: 2, bandwidth_gbps: 25, latency_ns: 700}\n"
      "    - {kind: ring, size: 4, bandwidth_gbps: 100, latency_ns: 100}\n");
  EXPECT_EQ(st.num_chips(), 8);
  EXPECT_EQ(st.kind(), Kind::stacked);
  const auto g = load(
      "topology:\n  kind: graph\n  chips: 3\n  switches: 1\n  bandwidth_gbps: 10\n  latency_ns: 1\n"
      "  links:\n    - [0, 1]\n    - {from: 1, to: s0, bandwidth_gbps: 5}\n    - [s0, 2]\n  placement: [2, 0, 1]\n");
  EXPECT_EQ(g.hop_count(0, 2), 3);
  EXPECT_EQ(g.placement(), (std::vector<int>{2, 0, 1}));
  EXPECT_DOUBLE_EQ(g.link(*g.link_between(1, 3)).bandwidth_gbps, 5.0);
}

TEST(TopologyYaml, BadInputNamesTheFieldAndLine) {
  struct Case {
    std::string yaml, expect;
  };
  const std::vector<Case> cases = {
      {"topology:\n  kind: torus\n  dims: [2, 3]\n  chips: 8\n  bandwidth_gbps: 10\n",
       "topo.yaml:4: topology.chips: 8 chips, but dims 2x3 make 6"},
      {"topology:\n  kind: ring\n  chips: 4\n  bandwidth_gbps: 0\n", "topo.yaml:4: topology.bandwidth_gbps: must be a finite number > 0 within 0.001..1e+06 GB/s (got 0)"},
      {"topology:\n  kind: ring\n  chips: 4\n  bandwidth_gbps: -5\n", "topology.bandwidth_gbps: must be a finite number > 0 within 0.001..1e+06 GB/s (got -5)"},
      // Outside the sane range (topology.h: 1 MB/s .. 1 PB/s, 0 .. 1 s): unit mistakes, and times would overflow.
      {"topology:\n  kind: ring\n  chips: 4\n  bandwidth_gbps: 1e308\n", "topology.bandwidth_gbps: must be a finite number > 0 within 0.001..1e+06 GB/s (got 1e308)"},
      {"topology:\n  kind: ring\n  chips: 4\n  bandwidth_gbps: 1e-300\n", "topology.bandwidth_gbps: must be a finite number > 0 within 0.001..1e+06 GB/s (got 1e-300)"},
      {"topology:\n  kind: ring\n  chips: 4\n  bandwidth_gbps: 10\n  latency_ns: 1e300\n",
       "topo.yaml:5: topology.latency_ns: must be a finite number >= 0 within 0..1e+09 ns (got 1e300)"},
      {"topology:\n  kind: ring\n  chips: 4\n  bandwidth_gbps: .nan\n",
       "topo.yaml:4: topology.bandwidth_gbps: must be a finite number > 0 within 0.001..1e+06 GB/s (got .nan)"},
      {"topology:\n  kind: ring\n  chips: 4\n  bandwidth_gbps: 10\n  latency_ns: .inf\n",
       "topo.yaml:5: topology.latency_ns: must be a finite number"},
      {"topology:\n  kind: ring\n  chips: 4\n  bandwidth_gbps: 10\n  latency_ns: -1\n",
       "topology.latency_ns: must be a finite number >= 0 within 0..1e+09 ns (got -1)"},
      {"topology:\n  kind: torus\n  dims: [2, 2]\n  bandwidth_gbps: [10, .nan]\n",
       "topology.bandwidth_gbps[1]: must be a finite number"},
      {"topology:\n  kind: graph\n  chips: 3\n  bandwidth_gbps: 1\n  links:\n    - [0, 1]\n    - [1, 3]\n",
       "topo.yaml:7: topology.links[1][1]: chip 3 does not exist (chips 0..2)"},
      {"topology:\n  kind: graph\n  chips: 3\n  bandwidth_gbps: 1\n  links:\n    - [0, s1]\n",
       "topology.links[0][1]: switch s1 does not exist (0 switches)"},
      {"topology:\n  kind: graph\n  chips: 4\n  bandwidth_gbps: 1\n  links:\n    - [0, 1]\n    - [2, 3]\n",
       "the graph is disconnected: chip 0 cannot reach chip 2"},
      {"topology:\n  kind: graph\n  chips: 2\n  links:\n    - {from: 0, to: 1, bandwidth_gbps: .nan}\n",
       "topology.links[0].bandwidth_gbps: must be a finite number"},
      {"topology:\n  kind: stacked\n  dims:\n    - {kind: hypercube, size: 2, bandwidth_gbps: 1}\n",
       "topo.yaml:4: topology.dims[0].kind: unknown dimension kind 'hypercube'"},
      {"topology:\n  kind: stacked\n  dims:\n    - {kind: ring, size: 0, bandwidth_gbps: 1}\n", "topology.dims[0].size"},
      {"topology:\n  kind: star\n  chips: 2\n", "topo.yaml:2: topology.kind: unknown kind 'star'"},
      {"topology:\n  kind: ring\n  chips: 4\n  bandwidth_gbps: 1\n  placement: [0, 1, 1, 2]\n",
       "topo.yaml:5: topology.placement[2]: chip 1 is already used by rank 1"},
      {"topology:\n  kind: switch\n  chips: 4\n  bandwidth_gbps: 1\n  bidirectional: false\n",
       "topology.bidirectional: only for kind 'ring'"},
      {"topology:\n  kind: ring\n  chips: 4\n  bandwidth_gbps: 1\n  reduction: true\n", "unknown key"},
      {"topology:\n  kind: stacked\n  dims:\n    - {kind: ring, size: 2, bandwidth_gbps: 1, reduction: true}\n",
       "topology.dims[0].reduction: only for switches"},
      {"topology:\n  kind: switch\n  chips: 4\n  bandwidth_gbps: 1\n  reduction_bandwidth_gbps: 5\n",
       "topology.reduction_bandwidth_gbps: needs 'reduction: true'"},
      {"topology:\n  kind: switch\n  chips: 4\n  bandwidth_gbps: 1\n  reduction: true\n  reduction_latency_ns: -1\n",
       "topo.yaml:6: topology.reduction_latency_ns: must be a finite number >= 0"},
  };
  for (const auto& c : cases) {
    const std::string e = error_of(c.yaml);
    EXPECT_NE(e.find(c.expect), std::string::npos) << "config:\n" << c.yaml << "error: " << e;
  }
}

TEST(TopologyYaml, SwitchReductionKeys) {
  auto t = topology::load_topology_file(std::string(SHARDSIM_CONFIG_DIR) + "/topologies/dgx_h100_nvls.yaml");
  ASSERT_EQ(t.kind(), Kind::switch_);
  EXPECT_TRUE(t.dim_specs()[0].reduction.enabled);
  EXPECT_EQ(t.dim_specs()[0].reduction.rate.bandwidth_gbps, 275);
  EXPECT_NE(t.describe().find("in-switch reduction 275 GB/s, 1000 ns"), std::string::npos) << t.describe();
  // A chip's route to and from its own switch is its up- / down-link; any other switch end is refused.
  const int sw = t.switch_node(0, 3);
  ASSERT_EQ(t.route(3, sw).size(), 1u);
  EXPECT_EQ(t.link(t.route(3, sw)[0]).src, 3);
  EXPECT_EQ(t.link(t.route(sw, 5)[0]).dst, 5);
  auto stacked = topology::load_topology(ConfigNode::load_string(
      "kind: stacked\ndims:\n  - {kind: switch, size: 2, bandwidth_gbps: 50, reduction: true}\n"
      "  - {kind: switch, size: 4, bandwidth_gbps: 450}\n", "s.yaml"));
  EXPECT_TRUE(stacked.dim_specs()[0].reduction.enabled);
  EXPECT_EQ(stacked.dim_specs()[0].reduction.rate.bandwidth_gbps, 50);  // default: the link bandwidth
  EXPECT_FALSE(stacked.dim_specs()[1].reduction.enabled);
  EXPECT_THROW(stacked.route(0, stacked.switch_node(1, 5)), std::invalid_argument);
}

TEST(AstraNetwork, SwitchAndFullyConnectedDimensionsLoad) {
  auto root = ConfigNode::load_string(
      "topology: [ Switch ]\nnpus_count: [ 8 ]\nbandwidth: [ 50.0 ]\nlatency: [ 500.0 ]\n", "network.yml");
  const auto sw = topology::load_astra_network(root);
  EXPECT_EQ(sw.kind(), Kind::switch_);
  EXPECT_EQ(sw.num_chips(), 8);
  EXPECT_EQ(sw.hop_count(0, 7), 2);
  EXPECT_DOUBLE_EQ(sw.link(sw.route(0, 7)[0]).bandwidth_gbps, 50.0 * 1.073741824);
  root = ConfigNode::load_string(
      "topology: [ Ring, FullyConnected, Switch ]\nnpus_count: [ 2, 4, 2 ]\nbandwidth: [ 100, 50, 25 ]\n"
      "latency: [ 10, 20, 30 ]\n", "network.yml");
  const auto st = topology::load_astra_network(root);
  EXPECT_EQ(st.kind(), Kind::stacked);
  EXPECT_EQ(st.dims(), (std::vector<int>{2, 4, 2}));
  EXPECT_EQ(st.dim_specs()[0].kind, DimKind::switch_);  // ASTRA-sim's last dimension is our first
  EXPECT_EQ(st.dim_specs()[2].kind, DimKind::ring);
  EXPECT_EQ(st.hop_count(0, 1), 1);                      // NPU 0 -> 1: the Ring (x0)
  EXPECT_DOUBLE_EQ(latency(st, 0, 2 * 3), 20.0);         // NPU 0 -> 6: x1 0 -> 3, one FullyConnected hop
  EXPECT_DOUBLE_EQ(latency(st, 0, 8), 60.0);             // NPU 0 -> 8: x2 0 -> 1 through the Switch
}

// ---- contention (sim::Timeline): the claims docs/MODEL.md makes ----

TEST(Contention, TwoFlowsOnOneLinkTakeTwiceAsLong) {
  auto t = Topology::ring(4, LinkSpec{10, 100});  // 10 GB/s = 10 B/ns
  sim::Timeline tl(0, t, sim::device_preset("generic"));
  const double S = 1e6;
  const auto a = tl.send("a", 1, S, 0);
  const auto b = tl.send("b", 1, S, 0);
  EXPECT_DOUBLE_EQ(a.end, 100 + S / 10);
  EXPECT_DOUBLE_EQ(b.end, 100 + 2 * S / 10);  // the second waits for the link: twice as long
}

TEST(Contention, FlowsOnDisjointLinksDoNotSlowEachOther) {
  auto t = Topology::ring(4, LinkSpec{10, 100});
  sim::Timeline tl(0, t, sim::device_preset("generic"));
  const auto a = tl.send("a", 1, 1e6, 0);  // + link
  const auto b = tl.send("b", 3, 1e6, 0);  // - link
  EXPECT_DOUBLE_EQ(a.end, b.end);
  EXPECT_DOUBLE_EQ(a.end, 100 + 1e5);
}

TEST(Contention, ASwitchUplinkIsSharedByEveryFlowOfTheChip) {
  // On a switch each chip has one uplink: flows to different chips still serialize on it.
  auto t = Topology::switched(4, LinkSpec{10, 100});
  sim::Timeline tl(0, t, sim::device_preset("generic"));
  const auto a = tl.send("a", 1, 1e6, 0);
  const auto b = tl.send("b", 2, 1e6, 0);
  EXPECT_DOUBLE_EQ(a.end, 200 + 1e5);
  EXPECT_DOUBLE_EQ(b.end, 200 + 2e5);
  // On a fully-connected network the same two flows use two links: no slowdown.
  auto fc = Topology::fully_connected(4, LinkSpec{10, 100});
  sim::Timeline tf(0, fc, sim::device_preset("generic"));
  EXPECT_DOUBLE_EQ(tf.send("a", 1, 1e6, 0).end, tf.send("b", 2, 1e6, 0).end);
}

TEST(Contention, SendSideSeesOnlyTheChipsOwnFlows) {
  // Each sender books only its own flows: two chips injecting into the same switch down-link get the same
  // sender-side arrival. The receiver's booking (below) is what queues them.
  auto t = Topology::switched(4, LinkSpec{10, 100});
  sim::Timeline c0(0, t, sim::device_preset("generic")), c1(1, t, sim::device_preset("generic"));
  const auto a = c0.send("a", 3, 1e6, 0);
  const auto b = c1.send("b", 3, 1e6, 0);
  EXPECT_DOUBLE_EQ(a.end, b.end);
}

// Incast: N chips send S bytes to chip 0 through one switch at once. The receiver books them on its down-link:
// the k-th (in (start, source) order) arrives at 2 alpha + k S/B, so the last after N transfers.
TEST(Contention, IncastThroughASwitchTakesNTimesOneTransfer) {
  const int n = 7;
  auto t = Topology::switched(n + 1, LinkSpec{10, 100});
  const double S = 1e6, one = S / 10;
  sim::Timeline rx(0, t, sim::device_preset("generic"));
  double last = 0;
  for (int src = 1; src <= n; ++src) {
    sim::Timeline tx(src, t, sim::device_preset("generic"));
    const auto span = tx.send("x", 0, S, 0);
    EXPECT_DOUBLE_EQ(span.end, 200 + one);  // alone, every flow would take one transfer
    const double at = rx.receive(src, S, span.start, span.end);
    EXPECT_DOUBLE_EQ(at, 200 + src * one);
    last = at;
  }
  EXPECT_NEAR((last - 200) / one, n, 1e-12);
}

// Two flows of different senders to one receiver crossing the same mesh link in the same direction take 2x; on
// a line 0-1-2-3 the flows 0->3 and 1->3 share links 1->2 and 2->3.
TEST(Contention, TwoFlowsCrossingOneMeshLinkTakeTwiceAsLong) {
  auto t = Topology::mesh({4}, {LinkSpec{10, 100}});
  const double S = 1e6, one = S / 10;
  sim::Timeline c0(0, t, sim::device_preset("generic")), c1(1, t, sim::device_preset("generic"));
  sim::Timeline rx(3, t, sim::device_preset("generic"));
  const auto a = c1.send("a", 3, S, 0);  // 2 hops
  const auto b = c0.send("b", 3, S, 0);  // 3 hops: its head reaches link 1->2 at alpha
  EXPECT_DOUBLE_EQ(rx.receive(1, S, a.start, a.end), 200 + one);
  // b's head reaches 1->2 at 100, when a holds it until 1e5: b waits until then and arrives 2 transfers later.
  EXPECT_DOUBLE_EQ(rx.receive(0, S, b.start, b.end), 1e5 - 100 + 300 + one);
  EXPECT_NEAR((rx.receive(0, 0, 0, 0)), 0, 0);  // empty messages are never booked
}

TEST(Contention, DisjointRoutesAndOneSendersFlowsDoNotMove) {
  // 2x2 mesh: 1 -> 3 (link 1->3) and 2 -> 3 (link 2->3) reach chip 3 over different links: no interference.
  auto t = Topology::mesh({2, 2}, {LinkSpec{10, 100}, LinkSpec{10, 100}});
  sim::Timeline c1(1, t, sim::device_preset("generic")), c2(2, t, sim::device_preset("generic"));
  sim::Timeline rx(3, t, sim::device_preset("generic"));
  const auto a = c1.send("a", 3, 1e6, 0), b = c2.send("b", 3, 1e6, 0);
  EXPECT_EQ(rx.receive(1, 1e6, a.start, a.end), a.end);
  EXPECT_EQ(rx.receive(2, 1e6, b.start, b.end), b.end);
  // Back-to-back flows of one sender on one link: the receiver books them where the sender put them, bit for
  // bit, in any order.
  auto ring = Topology::ring(4, LinkSpec{10, 100});
  sim::Timeline tx(0, ring, sim::device_preset("generic")), r1(1, ring, sim::device_preset("generic"));
  std::vector<sim::Span> spans;
  for (int i = 0; i < 5; ++i) spans.push_back(tx.send("x", 1, 1000.0 * (i + 1), 50.0 * i));
  for (int i : {3, 0, 4, 1, 2}) EXPECT_EQ(r1.receive(0, 1000.0 * (i + 1), spans[i].start, spans[i].end), spans[i].end);
}

TEST(Contention, LateBookedEarlyFlowFillsAGap) {
  // A flow booked after a later one still takes the gap before it (booking order only matters on overlap).
  auto t = Topology::switched(3, LinkSpec{10, 0});
  sim::Timeline rx(0, t, sim::device_preset("generic"));
  EXPECT_DOUBLE_EQ(rx.receive(1, 1000, 500, 600), 600);
  EXPECT_DOUBLE_EQ(rx.receive(2, 1000, 0, 100), 100);     // [0, 100) is free
  EXPECT_DOUBLE_EQ(rx.receive(2, 1000, 450, 550), 700);   // overlaps [500, 600): after it
  rx.reset();
  EXPECT_DOUBLE_EQ(rx.receive(2, 1000, 450, 550), 550);   // reset forgets the bookings
}

TEST(Contention, MultiHopIsCutThroughWithPerHopLatency) {
  auto t = Topology::mesh({4}, {LinkSpec{10, 100}});
  sim::Timeline tl(0, t, sim::device_preset("generic"));
  const auto a = tl.send("a", 3, 1e6, 0);  // 3 hops
  EXPECT_DOUBLE_EQ(a.end, 3 * 100 + 1e5);
  // A second flow to chip 1 shares only the first link: it waits for that link only.
  const auto b = tl.send("b", 1, 1e6, 0);
  EXPECT_DOUBLE_EQ(b.start, 1e5);
}

// Crossing flows (sim::Timeline::begin_step): the step's global pattern says which links flows of several
// senders share. On a line 0-1-2-3, 0 -> 2 and 1 -> 3 both cross 1 -> 2.
namespace {
struct StepRun {  // every chip of TOPO runs one step: the flows PAIRS (all of them, sent at time 0)
  std::vector<double> arrivals;  // per flow, at its receiver
};
StepRun run_step(const Topology& t, const std::vector<std::pair<int, int>>& pairs, double bytes, bool with_pattern) {
  const auto share = sim::StepShare::make(t, pairs);
  std::vector<std::unique_ptr<sim::Timeline>> tl;
  for (int c = 0; c < t.num_chips(); ++c) {
    tl.push_back(std::make_unique<sim::Timeline>(c, t, sim::device_preset("generic")));
    if (with_pattern) tl.back()->begin_step(&share);
  }
  std::vector<sim::Span> spans;
  for (const auto& [a, b] : pairs) spans.push_back(tl[static_cast<size_t>(a)]->send("x", b, bytes, 0));
  StepRun out;
  for (size_t i = 0; i < pairs.size(); ++i)
    out.arrivals.push_back(tl[static_cast<size_t>(pairs[i].second)]->receive(pairs[i].first, bytes, spans[i].start,
                                                                              spans[i].end));
  for (auto& x : tl) x->end_step();
  return out;
}
}  // namespace

TEST(Contention, CrossingFlowsOfDifferentSendersAndReceiversTakeTwiceAsLong) {
  auto t = Topology::mesh({4}, {LinkSpec{10, 100}});
  const double S = 1e6, one = S / 10;
  const std::vector<std::pair<int, int>> crossing{{0, 2}, {1, 3}};
  const auto share = sim::StepShare::make(t, crossing);
  EXPECT_TRUE(share.any_shared);
  const auto before = run_step(t, crossing, S, false);  // no pattern: each as if alone
  EXPECT_DOUBLE_EQ(before.arrivals[0], 200 + one);
  EXPECT_DOUBLE_EQ(before.arrivals[1], 200 + one);
  const auto now = run_step(t, crossing, S, true);  // link 1->2 carries both: B/2 each
  EXPECT_DOUBLE_EQ(now.arrivals[0], 200 + 2 * one);
  EXPECT_DOUBLE_EQ(now.arrivals[1], 200 + 2 * one);
  // Three flows over 1->2 (0->2, 1->3, 0->3): 3 transfers for each.
  const auto three = run_step(t, {{0, 2}, {1, 3}, {0, 3}}, S, true);
  EXPECT_DOUBLE_EQ(three.arrivals[1], 200 + 3 * one);
  EXPECT_DOUBLE_EQ(three.arrivals[2], 300 + 3 * one);
}

TEST(Contention, StepPatternLeavesDisjointAndOneSenderLinksBitForBit) {
  auto t = Topology::mesh({4}, {LinkSpec{10, 100}});
  // Disjoint routes: nothing shared, the step is a no-op.
  const std::vector<std::pair<int, int>> disjoint{{0, 1}, {2, 3}, {3, 2}};
  EXPECT_FALSE(sim::StepShare::make(t, disjoint).any_shared);
  EXPECT_EQ(run_step(t, disjoint, 1e6, true).arrivals, run_step(t, disjoint, 1e6, false).arrivals);
  // A ring shift (one sender per link, several lanes each): nothing shared, own flows still serialize.
  auto ring = Topology::ring(8, LinkSpec{10, 100});
  std::vector<std::pair<int, int>> shift;
  for (int r = 0; r < 8; ++r)
    for (int lane = 0; lane < 3; ++lane) shift.emplace_back(r, (r + 1) % 8);
  EXPECT_FALSE(sim::StepShare::make(ring, shift).any_shared);
  EXPECT_EQ(run_step(ring, shift, 1e5, true).arrivals, run_step(ring, shift, 1e5, false).arrivals);
  // Crossing on 1->2 does not touch 2->3's own flow 2->3 (route without a shared link): bit for bit.
  const std::vector<std::pair<int, int>> mixed{{0, 2}, {1, 2}, {2, 3}};
  EXPECT_TRUE(sim::StepShare::make(t, mixed).any_shared);
  EXPECT_EQ(run_step(t, mixed, 1e6, true).arrivals[2], run_step(t, mixed, 1e6, false).arrivals[2]);
}

// The patterns of the remaining SPMD steps (runtime::FlowPattern): Thakur's fold / unfold (halving-doubling and
// recursive doubling at p != 2^k) and one level of a binomial tree. On a line whose ranks sit on chips
// 0, 2, 1, 3, ... the fold 0 -> 1, 2 -> 3 runs chip 0 -> 2 and 1 -> 3, and tree level 1 (v -> v + 1 for even v)
// does the same: both cross link 1 -> 2, so each flow takes 2 S/B; with rank r on chip r their routes are
// disjoint and the pattern is a no-op (share_on returns nullptr: nothing moves, bit for bit).
std::vector<std::pair<int, int>> on_chips(std::vector<std::pair<int, int>> pairs, const std::vector<int>& chips) {
  for (auto& [a, b] : pairs) {
    a = chips[static_cast<size_t>(a)];
    b = chips[static_cast<size_t>(b)];
  }
  return pairs;
}

TEST(Contention, FoldAndUnfoldStepsCrossOnlyWhereThePlacementMakesThemCross) {
  using runtime::FlowPattern;
  using Pairs = std::vector<std::pair<int, int>>;
  EXPECT_EQ(FlowPattern::halving_doubling(0, false).pairs(6), (Pairs{{0, 1}, {2, 3}}));
  EXPECT_EQ(FlowPattern::halving_doubling(0, true).pairs(6), (Pairs{{1, 0}, {3, 2}}));
  EXPECT_EQ(FlowPattern::halving_doubling(0, false).pairs(7), (Pairs{{0, 1}, {2, 3}, {4, 5}}));
  EXPECT_TRUE(FlowPattern::halving_doubling(0, false).pairs(8).empty());  // 2^k: no fold
  auto line = Topology::mesh({6}, {LinkSpec{10, 100}});
  const double S = 1e6, one = S / 10;
  const std::vector<int> crossed{0, 2, 1, 3, 4, 5};
  for (bool unfold : {false, true}) {
    const auto pattern = FlowPattern::halving_doubling(0, unfold);
    ASSERT_NE(pattern.share_on(line, crossed), nullptr) << "unfold " << unfold;
    const auto flows = on_chips(pattern.pairs(6), crossed);  // 0->2, 1->3 (fold); 2->0, 3->1 (unfold)
    const auto now = run_step(line, flows, S, true), before = run_step(line, flows, S, false);
    for (size_t i = 0; i < flows.size(); ++i) {
      EXPECT_DOUBLE_EQ(before.arrivals[i], 200 + one) << "unfold " << unfold << " flow " << i;
      EXPECT_DOUBLE_EQ(now.arrivals[i], 200 + 2 * one) << "unfold " << unfold << " flow " << i;  // 2x: they cross
    }
    EXPECT_EQ(pattern.share_on(line, {0, 1, 2, 3, 4, 5}), nullptr) << "unfold " << unfold;  // disjoint: no-op
  }
}

TEST(Contention, BinomialTreeLevelsCrossOnlyWhereThePlacementMakesThemCross) {
  using runtime::FlowPattern;
  using Pairs = std::vector<std::pair<int, int>>;
  EXPECT_EQ(FlowPattern::binomial(2, 0, false).pairs(4), (Pairs{{0, 2}}));
  EXPECT_EQ(FlowPattern::binomial(1, 0, false).pairs(4), (Pairs{{0, 1}, {2, 3}}));
  EXPECT_EQ(FlowPattern::binomial(1, 1, false).pairs(4), (Pairs{{1, 2}, {3, 0}}));  // root-relative ranks
  EXPECT_EQ(FlowPattern::binomial(1, 1, true).pairs(4), (Pairs{{2, 1}, {0, 3}}));   // reduce: child -> parent
  EXPECT_EQ(FlowPattern::binomial(4, 0, false).pairs(6), (Pairs{{0, 4}}));
  EXPECT_EQ(FlowPattern::binomial(2, 0, false).pairs(6), (Pairs{{0, 2}}));           // 4 + 2 >= 6: no flow
  EXPECT_NE(FlowPattern::binomial(1, 0, false).key, FlowPattern::binomial(1, 0, true).key);
  EXPECT_NE(FlowPattern::binomial(1, 0, false).key, FlowPattern::binomial(1, 1, false).key);
  auto line = Topology::mesh({4}, {LinkSpec{10, 100}});
  const double S = 1e6, one = S / 10;
  const std::vector<int> crossed{0, 2, 1, 3};
  for (bool up : {false, true}) {
    const auto level = FlowPattern::binomial(1, 0, up);
    ASSERT_NE(level.share_on(line, crossed), nullptr) << "up " << up;
    const auto flows = on_chips(level.pairs(4), crossed);  // 0->2, 1->3 (broadcast); 2->0, 3->1 (reduce)
    const auto now = run_step(line, flows, S, true);
    for (size_t i = 0; i < flows.size(); ++i) EXPECT_DOUBLE_EQ(now.arrivals[i], 200 + 2 * one) << "up " << up;
    EXPECT_EQ(FlowPattern::binomial(2, 0, up).share_on(line, crossed), nullptr);  // one flow: nothing to share
  }
}

// Rank r on chip r, any root: a tree level's flows v -> v + mask for v = 0, 2 mask, ... are disjoint intervals of
// the rank order and the fold's pairs are neighbours, so on a line, a two-way ring, a 2x4 mesh, a switch and the
// full 2x4 torus no two senders meet and these patterns change nothing (bit for bit). Where they do meet with
// rank r on chip r: a one-way ring, whose flows against its direction (the reduce tree's child -> parent, the
// unfold's odd -> even) all go the long way round and overlap; and a torus that the group fills only in part
// (2x4 with p = 7: root 2's level 1 runs 6 -> 0 through (0,2) -> (0,3), the link of 2 -> 3).
TEST(Contention, TreeAndFoldPatternsMeetOnlyWhereFlowsOverlap) {
  using runtime::FlowPattern;
  const LinkSpec l{10, 100};
  auto identity = [](int p) {
    std::vector<int> chips(static_cast<size_t>(p));
    for (int r = 0; r < p; ++r) chips[static_cast<size_t>(r)] = r;
    return chips;
  };
  const std::vector<std::pair<std::string, Topology>> topos = {
      {"line 8", Topology::mesh({8}, {l})}, {"ring 8", Topology::ring(8, l)},
      {"mesh 2x4", Topology::mesh({2, 4}, {l, l})}, {"switch 8", Topology::switched(8, l)},
      {"torus 2x4", Topology::torus({2, 4}, {l, l})}};
  for (const auto& [name, t] : topos)
    for (int p = name == "torus 2x4" ? 8 : 2; p <= 8; ++p) {
      const auto chips = identity(p);
      for (bool rev : {false, true})
        EXPECT_EQ(FlowPattern::halving_doubling(0, rev).share_on(t, chips), nullptr) << name << " p " << p;
      for (int root = 0; root < p; ++root)
        for (int mask = 1; mask < p; mask *= 2)
          for (bool up : {false, true})
            EXPECT_EQ(FlowPattern::binomial(mask, root, up).share_on(t, chips), nullptr)
                << name << " p " << p << " root " << root << " mask " << mask << " up " << up;
    }
  const auto one_way = Topology::ring(8, l, false);
  for (int p = 4; p <= 8; ++p) {  // p = 3: level 1 is one flow
    const auto chips = identity(p);
    EXPECT_EQ(FlowPattern::binomial(1, 0, false).share_on(one_way, chips), nullptr) << "one-way p " << p;
    EXPECT_NE(FlowPattern::binomial(1, 0, true).share_on(one_way, chips), nullptr) << "one-way p " << p;
    if (p == 4 || p == 8) continue;
    EXPECT_EQ(FlowPattern::halving_doubling(0, false).share_on(one_way, chips), nullptr) << "one-way p " << p;
    if (p >= 6) {  // p = 5: one pair
      EXPECT_NE(FlowPattern::halving_doubling(0, true).share_on(one_way, chips), nullptr) << "one-way p " << p;
    }
  }
  EXPECT_NE(FlowPattern::binomial(1, 2, false).share_on(Topology::torus({2, 4}, {l, l}), identity(7)), nullptr);
}

TEST(Contention, AllToAllOnA2x4MeshMeetsTheFullContentionBound) {
  // Every chip sends S to every other at once. With dimension-order routes, link (0,1)->(0,2) carries 8 flows
  // ((0,0),(0,1),(1,0),(1,1) to (0,2),(0,3)): the step takes 8 S/B plus the longest such route, 4 alpha.
  auto t = Topology::mesh({2, 4}, {LinkSpec{100, 1000}, LinkSpec{100, 1000}});
  const double S = 1 << 20;
  std::vector<std::pair<int, int>> all;
  for (int a = 0; a < 8; ++a)
    for (int b = 0; b < 8; ++b)
      if (a != b) all.emplace_back(a, b);
  const auto share = sim::StepShare::make(t, all);
  EXPECT_EQ(*std::max_element(share.flows.begin(), share.flows.end()), 8u);
  const auto now = run_step(t, all, S, true);
  EXPECT_DOUBLE_EQ(*std::max_element(now.arrivals.begin(), now.arrivals.end()), 4 * 1000 + 8 * S / 100);
  // No flow beats the bound of its own busiest link.
  for (size_t i = 0; i < all.size(); ++i) {
    uint32_t k = 0;
    for (int id : t.route(all[i].first, all[i].second)) k = std::max(k, share.flows[static_cast<size_t>(id)]);
    EXPECT_GE(now.arrivals[i], k * S / 100) << all[i].first << "->" << all[i].second;
  }
}

TEST(Determinism, SameScheduleSameTimes) {
  auto run = [] {
    auto t = Topology::stacked({Dim{DimKind::switch_, 2, LinkSpec{25, 700}, true},
                                Dim{DimKind::ring, 4, LinkSpec{100, 100}, true}});
    sim::Timeline tl(3, t, sim::device_preset("generic"));
    std::vector<double> ends;
    for (int i = 0; i < 50; ++i) ends.push_back(tl.send("x", (i * 5) % 8, 1000.0 * (i + 1), i * 10.0).end);
    return ends;
  };
  EXPECT_EQ(run(), run());
}

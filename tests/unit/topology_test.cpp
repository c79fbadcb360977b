#include <gtest/gtest.h>

#include "common/config.h"
#include "common/error.h"
#include "topology/topology.h"
#include "topology/topology_yaml.h"

using shardsim::topology::LinkSpec;
using shardsim::topology::Topology;

TEST(Ring, NeighboursAndHops) {
  auto t = Topology::ring(8, LinkSpec{100, 500});
  EXPECT_EQ(t.num_chips(), 8);
  EXPECT_EQ(t.links().size(), 16u);  // two directed links per chip
  EXPECT_EQ(t.neighbors(0), (std::vector<int>{1, 7}));
  EXPECT_EQ(t.hop_count(0, 1), 1);
  EXPECT_EQ(t.hop_count(0, 7), 1);  // shorter way round
  EXPECT_EQ(t.hop_count(0, 3), 3);
  EXPECT_EQ(t.hop_count(0, 5), 3);
  EXPECT_EQ(t.hop_count(2, 2), 0);
  EXPECT_EQ(t.diameter(), 4);
}

TEST(Ring, ShorterDirectionAndTieGoesUp) {
  auto t = Topology::ring(6, LinkSpec{100, 500});
  auto r = t.route(0, 5);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(t.link(r[0]).dir, -1);
  auto tie = t.route(0, 3);
  ASSERT_EQ(tie.size(), 3u);
  for (int id : tie) EXPECT_EQ(t.link(id).dir, +1);
  // The route is a connected path from source to destination.
  int at = 1;
  for (int id : t.route(1, 4)) {
    EXPECT_EQ(t.link(id).src, at);
    at = t.link(id).dst;
  }
  EXPECT_EQ(at, 4);
}

TEST(Ring, Unidirectional) {
  auto t = Topology::ring(5, LinkSpec{10, 1}, /*bidirectional=*/false);
  EXPECT_EQ(t.links().size(), 5u);
  EXPECT_EQ(t.hop_count(0, 4), 4);
  EXPECT_EQ(t.hop_count(4, 0), 1);
}

TEST(Ring, TwoAndOneChips) {
  auto two = Topology::ring(2, LinkSpec{10, 1});
  EXPECT_EQ(two.links().size(), 2u);
  EXPECT_EQ(two.hop_count(0, 1), 1);
  EXPECT_EQ(two.hop_count(1, 0), 1);
  auto one = Topology::ring(1, LinkSpec{10, 1});
  EXPECT_TRUE(one.links().empty());
  EXPECT_EQ(one.hop_count(0, 0), 0);
}

TEST(Torus, CoordinatesRoundTrip) {
  auto t = Topology::torus({2, 3, 4}, {LinkSpec{50, 100}});
  EXPECT_EQ(t.num_chips(), 24);
  for (int c = 0; c < t.num_chips(); ++c) EXPECT_EQ(t.chip_at(t.coords(c)), c);
  EXPECT_EQ(t.coords(23), (std::vector<int>{1, 2, 3}));
}

TEST(Torus, DimensionOrderRouting) {
  auto t = Topology::torus({4, 4}, {LinkSpec{50, 100}, LinkSpec{25, 200}});
  const int src = t.chip_at({0, 0}), dst = t.chip_at({3, 2});
  auto r = t.route(src, dst);
  // dim 0: 0 -> 3 is one hop backwards (wrap); dim 1: 0 -> 2 is a tie, two hops forwards.
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(t.link(r[0]).dim, 0);
  EXPECT_EQ(t.link(r[0]).dir, -1);
  EXPECT_EQ(t.link(r[1]).dim, 1);
  EXPECT_EQ(t.link(r[2]).dim, 1);
  EXPECT_EQ(t.link(r[0]).bandwidth_gbps, 50);  // per-dimension link specs
  EXPECT_EQ(t.link(r[1]).bandwidth_gbps, 25);
  EXPECT_EQ(t.link(r.back()).dst, dst);
  EXPECT_EQ(t.diameter(), 4);
}

TEST(Torus, NeighboursIn3D) {
  auto t = Topology::torus({2, 2, 2}, {LinkSpec{50, 100}});
  // Size-2 dimensions have one link each way, so every chip has exactly 3 neighbours.
  for (int c = 0; c < 8; ++c) EXPECT_EQ(t.neighbors(c).size(), 3u);
  EXPECT_EQ(t.diameter(), 3);
  auto t2 = Topology::torus({3, 4}, {LinkSpec{50, 100}});
  EXPECT_EQ(t2.neighbors(0).size(), 4u);
}

TEST(Topology, RejectsBadShapes) {
  EXPECT_THROW(Topology::ring(0, LinkSpec{1, 1}), std::invalid_argument);
  EXPECT_THROW(Topology::ring(4, LinkSpec{-1, 1}), std::invalid_argument);
  EXPECT_THROW(Topology::torus({2, 0}, {LinkSpec{1, 1}}), std::invalid_argument);
  auto t = Topology::ring(4, LinkSpec{1, 1});
  EXPECT_THROW(t.route(0, 4), std::out_of_range);
}

// ASTRA-sim's analytical network.yml: stacked Rings become a torus, dimension 0 (innermost) last, GB = 2^30 B.
TEST(AstraNetwork, StackedRingsBecomeATorus) {
  const auto root = shardsim::ConfigNode::load_string(
      "topology: [ Ring, Ring ]\nnpus_count: [ 2, 4 ]\nbandwidth: [ 50.0, 25.0 ]\nlatency: [ 500.0, 100.0 ]\n",
      "network.yml");
  ASSERT_TRUE(shardsim::topology::is_astra_network(root));
  const auto t = shardsim::topology::load_astra_network(root);
  EXPECT_EQ(t.kind(), shardsim::topology::Kind::torus);
  ASSERT_EQ(t.dims(), (std::vector<int>{4, 2}));
  // ASTRA-sim NPU 1 is x0 = 1 (its dimension 0, our last): a neighbour over the 50 GB/s, 500 ns links.
  const auto l = t.link_between(0, 1);
  ASSERT_TRUE(l.has_value());
  EXPECT_DOUBLE_EQ(t.link(*l).bandwidth_gbps, 50.0 * 1073741824.0 / 1e9);
  EXPECT_DOUBLE_EQ(t.link(*l).latency_ns, 500.0);
  const auto l2 = t.link_between(0, 2);  // x1 = 1: ASTRA-sim's dimension 1
  ASSERT_TRUE(l2.has_value());
  EXPECT_DOUBLE_EQ(t.link(*l2).bandwidth_gbps, 25.0 * 1073741824.0 / 1e9);
  EXPECT_DOUBLE_EQ(t.link(*l2).latency_ns, 100.0);
}

TEST(AstraNetwork, UnsupportedAndMalformedDimensionsNameTheLine) {
  auto error_of = [](const std::string& text) {
    try {
      shardsim::topology::load_astra_network(shardsim::ConfigNode::load_string(text, "network.yml"));
    } catch (const shardsim::ConfigError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const std::string sw = error_of("topology: [ Ring, Torus ]\nnpus_count: [ 4, 2 ]\nbandwidth: [ 50, 50 ]\nlatency: [ 5, 5 ]\n");
  EXPECT_NE(sw.find("network.yml:1"), std::string::npos) << sw;
  EXPECT_NE(sw.find("unknown ASTRA-sim topology 'Torus'"), std::string::npos) << sw;
  const std::string nan = error_of("topology: [ Ring ]\nnpus_count: [ 4 ]\nbandwidth: [ .nan ]\nlatency: [ 5 ]\n");
  EXPECT_NE(nan.find("bandwidth[0]: must be a finite number"), std::string::npos) << nan;
  const std::string count = error_of("topology: [ Ring, Ring ]\nnpus_count: [ 4 ]\nbandwidth: [ 50, 50 ]\nlatency: [ 5, 5 ]\n");
  EXPECT_NE(count.find("network.yml:2"), std::string::npos) << count;
  const std::string bw = error_of("topology: [ Ring ]\nnpus_count: [ 4 ]\nbandwidth: [ -1 ]\nlatency: [ 5 ]\n");
  EXPECT_NE(bw.find("bandwidth[0]: must be a finite number > 0 within 0.001..1e+06 GB/s (got -1)"), std::string::npos) << bw;
}

// Clos / fat-tree topologies (topology/clos.h): the graph it builds, its closed-form metrics against the graph's
// own tables and the exact bisection search, and the loader's errors.
#include <gtest/gtest.h>

#include <string>

#include "common/config.h"
#include "common/error.h"
#include "topology/clos.h"
#include "topology/topology_yaml.h"

using namespace shardsim;
using topology::ClosSpec;
using topology::LinkSpec;

namespace {

ClosSpec spec(int c, int l, int p, double o_leaf, double o_pod) {
  ClosSpec s;
  s.chips_per_leaf = c;
  s.leaves_per_pod = l;
  s.pods = p;
  s.link = LinkSpec{50, 1000};
  s.leaf_oversubscription = o_leaf;
  s.pod_oversubscription = o_pod;
  return s;
}

std::string error_of(const std::string& yaml) {
  try {
    topology::load_topology(ConfigNode::load_string(yaml, "clos.yaml").child("topology"));
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST(Clos, ClosedFormsEqualTheGraphsTables) {
  for (const auto& s : {spec(4, 3, 2, 1, 7), spec(16, 4, 4, 1, 7), spec(8, 1, 3, 2, 1), spec(5, 2, 1, 1, 1),
                        spec(3, 1, 1, 1, 1), spec(1, 1, 1, 1, 1), spec(2, 2, 2, 3, 7)}) {
    const auto t = topology::clos(s);
    const auto m = topology::clos_metrics(s);
    SCOPED_TRACE(s.describe());
    EXPECT_EQ(t.num_chips(), s.chips());
    EXPECT_EQ(t.diameter(), m.diameter_hops);
    EXPECT_NEAR(t.average_hop_count(), m.average_hops, 1e-12);
    // Routes are the tree's: chip -> leaf -> pod switch -> core and back down.
    if (s.pods > 1) EXPECT_EQ(t.route(0, s.chips() - 1).size(), 6u);
  }
}

TEST(Clos, BisectionClosedFormEqualsTheExactSearch) {
  // Up to 22 nodes the exact search over balanced cuts runs: 8 chips + 4 leaves + 2 pod switches + 1 core.
  for (const auto& s : {spec(2, 2, 2, 1, 7), spec(2, 2, 2, 2, 1), spec(4, 4, 1, 1, 1), spec(4, 4, 1, 3, 1),
                        spec(8, 1, 1, 1, 1), spec(4, 1, 2, 1, 7)}) {
    SCOPED_TRACE(s.describe());
    const auto t = topology::clos(s);
    const auto exact = t.bisection_bandwidth_exact_gbps();
    const auto m = topology::clos_metrics(s);
    ASSERT_TRUE(exact.has_value());
    ASSERT_TRUE(m.bisection_gbps.has_value());
    EXPECT_NEAR(*m.bisection_gbps, *exact, 1e-9 * *exact);
  }
  // Llama 3's cluster shape at 1:7: half of the pods' up-links, (P/2) x (3072 x 50 / 7) GB/s.
  const auto m = topology::clos_metrics(spec(16, 192, 8, 1, 7));
  ASSERT_TRUE(m.bisection_gbps.has_value());
  EXPECT_DOUBLE_EQ(*m.bisection_gbps, 4 * 3072 * 50.0 / 7);
  EXPECT_FALSE(topology::clos_metrics(spec(4, 2, 3, 1, 7)).bisection_gbps.has_value());  // odd pods
}

TEST(Clos, UpLinksCarryTheTiersShareOfBandwidth) {
  const auto s = spec(4, 2, 2, 2, 7);
  const auto t = topology::clos(s);
  // chip 0 -> chip 15: chip->leaf (50), leaf->pod (4 x 50 / 2 = 100), pod->core (2 x 100 / 7), and back down.
  const auto r = t.route(0, 15);
  ASSERT_EQ(r.size(), 6u);
  EXPECT_DOUBLE_EQ(t.link(r[0]).bandwidth_gbps, 50);
  EXPECT_DOUBLE_EQ(t.link(r[1]).bandwidth_gbps, 100);
  EXPECT_DOUBLE_EQ(t.link(r[2]).bandwidth_gbps, 200.0 / 7);
  EXPECT_DOUBLE_EQ(t.link(r[3]).bandwidth_gbps, 200.0 / 7);
  EXPECT_DOUBLE_EQ(t.link(r[5]).bandwidth_gbps, 50);
}

TEST(Clos, LoadsFromYamlAndNamesBadKeys) {
  const auto t = topology::load_topology(
      ConfigNode::load_string("topology:\n  kind: clos\n  chips_per_leaf: 4\n  leaves_per_pod: 2\n  pods: 2\n"
                              "  bandwidth_gbps: 50\n  latency_ns: 500\n  pod_oversubscription: 7\n",
                              "clos.yaml")
          .child("topology"));
  EXPECT_EQ(t.num_chips(), 16);
  EXPECT_EQ(t.num_nodes(), 16 + 4 + 2 + 1);
  const auto bad = [](const std::string& extra) {
    return error_of("topology:\n  kind: clos\n  chips_per_leaf: 4\n  pods: 2\n  bandwidth_gbps: 50\n" + extra);
  };
  EXPECT_NE(bad("  pod_oversubscription: 0.5\n").find("clos.yaml:6: topology.pod_oversubscription: must be a finite "
                                                      "number >= 1"),
            std::string::npos)
      << bad("  pod_oversubscription: 0.5\n");
  EXPECT_NE(bad("  chips: 9\n").find("topology.chips: 9 chips, but"), std::string::npos) << bad("  chips: 9\n");
  EXPECT_NE(bad("  racks: 2\n").find("racks"), std::string::npos) << bad("  racks: 2\n");
  EXPECT_NE(bad("  leaves_per_pod: 2048\n").find("at most 4096"), std::string::npos) << bad("  leaves_per_pod: 2048\n");
  EXPECT_NE(error_of("topology:\n  kind: clos\n  pods: 2\n  bandwidth_gbps: 50\n").find("chips_per_leaf"),
            std::string::npos);
}

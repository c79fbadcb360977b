#include <gtest/gtest.h>

#include <map>

#include "sharding/trace.h"

using namespace shardsim;

TEST(Trace, ValidEventsAndNoOverlapPerEngine) {
  auto topo = topology::Topology::ring(4, topology::LinkSpec{10, 100});
  sim::Timeline tl(1, topo, sim::device_preset("generic"));
  double t = 0;
  for (int i = 0; i < 5; ++i) {
    t = tl.compute("gemm", 1e8, 1e6, sim::Precision::fp32, t - 500).end;  // ready before the engine is free
    tl.send("to2", 2, 4096, t);
    tl.send("to2 again", 2, 4096, t);  // same port: must queue
    tl.send("to0", 0, 4096, t);
  }
  tl.record_region("all_reduce", "collective", {0, t});
  // Round-trip through text, as a viewer would read it.
  auto ev = nlohmann::json::parse(sharding::trace_events(tl).dump());
  ASSERT_TRUE(ev.is_array());
  std::map<int, std::vector<std::pair<double, double>>> by_tid;
  int spans = 0;
  for (const auto& e : ev) {
    ASSERT_TRUE(e.contains("ph"));
    EXPECT_EQ(e["pid"], 1);
    if (e["ph"] != "X") continue;
    ++spans;
    ASSERT_TRUE(e.contains("ts") && e.contains("dur") && e.contains("name"));
    EXPECT_GE(e["dur"].get<double>(), 0.0);
    by_tid[e["tid"].get<int>()].push_back({e["ts"].get<double>(), e["ts"].get<double>() + e["dur"].get<double>()});
  }
  EXPECT_EQ(spans, 5 * 4 + 1);
  EXPECT_EQ(by_tid.size(), 4u);  // compute, two ports, collectives
  const int collectives_tid = tl.num_engines();
  for (auto& [tid, v] : by_tid) {
    if (tid == collectives_tid) continue;
    std::sort(v.begin(), v.end());
    for (size_t i = 1; i < v.size(); ++i) EXPECT_LE(v[i - 1].second, v[i].first + 1e-9) << "engine " << tid;
  }
}

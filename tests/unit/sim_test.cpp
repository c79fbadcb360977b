#include <gtest/gtest.h>

#include "sim/cost.h"
#include "sim/timeline.h"

using namespace shardsim;
using topology::LinkSpec;
using topology::Topology;

namespace {
sim::DeviceSpec dev() {
  sim::DeviceSpec d;
  d.name = "t";
  d.peak_tflops_fp32 = 10;   // 1e4 FLOP per ns
  d.peak_tflops_bf16 = 40;
  d.hbm_gbps = 100;          // 100 B per ns
  d.hbm_gib = 1;
  d.launch_overhead_ns = 5;
  return d;
}
}  // namespace

TEST(Cost, RooflineTakesTheSlowerBound) {
  // compute bound: 1e6 FLOP / 1e4 = 100 ns > 1000 B / 100 = 10 ns
  EXPECT_DOUBLE_EQ(sim::compute_time_ns(dev(), 1e6, 1000, sim::Precision::fp32), 105.0);
  // bf16 has 4x the FLOP/s
  EXPECT_DOUBLE_EQ(sim::compute_time_ns(dev(), 1e6, 1000, sim::Precision::bf16), 30.0);
  // memory bound
  EXPECT_DOUBLE_EQ(sim::compute_time_ns(dev(), 1e3, 1e5, sim::Precision::fp32), 1005.0);
}

TEST(Cost, TransferIsAlphaPlusSizeOverBandwidthPerRoute) {
  auto t = Topology::ring(8, LinkSpec{100, 500});
  auto c1 = sim::transfer_cost(t, t.route(0, 1), 1e6);
  EXPECT_DOUBLE_EQ(c1.total_ns(), 500 + 1e6 / 100);
  auto c3 = sim::transfer_cost(t, t.route(0, 3), 1e6);  // three hops, cut-through
  EXPECT_DOUBLE_EQ(c3.latency_ns, 1500);
  EXPECT_DOUBLE_EQ(c3.occupancy_ns, 1e4);
  auto torus = Topology::torus({2, 4}, {LinkSpec{50, 100}, LinkSpec{25, 10}});
  auto ct = sim::transfer_cost(torus, torus.route(0, torus.chip_at({1, 1})), 1000);
  EXPECT_DOUBLE_EQ(ct.latency_ns, 110);
  EXPECT_DOUBLE_EQ(ct.occupancy_ns, 1000.0 / 25);  // bottleneck link
}

TEST(Timeline, SendsOnOnePortSerialize) {
  auto t = Topology::ring(4, LinkSpec{100, 50});
  sim::Timeline tl(0, t, dev());
  auto a = tl.send("a", 1, 1000, 0);  // 10 ns on the port, arrives at 60
  auto b = tl.send("b", 1, 1000, 0);  // same port: waits for a
  EXPECT_DOUBLE_EQ(a.start, 0);
  EXPECT_DOUBLE_EQ(a.end, 60);
  EXPECT_DOUBLE_EQ(b.start, 10);
  EXPECT_DOUBLE_EQ(b.end, 70);
}

TEST(Timeline, SendsOnDifferentPortsOverlap) {
  auto t = Topology::ring(4, LinkSpec{100, 50});
  sim::Timeline tl(0, t, dev());
  auto a = tl.send("a", 1, 1000, 0);
  auto b = tl.send("b", 3, 1000, 0);  // the -1 port
  EXPECT_DOUBLE_EQ(a.start, b.start);
  EXPECT_DOUBLE_EQ(a.end, b.end);
}

TEST(Timeline, ComputeSerializesAndStartsWhenReady) {
  auto t = Topology::ring(2, LinkSpec{100, 50});
  sim::Timeline tl(0, t, dev());
  auto a = tl.compute("a", 1e6, 0, sim::Precision::fp32, 0);      // 0..105
  auto b = tl.compute("b", 1e6, 0, sim::Precision::fp32, 50);     // waits for the engine
  auto c = tl.compute("c", 1e6, 0, sim::Precision::fp32, 1000);   // waits for its input
  EXPECT_DOUBLE_EQ(a.end, 105);
  EXPECT_DOUBLE_EQ(b.start, 105);
  EXPECT_DOUBLE_EQ(c.start, 1000);
}

TEST(Timeline, BreakdownSeparatesExposedCommunication) {
  auto t = Topology::ring(2, LinkSpec{100, 50});
  sim::Timeline tl(0, t, dev());
  tl.compute("c", 1e6, 0, sim::Precision::fp32, 0);        // [0, 105]
  tl.record_region("ar", "collective", {50, 300});          // overlaps compute for 55 ns
  tl.compute("d", 1e6, 0, sim::Precision::fp32, 300);       // [300, 405]
  auto b = tl.breakdown();
  EXPECT_DOUBLE_EQ(b.total, 405);
  EXPECT_DOUBLE_EQ(b.compute, 210);
  EXPECT_DOUBLE_EQ(b.communication, 250);
  EXPECT_DOUBLE_EQ(b.exposed_comm, 195);
  EXPECT_DOUBLE_EQ(b.flops, 2e6);
}

TEST(Timeline, SelfSendIsFree) {
  auto t = Topology::ring(2, LinkSpec{100, 50});
  sim::Timeline tl(1, t, dev());
  auto s = tl.send("self", 1, 1e9, 42);
  EXPECT_DOUBLE_EQ(s.start, 42);
  EXPECT_DOUBLE_EQ(s.end, 42);
}

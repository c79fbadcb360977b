// The critical path across chips (sim/critical_path.h) on graphs whose answer is known: a hand-built chain across
// 3 chips, and the same chain booked through real Timelines (dependency recording), where every time follows
// from the roofline and alpha-beta terms by hand.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "sim/critical_path.h"
#include "sim/timeline.h"
#include "topology/topology.h"

using namespace shardsim;
using sim::Bound;
using sim::Event;

namespace {

Event ev(const std::string& name, const std::string& cat, int engine, double start, double end, std::uint64_t id,
         std::uint64_t producer, Bound b, int peer = -1) {
  Event e;
  e.name = name;
  e.category = cat;
  e.engine = engine;
  e.span = {start, end};
  e.peer = peer;
  e.id = id;
  e.producer = producer;
  e.bound = b;
  return e;
}

std::uint64_t id(int chip, std::uint64_t n) { return (static_cast<std::uint64_t>(chip + 1) << 40) | n; }

// Each timeline's events followed by its receives, as the profiler reads them.
std::vector<sim::ChipEvents> chip_events(const std::vector<sim::Timeline>& tl) {
  std::vector<sim::ChipEvents> chips;
  for (const auto& t : tl) {
    sim::ChipEvents ce{t.chip(), t.events()};
    ce.events.insert(ce.events.end(), t.receives().begin(), t.receives().end());
    chips.push_back(std::move(ce));
  }
  return chips;
}

// chip 0: gemm [0,10] -> send to 1 [10,14]; chip 1: recv [14,15] -> gemm [15,35] -> send to 2 [35,37];
// chip 2: recv [37,40] -> norm [40,46]. Distractors: chip 0's idle kernel [20,30], chip 2's early kernel [0,5].
std::vector<sim::ChipEvents> chain() {
  std::vector<sim::ChipEvents> c(3);
  c[0].chip = 0;
  c[0].events = {ev("gemm", "compute", 0, 0, 10, id(0, 1), 0, Bound::compute),
                 ev("send0", "send", 1, 10, 14, id(0, 2), id(0, 1), Bound::link, 1),
                 ev("other", "compute", 0, 20, 30, id(0, 3), id(0, 1), Bound::hbm)};
  c[1].chip = 1;
  c[1].events = {ev("gemm", "compute", 0, 15, 35, id(1, 2), id(1, 1), Bound::compute),
                 ev("send1", "send", 1, 35, 37, id(1, 3), id(1, 2), Bound::latency, 2),
                 ev("all_reduce", "collective", -1, 14, 37, id(1, 4), id(1, 3), Bound::none),
                 ev("recv", "recv", -2, 14, 15, id(1, 1), id(0, 2), Bound::latency, 0)};
  c[2].chip = 2;
  c[2].events = {ev("early", "compute", 0, 0, 5, id(2, 1), 0, Bound::compute),
                 ev("norm", "compute", 0, 40, 46, id(2, 3), id(2, 2), Bound::hbm),
                 ev("recv", "recv", -2, 37, 40, id(2, 2), id(1, 3), Bound::latency, 1)};
  return c;
}

}  // namespace

TEST(CriticalPath, ChainAcrossThreeChips) {
  const auto c = chain();
  const auto p = sim::critical_path(c);
  EXPECT_EQ(p.end, 46);
  ASSERT_EQ(p.steps.size(), 7u);
  const std::vector<std::pair<int, std::string>> want = {{0, "gemm"},  {0, "send0"}, {1, "recv"}, {1, "gemm"},
                                                         {1, "send1"}, {2, "recv"},  {2, "norm"}};
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(p.steps[i].chip, want[i].first) << i;
    EXPECT_EQ(c[static_cast<size_t>(p.steps[i].chip)].events[p.steps[i].index].name, want[i].second) << i;
  }
  EXPECT_EQ(p.waiting, 0);

  const auto pr = sim::profile(chain());
  // Path time per class: compute 10 + 20, link 4, latency 1 + 2 + 3, HBM 6; it adds up to the end.
  EXPECT_EQ(pr.path_by_class[size_t(sim::TimeClass::compute)], 30);
  EXPECT_EQ(pr.path_by_class[size_t(sim::TimeClass::link)], 4);
  EXPECT_EQ(pr.path_by_class[size_t(sim::TimeClass::latency)], 6);
  EXPECT_EQ(pr.path_by_class[size_t(sim::TimeClass::hbm)], 6);
  EXPECT_EQ(pr.path_by_class[size_t(sim::TimeClass::waiting)], 0);
  // Chip 1 holds the most path time (recv 1 + gemm 20 + send 2), then chip 0 (14), chip 2 (9).
  ASSERT_EQ(pr.chip_time.size(), 3u);
  EXPECT_EQ(pr.chip_time[0], (std::pair<int, double>{1, 23}));
  EXPECT_EQ(pr.chip_time[1], (std::pair<int, double>{0, 14}));
  EXPECT_EQ(pr.chip_time[2], (std::pair<int, double>{2, 9}));
  ASSERT_FALSE(pr.bottlenecks.empty());
  EXPECT_EQ(pr.bottlenecks[0].op, "gemm");
  EXPECT_EQ(pr.bottlenecks[0].time, 30);
  EXPECT_EQ(pr.bottlenecks[0].chips, 2);
  // Chip 2's norm idled 35 ns (after `early` ended at 5) for chip 1's send1.
  ASSERT_FALSE(pr.waits.empty());
  EXPECT_EQ(pr.waits[0].chip, 2);
  EXPECT_EQ(pr.waits[0].on_chip, 1);
  EXPECT_EQ(pr.waits[0].on_op, "sendN");
  EXPECT_EQ(pr.waits[0].time, 35);
}

TEST(CriticalPath, MissingProducerIsWaiting) {
  auto c = chain();
  c[1].events[3].producer = id(0, 99);  // chip 1's recv: its send is not recorded
  const auto p = sim::critical_path(c);
  ASSERT_EQ(p.steps.size(), 5u);
  EXPECT_EQ(p.steps[0].chip, 1);
  EXPECT_EQ(p.waiting, 14);  // [0, 14) before chip 1's recv
}

TEST(CriticalPath, ProducerLoopIsAnError) {
  auto c = chain();
  c[0].events[0].producer = id(2, 3);  // chip 0's first gemm "waits" for chip 2's last op
  EXPECT_THROW(sim::critical_path(c), std::invalid_argument);
}

// The same kind of chain booked through Timelines: chip 0 computes and sends to chip 1, which computes and sends
// to chip 2, which computes. Line of 3 chips, 100 GB/s, 1000 ns per hop; 1e6 FLOPs at 10 TFLOP/s = 100 ns + 5 ns
// launch; 1e5 bytes take 1000 ns on a link.
TEST(CriticalPath, TimelinesRecordTheChain) {
  const auto topo = topology::Topology::ring(3, topology::LinkSpec{100, 1000});
  sim::DeviceSpec d;
  d.peak_tflops_fp32 = 10;
  d.peak_tflops_bf16 = 40;
  d.hbm_gbps = 100;
  d.hbm_gib = 1;
  d.launch_overhead_ns = 5;
  std::vector<sim::Timeline> tl;
  for (int c = 0; c < 3; ++c) {
    tl.emplace_back(c, topo, d);
    tl.back().set_record_dependencies(true);
  }
  using P = sim::Precision;
  tl[2].compute("early", 1e4, 0, P::fp32, 0, {});  // 6 ns, not on the path
  double ready = tl[0].compute("gemm", 1e6, 0, P::fp32, 0, {}).end;  // 105
  for (int c = 0; c < 2; ++c) {
    const sim::Span s = tl[static_cast<size_t>(c)].send("send", c + 1, 1e5, ready);
    const double arrival = tl[static_cast<size_t>(c) + 1].receive(c, 1e5, s.start, s.end,
                                                                 tl[static_cast<size_t>(c)].last_send_id(),
                                                                 tl[static_cast<size_t>(c)].last_send_end());
    ready = tl[static_cast<size_t>(c) + 1].compute("gemm", 1e6, 0, P::fp32, arrival, {}).end;
  }
  // 105 + (1000 + 1000 + 105) * 2 = 4315.
  EXPECT_EQ(ready, 4315);
  const std::vector<sim::ChipEvents> chips = chip_events(tl);
  const auto pr = sim::profile(chips);
  EXPECT_EQ(pr.path.end, 4315);
  EXPECT_EQ(pr.path.waiting, 0);
  ASSERT_EQ(pr.path.steps.size(), 7u);
  const std::vector<std::string> names = {"gemm", "send", "recv", "gemm", "send", "recv", "gemm"};
  for (size_t i = 0; i < names.size(); ++i) {
    const auto& s = pr.path.steps[i];
    EXPECT_EQ(s.chip, static_cast<int>((i + 1) / 3)) << i;
    EXPECT_EQ(pr.chips[static_cast<size_t>(s.chip)].events[s.index].name, names[i]) << i;
  }
  EXPECT_EQ(pr.path_by_class[size_t(sim::TimeClass::compute)], 315);
  EXPECT_EQ(pr.path_by_class[size_t(sim::TimeClass::link)], 2000);     // S/B = alpha: occupancy >= latency
  EXPECT_EQ(pr.path_by_class[size_t(sim::TimeClass::latency)], 2000);  // the flights
  // Ids are unique and name their chip.
  for (const auto& ce : chips)
    for (const auto& e : ce.events) EXPECT_EQ(sim::chip_of_event(e.id), ce.chip);
}

// Recording dependencies changes no simulated time.
TEST(CriticalPath, RecordingChangesNoTime) {
  const auto topo = topology::Topology::ring(4, topology::LinkSpec{50, 700});
  sim::DeviceSpec d;
  d.peak_tflops_fp32 = 3;
  d.peak_tflops_bf16 = 7;
  d.hbm_gbps = 33;
  d.hbm_gib = 1;
  d.launch_overhead_ns = 3;
  std::vector<std::vector<double>> ends(2);
  for (int on = 0; on < 2; ++on) {
    sim::Timeline t(0, topo, d), r(1, topo, d);
    t.set_record_dependencies(on);
    r.set_record_dependencies(on);
    double ready = 0;
    for (int i = 0; i < 50; ++i) {
      ready = t.compute("k", 1e5 * (i % 7), 3e4 * (i % 5), sim::Precision::fp32, ready * 0.5, {}).end;
      const auto s = t.send("s", 1 + i % 3, 1e4 * (i % 4 + 1), ready - 10);
      ends[size_t(on)].push_back(s.end);
      ends[size_t(on)].push_back(r.receive(0, 1e4 * (i % 4 + 1), s.start, s.end, t.last_send_id(), t.last_send_end()));
    }
    ends[size_t(on)].push_back(t.end_time());
  }
  EXPECT_EQ(ends[0], ends[1]);
}

// Eager launch: kernels shorter than the host's issue time start when the host issues them. The path runs through
// the host's issue (host_launch events) and a host_sync back to the device event the host waited for, so it covers
// the whole run with no unexplained waiting (before this, a host-bound kernel had no producer and a Llama-3-70B step
// on h100 was 97.8 % "waiting"). Recording them changes no simulated time.
TEST(CriticalPath, HostBoundKernelsChainThroughTheHost) {
  const auto topo = topology::Topology::ring(2, topology::LinkSpec{50, 700});
  sim::DeviceSpec d;
  d.peak_tflops_fp32 = 1;
  d.hbm_gbps = 1000;
  d.hbm_gib = 1;
  d.launch_overhead_ns = 100;
  d.host_launch_ns = 1000;  // each kernel below runs 100 ns + 1e4 flops / 1 TFLOP/s = 110 ns: host-bound
  std::vector<double> ends[2];
  for (int on = 0; on < 2; ++on) {
    sim::Timeline t(0, topo, d);
    t.set_record_dependencies(on);
    double end = 0;
    for (int i = 0; i < 5; ++i) end = t.compute("small", 1e4, 0, sim::Precision::fp32, 0, {}).end;
    const double big = t.compute("big", 1e8, 0, sim::Precision::fp32, end, {}).end;  // 100.1 us: the host runs ahead
    t.host_sync(big);  // the host reads a value back (as the gradient norm's .item())
    for (int i = 0; i < 3; ++i) end = t.compute("after_sync", 1e4, 0, sim::Precision::fp32, 0, {}).end;
    ends[on] = {big, end, t.end_time()};
    if (!on) continue;
    EXPECT_DOUBLE_EQ(end, big + 3 * 1000 + 110);  // three host issues after the sync, then the kernel
    std::vector<sim::ChipEvents> chips{sim::ChipEvents(0, t.events())};
    const auto p = sim::critical_path(chips);
    EXPECT_DOUBLE_EQ(p.end, end);
    EXPECT_DOUBLE_EQ(p.waiting, 0);
    int host_steps = 0;
    bool big_on_path = false;
    for (const auto& s : p.steps) {
      const auto& e = chips[0].events[s.index];
      host_steps += e.engine == sim::Timeline::kHostEngine;
      big_on_path = big_on_path || e.name == "big";
    }
    EXPECT_TRUE(big_on_path);  // the sync's device event is on the path
    EXPECT_EQ(host_steps, 9);  // every kernel here is host-bound: the 5 small ones, big, the 3 after the sync
  }
  EXPECT_EQ(ends[0], ends[1]);
}

// Issue 46 (kind 4): an in-switch reduction's down-link receive comes from the switch node; with the producing
// chip's send as its producer it names that chip as its peer (not the switch, "chip 24" of a 16-chip job), and the
// path crosses the switch to the sending chip.
TEST(CriticalPath, ReceiveFromASwitchNamesTheSendingChip) {
  const auto topo = topology::Topology::switched(2, topology::LinkSpec{100, 1000});
  sim::DeviceSpec d;
  d.peak_tflops_fp32 = 10;
  d.peak_tflops_bf16 = 40;
  d.hbm_gbps = 100;
  d.hbm_gib = 1;
  std::vector<sim::Timeline> tl;
  for (int c = 0; c < 2; ++c) {
    tl.emplace_back(c, topo, d);
    tl.back().set_record_dependencies(true);
  }
  const int sw = topo.num_chips();  // the switch node
  const double ready = tl[0].compute("gemm", 1e6, 0, sim::Precision::fp32, 0, {}).end;
  const sim::Span up = tl[0].send("up", sw, 1e5, ready);
  const double at = tl[1].receive(sw, 1e5, up.end, up.end + 2000, tl[0].last_send_id(), tl[0].last_send_end());
  ASSERT_EQ(tl[1].receives().size(), 1u);
  EXPECT_EQ(tl[1].receives()[0].peer, 0);
  const std::vector<sim::ChipEvents> chips = chip_events(tl);
  const auto path = sim::critical_path(chips);
  EXPECT_EQ(path.end, at);
  EXPECT_EQ(path.waiting, 0);
  ASSERT_EQ(path.steps.size(), 3u);  // gemm and up-send on chip 0, the receive on chip 1
  EXPECT_EQ(path.steps[0].chip, 0);
  EXPECT_EQ(path.steps[2].chip, 1);
  // Without a producer the receive still names the switch (nothing better is known).
  EXPECT_EQ(tl[1].receive(sw, 1e5, at, at + 2000), at + 2000);
  EXPECT_EQ(tl[1].receives().back().peer, sw);
}

// Issue 46 (kind 13): in a long step a producer's entry must not be lost. A send whose data was ready at an early
// kernel's end is booked after 20,000 other kernels have ended on its chip: the table of 4,096 direct-mapped slots
// that looked producers up lost such entries (a slot shared with a later end: here with probability 99 %), the
// critical path stopped there and everything before it counted as "waiting" (94.7 % of a full Llama-3-70B step).
TEST(CriticalPath, AProducerIsFoundAfterManyLaterEnds) {
  const auto topo = topology::Topology::ring(2, topology::LinkSpec{100, 1000});
  sim::DeviceSpec d;
  d.peak_tflops_fp32 = 10;
  d.peak_tflops_bf16 = 40;
  d.hbm_gbps = 100;
  d.hbm_gib = 1;
  d.launch_overhead_ns = 5;
  sim::Timeline t(0, topo, d), r(1, topo, d);
  t.set_record_dependencies(true);
  r.set_record_dependencies(true);
  const sim::Span first = t.compute("first", 1e6, 0, sim::Precision::fp32, 0, {});
  const std::uint64_t first_id = t.events().back().id;
  for (int i = 0; i < 20000; ++i) t.compute("later", 1e3 * (1 + i % 13), 0, sim::Precision::fp32, 0, {});
  const sim::Span s = t.send("send", 1, 1e5, first.end);  // the port is free: it starts when the data is ready
  EXPECT_EQ(s.start, first.end);
  EXPECT_EQ(t.events().back().producer, first_id);
  // And through the profiler: the receive's chain reaches the first kernel, with no waiting.
  const double arrival = r.receive(0, 1e5, s.start, s.end, t.last_send_id(), t.last_send_end());
  r.compute("use", 1e10, 0, sim::Precision::fp32, arrival, {});  // 1 ms: ends after chip 0's kernels
  std::vector<sim::ChipEvents> chips;
  for (auto* tl : {&t, &r}) {
    sim::ChipEvents ce{tl->chip(), tl->events()};
    ce.events.insert(ce.events.end(), tl->receives().begin(), tl->receives().end());
    chips.push_back(std::move(ce));
  }
  const auto p = sim::critical_path(chips);
  EXPECT_EQ(p.waiting, 0);
  ASSERT_EQ(p.steps.size(), 4u);  // first -> send -> recv -> use
  EXPECT_EQ(chips[0].events[p.steps[0].index].name, "first");
  EXPECT_EQ(chips[1].events[p.steps[3].index].name, "use");
}

// The profiler's events keep their names interned (one copy per distinct name) and its index finds every id.
TEST(CriticalPath, EventIndexFindsEveryIdAndNamesAreShared) {
  const auto c = chain();
  const sim::EventIndex index(c);
  size_t n = 0;
  for (const auto& ce : c)
    for (const auto& e : ce.events) {
      ASSERT_NE(index.find(e.id), nullptr) << e.name;
      EXPECT_EQ(index.find(e.id), &e);
      ++n;
    }
  EXPECT_EQ(index.size(), n);
  EXPECT_EQ(index.find(id(5, 1)), nullptr);
  EXPECT_EQ(index.find(0), nullptr);
  EXPECT_EQ(c[0].events[0].name.data(), c[1].events[0].name.data());  // both "gemm": one pooled copy
  EXPECT_EQ(sim::intern_name("gemm").data(), c[0].events[0].name.data());
}

// A collective call's fixed cost (topology protocol call_overhead_ns) is an event of its own on the host lane
// (Timeline::fixed_cost): the send after it has the cost as its producer, the cost has the kernel before it, so the
// path covers the run with no waiting (with call_overhead_ns 2000 the default MLP's path was 78 % "waiting").
// Recording it changes no simulated time.
TEST(CriticalPath, ACallsFixedCostIsOnThePath) {
  const auto topo = topology::Topology::ring(2, topology::LinkSpec{100, 1000});
  sim::DeviceSpec d;
  d.peak_tflops_fp32 = 10;
  d.hbm_gbps = 100;
  d.hbm_gib = 1;
  d.launch_overhead_ns = 5;
  std::vector<double> ends[2];
  for (int on = 0; on < 2; ++on) {
    std::vector<sim::Timeline> tl;
    for (int c = 0; c < 2; ++c) {
      tl.emplace_back(c, topo, d);
      tl.back().set_record_dependencies(on);
    }
    const double k = tl[0].compute("gemm", 1e6, 0, sim::Precision::fp32, 0, {}).end;  // 105
    const double go = tl[0].fixed_cost("all_reduce.launch", k, 2000);
    EXPECT_EQ(go, k + 2000);
    const sim::Span s = tl[0].send("send", 1, 1e5, go);
    const double arrival = tl[1].receive(0, 1e5, s.start, s.end, tl[0].last_send_id(), tl[0].last_send_end());
    const double end = tl[1].compute("norm", 1e6, 0, sim::Precision::fp32, arrival, {}).end;
    ends[on] = {go, s.start, s.end, arrival, end, tl[0].end_time(), tl[1].end_time()};
    if (!on) {
      for (const auto& e : tl[0].events()) EXPECT_NE(e.name, "all_reduce.launch");  // bookkeeping of recording only
      continue;
    }
    const std::vector<sim::ChipEvents> chips = chip_events(tl);
    const auto p = sim::critical_path(chips);
    EXPECT_DOUBLE_EQ(p.end, end);
    EXPECT_DOUBLE_EQ(p.waiting, 0);
    std::vector<std::string> names;
    for (const auto& st : p.steps) names.push_back(std::string(chips[size_t(st.chip)].events[st.index].name));
    EXPECT_EQ(names, (std::vector<std::string>{"gemm", "all_reduce.launch", "send", "recv", "norm"}));
  }
  EXPECT_EQ(ends[0], ends[1]);
}

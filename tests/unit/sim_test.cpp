#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cmath>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "common/config.h"
#include "common/error.h"
#include "runtime/dtype.h"
#include "sim/cost.h"
#include "sim/device_spec.h"
#include "sim/timeline.h"
#include "topology/topology_yaml.h"

using namespace shardsim;
using topology::LinkSpec;
using topology::Topology;

namespace {
// Not `d.name = "t"`: GCC 12 at -O2 warns (-Wrestrict, a known false positive, GCC bug 105329) on a short
// literal assigned to a std::string here; the name does not matter to these tests.
sim::DeviceSpec dev() {
  sim::DeviceSpec d;
  d.peak_tflops_fp32 = 10;   // 1e4 FLOP per ns
  d.peak_tflops_bf16 = 40;
  d.hbm_gbps = 100;          // 100 B per ns
  d.hbm_gib = 1;
  d.launch_overhead_ns = 5;
  return d;
}

using P = sim::Precision;

// The published (or documented as assumed) figures of every preset, written out independently of
// sim/device_spec.cpp: peaks in TFLOP/s after the fallback, in kAllPrecisions order (fp64 fp32 fp16 bf16 fp8 int8).
struct PresetRow {
  const char* name;
  double peak[6];
  double hbm_gbps, hbm_gib, launch_ns;
};
const PresetRow kPresetTable[] = {
    // AWS Neuron docs: 47.5 fp32, 190 fp16/bf16/cFP8, 380 int8; fp64 unset -> fp32.
    {"trainium1", {47.5, 47.5, 190, 190, 190, 380}, 820, 32, 2000},
    // Jouppi et al. ISCA 2023: 275 bf16/int8; fp32 assumed 275/6; fp64 -> fp32; fp16, fp8 -> bf16.
    {"tpu_v4", {275.0 / 6, 275.0 / 6, 275, 275, 275, 275}, 1200, 32, 2000},
    // H100 SXM datasheet, dense: 34 fp64, 67 fp32, 989 fp16/bf16, 1979 fp8/int8.
    {"h100", {34, 67, 989, 989, 1979, 1979}, 3350, 80, 900},
    // A100 80GB SXM datasheet, dense: 9.7 fp64, 19.5 fp32, 312 fp16/bf16, no fp8 (-> fp16), 624 int8.
    {"a100", {9.7, 19.5, 312, 312, 312, 624}, 2039, 80, 900},
    // Round numbers: fp64 -> fp32; fp16, fp8, int8 -> bf16.
    {"generic", {100, 100, 400, 400, 400, 400}, 1000, 16, 1000},
};
}  // namespace

TEST(Cost, RooflineTakesTheSlowerBound) {
  // compute bound: 1e6 FLOP / 1e4 = 100 ns > 1000 B / 100 = 10 ns
  EXPECT_DOUBLE_EQ(sim::compute_time_ns(dev(), 1e6, 1000, sim::Precision::fp32), 105.0);
  // bf16 has 4x the FLOP/s
  EXPECT_DOUBLE_EQ(sim::compute_time_ns(dev(), 1e6, 1000, sim::Precision::bf16), 30.0);
  // memory bound
  EXPECT_DOUBLE_EQ(sim::compute_time_ns(dev(), 1e3, 1e5, sim::Precision::fp32), 1005.0);
}

TEST(Precision, FallbackRules) {
  sim::DeviceSpec d = dev();  // only fp32 (10) and bf16 (40) set: the pre-precision config format
  EXPECT_DOUBLE_EQ(d.peak_tflops(P::fp64), 10);
  EXPECT_DOUBLE_EQ(d.peak_tflops(P::fp32), 10);
  EXPECT_DOUBLE_EQ(d.peak_tflops(P::fp16), 40);
  EXPECT_DOUBLE_EQ(d.peak_tflops(P::bf16), 40);
  EXPECT_DOUBLE_EQ(d.peak_tflops(P::fp8), 40);
  EXPECT_DOUBLE_EQ(d.peak_tflops(P::int8), 40);
  EXPECT_EQ(d.effective_precision(P::int8), P::bf16);
  EXPECT_EQ(d.effective_precision(P::fp64), P::fp32);
  // fp16 set: fp8 and int8 follow it, bf16 does not.
  d.peak_tflops_fp16 = 20;
  EXPECT_DOUBLE_EQ(d.peak_tflops(P::fp16), 20);
  EXPECT_DOUBLE_EQ(d.peak_tflops(P::fp8), 20);
  EXPECT_DOUBLE_EQ(d.peak_tflops(P::int8), 20);
  EXPECT_DOUBLE_EQ(d.peak_tflops(P::bf16), 40);
  EXPECT_EQ(d.effective_precision(P::int8), P::fp16);
  // fp8 set: int8 follows it.
  d.peak_tflops_fp8 = 80;
  EXPECT_DOUBLE_EQ(d.peak_tflops(P::int8), 80);
  EXPECT_EQ(d.effective_precision(P::int8), P::fp8);
  // int8 and fp64 set: their own rates.
  d.peak_tflops_int8 = 160;
  d.peak_tflops_fp64 = 5;
  EXPECT_DOUBLE_EQ(d.peak_tflops(P::int8), 160);
  EXPECT_DOUBLE_EQ(d.peak_tflops(P::fp64), 5);
  EXPECT_DOUBLE_EQ(d.peak_tflops(P::fp8), 80);
  // The roofline uses the resolved rate: 1e6 FLOP at 160 TFLOP/s = 6.25 ns, memory 1000 B / 100 = 10 ns.
  EXPECT_DOUBLE_EQ(sim::compute_time_ns(d, 1e6, 1000, P::int8), 15.0);
  EXPECT_DOUBLE_EQ(sim::compute_time_ns(d, 1e6, 0, P::fp64), 205.0);
  // The ends of the chains.
  // Every chain ends at fp32 or bf16 within three steps.
  for (P p : sim::kAllPrecisions) {
    P end = p;
    for (int i = 0; i < 3; ++i) end = sim::fallback_of(end);
    EXPECT_TRUE(end == P::fp32 || end == P::bf16) << sim::precision_name(p);
  }
  EXPECT_EQ(sim::fallback_of(P::fp32), P::fp32);
  EXPECT_EQ(sim::fallback_of(P::bf16), P::bf16);
}

TEST(Precision, OfEveryDType) {
  using runtime::DType;
  const std::pair<DType, P> expected[] = {
      {DType::int8, P::int8},   {DType::uint8, P::int8},    {DType::int32, P::fp32},    {DType::uint32, P::fp32},
      {DType::int64, P::fp64},  {DType::uint64, P::fp64},   {DType::fp16, P::fp16},     {DType::bf16, P::bf16},
      {DType::fp32, P::fp32},   {DType::fp64, P::fp64},     {DType::fp8_e4m3, P::fp8},  {DType::fp8_e5m2, P::fp8},
  };
  EXPECT_EQ(std::size(expected), runtime::all_dtypes().size());
  for (const auto& [t, p] : expected)
    EXPECT_EQ(runtime::precision_of(t), p) << runtime::dtype_name(t) << " -> " << sim::precision_name(runtime::precision_of(t));
}

TEST(Presets, NamesAndErrorListEveryPreset) {
  // The presets the published results were computed with are still there (configs/devices.yaml holds more).
  const auto names = sim::device_preset_names();
  for (const auto& row : kPresetTable)
    EXPECT_NE(std::find(names.begin(), names.end(), row.name), names.end()) << row.name;
  for (const auto& name : sim::device_preset_names()) {
    const auto d = sim::device_preset(name);
    EXPECT_EQ(d.name, name);
    EXPECT_FALSE(d.source.empty()) << name;
  }
  try {
    sim::device_preset("tpu_v9");
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("'tpu_v9'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("(known: trainium1, inferentia2, trainium2, tpu_v4, tpu_v5e, tpu_v5p, tpu_v6e, a100, h100, h200, b200, mi300x, mi325x, mi355x, generic)"), std::string::npos) << msg;
  }
}

// Every preset at every precision: the compute-bound and the memory-bound side of the roofline (the peak kernel
// model; the shaped one is tests/unit/kernel_model_test.cpp's).
TEST(Presets, RooflinePerPrecision) {
  for (const auto& row : kPresetTable) {
    auto d = sim::device_preset(row.name);
    d.kernel.shaped = false;
    EXPECT_DOUBLE_EQ(d.hbm_gbps, row.hbm_gbps) << row.name;
    EXPECT_DOUBLE_EQ(d.hbm_gib, row.hbm_gib) << row.name;
    EXPECT_DOUBLE_EQ(d.launch_overhead_ns, row.launch_ns) << row.name;
    for (size_t i = 0; i < sim::kAllPrecisions.size(); ++i) {
      const P p = sim::kAllPrecisions[i];
      const std::string what = std::string(row.name) + " " + sim::precision_name(p);
      EXPECT_DOUBLE_EQ(d.peak_tflops(p), row.peak[i]) << what;
      // Compute bound: 1 us of math at the peak (peak TFLOP/s = peak * 1e3 FLOP/ns), 0.25 us of HBM traffic.
      const double flops = row.peak[i] * 1e3 * 1000.0;
      EXPECT_NEAR(sim::compute_time_ns(d, flops, row.hbm_gbps * 250.0, p), row.launch_ns + 1000.0, 1e-9) << what;
      // Memory bound: 3 us of HBM traffic, 1 us of math.
      EXPECT_NEAR(sim::compute_time_ns(d, flops, row.hbm_gbps * 3000.0, p), row.launch_ns + 3000.0, 1e-9) << what;
    }
  }
}

TEST(Presets, DescribeListsTheExplicitPeaks) {
  EXPECT_EQ(sim::describe(sim::device_preset("trainium1")),
            "trainium1: 47.5 TFLOP/s fp32, 190 TFLOP/s bf16 (fp16 190, fp8 190, int8 380), HBM 820 GB/s 32 GiB, "
            "launch 2000 ns, compiled step: 2000 ns between kernels; kernels shaped (systolic 128x128 array, moving tile 512): gemm 96.6%, attention "
            "96.6%/96.6%, HBM 100%, 2 units");
  EXPECT_EQ(sim::describe(sim::device_preset("generic")),
            "generic: 100 TFLOP/s fp32, 400 TFLOP/s bf16, HBM 1000 GB/s 16 GiB, launch 1000 ns; kernels at peak (no "
            "kernel model: every kernel at the roofline)");
}

namespace {
sim::DeviceSpec load_device_yaml(const std::string& body) {
  return sim::load_device(ConfigNode::load_string("device:\n" + body, "dev.yaml").child("device"));
}
std::string device_error(const std::string& body) {
  try {
    load_device_yaml(body);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(DeviceYaml, PeaksPerPrecision) {
  // Only the two old keys: everything else falls back (old configs keep working).
  auto d = load_device_yaml("  peak_tflops_fp32: 10\n  peak_tflops_bf16: 40\n  hbm_gbps: 100\n  hbm_gib: 1\n");
  EXPECT_EQ(d.name, "custom");
  EXPECT_DOUBLE_EQ(d.peak_tflops(P::fp8), 40);
  EXPECT_DOUBLE_EQ(d.peak_tflops(P::fp64), 10);
  // Every key.
  d = load_device_yaml(
      "  peak_tflops_fp64: 1\n  peak_tflops_fp32: 2\n  peak_tflops_fp16: 3\n  peak_tflops_bf16: 4\n"
      "  peak_tflops_fp8: 5\n  peak_tflops_int8: 6\n  hbm_gbps: 100\n  hbm_gib: 1\n");
  for (size_t i = 0; i < sim::kAllPrecisions.size(); ++i)
    EXPECT_DOUBLE_EQ(d.peak_tflops(sim::kAllPrecisions[i]), double(i + 1)) << i;
  // A preset with one override: only that precision changes.
  d = load_device_yaml("  preset: h100\n  peak_tflops_fp8: 1000\n");
  EXPECT_DOUBLE_EQ(d.peak_tflops(P::fp8), 1000);
  EXPECT_DOUBLE_EQ(d.peak_tflops(P::int8), 1979);
  EXPECT_DOUBLE_EQ(d.peak_tflops(P::bf16), 989);
  EXPECT_EQ(load_device_yaml("  preset: tpu_v4\n").name, "tpu_v4");
}

TEST(DeviceYaml, BadNumbersNameTheKey) {
  for (std::string key : {"peak_tflops_fp64", "peak_tflops_fp32", "peak_tflops_fp16", "peak_tflops_bf16",
                          "peak_tflops_fp8", "peak_tflops_int8", "hbm_gbps", "hbm_gib"}) {
    for (std::string bad : {"0", "-1", ".nan", ".inf", "-.inf"}) {
      const auto msg = device_error("  preset: generic\n  " + key + ": " + bad + "\n");
      EXPECT_NE(msg.find("dev.yaml:3: device." + key + ": must be"), std::string::npos) << key << "=" << bad << ": " << msg;
    }
  }
  EXPECT_NE(device_error("  preset: generic\n  launch_overhead_ns: .nan\n").find("device.launch_overhead_ns: must be a finite"),
            std::string::npos);
  EXPECT_NE(device_error("  preset: generic\n  launch_overhead_ns: -1\n").find("device.launch_overhead_ns: must be between 0"),
            std::string::npos);
  // Issue 46 (kind 3): figures that would make a simulated time infinite or unprintable are out of bounds.
  for (std::string kv : {"peak_tflops_fp32: 4.9e-324", "peak_tflops_bf16: 1e-298", "hbm_gib: 1e-9", "hbm_gbps: 1e300",
                         "launch_overhead_ns: 1e300", "hbm_reserve_gib: 16", "gemm_efficiency: 1e-300"}) {
    const auto m = device_error("  preset: generic\n  " + kv + "\n");
    EXPECT_NE(m.find("dev.yaml:3: device." + kv.substr(0, kv.find(':')) + ": must be"), std::string::npos) << kv << ": " << m;
  }
  EXPECT_EQ(sim::device_figure_obstacle("peak_tflops_fp8", 1e6), "");
  EXPECT_NE(sim::device_figure_obstacle("hbm_gbps", std::nan("")), "");
  EXPECT_EQ(sim::device_figure_obstacle("name", 0), "");
  EXPECT_EQ(sim::device_preset("generic").hbm_reserve_gib, 1);
  EXPECT_NE(device_error("  preset: generic\n  peak_tflops_fp4: 1\n").find("unknown key 'device.peak_tflops_fp4'"),
            std::string::npos);
  const auto msg = device_error("  preset: v100\n");
  EXPECT_NE(msg.find("dev.yaml:2: device.preset: unknown device preset 'v100' (known: trainium1, inferentia2, trainium2, tpu_v4, tpu_v5e, tpu_v5p, tpu_v6e, a100, h100, h200, b200, mi300x, mi325x, mi355x, generic)"),
            std::string::npos)
      << msg;
  EXPECT_NE(device_error("  peak_tflops_fp32: 1\n  hbm_gbps: 1\n  hbm_gib: 1\n").find("'peak_tflops_bf16' is required"),
            std::string::npos);
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

TEST(Protocol, EfficiencyAndLowLatencyMessages) {
  auto t = Topology::ring(8, LinkSpec{100, 500});
  topology::Protocol p;
  p.efficiency = 0.5;
  p.low_latency_max_bytes = 4096;
  p.low_latency_efficiency = 0.25;
  p.low_latency_latency_factor = 0.2;
  t.set_protocol(p);
  // Bandwidth protocol: S / (B x 0.5) after the full latency, over three hops.
  auto big = sim::transfer_cost(t, t.route(0, 3), 1e6);
  EXPECT_DOUBLE_EQ(big.latency_ns, 1500);
  EXPECT_DOUBLE_EQ(big.occupancy_ns, 1e6 / 50);
  // Up to low_latency_max_bytes inclusive: the low-latency protocol; one byte more: the bandwidth one.
  auto small = sim::transfer_cost(t, t.route(0, 3), 4096);
  EXPECT_DOUBLE_EQ(small.latency_ns, 1500 * 0.2);
  EXPECT_DOUBLE_EQ(small.occupancy_ns, 4096 / 25.0);
  auto edge = sim::transfer_cost(t, t.route(0, 3), 4097);
  EXPECT_DOUBLE_EQ(edge.latency_ns, 1500);
  // The timeline charges the same: port busy for the occupancy, arrival after latency + occupancy.
  sim::Timeline tl(0, t, dev());
  auto a = tl.send("a", 3, 4096, 0);
  EXPECT_DOUBLE_EQ(a.end, small.total_ns());
  auto b = tl.send("b", 3, 1e6, 0);
  EXPECT_DOUBLE_EQ(b.start, small.occupancy_ns);
  EXPECT_DOUBLE_EQ(b.end, small.occupancy_ns + big.total_ns());
  EXPECT_NE(t.describe().find("protocol: efficiency 0.5; messages <= 4096 B low-latency"), std::string::npos);
}

TEST(Protocol, DefaultIsThePlainLinkModel) {
  auto plain = Topology::torus({2, 4}, {LinkSpec{50, 100}, LinkSpec{25, 10}});
  auto with = plain;
  with.set_protocol(topology::Protocol{});
  EXPECT_EQ(with.describe(), plain.describe());
  sim::Timeline a(0, plain, dev()), b(0, with, dev());
  for (double bytes : {0.0, 1.0, 3.0, 4096.0, 1e6 / 3})
    for (int dst = 1; dst < 8; ++dst) {
      const auto x = a.send("x", dst, bytes, 7), y = b.send("y", dst, bytes, 7);
      EXPECT_EQ(x.start, y.start);  // bit for bit
      EXPECT_EQ(x.end, y.end);
    }
}

TEST(Protocol, MessageOverheadOncePerMessageAtTheSender) {
  auto t = Topology::ring(8, LinkSpec{100, 500});
  topology::Protocol p;
  p.message_overhead_ns = 2000;
  t.set_protocol(p);
  // Three hops: o once, then the three latencies and the occupancy (not o per hop).
  const auto c3 = sim::transfer_cost(t, t.route(0, 3), 1e6);
  EXPECT_DOUBLE_EQ(c3.overhead_ns, 2000);
  EXPECT_DOUBLE_EQ(c3.latency_ns, 1500);
  EXPECT_DOUBLE_EQ(c3.occupancy_ns, 1e6 / 100);
  EXPECT_DOUBLE_EQ(c3.total_ns(), 2000 + 1500 + 1e4);
  sim::Timeline tl(0, t, dev());
  const auto a = tl.send("a", 3, 1e6, 0);
  EXPECT_DOUBLE_EQ(a.start, 0);
  EXPECT_DOUBLE_EQ(a.end, 2000 + 1500 + 1e4);
  // A second message on the same port waits for the first one's overhead and occupancy, then pays its own
  // overhead: two overheads, two occupancies, one route latency.
  const auto b = tl.send("b", 3, 1e6, 0);
  EXPECT_DOUBLE_EQ(b.start, 2000 + 1e4);
  EXPECT_DOUBLE_EQ(b.end, 2 * (2000 + 1e4) + 1500);
  // One hop costs the same overhead: the hop count changes only the latency term.
  sim::Timeline near(0, t, dev());
  EXPECT_DOUBLE_EQ(near.send("n", 1, 1e6, 0).end - a.end, -1000);
  // The receiver books the flow's links from the data's start (o after the sender's): a lone flow is not moved.
  sim::Timeline rx(3, t, dev());
  EXPECT_DOUBLE_EQ(rx.receive(0, 1e6, a.start, a.end), a.end);
  EXPECT_NE(t.describe().find("2000 ns overhead per message"), std::string::npos) << t.describe();
}

// The per-call overhead is not a per-message cost: a Timeline's sends do not see it (collectives charge it once per
// call, collectives/algorithms.h; tests/mpi/topologies_test.cpp, TopologiesProtocol); describe() names it.
TEST(Protocol, CallOverheadIsNotChargedPerMessage) {
  auto plain = Topology::ring(8, LinkSpec{100, 500});
  auto with = plain;
  topology::Protocol p;
  p.call_overhead_ns = 6000;
  with.set_protocol(p);
  EXPECT_FALSE(with.protocol().is_default());
  sim::Timeline a(0, plain, dev()), b(0, with, dev());
  for (double bytes : {0.0, 4096.0, 1e6})
    for (int dst = 1; dst < 8; ++dst) {
      const auto x = a.send("x", dst, bytes, 7), y = b.send("y", dst, bytes, 7);
      EXPECT_EQ(x.start, y.start);
      EXPECT_EQ(x.end, y.end);
    }
  EXPECT_EQ(sim::transfer_cost(with, with.route(0, 3), 1e6).total_ns(),
            sim::transfer_cost(plain, plain.route(0, 3), 1e6).total_ns());
  EXPECT_NE(with.describe().find("6000 ns overhead per collective call"), std::string::npos) << with.describe();
}

TEST(Protocol, TopologyFileErrorsNameTheKey) {
  auto err = [](const std::string& proto) {
    try {
      topology::load_topology(
          ConfigNode::load_string("topology:\n  kind: ring\n  chips: 4\n  bandwidth_gbps: 10\n  protocol: " + proto +
                                      "\n",
                                  "t.yaml")
              .child("topology"));
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(err("{efficiency: 1.5}").find("t.yaml:5: topology.protocol.efficiency must be in [0.01, 1]"),
            std::string::npos)
      << err("{efficiency: 1.5}");
  EXPECT_NE(err("{low_latency_efficiency: 0}").find("low_latency_efficiency must be in [0.01, 1]"), std::string::npos);
  EXPECT_NE(err("{low_latency_max_bytes: -1}").find("low_latency_max_bytes must be"), std::string::npos);
  EXPECT_NE(err("{efficiency: .nan}").find("must be a finite number"), std::string::npos);
  EXPECT_NE(err("{overhead: 3}").find("unknown key"), std::string::npos);
  EXPECT_NE(err("{message_overhead_ns: -1}").find("t.yaml:5: topology.protocol.message_overhead_ns must be in [0, 1e9]"),
            std::string::npos)
      << err("{message_overhead_ns: -1}");
  EXPECT_EQ(err("{message_overhead_ns: 2500}"), "");
  EXPECT_NE(err("{call_overhead_ns: -1}").find("t.yaml:5: topology.protocol.call_overhead_ns must be in [0, 1e9]"),
            std::string::npos)
      << err("{call_overhead_ns: -1}");
  EXPECT_NE(err("{call_overhead_ns: 2e9}").find("call_overhead_ns must be in [0, 1e9]"), std::string::npos);
  EXPECT_EQ(err("{call_overhead_ns: 6000}"), "");
  EXPECT_EQ(err("{efficiency: 0.8, low_latency_max_bytes: 65536, low_latency_efficiency: 0.5, "
                "low_latency_latency_factor: 0.3}"),
            "");
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
  auto a = tl.compute("a", 1e6, 0, sim::Precision::fp32, 0, {});      // 0..105
  auto b = tl.compute("b", 1e6, 0, sim::Precision::fp32, 50, {});     // waits for the engine
  auto c = tl.compute("c", 1e6, 0, sim::Precision::fp32, 1000, {});   // waits for its input
  EXPECT_DOUBLE_EQ(a.end, 105);
  EXPECT_DOUBLE_EQ(b.start, 105);
  EXPECT_DOUBLE_EQ(c.start, 1000);
}

TEST(Timeline, BreakdownSeparatesExposedCommunication) {
  auto t = Topology::ring(2, LinkSpec{100, 50});
  sim::Timeline tl(0, t, dev());
  tl.compute("c", 1e6, 0, sim::Precision::fp32, 0, {});        // [0, 105]
  tl.record_region("ar", "collective", {50, 300});          // overlaps compute for 55 ns
  tl.compute("d", 1e6, 0, sim::Precision::fp32, 300, {});       // [300, 405]
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

// Routes and link state are made per destination / link actually used (issue 17: no O(chips) slots per chip).
// Every destination of a 64-chip ring, in a scrambled order, gets the same send span as on a fresh timeline, and
// a chip outside the topology is still an error.
TEST(Timeline, RoutesMadeOnFirstUseMatchFreshTimelines) {
  auto t = Topology::ring(64, LinkSpec{100, 50});
  sim::Timeline tl(5, t, dev());
  for (int i = 0; i < 64; ++i) {
    const int dst = (i * 37 + 11) % 64;
    sim::Timeline fresh(5, t, dev());
    const auto a = tl.send("x", dst, 1000, 0);
    tl.reset();
    const auto b = fresh.send("x", dst, 1000, 0);
    EXPECT_EQ(a.start, b.start) << dst;
    EXPECT_EQ(a.end, b.end) << dst;
  }
  EXPECT_THROW(tl.send("x", 64, 1000, 0), std::out_of_range);
  EXPECT_THROW(tl.receive(-1, 1000, 0, 10), std::out_of_range);
}

namespace {
// The receive side as specified in sim/timeline.h, written plainly: per topology link a sorted vector of disjoint
// busy intervals, a flow placed at the earliest t >= start that fits on every link of its route, and beyond 256
// intervals the two earliest merged. The Timeline must give the same arrival for every flow, bit for bit.
struct ReferenceReceiver {
  const Topology& topo;
  int chip;
  std::vector<std::vector<sim::Span>> busy;
  ReferenceReceiver(const Topology& t, int c) : topo(t), chip(c), busy(t.links().size()) {}
  double receive(int src, double bytes, double start, double arrival) {
    const auto links = topo.route(src, chip);
    std::vector<double> off;
    double at = 0, bw = 1e300;
    for (int id : links) {
      off.push_back(at);
      at += topo.link(id).latency_ns;
      bw = std::min(bw, topo.link(id).bandwidth_gbps);
    }
    const double occ = bytes / bw;
    double t = start;
    for (bool moved = true; moved;) {
      moved = false;
      for (size_t i = 0; i < links.size(); ++i)
        for (const auto& s : busy[static_cast<size_t>(links[i])]) {
          const double a = t + off[i];
          if (!(s.end > a)) continue;  // the first interval ending after the head arrives decides
          if (s.start < a + occ && s.end - off[i] > t) {
            t = s.end - off[i];
            moved = true;
          }
          break;
        }
    }
    for (size_t i = 0; i < links.size(); ++i) {
      auto& v = busy[static_cast<size_t>(links[i])];
      sim::Span s{t + off[i], t + off[i] + occ};
      std::vector<sim::Span> out;
      for (const auto& x : v) {
        if (x.end < s.start || x.start > s.end) {
          out.push_back(x);
        } else {
          s.start = std::min(s.start, x.start);
          s.end = std::max(s.end, x.end);
        }
      }
      out.push_back(s);
      std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.start < b.start; });
      if (out.size() > 256) {
        out[1].start = out[0].start;
        out.erase(out.begin());
      }
      v = std::move(out);
    }
    return t == start ? arrival : arrival + (t - start);
  }
};
}  // namespace

// Thousands of flows from 7 senders through one switch into chip 0, at scattered start times (so gaps stay open
// and the 256-interval cap is hit many times, also across reset()): the same arrivals as the plain model.
TEST(Timeline, ReceiveIntervalsMatchThePlainModelBeyondTheCap) {
  auto t = Topology::switched(8, LinkSpec{10, 100});
  sim::Timeline rx(0, t, dev());
  uint64_t x = 12345;
  auto next = [&x] {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<double>(x >> 40);  // 0 .. 2^24
  };
  for (int round = 0; round < 2; ++round) {
    ReferenceReceiver ref(t, 0);
    double clock = 0;
    for (int i = 0; i < 3000; ++i) {
      const int src = 1 + i % 7;
      const double bytes = 1000 + std::fmod(next(), 50000);
      clock += std::fmod(next(), 9000);
      const double start = clock - std::fmod(next(), 20000);  // some flows start before earlier ones
      const double arrival = start + 200 + bytes / 10;
      ASSERT_EQ(rx.receive(src, bytes, start, arrival), ref.receive(src, bytes, start, arrival)) << round << " " << i;
    }
    rx.reset();
  }
}

// The summary (Timeline::set_keep_events(false)) gives every figure bit for bit as the kept events do, also past
// the summary's merge of pending spans (1,024) and with regions recorded out of order, overlapping, touching and
// empty; and the kept events' own merge (the reference below) agrees with both.
TEST(Timeline, SummaryWithoutEventsIsBitIdentical) {
  auto t = Topology::ring(4, LinkSpec{100, 50});
  sim::Timeline kept(0, t, dev()), folded(0, t, dev());
  folded.set_keep_events(false);
  uint64_t x = 88172645463325252ull;
  auto rnd = [&] { x ^= x << 13; x ^= x >> 7; x ^= x << 17; return x; };
  for (int i = 0; i < 5000; ++i) {
    for (sim::Timeline* tl : {&kept, &folded}) {
      const uint64_t saved = x;
      const double ready = double(rnd() % 100000) * 0.37;
      switch (rnd() % 4) {
        case 0: tl->compute("gemm" + std::to_string(i % 7), 1e6 + double(rnd() % 1000), 10, sim::Precision::fp32, ready, {}); break;
        case 1: tl->send("all_gather.ring.step" + std::to_string(i % 5), 1 + int(rnd() % 3), double(rnd() % 4096), ready); break;
        case 2: tl->record_region("all_gather.unit" + std::to_string(i % 3), "collective", {ready, ready + double(rnd() % 500)}, 64); break;
        default: tl->record_region("touching", "collective", {ready, ready}, 0); break;
      }
      if (tl == &kept) x = saved;  // the same draws for both timelines
    }
  }
  EXPECT_TRUE(folded.events().empty());
  ASSERT_EQ(kept.events().size(), 5000u);
  const auto a = kept.breakdown(), b = folded.breakdown();
  for (auto [p, q] : {std::pair{a.total, b.total}, {a.compute, b.compute}, {a.communication, b.communication},
                      {a.exposed_comm, b.exposed_comm}, {a.flops, b.flops}, {a.bytes_sent, b.bytes_sent}})
    EXPECT_EQ(std::bit_cast<uint64_t>(p), std::bit_cast<uint64_t>(q));
  // Reference: one merge of all kept spans, as the breakdown is defined (docs/MODEL.md).
  auto merged = [&](const char* cat) {
    std::vector<sim::Span> v;
    for (const auto& e : kept.events())
      if (e.category == cat) v.push_back(e.span);
    std::sort(v.begin(), v.end(), [](const sim::Span& p, const sim::Span& q) { return p.start < q.start; });
    std::vector<sim::Span> out;
    for (const auto& s : v) {
      if (s.end <= s.start) continue;
      if (!out.empty() && s.start <= out.back().end) out.back().end = std::max(out.back().end, s.end);
      else out.push_back(s);
    }
    double len = 0;
    for (const auto& s : out) len += s.duration();
    return len;
  };
  EXPECT_EQ(std::bit_cast<uint64_t>(merged("compute")), std::bit_cast<uint64_t>(b.compute));
  EXPECT_EQ(std::bit_cast<uint64_t>(merged("collective")), std::bit_cast<uint64_t>(b.communication));
  const auto oa = kept.op_totals(), ob = folded.op_totals();
  ASSERT_EQ(oa.size(), ob.size());
  ASSERT_EQ(oa.size(), 3u);  // gemm0..gemm6 are one row gemmN (digits become N), all_gather.unitN, touching
  for (size_t i = 0; i < oa.size(); ++i) {
    EXPECT_EQ(oa[i].name, ob[i].name);
    EXPECT_EQ(oa[i].calls, ob[i].calls);
    EXPECT_EQ(std::bit_cast<uint64_t>(oa[i].time_ns), std::bit_cast<uint64_t>(ob[i].time_ns));
  }
  EXPECT_EQ(folded.events_recorded(), 5000u);
}

// The host issue model (sim/timeline.h, "Host issue"): kernels start no earlier than the host has issued them in
// eager mode; long kernels hide the host; a host_sync makes the host wait; cuda_graph and host_launch_ns 0 change
// nothing; the graph modes (cuda_graph, compiled) pay graph_launch_overhead_ns between kernels.
#include <gtest/gtest.h>

#include "common/config.h"
#include "common/error.h"
#include "sim/device_spec.h"
#include "sim/timeline.h"
#include "topology/topology.h"

using namespace shardsim;

namespace {

sim::DeviceSpec dev(double host_ns, bool graph) {
  sim::DeviceSpec d;
  d.peak_tflops_fp32 = 1;  // 1e3 FLOP per ns
  d.peak_tflops_bf16 = 1;
  d.hbm_gbps = 1000;
  d.hbm_gib = 1;
  d.launch_overhead_ns = 10;
  d.host_launch_ns = host_ns;
  d.cuda_graph = graph;
  return d;
}

// N kernels of FLOPS each, back to back (ready at 0): the end of the last.
double run(const sim::DeviceSpec& d, int n, double flops) {
  auto topo = topology::Topology::ring(2, topology::LinkSpec{100, 500});
  sim::Timeline tl(0, topo, d);
  double end = 0;
  for (int i = 0; i < n; ++i) end = tl.compute("k", flops, 0, sim::Precision::fp32, 0, {}).end;
  return end;
}

}  // namespace

TEST(HostIssue, ShortKernelsAreLaunchBound) {
  // 100 kernels of 1000 FLOPs: 1 ns of work + 10 ns launch each on the device; the host needs 5000 ns each.
  EXPECT_DOUBLE_EQ(run(dev(0, false), 100, 1000), 100 * 11.0);
  EXPECT_DOUBLE_EQ(run(dev(5000, false), 100, 1000), 100 * 5000.0 + 11.0);  // the last starts at 500 us
}

TEST(HostIssue, LongKernelsHideTheHost) {
  // 1e7 FLOPs = 10 us per kernel > 5 us of host time: only the first kernel waits for the host.
  EXPECT_DOUBLE_EQ(run(dev(5000, false), 10, 1e7), 5000.0 + 10 * 10010.0);
}

TEST(HostIssue, CudaGraphRemovesTheHostCost) {
  EXPECT_DOUBLE_EQ(run(dev(5000, true), 100, 1000), run(dev(0, false), 100, 1000));
}

// device.graph_launch_overhead_ns: the gap between kernels replayed from a CUDA graph or run inside a compiled
// step; unset (< 0), the eager gap; eager mode never uses it.
TEST(HostIssue, GraphModesUseTheirOwnGap) {
  sim::DeviceSpec eager = dev(5000, false), graph = dev(5000, true);
  eager.graph_launch_overhead_ns = graph.graph_launch_overhead_ns = 4;
  EXPECT_DOUBLE_EQ(eager.kernel_gap_ns(), 10.0);
  EXPECT_DOUBLE_EQ(graph.kernel_gap_ns(), 4.0);
  EXPECT_DOUBLE_EQ(run(graph, 100, 1000), 100 * 5.0);  // 1 ns of work + 4 ns between kernels, no host time
  EXPECT_DOUBLE_EQ(run(eager, 100, 1000), 100 * 5000.0 + 11.0);
  graph.graph_launch_overhead_ns = -1;  // unset: the eager gap
  EXPECT_DOUBLE_EQ(run(graph, 100, 1000), 100 * 11.0);
}

TEST(HostIssue, LaunchModeKeys) {
  const auto load = [](const std::string& extra) {
    return sim::load_device(ConfigNode::load_string("preset: h100\n" + extra, "dev.yaml"));
  };
  const auto h100 = load("");
  EXPECT_FALSE(h100.cuda_graph);
  EXPECT_EQ(h100.launch_mode_name(), "eager");
  EXPECT_DOUBLE_EQ(h100.kernel_gap_ns(), h100.launch_overhead_ns);
  const auto graph = load("launch_mode: cuda_graph\n");
  EXPECT_TRUE(graph.cuda_graph);
  EXPECT_FALSE(graph.compiled);
  EXPECT_DOUBLE_EQ(graph.kernel_gap_ns(), 500.0);  // the preset's measured graph gap
  EXPECT_NE(sim::describe(graph).find("CUDA graph: 500 ns between kernels"), std::string::npos) << sim::describe(graph);
  const auto mine = load("launch_mode: cuda_graph\ngraph_launch_overhead_ns: 0\n");
  EXPECT_DOUBLE_EQ(mine.kernel_gap_ns(), 0.0);
  const auto trn = sim::device_preset("trainium1");  // Neuron: the compiled step
  EXPECT_TRUE(trn.compiled && trn.cuda_graph);
  EXPECT_EQ(trn.launch_mode_name(), "compiled");
  EXPECT_DOUBLE_EQ(trn.kernel_gap_ns(), trn.launch_overhead_ns);  // no graph gap set: the assumed gap
  EXPECT_THROW(load("launch_mode: lazy\n"), ConfigError);
  EXPECT_THROW(load("graph_launch_overhead_ns: -1\n"), ConfigError);
}

TEST(HostIssue, SyncMakesTheHostWait) {
  auto topo = topology::Topology::ring(2, topology::LinkSpec{100, 500});
  sim::Timeline tl(0, topo, dev(5000, false));
  const double long_end = tl.compute("long", 1e8, 0, sim::Precision::fp32, 0, {}).end;  // 100 us
  tl.host_sync(long_end);  // the host reads the result back
  const auto next = tl.compute("next", 1000, 0, sim::Precision::fp32, 0, {});
  EXPECT_DOUBLE_EQ(next.start, long_end + 5000.0);  // issued only after the sync
  tl.reset();
  EXPECT_DOUBLE_EQ(tl.host_time(), 0.0);
  sim::Timeline graph(0, topo, dev(5000, true));
  graph.host_sync(1e9);
  EXPECT_DOUBLE_EQ(graph.compute("k", 1000, 0, sim::Precision::fp32, 0, {}).start, 0.0);
}

// device.kernel_fusion: eager (sim/eager_kernels.h): a fused element-wise kernel is charged as PyTorch eager's
// sequence, each part a kernel with its own launch; the casts drop out in fp32; other kernels are unchanged.
TEST(EagerKernels, RmsnormIsChargedAsItsAtenSequence) {
  auto topo = topology::Topology::ring(2, topology::LinkSpec{100, 500});
  sim::DeviceSpec d = dev(0, false);  // roofline: 1000 bytes per ns, 10 ns launch
  d.eager_kernels = true;
  const double n = 1e6;
  {
    sim::Timeline tl(0, topo, d);  // bf16: fused 2e bytes per element, eager 4e + 7f = 36 over 8 kernels
    const auto s = tl.compute("rmsnorm.attn", 0, 2 * 2 * n, sim::Precision::bf16, 0, {});
    EXPECT_DOUBLE_EQ(s.start, 0.0);
    EXPECT_DOUBLE_EQ(s.end, 36 * n / 1000 + 8 * 10.0);
  }
  {
    sim::Timeline tl(0, topo, d);  // fp32: the two casts are no-ops, 6 kernels of 28 bytes per element
    EXPECT_DOUBLE_EQ(tl.compute("rmsnorm", 0, 2 * 4 * n, sim::Precision::fp32, 0, {}).end, 28 * n / 1000 + 6 * 10.0);
  }
  {
    sim::Timeline tl(0, topo, d);  // not decomposed: a residual add and a GEMM run as one kernel in eager PyTorch too
    EXPECT_DOUBLE_EQ(tl.compute("residual", 0, 6 * n, sim::Precision::bf16, 0, {}).end, 6 * n / 1000 + 10.0);
  }
  d.eager_kernels = false;
  sim::Timeline tl(0, topo, d);  // fused: one kernel
  EXPECT_DOUBLE_EQ(tl.compute("rmsnorm.attn", 0, 4 * n, sim::Precision::bf16, 0, {}).end, 4 * n / 1000 + 10.0);
}

// The block's GEMM issue order (sharding/plans/block_ops.h, column_gemms): a device issuing fused kernels
// (device.kernel_fusion: fused; Megatron-LM's linear_qkv and linear_fc1, Transformer Engine's LayerNormLinear and
// LayerNormMLP) charges the GEMMs that read one input as ONE GEMM over the concatenated columns, forward and
// backward; a PyTorch eager model (kernel_fusion: eager; torchtitan's separate wq/wk/wv and w1/w3) charges each.
// The values are the separate GEMMs' either way, bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "sharding/plans/block_ops.h"
#include "sim/device_spec.h"
#include "sim/timeline.h"
#include "topology/topology.h"

using namespace shardsim;
using runtime::DType;
using runtime::Tensor;

namespace {

sim::DeviceSpec dev(bool eager) {
  sim::DeviceSpec d;
  d.peak_tflops_fp32 = 1;  // 1e3 FLOP per ns
  d.peak_tflops_bf16 = 1;
  d.hbm_gbps = 1000;
  d.hbm_gib = 1;
  d.launch_overhead_ns = 1000;
  d.eager_kernels = eager;
  return d;
}

Tensor filled(int64_t rows, int64_t cols, int seed) {
  Tensor t(DType::fp32, {rows, cols});
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, std::sin(0.37f * float(i) + float(seed)));
  return t;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

std::vector<std::string> names(const sim::Timeline& tl) {
  std::vector<std::string> out;
  for (const auto& e : tl.events()) out.push_back(e.name);
  return out;
}

}  // namespace

TEST(IssueOrder, FusedDeviceChargesOneQkvGemmWithTheSeparateGemmsValues) {
  const Tensor x = filled(8, 16, 1), wq = filled(16, 16, 2), wk = filled(16, 8, 3), wv = filled(16, 8, 4);
  const auto topo = topology::Topology::ring(2, topology::LinkSpec{100, 500});
  sim::Timeline fused_tl(0, topo, dev(false)), eager_tl(0, topo, dev(true)), plain_tl(0, topo, dev(true));
  sharding::plans::Chip fused{&fused_tl}, eager{&eager_tl}, plain{&plain_tl};
  const std::vector<const Tensor*> w = {&wq, &wk, &wv};
  const std::vector<std::string> parts = {"gemm.q", "gemm.k", "gemm.v"};
  const auto f = sharding::plans::column_gemms(fused, x, w, parts, "gemm.qkv");
  const auto e = sharding::plans::column_gemms(eager, x, w, parts, "gemm.qkv");
  EXPECT_EQ(names(fused_tl), (std::vector<std::string>{"gemm.qkv"}));
  EXPECT_EQ(names(eager_tl), parts);
  EXPECT_DOUBLE_EQ(fused_tl.events()[0].flops, 2.0 * 8 * 16 * (16 + 8 + 8));
  EXPECT_LT(fused.t, eager.t);  // one launch instead of three, X read once
  ASSERT_EQ(f.size(), 3u);
  ASSERT_EQ(e.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    const Tensor ref = sharding::plans::gemm(plain, x, *w[i], parts[i]);
    EXPECT_TRUE(same_bits(f[i], ref)) << parts[i];
    EXPECT_TRUE(same_bits(e[i], ref)) << parts[i];
  }
}

TEST(IssueOrder, FusedDeviceChargesOneGateUpBackward) {
  const Tensor x = filled(8, 16, 5), wg = filled(16, 32, 6), wu = filled(16, 32, 7);
  const Tensor dg = filled(8, 32, 8), du = filled(8, 32, 9);
  const auto topo = topology::Topology::ring(2, topology::LinkSpec{100, 500});
  sim::Timeline fused_tl(0, topo, dev(false)), eager_tl(0, topo, dev(true));
  sharding::plans::Chip fused{&fused_tl}, eager{&eager_tl};
  Tensor dwg_f(DType::fp32, {16, 32}), dwu_f(DType::fp32, {16, 32}), dwg_e(DType::fp32, {16, 32}),
      dwu_e(DType::fp32, {16, 32});
  const Tensor dx_f = sharding::plans::column_gemms_backward(fused, x, {&wg, &wu}, {&dg, &du}, {&dwg_f, &dwu_f},
                                                             "gemm_backward.gate_up");
  const Tensor dx_e = sharding::plans::column_gemms_backward(eager, x, {&wg, &wu}, {&dg, &du}, {&dwg_e, &dwu_e},
                                                             "gemm_backward.gate_up");
  ASSERT_EQ(fused_tl.events().size(), 1u);
  EXPECT_EQ(fused_tl.events()[0].name, "gemm_backward.gate_up");
  EXPECT_DOUBLE_EQ(fused_tl.events()[0].flops, 2 * 2.0 * 8 * 16 * 64);  // dX and dW over the 64 columns
  EXPECT_EQ(eager_tl.events().size(), 3u);  // two gemm_backward and the add of the partial dX
  EXPECT_LT(fused.t, eager.t);
  EXPECT_TRUE(same_bits(dx_f, dx_e));
  EXPECT_TRUE(same_bits(dwg_f, dwg_e));
  EXPECT_TRUE(same_bits(dwu_f, dwu_e));
}

// One weight, or no timeline: the plain GEMM whatever the device.
TEST(IssueOrder, OneWeightIsThePlainGemm) {
  const Tensor x = filled(4, 16, 1), w = filled(16, 8, 2);
  const auto topo = topology::Topology::ring(2, topology::LinkSpec{100, 500});
  sim::Timeline tl(0, topo, dev(false));
  sharding::plans::Chip chip{&tl};
  (void)sharding::plans::column_gemms(chip, x, {&w}, {"gemm.up"}, "gemm.fused");
  EXPECT_EQ(names(tl), (std::vector<std::string>{"gemm.up"}));
  sharding::plans::Chip none;
  const auto out = sharding::plans::column_gemms(none, x, {&w, &w}, {"a", "b"}, "ab");
  EXPECT_EQ(out.size(), 2u);
  EXPECT_FALSE(sharding::plans::fuses_column_gemms(none));
}

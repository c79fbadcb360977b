#include <gtest/gtest.h>

#include <cmath>

#include "common/error.h"
#include "sharding/mlp.h"

using namespace shardsim;
using runtime::DType;
using runtime::Tensor;
using shardsim::ConfigError;

// The tensor-parallel decomposition without communication: the sum over shards of each shard's partial output
// equals the single-device output. This checks the sharding arithmetic (including uneven FFN splits);
// tests/mpi checks the same over real ranks with the all_reduce.
class MlpShards : public ::testing::TestWithParam<int> {};

TEST_P(MlpShards, PartialsSumToTheSingleDeviceOutput) {
  const int tp = GetParam();
  sharding::MlpShape s{5, 16, 37, kernels::Activation::silu, DType::fp32, 11};
  const Tensor x = sharding::make_mlp_input(s);
  const auto full = sharding::make_mlp_weights(s, 0, s.ffn);
  const Tensor y_ref = sharding::mlp_forward(s, x, full, nullptr, nullptr);
  std::vector<double> sum(static_cast<size_t>(y_ref.numel()), 0.0);
  const auto part = sharding::ffn_partition(s, tp);
  int64_t covered = 0;
  for (int t = 0; t < tp; ++t) {
    const auto w = sharding::make_mlp_weights(s, int64_t(part.offset(size_t(t))), int64_t(part.size(size_t(t))));
    covered += w.ffn_size;
    const Tensor y = sharding::mlp_forward(s, x, w, nullptr, nullptr);
    for (int64_t i = 0; i < y.numel(); ++i) sum[size_t(i)] += y.get(i);
  }
  EXPECT_EQ(covered, s.ffn);
  double max_ref = 0, max_err = 0;
  for (int64_t i = 0; i < y_ref.numel(); ++i) {
    max_ref = std::max(max_ref, std::fabs(double(y_ref.get(i))));
    max_err = std::max(max_err, std::fabs(sum[size_t(i)] - y_ref.get(i)));
  }
  EXPECT_GT(max_ref, 0.0);
  EXPECT_LE(max_err, 1e-5 * max_ref);
}
INSTANTIATE_TEST_SUITE_P(TpSizes, MlpShards, ::testing::Values(1, 2, 3, 4, 8));

TEST(Mlp, ChargesTheTimelineWithGemmFlops) {
  sharding::MlpShape s{4, 8, 12, kernels::Activation::gelu, DType::bf16, 3};
  auto topo = topology::Topology::ring(1, topology::LinkSpec{1, 0});
  sim::DeviceSpec d = sim::device_preset("generic");
  sim::Timeline tl(0, topo, d);
  sharding::MlpTiming timing;
  sharding::mlp_forward(s, sharding::make_mlp_input(s), sharding::make_mlp_weights(s, 0, s.ffn), &tl, &timing);
  const double gemm_flops = 3 * 2.0 * 4 * 8 * 12;
  EXPECT_GT(timing.flops, gemm_flops);  // plus the GLU
  EXPECT_LT(timing.flops, gemm_flops * 1.5);
  EXPECT_EQ(tl.events().size(), 4u);  // gate, up, glu, down
  EXPECT_GE(timing.end, 4 * d.launch_overhead_ns);
}

TEST(Mlp, PeakMemoryPerChip) {
  sharding::MlpShape s{10, 16, 37, kernels::Activation::silu, DType::bf16, 1};
  // One device: 3 weights (16x37), x and y (10x16), gate and up (10x37), no ring buffer; 2 bytes each.
  EXPECT_DOUBLE_EQ(sharding::mlp_tp_peak_bytes(s, 1, 0), 2.0 * (3 * 16 * 37 + 2 * 10 * 16 + 2 * 10 * 37));
  // tp=4: 37 = 10 + 9 + 9 + 9; chip 0 holds the extra column; ring buffer = ceil(160 / 4) elements.
  EXPECT_DOUBLE_EQ(sharding::mlp_tp_peak_bytes(s, 4, 0), 2.0 * (3 * 16 * 10 + 2 * 10 * 16 + 2 * 10 * 10 + 40));
  EXPECT_GT(sharding::mlp_tp_peak_bytes(s, 4, 0), sharding::mlp_tp_peak_bytes(s, 4, 3));
  EXPECT_NO_THROW(sharding::check_mlp_fits(s, 4, 1.0));
  try {
    sharding::check_mlp_fits(s, 4, 1e-6);
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("simulated out of memory on chip 0: needs"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("GiB, has 0.000 GiB"), std::string::npos) << e.what();
  }
}

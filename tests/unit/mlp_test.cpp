#include <gtest/gtest.h>

#include <cmath>

#include "common/error.h"
#include "models/mlp.h"

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
  // tp=4: 37 = 10 + 9 + 9 + 9; chip 0 holds the extra column. gate and up (2x10x10 = 200 elements) are gone
  // before the all_reduce's ring buffer (ceil(160 / 4) = 40 elements) arrives, so the peak is the local forward.
  EXPECT_DOUBLE_EQ(sharding::mlp_tp_peak_bytes(s, 4, 0), 2.0 * (3 * 16 * 10 + 2 * 10 * 16 + 2 * 10 * 10));
  EXPECT_GT(sharding::mlp_tp_peak_bytes(s, 4, 0), sharding::mlp_tp_peak_bytes(s, 4, 3));
  // Many tokens, few FFN columns per chip: the ring buffer phase is the peak.
  sharding::MlpShape wide{64, 32, 8, kernels::Activation::silu, DType::fp32, 1};
  // tp=8: ffn_r = 1; local phase 2x64x1 = 128 elements < ring chunk 64x32/8 = 256.
  EXPECT_DOUBLE_EQ(sharding::mlp_tp_peak_bytes(wide, 8, 0), 4.0 * (3 * 32 * 1 + 2 * 64 * 32 + 256));
  EXPECT_NO_THROW(sharding::check_mlp_fits(s, 4, 1.0));
  try {
    sharding::check_mlp_fits(s, 4, 1e-6);
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("simulated out of memory on chip 0: needs"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("GiB (1.2 KiB), has 0.000 GiB (1.0 KiB)"), std::string::npos) << e.what();
  }
}

// The tracker's replay of the planned allocations and the closed form agree for every chip, shape and tp.
TEST(Mlp, MemoryPlanMatchesTheClosedForm) {
  for (const sharding::MlpShape& s : {sharding::MlpShape{10, 16, 37, kernels::Activation::silu, DType::bf16, 1},
                                      sharding::MlpShape{64, 32, 8, kernels::Activation::gelu, DType::fp32, 1},
                                      sharding::MlpShape{512, 4096, 11008, kernels::Activation::silu, DType::fp32, 1}}) {
    for (int tp : {1, 2, 3, 4, 8}) {
      if (s.ffn < tp) continue;
      for (int r = 0; r < tp; ++r) {
        const auto m = sharding::plan_mlp_tp_memory(s, tp, r, 1e12);
        EXPECT_EQ(double(m.peak()), sharding::mlp_tp_peak_bytes(s, tp, r)) << "tp=" << tp << " rank=" << r;
        EXPECT_EQ(m.in_use(), 0u);  // everything freed at the end of the plan
        EXPECT_EQ(m.chip(), r);
      }
    }
  }
  // The default job (Llama-2-7B MLP, tp=8, fp32): the peak is set by y during the local forward.
  const sharding::MlpShape llama{512, 4096, 11008, kernels::Activation::silu, DType::fp32, 1};
  const auto m = sharding::plan_mlp_tp_memory(llama, 8, 0, 32.0 * 1073741824.0);
  EXPECT_EQ(m.peak(), uint64_t(4) * (3 * 4096 * 1376 + 2 * 512 * 4096 + 2 * 512 * 1376));
  EXPECT_EQ(m.peak_allocation(), "y [512, 4096]");
  ASSERT_EQ(m.live_at_peak().size(), 7u);
}

TEST(Mlp, OutOfMemoryNamesTheChipAndTheAllocation) {
  const sharding::MlpShape s{512, 4096, 11008, kernels::Activation::silu, DType::fp32, 1};
  // Chip 0 holds 1376 FFN columns; x (8 MiB) and three 21.5 MiB weight shards are resident. 0.05 GiB = 51.2 MiB
  // holds x, w_gate and w_up (51 MiB) but not w_down.
  try {
    sharding::check_mlp_fits(s, 8, 0.05);
    FAIL() << "no error";
  } catch (const sim::OutOfMemory& e) {
    EXPECT_EQ(e.exit_code(), 2);
    EXPECT_EQ(e.chip(), 0);
    EXPECT_EQ(e.allocation(), "w_down [1376, 4096]");
    EXPECT_EQ(std::string(e.what()).rfind("simulated out of memory on chip 0: needs 0.071 GiB, has 0.050 GiB "
                                          "(allocating 'w_down [1376, 4096]' of 21.500 MiB; in use before: ",
                                          0),
              0u)
        << e.what();
  }
  // 11008 = 8 x 1376: every chip is the same, so chip 0 fails first. With 11009 columns chip 0 has one more.
  const sharding::MlpShape uneven{512, 4096, 11009, kernels::Activation::silu, DType::fp32, 1};
  const double chip1 = sharding::mlp_tp_peak_bytes(uneven, 8, 1);
  EXPECT_NO_THROW(sharding::check_mlp_fits(uneven, 8, sharding::mlp_tp_peak_bytes(uneven, 8, 0) / 1073741824.0));
  try {
    sharding::check_mlp_fits(uneven, 8, chip1 / 1073741824.0);  // enough for chips 1..7, not for chip 0
    FAIL() << "no error";
  } catch (const sim::OutOfMemory& e) {
    EXPECT_EQ(e.chip(), 0);
    EXPECT_EQ(e.allocation(), "y [512, 4096]");
  }
}

// The forward itself allocates its tensors in the tracker and frees the temporaries.
TEST(Mlp, ForwardCountsItsAllocations) {
  sharding::MlpShape s{10, 16, 37, kernels::Activation::silu, DType::fp32, 1};
  sim::Memory m(0, 1e9);
  {
    const auto resident = sharding::allocate_mlp_resident(m, s, s.ffn);
    EXPECT_EQ(m.in_use(), 4u * (10 * 16 + 3 * 16 * 37));
    const auto x = sharding::make_mlp_input(s);
    const auto w = sharding::make_mlp_weights(s, 0, s.ffn);
    sharding::mlp_forward(s, x, w, nullptr, nullptr, &m);
    EXPECT_EQ(m.in_use(), 4u * (10 * 16 + 3 * 16 * 37));  // gate, up and y are gone again
    EXPECT_EQ(double(m.peak()), sharding::mlp_tp_peak_bytes(s, 1, 0));
  }
  EXPECT_EQ(m.in_use(), 0u);
}

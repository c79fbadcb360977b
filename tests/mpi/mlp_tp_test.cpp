// The Megatron tensor-parallel MLP over real ranks against the single-device MLP (computed on every rank).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstring>

#include "models/mlp.h"

using namespace shardsim;
using runtime::DType;
using runtime::Tensor;

namespace {
double rel_error(const Tensor& y, const Tensor& ref) {
  double e = 0, m = 0;
  for (int64_t i = 0; i < y.numel(); ++i) {
    e = std::max(e, std::fabs(double(y.get(i)) - ref.get(i)));
    m = std::max(m, std::fabs(double(ref.get(i))));
  }
  return e / m;
}
}  // namespace

class TpMlp : public ::testing::TestWithParam<std::tuple<int64_t, DType, kernels::Activation>> {};

TEST_P(TpMlp, MatchesSingleDevice) {
  const auto [ffn, dtype, act] = GetParam();
  int rank, p;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &p);
  sharding::MlpShape s{6, 32, ffn, act, dtype, 5};
  auto topo = topology::Topology::ring(p, topology::LinkSpec{100, 500});
  sim::Timeline tl(rank, topo, sim::device_preset("generic"));
  std::vector<int> ids(static_cast<size_t>(p));
  for (int i = 0; i < p; ++i) ids[size_t(i)] = i;
  runtime::Transport tp(MPI_COMM_WORLD, tl, ids);

  const auto part = sharding::ffn_partition(s, p);
  const auto w = sharding::make_mlp_weights(s, int64_t(part.offset(size_t(rank))), int64_t(part.size(size_t(rank))));
  const Tensor x = sharding::make_mlp_input(s);
  sharding::MlpTiming timing;
  // Simulated HBM: the real forward's allocations reach the same peak as the plan check_mlp_fits replays.
  sim::Memory memory(rank, 1e9);
  const auto resident = sharding::allocate_mlp_resident(memory, s, w.ffn_size);
  const Tensor y = sharding::mlp_forward_tp(tp, s, x, w, 0.0, &timing, "ring", &memory);
  EXPECT_EQ(memory.peak(), sharding::plan_mlp_tp_memory(s, p, rank, 1e9).peak()) << "p=" << p << " rank=" << rank;
  EXPECT_EQ(double(memory.peak()), sharding::mlp_tp_peak_bytes(s, p, rank));
  EXPECT_EQ(memory.live_count(), 4u);  // only the resident x and weights are left
  const Tensor ref = sharding::mlp_forward(s, x, sharding::make_mlp_weights(s, 0, s.ffn), nullptr, nullptr);
  // fp32: the bound. bf16: 2^-6 relative to max|y| (see docs/performance/workloads.md, "bf16 tolerance", for the justification).
  const double tol = dtype == DType::fp32 ? 1e-5 : 1.0 / 64;
  EXPECT_LE(rel_error(y, ref), tol) << "ffn=" << ffn << " p=" << p;
  if (p == 1 && dtype == DType::fp32) {
    EXPECT_TRUE(y.bit_equal(ref));
  }
  // Communication volume: ring all_reduce sends 2(p-1)/p of the output per chip.
  const double m = double(y.nbytes());
  EXPECT_NEAR(timing.all_reduce_bytes_sent, 2.0 * (p - 1) / p * m, 2.0 * double(runtime::dtype_size(dtype)) * p);
  // Every chip holds the same output.
  std::vector<unsigned char> first(y.nbytes());
  std::memcpy(first.data(), y.data(), y.nbytes());
  MPI_Bcast(first.data(), int(first.size()), MPI_BYTE, 0, MPI_COMM_WORLD);
  EXPECT_EQ(std::memcmp(first.data(), y.data(), y.nbytes()), 0);
}

INSTANTIATE_TEST_SUITE_P(Shapes, TpMlp,
                         ::testing::Combine(::testing::Values(int64_t{40}, int64_t{37}, int64_t{203}),
                                            ::testing::Values(DType::fp32, DType::bf16),
                                            ::testing::Values(kernels::Activation::silu, kernels::Activation::gelu)));

// Fused GEMM + collective ops (sharding/fused.h): the same numbers as the unfused path at several chip counts,
// chunk counts and uneven sizes, and the simulated overlap the fusion is for.
#include <gtest/gtest.h>

#include <cmath>

#include "collectives/collectives.h"
#include "kernels/backward.h"
#include "kernels/gemm.h"
#include "kernels/norm.h"
#include "mpi/collective_fixture.h"
#include "mpi/mpi_util.h"
#include "sharding/fused.h"
#include "models/init.h"

using namespace shardsim;
using runtime::DType;
using runtime::Tensor;

namespace {

Tensor random(int64_t rows, int64_t cols, uint32_t id, int64_t global_cols = -1, int64_t row0 = 0, int64_t col0 = 0) {
  Tensor t(DType::fp32, {rows, cols});
  models::fill_uniform_block(t, models::InitSpec{42, id, -1.0f, 1.0f}, global_cols < 0 ? cols : global_cols, row0, col0);
  return t;
}

double max_rel_diff(const Tensor& a, const Tensor& b) {
  double err = 0, ref = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    err = std::max(err, std::fabs(double(a.get(i)) - b.get(i)));
    ref = std::max(ref, std::fabs(double(b.get(i))));
  }
  return ref > 0 ? err / ref : err;
}

topology::Topology ring(double bw, double lat) { return topology::Topology::ring(world_size(), {bw, lat}); }

}  // namespace

TEST(Fused, GemmAllReduceEqualsUnfusedAtEveryChunkCount) {
  const int p = world_size(), r = world_rank();
  for (int64_t M : {1, 7, 64, 101}) {
    const int64_t K = 24, N = 40;  // K split over ranks (row-parallel): rank r holds K/p... use a local slice
    const Tensor a = random(M, K, 1, K * p, 0, r * K), b = random(K, N, 2, N, r * K, 0);
    Fixture f(ring(100, 500));
    Tensor want(DType::fp32, {M, N});
    kernels::gemm(a, b, want);
    collectives::all_reduce(f.tp, want.data(), want.data(), static_cast<size_t>(want.numel()), DType::fp32,
                            collectives::ReduceOp::sum, 0.0, opts("ring"));
    for (int chunks : {1, 2, 3, 8}) {
      if (chunks > M) continue;
      Tensor got(DType::fp32, {M, N});
      f.tl.reset();
      sharding::gemm_all_reduce(f.tp, a, b, got, chunks, 0.0, "fused");
      EXPECT_LE(max_rel_diff(got, want), 1e-5) << "M " << M << " chunks " << chunks << " p " << p;
    }
  }
}

TEST(Fused, AllGatherGemmAndGemmReduceScatterEqualUnfused) {
  const int p = world_size(), r = world_rank();
  for (int64_t m : {1, 5, 32}) {
    const int64_t M = m * p, K = 16, N = 12;
    Fixture f(ring(100, 500));
    // all_gather + GEMM
    const Tensor x = random(m, K, 3, K, r * m, 0), w = random(K, N, 4, N * p, 0, r * N);
    Tensor full(DType::fp32, {M, K});
    collectives::all_gather(f.tp, x.data(), full.data(), static_cast<size_t>(full.numel()), DType::fp32, 0.0, opts("ring"));
    Tensor want(DType::fp32, {M, N}), got(DType::fp32, {M, N});
    kernels::gemm(full, w, want);
    sharding::all_gather_gemm(f.tp, x, w, got, 0.0, "ag_gemm");
    EXPECT_LE(max_rel_diff(got, want), 1e-6) << "all_gather_gemm m " << m;  // BLAS may block rows differently
    // GEMM + reduce_scatter
    const Tensor a = random(M, K, 5, K * p, 0, r * K), b = random(K, N, 6, N, r * K, 0);
    Tensor partial(DType::fp32, {M, N}), want_rs(DType::fp32, {m, N}), got_rs(DType::fp32, {m, N});
    kernels::gemm(a, b, partial);
    collectives::reduce_scatter(f.tp, partial.data(), want_rs.data(), static_cast<size_t>(partial.numel()), DType::fp32,
                                collectives::ReduceOp::sum, 0.0, opts("ring"));
    sharding::gemm_reduce_scatter(f.tp, a, b, got_rs, 0.0, "gemm_rs");
    EXPECT_LE(max_rel_diff(got_rs, want_rs), 1e-5) << "gemm_reduce_scatter m " << m;
  }
}

// The backward counterparts (the trainer's, models/lm_tp.h): all_gather_gemm_backward = all_gather(dY), then
// dX = dY·Wᵀ and dW = Xᵀ·dY; gemm_reduce_scatter_backward = reduce_scatter(Σ_j dY_j·W_jᵀ) and dW_j = all_gather(X)ᵀ·dY_j,
// against those collectives and gemm_backward run unfused; uneven per-rank values, 1 and 2 weights. The dW GEMMs
// are the unfused path's own call (exactly equal); dX rows may differ by BLAS blocking / the ring's add order.
TEST(Fused, BackwardFormsEqualUnfused) {
  const int p = world_size(), r = world_rank();
  for (int64_t m : {1, 6}) {
    const int64_t M = m * p, K = 10, N = 7;
    Fixture f(ring(100, 500));
    // Row-parallel layer: dY rows of this rank, X [M, K] and W [K, N] local.
    const Tensor dy = random(m, N, 21, N, r * m, 0), x = random(M, K, 22 + uint32_t(r)), w = random(K, N, 30 + uint32_t(r));
    Tensor dy_full(DType::fp32, {M, N});
    collectives::all_gather(f.tp, dy.data(), dy_full.data(), static_cast<size_t>(dy_full.numel()), DType::fp32, 0.0,
                            opts("ring"));
    Tensor want_dx(DType::fp32, {M, K}), want_dw(DType::fp32, {K, N}), dx(DType::fp32, {M, K}), dw(DType::fp32, {K, N});
    kernels::gemm_backward(x, w, dy_full, &want_dx, &want_dw);
    const auto t1 = sharding::all_gather_gemm_backward(f.tp, dy, x, w, dx, dw, 0.0, "ag_bwd");
    EXPECT_LE(max_rel_diff(dx, want_dx), 1e-6) << "all_gather_gemm_backward dX m " << m;
    EXPECT_TRUE(dw.bit_equal(want_dw)) << "all_gather_gemm_backward dW m " << m;
    EXPECT_GT(t1.fused_ns, 0);
    // Column-parallel layers: X this rank's rows, W_j and dY_j local.
    const Tensor xr = random(m, K, 41, K, r * m, 0);
    const Tensor w0 = random(K, N, 50 + uint32_t(r)), w1 = random(K, 3, 60 + uint32_t(r));
    const Tensor g0 = random(M, N, 70 + uint32_t(r)), g1 = random(M, 3, 80 + uint32_t(r));
    Tensor x_full(DType::fp32, {M, K});
    collectives::all_gather(f.tp, xr.data(), x_full.data(), static_cast<size_t>(x_full.numel()), DType::fp32, 0.0,
                            opts("ring"));
    for (int nw : {1, 2}) {
      Tensor part(DType::fp32, {M, K}), more(DType::fp32, {M, K}), want_x(DType::fp32, {m, K});
      Tensor want_w0(DType::fp32, {K, N}), want_w1(DType::fp32, {K, 3});
      kernels::gemm_backward(x_full, w0, g0, &part, &want_w0);
      if (nw == 2) {
        kernels::gemm_backward(x_full, w1, g1, &more, &want_w1);
        kernels::add_inplace(part, more);
      }
      collectives::reduce_scatter(f.tp, part.data(), want_x.data(), static_cast<size_t>(part.numel()), DType::fp32,
                                  collectives::ReduceOp::sum, 0.0, opts("ring"));
      Tensor got_x(DType::fp32, {m, K}), d0(DType::fp32, {K, N}), d1(DType::fp32, {K, 3});
      std::vector<const Tensor*> ws{&w0}, gs{&g0};
      std::vector<Tensor*> dws{&d0};
      if (nw == 2) {
        ws.push_back(&w1);
        gs.push_back(&g1);
        dws.push_back(&d1);
      }
      sharding::gemm_reduce_scatter_backward(f.tp, xr, ws, gs, got_x, dws, 0.0, "rs_bwd");
      EXPECT_LE(max_rel_diff(got_x, want_x), 1e-5) << "gemm_reduce_scatter_backward dX m " << m << " weights " << nw;
      EXPECT_TRUE(d0.bit_equal(want_w0)) << "dW0 m " << m;
      if (nw == 2) {
        EXPECT_TRUE(d1.bit_equal(want_w1)) << "dW1 m " << m;
      }
    }
  }
}

TEST(Fused, BadShapesAreUsageErrors) {
  Fixture f(ring(100, 500));
  Tensor a(DType::fp32, {4, 3}), b(DType::fp32, {5, 2}), c(DType::fp32, {4, 2});
  expect_usage_error([&] { sharding::gemm_all_reduce(f.tp, a, b, c, 1, 0.0, "x"); }, {"x:", "do not fit"}, "shapes");
  Tensor b2(DType::fp32, {3, 2});
  expect_usage_error([&] { sharding::gemm_all_reduce(f.tp, a, b2, c, -1, 0.0, "x"); }, {"chunks -1", "rows"}, "chunks");
  expect_usage_error([&] { sharding::gemm_all_reduce(f.tp, a, b2, c, 5, 0.0, "x"); }, {"chunks 5", "0 (auto)..4"},
                     "chunks > rows");
}

// The cut follows the longer side of C (columns when N > M), results still equal the unfused path; with one
// piece the fused op IS the unfused path, so its modelled unfused time must equal what ran, and T_comm must
// equal the all_reduce run alone.
TEST(Fused, CutRuleAndTheReportedUnfusedAndCommTimesAreWhatTheUnfusedPathTakes) {
  const int p = world_size(), r = world_rank();
  for (auto [M, N] : {std::pair<int64_t, int64_t>{6, 50}, {50, 6}, {9, 9}}) {
    const int64_t K = 20;
    const Tensor a = random(M, K, 11, K * p, 0, r * K), b = random(K, N, 12, N, r * K, 0);
    Fixture f(ring(100, 500));
    Tensor want(DType::fp32, {M, N});
    const auto cost = kernels::gemm(a, b, want);
    const auto g = f.tl.compute("gemm", cost.flops, cost.bytes, sim::Precision::fp32, 0.0, cost.shape);
    const auto ar = collectives::all_reduce(f.tp, want.data(), want.data(), static_cast<size_t>(want.numel()),
                                            DType::fp32, collectives::ReduceOp::sum, g.end, opts("ring"));
    const double unfused = ar.span.end;
    for (int chunks : {1, 3, 7}) {
      Tensor got(DType::fp32, {M, N});
      f.tl.reset();
      const auto t = sharding::gemm_all_reduce(f.tp, a, b, got, chunks, 0.0, "fused");
      EXPECT_EQ(t.cut, N > M ? "columns" : "rows") << M << "x" << N;
      EXPECT_EQ(t.chunks, chunks);
      EXPECT_LE(max_rel_diff(got, want), 1e-5) << M << "x" << N << " chunks " << chunks << " p " << p;
      // The replay estimate takes S/p bytes per ring chunk: 9x9 = 81 elements split 21/20/20/20 over 4 ranks
      // is off by up to one element per step (collectives/algorithms.h), hence 1e-4, not 1e-9.
      EXPECT_NEAR(t.unfused_ns, unfused, 1e-4 * unfused) << "the model's unfused time = the unfused path";
      EXPECT_NEAR(t.comm_ns, ar.span.duration(), 1e-4 * unfused) << "T_comm = the all_reduce alone";
      if (chunks == 1) {
        EXPECT_NEAR(t.fused_ns, unfused, 1e-9 * unfused) << "one piece = unfused";
      }
      if (M * N % p == 0) {
        EXPECT_NEAR(t.comm_ns, ar.span.duration(), 1e-9 * unfused) << "even chunks: exact";
      }
    }
  }
}

// chunks = 0: every rank picks the same count (else the pieces' all_reduces would not match and the test would
// hang or fail the argument check), and the pick is close to the best of an explicit sweep.
TEST(Fused, AutoChunksIsCloseToTheBestOfTheSweep) {
  const int p = world_size(), r = world_rank();
  if (p < 2) GTEST_SKIP() << "needs 2+ ranks";
  const int64_t M = 256, K = 96 + 8 * r, N = 384;  // uneven K_r: ranks model different GEMM times
  const Tensor a = random(M, K, 13), b = random(K, N, 14);
  auto topo = topology::Topology::ring(p, {20, 200});
  sim::DeviceSpec dev = sim::device_preset("generic");
  dev.peak_tflops_fp32 = 1.0;
  dev.launch_overhead_ns = 100;
  sim::Timeline tl(r, topo, dev);
  runtime::Transport tp(MPI_COMM_WORLD, tl, identity_chips(p));
  Tensor c(DType::fp32, {M, N});
  double best = 1e300;
  for (int chunks = 1; chunks <= 64; chunks *= 2) {
    tl.reset();
    best = std::min(best, sharding::gemm_all_reduce(tp, a, b, c, chunks, 0.0, "sweep").fused_ns);
  }
  tl.reset();
  const auto t = sharding::gemm_all_reduce(tp, a, b, c, 0, 0.0, "auto");
  EXPECT_TRUE(t.auto_chunks);
  EXPECT_GT(t.chunks, 1) << "a balanced config gains from pieces";
  int lo = t.chunks, hi = t.chunks;
  MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  EXPECT_EQ(lo, hi) << "every rank must pick the same count";
  EXPECT_LE(t.fused_ns, 1.05 * best) << "auto picked " << t.chunks;
  EXPECT_LT(t.fused_ns, t.unfused_ns);
}

// One gather feeding several weights (Q/K/V, gate/up) equals one all_gather_gemm per weight.
TEST(Fused, AllGatherGemmWithSeveralWeightsEqualsOnePerWeight) {
  const int p = world_size(), r = world_rank();
  const int64_t m = 3, K = 16;
  Fixture f(ring(100, 500));
  const Tensor x = random(m, K, 15, K, r * m, 0), w1 = random(K, 5, 16), w2 = random(K, 9, 17);
  Tensor c1(DType::fp32, {m * p, 5}), c2(DType::fp32, {m * p, 9}), want1(DType::fp32, {m * p, 5}),
      want2(DType::fp32, {m * p, 9});
  const auto both = sharding::all_gather_gemm(f.tp, x, {&w1, &w2}, {&c1, &c2}, 0.0, "both");
  f.tl.reset();
  const auto t1 = sharding::all_gather_gemm(f.tp, x, w1, want1, 0.0, "one");
  f.tl.reset();
  const auto t2 = sharding::all_gather_gemm(f.tp, x, w2, want2, 0.0, "two");
  EXPECT_TRUE(c1.bit_equal(want1));
  EXPECT_TRUE(c2.bit_equal(want2));
  EXPECT_NEAR(both.compute_ns, t1.compute_ns + t2.compute_ns, 1e-6);
  EXPECT_DOUBLE_EQ(both.bytes_sent, t1.bytes_sent);  // one gather, not two
  // Unfused, a device with fused kernels runs the weights as one GEMM over their concatenated columns
  // (sharding/plans/block_ops.h, column_gemms): the estimate of one all_gather_gemm with that [K, 14] weight.
  const Tensor w12 = random(K, 14, 18);
  Tensor c12(DType::fp32, {m * p, 14});
  f.tl.reset();
  const auto t12 = sharding::all_gather_gemm(f.tp, x, w12, c12, 0.0, "cat");
  EXPECT_NEAR(both.unfused_ns, t12.unfused_ns, 1e-6);
  EXPECT_LT(both.unfused_ns, t1.unfused_ns + t2.unfused_ns - t1.comm_ns);  // one launch, not two
}

// Balanced GEMM and all_reduce (T_comm ~ T_compute): with enough chunks the fused time is close to the larger of
// the two, and the chunk sweep shows the trade-off (1 chunk: no overlap; many: per-chunk launch and latency).
// A slow compute-bound device (1 TFLOP/s, 100 ns launch) keeps the host work small and the GEMM chunks
// compute-bound, so chunking does not change their FLOP time.
TEST(Fused, OverlapOnABalancedConfigAndTheChunkTradeOff) {
  const int p = world_size();
  if (p < 2) GTEST_SKIP() << "needs 2+ ranks";
  const int64_t M = 512, K = 256, N = 512;
  const Tensor a = random(M, K, 7), b = random(K, N, 8);
  sim::DeviceSpec dev = sim::device_preset("generic");
  dev.peak_tflops_fp32 = 1.0;
  dev.launch_overhead_ns = 100;
  const double t_gemm = 2.0 * M * K * N / 1e3 + 100;  // ns at 1 TFLOP/s (compute-bound: 2 MB of HBM traffic)
  const double alpha = 50, S = double(M * N * 4), steps = 2.0 * (p - 1);
  const double bw = steps * S / p / (t_gemm - steps * alpha);  // ring all_reduce = t_gemm
  auto topo = topology::Topology::ring(p, {bw, alpha});
  sim::Timeline tl(world_rank(), topo, dev);
  runtime::Transport tp(MPI_COMM_WORLD, tl, identity_chips(p));
  Tensor c(DType::fp32, {M, N});
  const auto cost = kernels::gemm(a, b, c);
  const auto g = tl.compute("gemm", cost.flops, cost.bytes, sim::Precision::fp32, 0.0, cost.shape);
  const auto ar = collectives::all_reduce(tp, c.data(), c.data(), static_cast<size_t>(c.numel()), DType::fp32,
                                          collectives::ReduceOp::sum, g.end, opts("ring"));
  const double t_compute = g.duration(), t_comm = ar.span.duration(), unfused = ar.span.end;
  EXPECT_NEAR(t_compute, t_gemm, 1e-6 * t_gemm);
  EXPECT_NEAR(t_comm, t_gemm, 0.01 * t_gemm) << "the config is balanced";
  std::vector<int> counts = {1, 2, 4, 8, 16, 64, 256};
  std::vector<double> sweep;
  for (int chunks : counts) {
    tl.reset();
    sweep.push_back(sharding::gemm_all_reduce(tp, a, b, c, chunks, 0.0, "fused").fused_ns);
  }
  EXPECT_NEAR(sweep[0], unfused, 1e-6 * unfused) << "one chunk = unfused";
  const double best = *std::min_element(sweep.begin(), sweep.end());
  EXPECT_LE(best, 1.15 * std::max(t_compute, t_comm)) << "compute " << t_compute << " comm " << t_comm;
  EXPECT_GT(sharding::overlap_efficiency(t_compute, t_comm, best), 0.7);
  EXPECT_LT(sweep[3], sweep[0]);                  // 8 chunks beat 1 ...
  EXPECT_GT(sweep.back(), best * 1.1);           // ... and 256 chunks pay launch + latency per chunk
  if (world_rank() == 0) {
    std::printf("[fused sweep p=%d] T_compute %.2f us, T_comm %.2f us, unfused %.2f us; fused by chunks", p,
                t_compute / 1e3, t_comm / 1e3, unfused / 1e3);
    for (size_t i = 0; i < counts.size(); ++i) std::printf(" %d:%.2f", counts[i], sweep[i] / 1e3);
    std::printf(" us; best: %.3f x max(T_compute, T_comm), overlap efficiency %.2f, speedup %.2fx\n",
                best / std::max(t_compute, t_comm), sharding::overlap_efficiency(t_compute, t_comm, best), unfused / best);
  }
}

// Crossing flows (docs/MODEL.md): a fused op's ring step declares the ring shift r -> r + 1, as the collective ring
// does. On a line of 4 whose ranks sit on chips 0 2 1 3 the shift runs chip 0 -> 2 and 1 -> 3 (both over link
// 1 -> 2) and 2 -> 1 and 3 -> 0 (both over 2 -> 1), so every ring send takes 2 S/B; with rank r on chip r the
// forward flows and the wrap-around 3 -> 0 use disjoint links and each send takes S/B.
TEST(Fused, RingStepsShareTheLinksTheirFlowsCross) {
  const int p = world_size(), r = world_rank();
  if (p != 4) GTEST_SKIP() << "needs 4 ranks";
  const double bw = 100;
  for (bool crossed : {true, false}) {
    const std::vector<int> chips = crossed ? std::vector<int>{0, 2, 1, 3} : identity_chips(4);
    Fixture f(topology::Topology::mesh({4}, {{bw, 500}}), chips);
    const int64_t m = 32, K = 16, N = 12;
    const Tensor x = random(m, K, 3, K, r * m, 0), w = random(K, N, 4, N * p, 0, r * N);
    Tensor got(DType::fp32, {m * p, N});
    sharding::all_gather_gemm(f.tp, x, w, got, 0.0, "ag_gemm");
    const Tensor a = random(m * p, K, 5, K * p, 0, r * K), b = random(K, N, 6, N, r * K, 0);
    Tensor got_rs(DType::fp32, {m, N});
    sharding::gemm_reduce_scatter(f.tp, a, b, got_rs, 0.0, "gemm_rs");
    int sends = 0;
    for (const auto& e : f.tl.events()) {
      if (e.category != "send") continue;
      ++sends;
      const double one = e.bytes / bw;
      EXPECT_NEAR(e.span.duration(), crossed ? 2 * one : one, 1e-9 * one)
          << (crossed ? "chips 0 2 1 3 " : "identity ") << e.name;
    }
    EXPECT_EQ(sends, 2 * (p - 1)) << "p - 1 ring steps in each fused op";
  }
}

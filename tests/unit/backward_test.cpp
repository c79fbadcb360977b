// Backward kernels (kernels/backward.h, cross_entropy.h, embedding.h) against central finite differences of
// fp64 re-implementations of their forwards (tests/unit/grad_check.h).
//
// Tolerance: max |kernel − FD| <= 1e-4 · max |FD| (per gradient tensor). The FD is exact to ~1e-9 relative
// (grad_check.h); the kernels compute in fp32, whose unit roundoff is 6e-8, over sums of at most 16 terms here,
// so their error is bounded by ~16 · 6e-8 ≈ 1e-6 relative (measured: at most 7e-8 in every case). 1e-4 leaves two
// orders of margin for the fp32 forward values the backward reuses, while a wrong term, sign or transpose gives
// an error of order 1.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "kernels/backward.h"
#include "kernels/cross_entropy.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/norm.h"
#include "tests/unit/grad_check.h"

using namespace shardsim;
using namespace shardsim::testing;
using runtime::DType;
using runtime::Tensor;

namespace {

constexpr double kTol = 1e-4;
const float kNaN = std::numeric_limits<float>::quiet_NaN();

bool has_nan(const Tensor& t, int64_t begin = 0, int64_t end = -1) {
  if (end < 0) end = t.numel();
  for (int64_t i = begin; i < end; ++i)
    if (std::isnan(t.get(i))) return true;
  return false;
}

bool all_nan(const Tensor& t, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i)
    if (!std::isnan(t.get(i))) return false;
  return true;
}

}  // namespace

TEST(GemmBackward, MatchesFiniteDifferences) {
  const int64_t M = 5, K = 4, N = 3;
  Tensor x = random_tensor({M, K}, 1), w = random_tensor({K, N}, 2), dy = random_tensor({M, N}, 3);
  Tensor dx(DType::fp32, {M, K}), dw(DType::fp32, {K, N});
  const auto cost = kernels::gemm_backward(x, w, dy, &dx, &dw);
  EXPECT_DOUBLE_EQ(cost.flops, 4.0 * M * N * K);
  const Forward f = [&](const std::vector<Vec>& in) {
    Vec y(size_t(M * N), 0.0);
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j)
        for (int64_t k = 0; k < K; ++k) y[size_t(i * N + j)] += in[0][size_t(i * K + k)] * in[1][size_t(k * N + j)];
    return y;
  };
  const auto g = fd_gradients(f, {widen(x), widen(w)}, widen(dy));
  EXPECT_LT(rel_error(dx, g[0]), kTol);
  EXPECT_LT(rel_error(dw, g[1]), kTol);
  // Either output may be skipped.
  Tensor dw2(DType::fp32, {K, N});
  kernels::gemm_backward(x, w, dy, nullptr, &dw2);
  EXPECT_TRUE(dw2.bit_equal(dw));
  Tensor bad(DType::fp32, {K, K});
  EXPECT_THROW(kernels::gemm_backward(x, w, dy, &bad, nullptr), std::invalid_argument);
}

TEST(GemmBackward, NaNInXReachesItsRowOfDW) {
  const int64_t M = 3, K = 2, N = 4;
  Tensor x = random_tensor({M, K}, 4), w = random_tensor({K, N}, 5), dy = random_tensor({M, N}, 6);
  x.set(1 * K + 0, kNaN);  // X[1, 0]
  Tensor dx(DType::fp32, {M, K}), dw(DType::fp32, {K, N});
  kernels::gemm_backward(x, w, dy, &dx, &dw);
  EXPECT_TRUE(all_nan(dw, 0, N));        // dW[0, :] = Σ_i X[i, 0] dY[i, :]
  EXPECT_FALSE(has_nan(dw, N, 2 * N));   // dW[1, :] does not read X[:, 0]
  EXPECT_FALSE(has_nan(dx));             // dX = dY W^T does not read X
}

TEST(SwigluBackward, MatchesFiniteDifferences) {
  const runtime::Shape s{3, 7};
  Tensor gate = random_tensor(s, 7, -4, 4), up = random_tensor(s, 8), dout = random_tensor(s, 9);
  Tensor dgate(DType::fp32, s), dup(DType::fp32, s);
  const auto cost = kernels::swiglu_backward(gate, up, dout, dgate, dup);
  EXPECT_DOUBLE_EQ(cost.flops, 10.0 * 21);
  // The forward the backward belongs to is glu_inplace(silu): check they agree.
  Tensor fwd = gate;
  kernels::glu_inplace(fwd, up, kernels::Activation::silu);
  const Forward f = [](const std::vector<Vec>& in) {
    Vec y(in[0].size());
    for (size_t i = 0; i < y.size(); ++i) y[i] = in[0][i] / (1 + std::exp(-in[0][i])) * in[1][i];
    return y;
  };
  EXPECT_LT(rel_error(fwd, f({widen(gate), widen(up)})), 1e-6);
  const auto g = fd_gradients(f, {widen(gate), widen(up)}, widen(dout));
  EXPECT_LT(rel_error(dgate, g[0]), kTol);
  EXPECT_LT(rel_error(dup, g[1]), kTol);
}

TEST(SwigluBackward, NaNStaysInItsElement) {
  Tensor gate = random_tensor({2, 3}, 10), up = random_tensor({2, 3}, 11), dout = random_tensor({2, 3}, 12);
  gate.set(4, kNaN);
  Tensor dgate(DType::fp32, {2, 3}), dup(DType::fp32, {2, 3});
  kernels::swiglu_backward(gate, up, dout, dgate, dup);
  EXPECT_TRUE(std::isnan(dgate.get(4)) && std::isnan(dup.get(4)));
  EXPECT_FALSE(has_nan(dgate, 0, 4) || has_nan(dup, 0, 4) || has_nan(dgate, 5, 6));
}

namespace {
Forward rmsnorm_ref(int64_t T, int64_t h, double eps) {
  return [=](const std::vector<Vec>& in) {
    Vec y(size_t(T * h));
    for (int64_t t = 0; t < T; ++t) {
      double ss = 0;
      for (int64_t i = 0; i < h; ++i) ss += in[0][size_t(t * h + i)] * in[0][size_t(t * h + i)];
      const double r = 1 / std::sqrt(ss / double(h) + eps);
      for (int64_t i = 0; i < h; ++i) y[size_t(t * h + i)] = in[0][size_t(t * h + i)] * r * in[1][size_t(i)];
    }
    return y;
  };
}
}  // namespace

TEST(RmsnormBackward, MatchesFiniteDifferences) {
  const int64_t T = 3, h = 8;
  const float eps = 1e-5f;
  Tensor x = random_tensor({T, h}, 13), w = random_tensor({h}, 14, 0.5f, 1.5f), dy = random_tensor({T, h}, 15);
  Tensor dx(DType::fp32, {T, h}), dw(DType::fp32, {h}), y(DType::fp32, {T, h});
  kernels::rmsnorm(x, w, y, eps);
  const auto f = rmsnorm_ref(T, h, double(eps));
  EXPECT_LT(rel_error(y, f({widen(x), widen(w)})), 1e-6);
  const auto cost = kernels::rmsnorm_backward(x, w, dy, dx, &dw, eps);
  EXPECT_DOUBLE_EQ(cost.flops, 12.0 * T * h);
  const auto g = fd_gradients(f, {widen(x), widen(w)}, widen(dy));
  EXPECT_LT(rel_error(dx, g[0]), kTol);
  EXPECT_LT(rel_error(dw, g[1]), kTol);
}

TEST(RmsnormBackward, NaNRowStaysInItsRow) {
  const int64_t T = 3, h = 4;
  Tensor x = random_tensor({T, h}, 16), w = random_tensor({h}, 17), dy = random_tensor({T, h}, 18);
  x.set(1 * h + 2, kNaN);
  Tensor dx(DType::fp32, {T, h}), dw(DType::fp32, {h});
  kernels::rmsnorm_backward(x, w, dy, dx, &dw);
  EXPECT_TRUE(all_nan(dx, h, 2 * h));                          // the row's statistic is NaN
  EXPECT_FALSE(has_nan(dx, 0, h) || has_nan(dx, 2 * h, 3 * h));  // rows are independent
  EXPECT_TRUE(all_nan(dw, 0, h));                              // dw sums over every row
}

TEST(RopeBackward, MatchesFiniteDifferences) {
  const int64_t T = 4, H = 2, d = 6;
  const std::vector<int64_t> pos{0, 3, 7, 100};
  Tensor x = random_tensor({T, H, d}, 19), dy = random_tensor({T, H, d}, 20);
  const Forward f = [&](const std::vector<Vec>& in) {
    Vec y(in[0].size());
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < d / 2; ++i) {
        const double a = double(pos[size_t(t)]) * std::pow(10000.0, -2.0 * double(i) / double(d));
        for (int64_t hh = 0; hh < H; ++hh) {
          const size_t b = size_t((t * H + hh) * d + 2 * i);
          y[b] = in[0][b] * std::cos(a) - in[0][b + 1] * std::sin(a);
          y[b + 1] = in[0][b] * std::sin(a) + in[0][b + 1] * std::cos(a);
        }
      }
    return y;
  };
  Tensor y = x;
  kernels::rope_inplace(y, pos);
  EXPECT_LT(rel_error(y, f({widen(x)})), 1e-6);
  Tensor dx = dy;
  kernels::rope_backward_inplace(dx, pos);
  EXPECT_LT(rel_error(dx, fd_gradients(f, {widen(x)}, widen(dy))[0]), kTol);
  dx.set(5, kNaN);  // a NaN gradient element stays in its rotated pair
  kernels::rope_backward_inplace(dx, pos);
  EXPECT_TRUE(std::isnan(dx.get(4)) && std::isnan(dx.get(5)));
  EXPECT_FALSE(has_nan(dx, 0, 4) || has_nan(dx, 6, dx.numel()));
}

TEST(AddBackward, MatchesFiniteDifferences) {
  Tensor a = random_tensor({2, 5}, 21), b = random_tensor({2, 5}, 22), dy = random_tensor({2, 5}, 23);
  Tensor da(DType::fp32, {2, 5}), db(DType::fp32, {2, 5});
  kernels::add_backward(dy, da, db);
  const Forward f = [](const std::vector<Vec>& in) {
    Vec y(in[0].size());
    for (size_t i = 0; i < y.size(); ++i) y[i] = in[0][i] + in[1][i];
    return y;
  };
  const auto g = fd_gradients(f, {widen(a), widen(b)}, widen(dy));
  EXPECT_LT(rel_error(da, g[0]), kTol);
  EXPECT_LT(rel_error(db, g[1]), kTol);
}

namespace {

// Mean cross-entropy of logits [T, V] in fp64.
double ce_ref(const Vec& z, const std::vector<int64_t>& y, int64_t T, int64_t V) {
  double total = 0;
  for (int64_t t = 0; t < T; ++t) {
    double m = -INFINITY;
    for (int64_t v = 0; v < V; ++v) m = std::max(m, z[size_t(t * V + v)]);
    double s = 0;
    for (int64_t v = 0; v < V; ++v) s += std::exp(z[size_t(t * V + v)] - m);
    total += m + std::log(s) - z[size_t(t * V + y[size_t(t)])];
  }
  return total / double(T);
}

// The four kernel calls on one shard list, with the all_reduce(max) / all_reduce(sum) done here as the caller
// would over the vocabulary axis. Returns the per-token losses and each shard's dlogits.
struct CeResult {
  Tensor loss;
  std::vector<Tensor> dlogits;
};
CeResult vocab_parallel_ce(const std::vector<Tensor>& shards, const std::vector<int64_t>& targets, int64_t vocab) {
  const int64_t T = shards[0].dim(0);
  Tensor m(DType::fp32, {T}), sumexp(DType::fp32, {T}), target(DType::fp32, {T}), loss(DType::fp32, {T});
  for (int64_t t = 0; t < T; ++t) m.f32()[t] = -INFINITY;
  for (const auto& s : shards) {
    Tensor ml(DType::fp32, {T});
    kernels::ce_shard_max(s, ml);
    for (int64_t t = 0; t < T; ++t) m.f32()[t] = std::max(m.f32()[t], ml.f32()[t]);  // all_reduce(max)
  }
  int64_t v0 = 0;
  for (const auto& s : shards) {
    Tensor sl(DType::fp32, {T}), tl(DType::fp32, {T});
    kernels::ce_shard_stats(s, m, targets, v0, vocab, sl, tl);
    for (int64_t t = 0; t < T; ++t) {  // all_reduce(sum)
      sumexp.f32()[t] += sl.f32()[t];
      target.f32()[t] += tl.f32()[t];
    }
    v0 += s.dim(1);
  }
  kernels::ce_loss(m, sumexp, target, loss);
  CeResult r{loss, {}};
  v0 = 0;
  for (const auto& s : shards) {
    Tensor dz(DType::fp32, s.shape());
    kernels::ce_backward(s, m, sumexp, targets, v0, vocab, 1.0f / float(T), dz);
    r.dlogits.push_back(dz);
    v0 += s.dim(1);
  }
  return r;
}

Tensor columns(const Tensor& z, int64_t c0, int64_t n) {
  Tensor out(z.dtype(), {z.dim(0), n});
  for (int64_t t = 0; t < z.dim(0); ++t)
    for (int64_t c = 0; c < n; ++c) out.set(t * n + c, z.get(t * z.dim(1) + c0 + c));
  return out;
}

}  // namespace

TEST(CrossEntropy, SingleShardMatchesFiniteDifferences) {
  const int64_t T = 4, V = 10;
  const std::vector<int64_t> y{3, 0, 9, 3};
  Tensor z = random_tensor({T, V}, 24, -3, 3);
  const auto r = vocab_parallel_ce({z}, y, V);
  double mean = 0;
  for (int64_t t = 0; t < T; ++t) mean += r.loss.get(t) / double(T);
  EXPECT_NEAR(mean, ce_ref(widen(z), y, T, V), 1e-6);
  const Forward f = [&](const std::vector<Vec>& in) { return Vec{ce_ref(in[0], y, T, V)}; };
  EXPECT_LT(rel_error(r.dlogits[0], fd_gradients(f, {widen(z)}, Vec{1.0})[0]), kTol);
}

TEST(CrossEntropy, VocabShardsCombineToTheFullLoss) {
  // Megatron's vocab-parallel form: shards of 3, 3 and 4 columns, no shard holding a full row; targets in each.
  const int64_t T = 5, V = 10;
  const std::vector<int64_t> y{0, 4, 9, 6, 2};
  Tensor z = random_tensor({T, V}, 25, -5, 5);
  z.set(2 * V + 7, 40.0f);  // a large logit in another shard than the row's target: the max must be global
  const auto full = vocab_parallel_ce({z}, y, V);
  const auto sharded = vocab_parallel_ce({columns(z, 0, 3), columns(z, 3, 3), columns(z, 6, 4)}, y, V);
  for (int64_t t = 0; t < T; ++t) EXPECT_NEAR(sharded.loss.get(t), full.loss.get(t), 1e-5 * std::max(1.0f, full.loss.get(t)));
  int64_t c0 = 0;
  for (const auto& dz : sharded.dlogits) {
    const Tensor want = columns(full.dlogits[0], c0, dz.dim(1));
    for (int64_t i = 0; i < dz.numel(); ++i) EXPECT_NEAR(dz.get(i), want.get(i), 1e-7);
    c0 += dz.dim(1);
  }
  // And the sharded gradient is the fp64 finite difference of the full loss.
  const Forward f = [&](const std::vector<Vec>& in) { return Vec{ce_ref(in[0], y, T, V)}; };
  const auto g = fd_gradients(f, {widen(z)}, Vec{1.0})[0];
  Tensor joined(DType::fp32, {T, V});
  c0 = 0;
  for (const auto& dz : sharded.dlogits) {
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < dz.dim(1); ++c) joined.set(t * V + c0 + c, dz.get(t * dz.dim(1) + c));
    c0 += dz.dim(1);
  }
  EXPECT_LT(rel_error(joined, g), kTol);
}

TEST(CrossEntropy, NaNLogitMakesOnlyItsRowNaN) {
  const int64_t T = 3, V = 6;
  const std::vector<int64_t> y{1, 2, 3};
  Tensor z = random_tensor({T, V}, 26);
  z.set(1 * V + 4, kNaN);
  const auto r = vocab_parallel_ce({columns(z, 0, 3), columns(z, 3, 3)}, y, V);
  EXPECT_TRUE(std::isnan(r.loss.get(1)));
  EXPECT_FALSE(std::isnan(r.loss.get(0)) || std::isnan(r.loss.get(2)));
  for (const auto& dz : r.dlogits) {
    EXPECT_TRUE(all_nan(dz, 3, 6));
    EXPECT_FALSE(has_nan(dz, 0, 3) || has_nan(dz, 6, 9));
  }
}

TEST(CrossEntropy, TargetOutsideVocabularyIsAnError) {
  Tensor z = random_tensor({2, 4}, 27), ml(DType::fp32, {2}), sl(DType::fp32, {2}), tl(DType::fp32, {2});
  kernels::ce_shard_max(z, ml);
  try {
    kernels::ce_shard_stats(z, ml, {1, 4}, 0, 4, sl, tl);
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("target of token 1 is 4"), std::string::npos) << e.what();
  }
}

TEST(Embedding, LookupAndScatterAddMatchFiniteDifferences) {
  const int64_t V = 7, h = 3;
  const std::vector<int64_t> tok{1, 4, 1, 6, 0};
  const int64_t T = int64_t(tok.size());
  Tensor table = random_tensor({V, h}, 28), dout = random_tensor({T, h}, 29);
  Tensor out(DType::fp32, {T, h}), dtable(DType::fp32, {V, h});
  kernels::embedding_forward(table, tok, 0, V, out);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < h; ++i) EXPECT_EQ(out.get(t * h + i), table.get(tok[size_t(t)] * h + i));
  const auto cost = kernels::embedding_backward(dout, tok, 0, V, dtable);
  EXPECT_DOUBLE_EQ(cost.flops, double(T * h));
  const Forward f = [&](const std::vector<Vec>& in) {
    Vec y(size_t(T * h));
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < h; ++i) y[size_t(t * h + i)] = in[0][size_t(tok[size_t(t)] * h + i)];
    return y;
  };
  EXPECT_LT(rel_error(dtable, fd_gradients(f, {widen(table)}, widen(dout))[0]), kTol);

  // Vocab-parallel: rows [0, 3) and [3, 7) on two shards; the sum of the lookups is the full lookup and the
  // shards' gradients are the full gradient's rows.
  Tensor s0 = table.rows(0, 3), s1 = table.rows(3, 4), o0(DType::fp32, {T, h}), o1(DType::fp32, {T, h});
  kernels::embedding_forward(s0, tok, 0, V, o0);
  kernels::embedding_forward(s1, tok, 3, V, o1);
  kernels::add_inplace(o0, o1);  // all_reduce(sum) over the vocabulary axis
  EXPECT_TRUE(o0.bit_equal(out));
  Tensor d0(DType::fp32, {3, h}), d1(DType::fp32, {4, h});
  kernels::embedding_backward(dout, tok, 0, V, d0);
  kernels::embedding_backward(dout, tok, 3, V, d1);
  EXPECT_TRUE(d0.bit_equal(dtable.rows(0, 3)));
  EXPECT_TRUE(d1.bit_equal(dtable.rows(3, 4)));
  Tensor two(DType::fp32, {2, h});
  EXPECT_THROW(kernels::embedding_forward(table, {1, 7}, 0, V, two), std::invalid_argument);
}

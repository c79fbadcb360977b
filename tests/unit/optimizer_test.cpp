// kernels::adamw_step against a straightforward fp64 AdamW, and the global-norm clipping rule on a simulated
// 2 x 2 (tp x dp) mesh.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "kernels/optimizer.h"
#include "tests/unit/grad_check.h"

using namespace shardsim;
using namespace shardsim::testing;
using runtime::DType;
using runtime::Tensor;

namespace {

// PyTorch's torch.optim.AdamW, written out in fp64.
struct AdamW64 {
  Vec p, m, v;
  void step(const Vec& g, int64_t t, const kernels::AdamWConfig& c, double scale) {
    for (size_t i = 0; i < p.size(); ++i) {
      const double gi = scale * g[i];
      p[i] *= 1.0 - double(c.lr) * double(c.weight_decay);
      m[i] = double(c.beta1) * m[i] + (1 - double(c.beta1)) * gi;
      v[i] = double(c.beta2) * v[i] + (1 - double(c.beta2)) * gi * gi;
      const double mh = m[i] / (1 - std::pow(double(c.beta1), double(t)));
      const double vh = v[i] / (1 - std::pow(double(c.beta2), double(t)));
      p[i] -= double(c.lr) * mh / (std::sqrt(vh) + double(c.eps));
    }
  }
};

}  // namespace

// Tolerance: |p32 − p64| <= 1e-6 · max|p|. Each fp32 step rounds p once (half an ulp, 6e-8 relative) and the
// update (~10 fp32 operations on lr-sized numbers, lr = 1e-2, so ~1e-8 absolute); over 6 steps that is below
// 5e-7 · max|p|. A missing bias correction or coupled (L2) decay moves p by ~lr·0.1 = 1e-3, far outside.
TEST(AdamW, MatchesFp64ReferenceOverSteps) {
  const kernels::AdamWConfig c{.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
  Tensor p = random_tensor({3, 5}, 51), m(DType::fp32, {3, 5}), v(DType::fp32, {3, 5});
  Tensor copy(DType::bf16, {3, 5});
  AdamW64 ref{widen(p), Vec(15, 0.0), Vec(15, 0.0)};
  for (int64_t t = 1; t <= 6; ++t) {
    const Tensor g = random_tensor({3, 5}, uint32_t(60 + t), -float(t), float(t));
    const float scale = t == 3 ? 0.25f : 1.0f;  // a clipped step
    const auto cost = kernels::adamw_step(p, m, v, g, t, c, scale, &copy);
    EXPECT_DOUBLE_EQ(cost.flops, 14.0 * 15);
    ref.step(widen(g), t, c, scale);
  }
  double pmax = 0;
  for (double x : ref.p) pmax = std::max(pmax, std::fabs(x));
  EXPECT_LT(rel_error(p, ref.p, pmax), 1e-6);
  EXPECT_LT(rel_error(m, ref.m), 1e-6);
  EXPECT_LT(rel_error(v, ref.v), 1e-6);
  // The bf16 compute copy is the master rounded once.
  for (int64_t i = 0; i < p.numel(); ++i)
    EXPECT_EQ(copy.bf16()[i], runtime::float_to_bf16(p.f32()[i])) << i;
}

TEST(AdamW, FirstStepMovesEveryWeightByAboutLr) {
  // Bias correction: after one step m̂ = g and v̂ = g², so each weight moves by lr · g / (|g| + eps) = ±lr
  // (plus decay), whatever the gradient's size; without the correction the move would be lr·(1-β1)/sqrt(1-β2).
  const kernels::AdamWConfig c{.lr = 1e-3f, .weight_decay = 0.0f};
  Tensor p = random_tensor({8}, 52), m(DType::fp32, {8}), v(DType::fp32, {8});
  const Tensor p0 = p;
  Tensor g = random_tensor({8}, 53, -1e-3f, 1e-3f);
  kernels::adamw_step(p, m, v, g, 1, c);
  for (int64_t i = 0; i < 8; ++i) EXPECT_NEAR(std::fabs(p.get(i) - p0.get(i)), 1e-3, 1e-6) << i;
}

TEST(AdamW, DecayIsDecoupledFromTheGradient) {
  // Zero gradient: the moments stay 0 and only the decay acts, p_t = p_0 (1 − lr·wd)^t (L2 regularisation folded
  // into g would instead move p by ~lr per step through the Adam normalisation).
  const kernels::AdamWConfig c{.lr = 0.1f, .weight_decay = 0.5f};
  Tensor p = random_tensor({4}, 54), m(DType::fp32, {4}), v(DType::fp32, {4}), g(DType::fp32, {4});
  const Tensor p0 = p;
  for (int64_t t = 1; t <= 3; ++t) kernels::adamw_step(p, m, v, g, t, c);
  for (int64_t i = 0; i < 4; ++i) EXPECT_NEAR(p.get(i), p0.get(i) * std::pow(0.95, 3), 1e-6);
}

TEST(AdamW, BadArgumentsAreErrors) {
  Tensor p(DType::fp32, {4}), m(DType::fp32, {4}), v(DType::fp32, {4}), g(DType::fp32, {4}), short_g(DType::fp32, {3});
  EXPECT_THROW(kernels::adamw_step(p, m, v, g, 0, {}), std::invalid_argument);
  EXPECT_THROW(kernels::adamw_step(p, m, v, short_g, 1, {}), std::invalid_argument);
  EXPECT_THROW(kernels::adamw_step(p, m, v, g, 1, {.beta1 = 1.0f}), std::invalid_argument);
  Tensor half(DType::bf16, {4});
  EXPECT_THROW(kernels::adamw_step(half, m, v, g, 1, {}), std::invalid_argument);
  g.set(2, std::numeric_limits<float>::quiet_NaN());  // a NaN gradient poisons only its own weight
  kernels::adamw_step(p, m, v, g, 1, {});
  EXPECT_TRUE(std::isnan(p.get(2)));
  EXPECT_FALSE(std::isnan(p.get(1)) || std::isnan(p.get(3)));
}

// A 2 x 2 mesh, chip (tp, dp), holding the gradients of three parameters after the dp all_reduce:
//   W [4, 6]   column-parallel: sharded over tp (columns [3·tp, 3·tp + 3)), replicated over dp
//   n [6]      an RMSNorm weight: replicated over tp and dp
//   b [8]      ZeRO-sharded: sharded over dp (elements [4·dp, 4·dp + 4)), replicated over tp
// The rule (count a parameter only at coordinate 0 of the axes replicating it, then all_reduce(sum) over the
// mesh) gives the single-device norm; summing every chip's pieces counts W twice, n four times and b twice.
TEST(GradClip, ReplicatedParametersAreCountedOnce) {
  const Tensor W = random_tensor({4, 6}, 55), n = random_tensor({6}, 56), b = random_tensor({8}, 57);
  const double single = kernels::grad_sq_norm_local({{&W, {}}, {&n, {}}, {&b, {}}});
  double ref = 0;  // fp64 reference of the single-device squared norm
  for (const Tensor* t : {&W, &n, &b})
    for (double x : widen(*t)) ref += x * x;
  EXPECT_NEAR(single, ref, 1e-12 * ref);

  double with_rule = 0, naive = 0;  // the all_reduce(sum) over all four chips, done here
  for (int64_t tp = 0; tp < 2; ++tp)
    for (int64_t dp = 0; dp < 2; ++dp) {
      Tensor w_shard(DType::fp32, {4, 3}), b_shard = b.rows(4 * dp, 4);
      for (int64_t r = 0; r < 4; ++r)
        for (int64_t c = 0; c < 3; ++c) w_shard.set(r * 3 + c, W.get(r * 6 + 3 * tp + c));
      with_rule += kernels::grad_sq_norm_local({{&w_shard, {dp}}, {&n, {tp, dp}}, {&b_shard, {tp}}});
      naive += kernels::grad_sq_norm_local({{&w_shard, {}}, {&n, {}}, {&b_shard, {}}});
    }
  EXPECT_NEAR(with_rule, ref, 1e-12 * ref);
  double wn = 0, nn = 0, bn = 0;
  for (double x : widen(W)) wn += x * x;
  for (double x : widen(n)) nn += x * x;
  for (double x : widen(b)) bn += x * x;
  EXPECT_NEAR(naive, 2 * wn + 4 * nn + 2 * bn, 1e-12 * naive);  // the double count, exactly as predicted
  EXPECT_GT(naive, 1.9 * ref);                                   // and far from the true norm
  // The clip coefficients then differ: the naive norm over-clips by sqrt(naive / ref).
  const double max_norm = 0.5 * std::sqrt(ref);
  EXPECT_NEAR(kernels::clip_coefficient(std::sqrt(with_rule), max_norm), 0.5, 1e-6);
  EXPECT_LT(kernels::clip_coefficient(std::sqrt(naive), max_norm), 0.5 / std::sqrt(1.9));
}

TEST(GradClip, Coefficient) {
  EXPECT_NEAR(kernels::clip_coefficient(4.0, 1.0), 0.25, 1e-6);
  EXPECT_EQ(kernels::clip_coefficient(0.5, 1.0), 1.0);  // below the limit: unchanged
  EXPECT_TRUE(std::isnan(kernels::clip_coefficient(std::numeric_limits<double>::quiet_NaN(), 1.0)));
  EXPECT_TRUE(std::isnan(kernels::clip_coefficient(std::numeric_limits<double>::infinity(), 1.0)));
  EXPECT_THROW(kernels::clip_coefficient(1.0, 0.0), std::invalid_argument);
  Tensor g(DType::fp32, {3});
  g.set(1, std::numeric_limits<float>::quiet_NaN());
  EXPECT_TRUE(std::isnan(kernels::grad_sq_norm_local({{&g, {}}})));
  EXPECT_EQ(kernels::grad_sq_norm_local({{&g, {1}}}), 0.0);  // not this chip's replica to count
}

// Apex's multi_tensor_apply cut (csrc/multi_tensor_apply.cuh): chunks of 65,536 elements, at most 320 blocks and
// depth_to_max_tensors[depth - 1] tensors per launch; a tensor cut by a full launch continues in the next one.
TEST(MultiTensorLaunches, CutsAsApexDoes) {
  using kernels::kMultiTensorChunk;
  EXPECT_TRUE(kernels::multi_tensor_launches({}, 4).empty());
  EXPECT_TRUE(kernels::multi_tensor_launches({0, 0}, 1).empty());
  // Small tensors: the tensor limit decides (36 at depth 4, 110 at depth 1).
  const std::vector<int64_t> small(100, 1000);
  EXPECT_EQ(kernels::multi_tensor_launches(small, 4), (std::vector<int64_t>{36000, 36000, 28000}));
  EXPECT_EQ(kernels::multi_tensor_launches(small, 1), (std::vector<int64_t>{100000}));
  // One large tensor: the block limit decides; 320 full chunks per launch, the remainder in the last.
  const int64_t big = 700 * kMultiTensorChunk + 5;
  EXPECT_EQ(kernels::multi_tensor_launches({big}, 5),
            (std::vector<int64_t>{320 * kMultiTensorChunk, 320 * kMultiTensorChunk, 60 * kMultiTensorChunk + 5}));
  // A cut tensor counts as one of the next launch's tensors: 330 chunks fill the first launch's 320 blocks, the
  // other 10 chunks and 35 small tensors reach the tensor limit (36) of the second, 5 small ones are left.
  std::vector<int64_t> mixed{330 * kMultiTensorChunk};
  mixed.insert(mixed.end(), 40, 10);
  EXPECT_EQ(kernels::multi_tensor_launches(mixed, 4),
            (std::vector<int64_t>{320 * kMultiTensorChunk, 10 * kMultiTensorChunk + 350, 50}));
  EXPECT_THROW(kernels::multi_tensor_launches({1}, 6), std::invalid_argument);
  EXPECT_THROW(kernels::multi_tensor_launches({-1}, 1), std::invalid_argument);
  // The split keeps the sums.
  const kernels::KernelCost whole{"adamw", 1400, 3000, runtime::DType::fp32};
  const auto parts = kernels::split_launches(whole, {36000, 36000, 28000});
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_DOUBLE_EQ(parts[0].flops + parts[1].flops + parts[2].flops, 1400);
  EXPECT_DOUBLE_EQ(parts[2].bytes, 3000 * 0.28);
}

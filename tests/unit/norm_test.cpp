// RMSNorm, RoPE and residual add (kernels/norm.h) against direct double-precision formulas.
#include <gtest/gtest.h>

#include <cmath>

#include "kernels/norm.h"

using namespace shardsim;
using runtime::DType;
using runtime::Tensor;

namespace {
Tensor ramp(DType t, runtime::Shape shape, float scale) {
  Tensor x(t, shape);
  for (int64_t i = 0; i < x.numel(); ++i) x.set(i, scale * std::sin(0.37f * static_cast<float>(i) + 0.1f));
  return x;
}
}  // namespace

TEST(RmsNorm, MatchesTheFormulaPerRow) {
  const Tensor x = ramp(DType::fp32, {5, 33}, 3.0f), w = ramp(DType::fp32, {33}, 1.0f);
  Tensor y(DType::fp32, {5, 33});
  const auto cost = kernels::rmsnorm(x, w, y, 1e-5f);
  for (int64_t t = 0; t < 5; ++t) {
    double ss = 0;
    for (int64_t i = 0; i < 33; ++i) ss += double(x.get(t * 33 + i)) * x.get(t * 33 + i);
    const double inv = 1.0 / std::sqrt(ss / 33 + 1e-5);
    for (int64_t i = 0; i < 33; ++i) EXPECT_NEAR(y.get(t * 33 + i), x.get(t * 33 + i) * inv * w.get(i), 1e-6);
  }
  EXPECT_DOUBLE_EQ(cost.flops, 4.0 * 5 * 33);
  Tensor bad(DType::fp32, {5, 32});
  EXPECT_THROW(kernels::rmsnorm(x, w, bad), std::invalid_argument);
}

TEST(Rope, RotatesPairsByPositionAndKeepsNorms) {
  Tensor x = ramp(DType::fp32, {3, 2, 8}, 1.0f);
  const Tensor before = x;
  kernels::rope_inplace(x, {0, 5, 17});
  for (int64_t i = 0; i < 16; ++i) EXPECT_EQ(x.get(i), before.get(i)) << "position 0 is the identity";
  // Token 1 at position 5, head 1, pair 2: angle 5 * 10000^(-4/8).
  const double a = 5 * std::pow(10000.0, -4.0 / 8.0);
  const int64_t base = (1 * 2 + 1) * 8 + 4;
  EXPECT_NEAR(x.get(base), before.get(base) * std::cos(a) - before.get(base + 1) * std::sin(a), 1e-6);
  EXPECT_NEAR(x.get(base + 1), before.get(base) * std::sin(a) + before.get(base + 1) * std::cos(a), 1e-6);
  for (int64_t r = 0; r < 6; ++r) {
    double n0 = 0, n1 = 0;
    for (int64_t c = 0; c < 8; ++c) {
      n0 += double(before.get(r * 8 + c)) * before.get(r * 8 + c);
      n1 += double(x.get(r * 8 + c)) * x.get(r * 8 + c);
    }
    EXPECT_NEAR(n0, n1, 1e-5);
  }
  EXPECT_THROW(kernels::rope_inplace(x, {0, 1}), std::invalid_argument);
}

TEST(Rope, DotProductsDependOnRelativePositionOnly) {
  // <rope(q, m), rope(k, n)> = <rope(q, m + s), rope(k, n + s)>: what makes RoPE relative.
  const Tensor q0 = ramp(DType::fp32, {1, 1, 16}, 1.0f), k0 = ramp(DType::fp32, {1, 1, 16}, 0.5f);
  auto dot = [&](int64_t m, int64_t n) {
    Tensor q = q0, k = k0;
    kernels::rope_inplace(q, {m});
    kernels::rope_inplace(k, {n});
    double s = 0;
    for (int64_t i = 0; i < 16; ++i) s += double(q.get(i)) * k.get(i);
    return s;
  };
  EXPECT_NEAR(dot(7, 3), dot(107, 103), 1e-5);
  EXPECT_GT(std::fabs(dot(7, 3) - dot(7, 4)), 1e-4);  // and it does depend on the distance
}

TEST(Add, ResidualAndShapeCheck) {
  Tensor a = ramp(DType::bf16, {4, 4}, 1.0f);
  const Tensor b = ramp(DType::bf16, {4, 4}, 2.0f), a0 = a;
  kernels::add_inplace(a, b);
  for (int64_t i = 0; i < 16; ++i) {
    Tensor one(DType::bf16, {1});
    one.set(0, a0.get(i) + b.get(i));
    EXPECT_EQ(a.get(i), one.get(0));
  }
  EXPECT_THROW(kernels::add_inplace(a, Tensor(DType::bf16, {4, 3})), std::invalid_argument);
}

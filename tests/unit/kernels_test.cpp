#include <gtest/gtest.h>

#include <cmath>

#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "models/init.h"

using namespace shardsim;
using runtime::DType;
using runtime::Tensor;

namespace {
Tensor random(DType t, int64_t r, int64_t c, uint32_t id) {
  Tensor x(t, {r, c});
  models::fill_uniform_block(x, models::InitSpec{99, id, -1, 1}, c, 0, 0);
  return x;
}
// Naive triple loop in double: the reference for the BLAS call.
std::vector<double> naive(const Tensor& a, const Tensor& b, bool ta, bool tb) {
  const int64_t m = ta ? a.dim(1) : a.dim(0), k = ta ? a.dim(0) : a.dim(1), n = tb ? b.dim(0) : b.dim(1);
  std::vector<double> c(static_cast<size_t>(m * n), 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j)
      for (int64_t p = 0; p < k; ++p) {
        const double av = ta ? a.get(p * a.dim(1) + i) : a.get(i * a.dim(1) + p);
        const double bv = tb ? b.get(j * b.dim(1) + p) : b.get(p * b.dim(1) + j);
        c[static_cast<size_t>(i * n + j)] += av * bv;
      }
  return c;
}
}  // namespace

class GemmTest : public ::testing::TestWithParam<std::tuple<bool, bool>> {};

TEST_P(GemmTest, MatchesNaiveLoopFp32) {
  const auto [ta, tb] = GetParam();
  const int64_t m = 7, k = 13, n = 5;
  Tensor a = ta ? random(DType::fp32, k, m, 1) : random(DType::fp32, m, k, 1);
  Tensor b = tb ? random(DType::fp32, n, k, 2) : random(DType::fp32, k, n, 2);
  Tensor c(DType::fp32, {m, n});
  auto cost = kernels::gemm(a, b, c, {ta, tb});
  EXPECT_DOUBLE_EQ(cost.flops, 2.0 * m * n * k);
  EXPECT_DOUBLE_EQ(cost.bytes, double(m * k + k * n + m * n) * 4);
  auto ref = naive(a, b, ta, tb);
  for (int64_t i = 0; i < m * n; ++i) EXPECT_NEAR(c.get(i), ref[static_cast<size_t>(i)], 1e-5);
}
INSTANTIATE_TEST_SUITE_P(Transposes, GemmTest,
                         ::testing::Combine(::testing::Bool(), ::testing::Bool()));

TEST(Gemm, Bf16AccumulatesInFp32AndRoundsOnce) {
  const int64_t m = 4, k = 300, n = 6;
  Tensor a = random(DType::bf16, m, k, 3), b = random(DType::bf16, k, n, 4);
  Tensor c(DType::bf16, {m, n});
  kernels::gemm(a, b, c);
  auto ref = naive(a, b, false, false);  // exact products of the bf16 inputs
  for (int64_t i = 0; i < m * n; ++i) {
    const float want = runtime::bf16_to_float(runtime::float_to_bf16(static_cast<float>(ref[static_cast<size_t>(i)])));
    // One rounding of an fp32-accumulated sum: at most one bf16 ulp from the correctly rounded value.
    EXPECT_NEAR(c.get(i), want, std::fabs(want) * std::ldexp(1.0, -7) + 1e-6) << i;
  }
}

TEST(Gemm, RejectsMismatchedShapes) {
  Tensor a(DType::fp32, {2, 3}), b(DType::fp32, {4, 5}), c(DType::fp32, {2, 5});
  EXPECT_THROW(kernels::gemm(a, b, c), std::invalid_argument);
  Tensor bb(DType::bf16, {3, 5});
  EXPECT_THROW(kernels::gemm(a, bb, c), std::invalid_argument);
}

TEST(Elementwise, ActivationsMatchTheirFormulas) {
  auto x = Tensor::from_float({-3.0f, -0.5f, 0.0f, 0.7f, 4.0f}, DType::fp32, {5});
  auto s = x, g = x;
  kernels::activation_inplace(s, kernels::Activation::silu);
  kernels::activation_inplace(g, kernels::Activation::gelu);
  for (int64_t i = 0; i < 5; ++i) {
    const double v = x.get(i);
    EXPECT_NEAR(s.get(i), v / (1 + std::exp(-v)), 1e-6);
    EXPECT_NEAR(g.get(i), 0.5 * v * (1 + std::erf(v / std::sqrt(2.0))), 1e-6);
  }
}

TEST(Elementwise, GluIsActivationTimesUp) {
  auto gate = random(DType::fp32, 3, 4, 5), up = random(DType::fp32, 3, 4, 6);
  auto fused = gate, split = gate;
  kernels::glu_inplace(fused, up, kernels::Activation::silu);
  kernels::activation_inplace(split, kernels::Activation::silu);
  kernels::mul_inplace(split, up);
  for (int64_t i = 0; i < 12; ++i) EXPECT_FLOAT_EQ(fused.get(i), split.get(i));
  Tensor wrong(DType::fp32, {4, 3});
  EXPECT_THROW(kernels::mul_inplace(gate, wrong), std::invalid_argument);
}

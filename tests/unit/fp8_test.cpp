// FP8 GEMM inputs (kernels/fp8.h): the quantiser's scales and error bounds, fine-grained scaling against an
// outlier, and gemm() under a recipe (values near the exact product, the FP8 cost) and without one (unchanged).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/fp8.h"
#include "kernels/gemm.h"
#include "runtime/tensor.h"

using namespace shardsim;
using runtime::DType;

namespace {

std::vector<float> ramp(int64_t n, float scale, float offset = 0) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = offset + scale * std::sin(0.37f * float(i) + 0.1f);
  return v;
}

double max_rel_err(const std::vector<float>& a, const std::vector<float>& b, float floor) {
  double e = 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::fabs(a[i]) >= floor) e = std::max(e, std::fabs(double(b[i]) - a[i]) / std::fabs(a[i]));
  return e;
}

}  // namespace

TEST(Fp8, PerTensorScaleMapsTheAmaxExactlyAndBoundsTheError) {
  auto x = ramp(256, 3.0f), q = x;
  kernels::fp8_quantize_dequantize(q.data(), 16, 16, 16, 1, DType::fp8_e4m3, 0, 0);
  float amax = 0, qmax = 0;
  for (size_t i = 0; i < x.size(); ++i) amax = std::max(amax, std::fabs(x[i])), qmax = std::max(qmax, std::fabs(q[i]));
  EXPECT_FLOAT_EQ(amax, qmax);  // amax · (448 / amax) = 448, representable
  // E4M3 keeps 3 mantissa bits: relative error <= 2^-4 for values in its normal range (here >= amax / 2^6).
  EXPECT_LE(max_rel_err(x, q, amax / 64), 1.0 / 16 + 1e-6);
  EXPECT_GT(max_rel_err(x, q, amax / 64), 0.0);  // it did round
}

TEST(Fp8, BlockScalingConfinesAnOutlier) {
  // One outlier of 1e6 in a 128 x 256 matrix of values ~1: per-tensor scaling (s = 448e-6) puts the small values
  // below E4M3's smallest subnormal (2^-9), so they round to 0; 1 x 128 tiles keep every tile without the outlier
  // at E4M3's precision.
  auto x = ramp(128 * 256, 1.0f);
  x[5] = 1e6f;
  auto t = x, b = x;
  kernels::fp8_quantize_dequantize(t.data(), 128, 256, 256, 1, DType::fp8_e4m3, 0, 0);
  kernels::fp8_quantize_dequantize(b.data(), 128, 256, 256, 1, DType::fp8_e4m3, 1, 128);
  double et = 0, eb = 0;
  for (size_t i = 256; i < x.size(); ++i) et += std::fabs(t[i] - x[i]), eb += std::fabs(b[i] - x[i]);
  EXPECT_LT(eb * 10, et);
}

TEST(Fp8, GemmUnderARecipeQuantisesAndChargesFp8) {
  const int64_t m = 32, k = 64, n = 48;
  // Positive operands (no cancellation in the sums), so C's relative error is that of the inputs' rounding: E4M3's
  // 2^-4 unit roundoff at most per operand, a few per cent in RMS. (Sign-alternating inputs whose products cancel
  // amplify it: with sin ramps of mean 0 the RMS relative error is 0.20, in any exact E4M3 quantiser.)
  const auto a = runtime::Tensor::from_float(ramp(m * k, 0.5f, 1.0f), DType::bf16, {m, k});
  const auto b = runtime::Tensor::from_float(ramp(k * n, 0.25f, 0.5f), DType::bf16, {k, n});
  runtime::Tensor c(DType::bf16, {m, n}), ref(DType::bf16, {m, n});
  const auto plain = kernels::gemm(a, b, ref);
  EXPECT_EQ(plain.dtype, DType::bf16);
  for (auto s : {kernels::Fp8Scaling::tensor, kernels::Fp8Scaling::block}) {
    kernels::Fp8Recipe r;
    r.scaling = s;
    const kernels::Fp8Scope scope(r);
    const auto cost = kernels::gemm(a, b, c);
    EXPECT_EQ(cost.dtype, DType::fp8_e4m3);
    EXPECT_DOUBLE_EQ(cost.flops, plain.flops);
    EXPECT_DOUBLE_EQ(cost.bytes, double(m * k + k * n) + 2.0 * double(m * n));
    const auto fc = c.to_float(), fr = ref.to_float();
    double num = 0, den = 0, diff = 0;
    for (size_t i = 0; i < fc.size(); ++i) num += double(fc[i] - fr[i]) * (fc[i] - fr[i]), den += double(fr[i]) * fr[i],
                                           diff += std::fabs(fc[i] - fr[i]);
    EXPECT_LT(std::sqrt(num / den), 0.05) << kernels::fp8_scaling_name(s);  // near the exact product
    EXPECT_GT(diff, 0.0) << kernels::fp8_scaling_name(s);                   // but quantised
  }
  EXPECT_FALSE(kernels::fp8_recipe().active());  // the scope restored none
  EXPECT_EQ(kernels::gemm(a, b, c).dtype, DType::bf16);
}

TEST(Fp8, WeightCastCostAndNames) {
  kernels::Fp8Recipe r;
  EXPECT_DOUBLE_EQ(kernels::fp8_weight_cast_cost(100, DType::bf16, r).bytes, 0.0);  // no recipe: nothing
  r.scaling = kernels::Fp8Scaling::tensor;
  EXPECT_DOUBLE_EQ(kernels::fp8_weight_cast_cost(100, DType::bf16, r).bytes, 300.0);
  // A block's activation casts (Transformer Engine): Llama-like shapes on one chip, 10 tokens.
  using runtime::Tensor;
  const auto w = [](int64_t i, int64_t o) { return Tensor::make(DType::bf16, {i, o}, false); };
  const Tensor wq = w(64, 64), wk = w(64, 16), wv = w(64, 16), wo = w(64, 64), gate = w(64, 176), up = w(64, 176),
               down = w(176, 64), none;
  const auto lin = kernels::fp8_block_linears(10, wq, wk, wv, wo, gate, up, down);
  EXPECT_DOUBLE_EQ(lin.fused_in, 64 + 64 + 176);  // LN -> QKV, LN -> FC1, act -> FC2: transposes only
  EXPECT_DOUBLE_EQ(lin.cast_in, 64);               // attention output -> proj: its own cast-transpose
  EXPECT_DOUBLE_EQ(lin.out, 64 + 16 + 16 + 64 + 176 + 176 + 64);
  // Forward: 10 x (64 x (2 + 2) + 304 x 2) bytes; backward: every dY read in bf16 and written twice in FP8.
  EXPECT_DOUBLE_EQ(kernels::fp8_block_cast_cost(lin, DType::bf16, r, false).bytes, 10.0 * (64 * 4 + 304 * 2));
  EXPECT_DOUBLE_EQ(kernels::fp8_block_cast_cost(lin, DType::bf16, r, true).bytes, 10.0 * 576 * 4);
  EXPECT_EQ(kernels::fp8_block_cast_cost(lin, DType::bf16, r, true).name, "fp8.cast_transpose_dgrad");
  // An MoE layer (no dense MLP weights): the attention's linears only.
  EXPECT_DOUBLE_EQ(kernels::fp8_block_linears(10, wq, wk, wv, wo, none, none, none).out, 64 + 16 + 16 + 64);
  kernels::Fp8Recipe off;
  EXPECT_DOUBLE_EQ(kernels::fp8_block_cast_cost(lin, DType::bf16, off, true).bytes, 0.0);
  EXPECT_EQ(kernels::parse_fp8_scaling("block"), kernels::Fp8Scaling::block);
  EXPECT_THROW(kernels::parse_fp8_scaling("e4m3"), std::invalid_argument);
  r.format = DType::bf16;
  EXPECT_THROW(kernels::set_fp8_recipe(r), std::invalid_argument);
}

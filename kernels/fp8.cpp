#include "kernels/fp8.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace shardsim::kernels {

namespace {

Fp8Recipe& recipe_slot() {
  static Fp8Recipe r;
  return r;
}

float round_to(float v, runtime::DType format) {
  if (format == runtime::DType::fp8_e4m3) return runtime::e4m3_to_float(runtime::float_to_e4m3(v));
  return runtime::e5m2_to_float(runtime::float_to_e5m2(v));
}

}  // namespace

std::string fp8_scaling_name(Fp8Scaling s) {
  switch (s) {
    case Fp8Scaling::none: return "none";
    case Fp8Scaling::tensor: return "tensor";
    case Fp8Scaling::block: return "block";
  }
  return "?";
}

Fp8Scaling parse_fp8_scaling(const std::string& name) {
  for (Fp8Scaling s : {Fp8Scaling::none, Fp8Scaling::tensor, Fp8Scaling::block})
    if (name == fp8_scaling_name(s)) return s;
  throw std::invalid_argument("must be none, tensor or block (got '" + name + "')");
}

const Fp8Recipe& fp8_recipe() { return recipe_slot(); }

void set_fp8_recipe(const Fp8Recipe& r) {
  if (r.format != runtime::DType::fp8_e4m3 && r.format != runtime::DType::fp8_e5m2)
    throw std::invalid_argument("fp8 recipe: the format must be fp8_e4m3 or fp8_e5m2, got " +
                                runtime::dtype_name(r.format));
  recipe_slot() = r;
}

void fp8_quantize_dequantize(float* x, int64_t rows, int64_t cols, int64_t row_stride, int64_t col_stride,
                             runtime::DType format, int64_t tile_rows, int64_t tile_cols) {
  if (rows <= 0 || cols <= 0) return;
  const int64_t tr = tile_rows > 0 ? tile_rows : rows, tc = tile_cols > 0 ? tile_cols : cols;
  const float fmax = static_cast<float>(runtime::max_finite(format));
  for (int64_t r0 = 0; r0 < rows; r0 += tr)
    for (int64_t c0 = 0; c0 < cols; c0 += tc) {
      const int64_t r1 = std::min(rows, r0 + tr), c1 = std::min(cols, c0 + tc);
      float amax = 0;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(x[r * row_stride + c * col_stride]));
      const float s = amax > 0 && std::isfinite(amax) ? fmax / amax : 1.0f;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) {
          float& v = x[r * row_stride + c * col_stride];
          v = round_to(v * s, format) / s;
        }
    }
}

KernelCost fp8_weight_cast_cost(double numel, runtime::DType from, const Fp8Recipe& r) {
  KernelCost k{"fp8.cast_weights", 0, 0, from, {}};
  if (!r.active() || numel <= 0) return k;
  k.flops = 2 * numel;  // |x| against the running amax, and the scale multiply
  k.bytes = numel * (double(runtime::dtype_size(from)) + 1.0);
  return k;
}

Fp8BlockLinears fp8_block_linears(double tokens, const runtime::Tensor& wq, const runtime::Tensor& wk,
                                  const runtime::Tensor& wv, const runtime::Tensor& wo, const runtime::Tensor& w_gate,
                                  const runtime::Tensor& w_up, const runtime::Tensor& w_down) {
  auto in = [](const runtime::Tensor& w) { return w.rank() == 2 ? double(w.dim(0)) : 0.0; };
  auto out = [](const runtime::Tensor& w) { return w.rank() == 2 ? double(w.dim(1)) : 0.0; };
  Fp8BlockLinears b;
  b.tokens = tokens;
  b.fused_in = in(wq) + in(w_up) + in(w_down);  // LN -> QKV (one input for wq, wk, wv), LN -> FC1, act -> FC2
  b.cast_in = in(wo);
  b.out = out(wq) + out(wk) + out(wv) + out(wo) + out(w_gate) + out(w_up) + out(w_down);
  return b;
}

KernelCost fp8_block_cast_cost(const Fp8BlockLinears& b, runtime::DType from, const Fp8Recipe& r, bool backward) {
  KernelCost k{backward ? "fp8.cast_transpose_dgrad" : "fp8.cast_transpose", 0, 0, from, {}};
  if (!r.active() || b.tokens <= 0) return k;
  const double es = double(runtime::dtype_size(from));
  const double cast = backward ? b.out : b.cast_in;  // elements per token read in the dtype, written twice in FP8
  const double transposed = backward ? 0.0 : b.fused_in;  // FP8 in, FP8 out
  k.flops = 2 * b.tokens * cast;
  k.bytes = b.tokens * (cast * (es + 2.0) + transposed * 2.0);
  return k;
}

KernelCost fp8_grouped_cast_cost(double elements, runtime::DType from, const Fp8Recipe& r, bool backward) {
  KernelCost k{backward ? "fp8.cast_transpose_dgrad.experts" : "fp8.cast_transpose.experts", 0, 0, from, {}};
  if (!r.active() || elements <= 0) return k;
  k.flops = 2 * elements;
  k.bytes = elements * (double(runtime::dtype_size(from)) + 2.0);
  return k;
}

KernelCost fp8_amax_update_cost(double tensors, double history, const Fp8Recipe& r) {
  KernelCost k{"fp8.amax_scale_update", 0, 0, runtime::DType::fp32, {}};
  if (r.scaling != Fp8Scaling::tensor || tensors <= 0) return k;
  const double h = std::max(history, 1.0);
  k.flops = tensors * (h + 4);                // the history's max, the scale's few operations
  k.bytes = tensors * (2 * h * 4.0 + 4 * 4.0);  // the history read and written (rolled), amax, scale, scale_inv
  return k;
}

}  // namespace shardsim::kernels

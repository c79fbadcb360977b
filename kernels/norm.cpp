#include "kernels/norm.h"

#include <cmath>
#include <stdexcept>

namespace shardsim::kernels {

using runtime::shape_str;
using runtime::Tensor;

KernelCost rmsnorm(const Tensor& x, const Tensor& w, Tensor& y, float eps) {
  if (x.rank() != 2 || w.rank() != 1 || w.dim(0) != x.dim(1) || y.shape() != x.shape())
    throw std::invalid_argument("rmsnorm: x " + shape_str(x.shape()) + ", w " + shape_str(w.shape()) + ", y " +
                                shape_str(y.shape()) + " (want x [T, h], w [h], y [T, h])");
  const int64_t T = x.dim(0), h = x.dim(1);
  const double es = static_cast<double>(runtime::dtype_size(x.dtype()));
  const KernelCost cost{"rmsnorm", 4.0 * static_cast<double>(T * h),
                        (2.0 * static_cast<double>(T * h) + static_cast<double>(h)) * es, x.dtype(), {}};
  if (cost_only({&x, &w}, {&y})) return cost;
  const auto wf = w.to_float();
  std::vector<float> row(static_cast<size_t>(h));
  for (int64_t t = 0; t < T; ++t) {
    double ss = 0;
    for (int64_t i = 0; i < h; ++i) {
      row[static_cast<size_t>(i)] = x.get(t * h + i);
      ss += static_cast<double>(row[static_cast<size_t>(i)]) * row[static_cast<size_t>(i)];
    }
    const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(h) + eps));
    for (int64_t i = 0; i < h; ++i) y.set(t * h + i, row[static_cast<size_t>(i)] * inv * wf[static_cast<size_t>(i)]);
  }
  return cost;
}

KernelCost layernorm(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& y, float eps) {
  if (x.rank() != 2 || w.rank() != 1 || w.dim(0) != x.dim(1) || b.shape() != w.shape() || y.shape() != x.shape())
    throw std::invalid_argument("layernorm: x " + shape_str(x.shape()) + ", w " + shape_str(w.shape()) + ", b " +
                                shape_str(b.shape()) + ", y " + shape_str(y.shape()) +
                                " (want x [T, h], w and b [h], y [T, h])");
  const int64_t T = x.dim(0), h = x.dim(1);
  const double es = static_cast<double>(runtime::dtype_size(x.dtype()));
  const KernelCost cost{"layernorm", 7.0 * static_cast<double>(T * h),
                        (2.0 * static_cast<double>(T * h) + 2.0 * static_cast<double>(h)) * es, x.dtype(), {}};
  if (cost_only({&x, &w, &b}, {&y})) return cost;
  const auto wf = w.to_float(), bf = b.to_float();
  std::vector<float> row(static_cast<size_t>(h));
  for (int64_t t = 0; t < T; ++t) {
    double sum = 0;
    for (int64_t i = 0; i < h; ++i) sum += row[static_cast<size_t>(i)] = x.get(t * h + i);
    const double mu = sum / static_cast<double>(h);
    double ss = 0;
    for (int64_t i = 0; i < h; ++i) ss += (row[static_cast<size_t>(i)] - mu) * (row[static_cast<size_t>(i)] - mu);
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(h) + eps);
    for (int64_t i = 0; i < h; ++i) {
      const size_t si = static_cast<size_t>(i);
      y.set(t * h + i, static_cast<float>((row[si] - mu) * inv) * wf[si] + bf[si]);
    }
  }
  return cost;
}

KernelCost rope_inplace(Tensor& x, const std::vector<int64_t>& positions, float theta) {
  if (x.rank() != 3 || x.dim(2) % 2 != 0 || static_cast<int64_t>(positions.size()) != x.dim(0))
    throw std::invalid_argument("rope: x " + shape_str(x.shape()) + " with " + std::to_string(positions.size()) +
                                " positions (want x [T, H, d] with d even and one position per token)");
  const int64_t T = x.dim(0), H = x.dim(1), d = x.dim(2);
  const double n = static_cast<double>(x.numel());
  const KernelCost cost{"rope", 3.0 * n, 2.0 * n * static_cast<double>(runtime::dtype_size(x.dtype())), x.dtype(), {}};
  if (cost_only({&x}, {&x})) return cost;
  std::vector<double> inv_freq(static_cast<size_t>(d / 2));
  for (int64_t i = 0; i < d / 2; ++i)
    inv_freq[static_cast<size_t>(i)] = std::pow(static_cast<double>(theta), -2.0 * static_cast<double>(i) / static_cast<double>(d));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < d / 2; ++i) {
      const double a = static_cast<double>(positions[static_cast<size_t>(t)]) * inv_freq[static_cast<size_t>(i)];
      const float c = static_cast<float>(std::cos(a)), s = static_cast<float>(std::sin(a));
      for (int64_t hh = 0; hh < H; ++hh) {
        const int64_t base = (t * H + hh) * d + 2 * i;
        const float x0 = x.get(base), x1 = x.get(base + 1);
        x.set(base, x0 * c - x1 * s);
        x.set(base + 1, x0 * s + x1 * c);
      }
    }
  return cost;
}

KernelCost add_inplace(Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape())
    throw std::invalid_argument("add: shapes " + shape_str(a.shape()) + " and " + shape_str(b.shape()) + " differ");
  const double n = static_cast<double>(a.numel());
  const KernelCost cost{"add", n, 3.0 * n * static_cast<double>(runtime::dtype_size(a.dtype())), a.dtype(), {}};
  if (cost_only({&a, &b}, {&a})) return cost;
  if (a.dtype() == runtime::DType::fp32 && b.dtype() == runtime::DType::fp32) {
    float* pa = a.f32();
    const float* pb = b.f32();
    for (int64_t i = 0; i < a.numel(); ++i) pa[i] += pb[i];
  } else {
    for (int64_t i = 0; i < a.numel(); ++i) a.set(i, a.get(i) + b.get(i));
  }
  return cost;
}

}  // namespace shardsim::kernels

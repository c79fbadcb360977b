// Central finite differences in fp64 for the backward-kernel tests.
//
// A kernel's forward is re-implemented here in double precision (a function of its inputs, widened exactly from
// the fp32 test tensors); the scalar L = Σ G · f(inputs) with a fixed random cotangent G then has
//   dL/dx_i ≈ (L(x + h e_i) − L(x − h e_i)) / 2h,   h = 1e-6 · max(1, |x_i|)
// whose truncation error is O(h² f''') ~ 1e-12 and rounding error ~ 1e-16 · |L| / h ~ 1e-10 for the O(1) values
// of these tests: so the difference is exact to ~1e-9 and any gap to the kernel's gradient is the kernel's own
// fp32 rounding (or a wrong formula, which shows as an O(1) relative error).
#pragma once

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "runtime/tensor.h"

namespace shardsim::testing {

using Vec = std::vector<double>;
using Forward = std::function<Vec(const std::vector<Vec>&)>;

inline Vec widen(const runtime::Tensor& t) {
  Vec v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[static_cast<size_t>(i)] = t.get(i);
  return v;
}

inline runtime::Tensor random_tensor(runtime::Shape shape, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  runtime::Tensor x(runtime::DType::fp32, std::move(shape));
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  for (int64_t i = 0; i < x.numel(); ++i) x.set(i, u(gen));
  return x;
}

inline double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Gradients of Σ cotangent · f(inputs) with respect to every input, by central differences.
inline std::vector<Vec> fd_gradients(const Forward& f, std::vector<Vec> inputs, const Vec& cotangent) {
  std::vector<Vec> grads;
  for (size_t k = 0; k < inputs.size(); ++k) {
    Vec g(inputs[k].size());
    for (size_t i = 0; i < inputs[k].size(); ++i) {
      const double x = inputs[k][i], h = 1e-6 * std::max(1.0, std::fabs(x));
      inputs[k][i] = x + h;
      const double up = dot(cotangent, f(inputs));
      inputs[k][i] = x - h;
      const double down = dot(cotangent, f(inputs));
      inputs[k][i] = x;
      g[i] = (up - down) / (2 * h);
    }
    grads.push_back(std::move(g));
  }
  return grads;
}

// max |got − want| / max(max |want|, floor): the error relative to the gradient's scale.
inline double rel_error(const runtime::Tensor& got, const Vec& want, double floor = 1e-3) {
  double scale = floor, err = 0;
  for (double w : want) scale = std::max(scale, std::fabs(w));
  for (size_t i = 0; i < want.size(); ++i) {
    const double e = std::fabs(double(got.get(int64_t(i))) - want[i]);
    if (!(e <= err)) err = e;  // a NaN is the worst error, not skipped
  }
  return err / scale;
}

}  // namespace shardsim::testing

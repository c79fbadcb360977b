#include "kernels/optimizer.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

namespace shardsim::kernels {

using runtime::DType;
using runtime::shape_str;
using runtime::Tensor;

KernelCost adamw_step(Tensor& master, Tensor& m, Tensor& v, const Tensor& grad, int64_t step, const AdamWConfig& c,
                      float grad_scale, Tensor* copy) {
  if (master.dtype() != DType::fp32 || m.dtype() != DType::fp32 || v.dtype() != DType::fp32)
    throw std::invalid_argument("adamw_step: master weights and moments must be fp32");
  if (m.shape() != master.shape() || v.shape() != master.shape() || grad.shape() != master.shape() ||
      (copy && copy->shape() != master.shape()))
    throw std::invalid_argument("adamw_step: master " + shape_str(master.shape()) + ", m " + shape_str(m.shape()) +
                                ", v " + shape_str(v.shape()) + ", grad " + shape_str(grad.shape()) +
                                (copy ? ", compute copy " + shape_str(copy->shape()) : std::string()) +
                                " must have one shape");
  if (grad.dtype() != DType::fp32 && grad.dtype() != DType::bf16)
    throw std::invalid_argument("adamw_step: grad must be fp32 or bf16, got " + runtime::dtype_name(grad.dtype()));
  if (copy && !runtime::is_floating(copy->dtype()))
    throw std::invalid_argument("adamw_step: the compute copy must be a floating type, got " +
                                runtime::dtype_name(copy->dtype()));
  if (step < 1) throw std::invalid_argument("adamw_step: step must be >= 1, got " + std::to_string(step));
  const bool ok = std::isfinite(c.lr) && c.lr >= 0 && std::isfinite(c.beta1) && c.beta1 >= 0 && c.beta1 < 1 &&
                  std::isfinite(c.beta2) && c.beta2 >= 0 && c.beta2 < 1 && std::isfinite(c.eps) && c.eps > 0 &&
                  std::isfinite(c.weight_decay) && c.weight_decay >= 0 && std::isfinite(grad_scale);
  if (!ok)
    throw std::invalid_argument("adamw_step: need finite lr >= 0, 0 <= beta1, beta2 < 1, eps > 0, weight_decay >= 0 "
                                "and a finite grad_scale");
  const double n = static_cast<double>(master.numel());
  const double gb = static_cast<double>(runtime::dtype_size(grad.dtype()));
  const double cb = copy ? static_cast<double>(runtime::dtype_size(copy->dtype())) : 0.0;
  const KernelCost cost{"adamw", 14.0 * n, n * (24.0 + gb + cb), DType::fp32, {}};
  if (cost_only({&master, &m, &v, &grad}, {&master, &m, &v, copy})) return cost;
  const float bc1 = static_cast<float>(1.0 - std::pow(double(c.beta1), double(step)));
  const float bc2 = static_cast<float>(1.0 - std::pow(double(c.beta2), double(step)));
  const float decay = 1.0f - c.lr * c.weight_decay;
  float *p = master.f32(), *pm = m.f32(), *pv = v.f32();
  const bool g32 = grad.dtype() == DType::fp32;
  for (int64_t i = 0; i < master.numel(); ++i) {
    const float g = grad_scale * (g32 ? grad.f32()[i] : grad.get(i));
    pm[i] = c.beta1 * pm[i] + (1.0f - c.beta1) * g;
    pv[i] = c.beta2 * pv[i] + (1.0f - c.beta2) * g * g;
    const float mhat = pm[i] / bc1, vhat = pv[i] / bc2;
    p[i] = p[i] * decay - c.lr * mhat / (std::sqrt(vhat) + c.eps);
    if (copy) copy->set(i, p[i]);
  }
  return cost;
}

double grad_sq_norm_local(const std::vector<GradNormTerm>& terms) {
  double s = 0;
  for (const auto& t : terms) {
    if (!t.grad) throw std::invalid_argument("grad_sq_norm_local: a term has no gradient");
    bool counted = true;
    for (int64_t c : t.replica_coords) counted = counted && c == 0;
    if (!counted || !t.grad->has_storage()) continue;  // shape-only: no values, contributes 0
    for (int64_t i = 0; i < t.grad->numel(); ++i) {
      const double g = t.grad->get(i);
      s += g * g;
    }
  }
  return s;
}

double clip_coefficient(double norm, double max_norm) {
  if (!std::isfinite(max_norm) || max_norm <= 0)
    throw std::invalid_argument("clip_coefficient: max_norm must be finite and > 0, got " + std::to_string(max_norm));
  if (!std::isfinite(norm)) return std::numeric_limits<double>::quiet_NaN();
  return std::min(1.0, max_norm / (norm + 1e-6));
}

int multi_tensor_max_tensors(int depth) {
  static constexpr int kMax[5] = {110, 64, 48, 36, 30};
  if (depth < 1 || depth > 5)
    throw std::invalid_argument("multi_tensor_launches: depth must be 1..5, got " + std::to_string(depth));
  return kMax[depth - 1];
}

std::vector<int64_t> multi_tensor_launches(const std::vector<int64_t>& numels, int depth) {
  const int max_tensors = multi_tensor_max_tensors(depth);
  std::vector<int64_t> launches;
  int tensors = 0, blocks = 0;  // in the launch being filled
  int64_t elements = 0;
  size_t last = numels.size();
  while (last > 0 && numels[last - 1] == 0) --last;  // the last tensor with elements closes the final launch
  for (size_t t = 0; t < last; ++t) {
    const int64_t n = numels[t];
    if (n < 0) throw std::invalid_argument("multi_tensor_launches: a tensor of " + std::to_string(n) + " elements");
    if (n == 0) continue;
    ++tensors;
    const int64_t chunks = (n + kMultiTensorChunk - 1) / kMultiTensorChunk;
    for (int64_t c = 0; c < chunks; ++c) {
      ++blocks;
      elements += std::min(kMultiTensorChunk, n - c * kMultiTensorChunk);
      const bool tensors_full = tensors == max_tensors && c == chunks - 1;
      const bool blocks_full = blocks == kMultiTensorBlocks;
      const bool last_chunk = t == last - 1 && c == chunks - 1;
      if (tensors_full || blocks_full || last_chunk) {
        launches.push_back(elements);
        elements = 0;
        blocks = 0;
        tensors = c == chunks - 1 ? 0 : 1;  // a tensor cut mid-way carries over into the next launch
      }
    }
  }
  return launches;
}

std::vector<KernelCost> split_launches(const KernelCost& whole, const std::vector<int64_t>& launches) {
  double total = 0;
  for (int64_t e : launches) total += double(e);
  std::vector<KernelCost> out;
  if (total <= 0) return out;
  out.reserve(launches.size());
  for (int64_t e : launches) {
    const double f = double(e) / total;
    out.push_back(KernelCost{whole.name, whole.flops * f, whole.bytes * f, whole.dtype, whole.shape});
  }
  return out;
}

KernelCost l2norm_cleanup_cost() {
  return KernelCost{"multi_tensor_l2norm.cleanup", double(kMultiTensorBlocks), 4.0 * (kMultiTensorBlocks + 1),
                    DType::fp32};
}

}  // namespace shardsim::kernels

#include "kernels/cross_entropy.h"

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

namespace shardsim::kernels {

using runtime::DType;
using runtime::shape_str;
using runtime::Tensor;

namespace {

void check_logits(const Tensor& z, const char* op) {
  if (z.rank() != 2 || (z.dtype() != DType::fp32 && z.dtype() != DType::bf16))
    throw std::invalid_argument(std::string(op) + ": logits must be fp32 or bf16 [T, Vs], got " +
                                runtime::dtype_name(z.dtype()) + " " + shape_str(z.shape()));
}

void check_stat(const Tensor& s, int64_t T, const char* op, const char* name) {
  if (s.dtype() != DType::fp32 || s.shape() != runtime::Shape{T})
    throw std::invalid_argument(std::string(op) + ": " + name + " must be fp32 [" + std::to_string(T) + "], got " +
                                runtime::dtype_name(s.dtype()) + " " + shape_str(s.shape()));
}

void check_targets(const std::vector<int64_t>& targets, int64_t T, int64_t v0, int64_t vs, int64_t vocab,
                   const char* op) {
  if (static_cast<int64_t>(targets.size()) != T)
    throw std::invalid_argument(std::string(op) + ": " + std::to_string(targets.size()) + " targets for " +
                                std::to_string(T) + " tokens");
  if (v0 < 0 || vs < 0 || v0 + vs > vocab)
    throw std::invalid_argument(std::string(op) + ": shard [" + std::to_string(v0) + ", " + std::to_string(v0 + vs) +
                                ") is not inside the vocabulary [0, " + std::to_string(vocab) + ")");
  for (int64_t t = 0; t < T; ++t) {
    const int64_t y = targets[static_cast<size_t>(t)];
    if (y < 0 || y >= vocab)
      throw std::invalid_argument(std::string(op) + ": target of token " + std::to_string(t) + " is " +
                                  std::to_string(y) + ", outside the vocabulary [0, " + std::to_string(vocab) + ")");
  }
}

double esize(const Tensor& t) { return static_cast<double>(runtime::dtype_size(t.dtype())); }

}  // namespace

KernelCost ce_shard_max(const Tensor& z, Tensor& m_local) {
  check_logits(z, "ce_shard_max");
  const int64_t T = z.dim(0), vs = z.dim(1);
  check_stat(m_local, T, "ce_shard_max", "m_local");
  const KernelCost cost{"ce_max", double(T * vs), double(T * vs) * esize(z) + 4.0 * double(T), z.dtype(), {}};
  if (cost_only({&z}, {&m_local})) return cost;
  for (int64_t t = 0; t < T; ++t) {
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t v = 0; v < vs; ++v) {
      const float x = z.get(t * vs + v);
      if (std::isnan(x)) {
        m = x;
        break;
      }
      m = std::max(m, x);
    }
    m_local.f32()[t] = m;
  }
  return cost;
}

KernelCost ce_shard_stats(const Tensor& z, const Tensor& m, const std::vector<int64_t>& targets, int64_t v0,
                          int64_t vocab, Tensor& sumexp_local, Tensor& target_local) {
  check_logits(z, "ce_shard_stats");
  const int64_t T = z.dim(0), vs = z.dim(1);
  check_stat(m, T, "ce_shard_stats", "m");
  check_stat(sumexp_local, T, "ce_shard_stats", "sumexp_local");
  check_stat(target_local, T, "ce_shard_stats", "target_local");
  check_targets(targets, T, v0, vs, vocab, "ce_shard_stats");
  const KernelCost cost{"ce_stats", 3.0 * double(T * vs), double(T * vs) * esize(z) + 12.0 * double(T), z.dtype(), {}};
  if (cost_only({&z, &m}, {&sumexp_local, &target_local})) return cost;
  for (int64_t t = 0; t < T; ++t) {
    const float mt = m.f32()[t];
    double s = 0;
    for (int64_t v = 0; v < vs; ++v) s += std::exp(double(z.get(t * vs + v)) - double(mt));
    sumexp_local.f32()[t] = static_cast<float>(s);
    const int64_t y = targets[static_cast<size_t>(t)] - v0;
    target_local.f32()[t] = (y >= 0 && y < vs) ? z.get(t * vs + y) : 0.0f;
  }
  return cost;
}

KernelCost ce_loss(const Tensor& m, const Tensor& sumexp, const Tensor& target, Tensor& loss) {
  if (m.rank() != 1)
    throw std::invalid_argument("ce_loss: m must be fp32 [T], got " + shape_str(m.shape()));
  const int64_t T = m.dim(0);
  check_stat(m, T, "ce_loss", "m");
  check_stat(sumexp, T, "ce_loss", "sumexp");
  check_stat(target, T, "ce_loss", "target");
  check_stat(loss, T, "ce_loss", "loss");
  const KernelCost cost{"ce_loss", 3.0 * double(T), 16.0 * double(T), DType::fp32, {}};
  if (cost_only({&m, &sumexp, &target}, {&loss})) return cost;
  for (int64_t t = 0; t < T; ++t)
    loss.f32()[t] = static_cast<float>(double(m.f32()[t]) + std::log(double(sumexp.f32()[t])) - double(target.f32()[t]));
  return cost;
}

KernelCost ce_backward(const Tensor& z, const Tensor& m, const Tensor& sumexp, const std::vector<int64_t>& targets,
                       int64_t v0, int64_t vocab, float scale, Tensor& dz) {
  check_logits(z, "ce_backward");
  const int64_t T = z.dim(0), vs = z.dim(1);
  if (dz.shape() != z.shape() || dz.dtype() != z.dtype())
    throw std::invalid_argument("ce_backward: dlogits " + shape_str(dz.shape()) + " must have the logits' shape " +
                                shape_str(z.shape()) + " and dtype");
  check_stat(m, T, "ce_backward", "m");
  check_stat(sumexp, T, "ce_backward", "sumexp");
  check_targets(targets, T, v0, vs, vocab, "ce_backward");
  const KernelCost cost{"ce_backward", 4.0 * double(T * vs), 2.0 * double(T * vs) * esize(z) + 8.0 * double(T),
                        z.dtype(), {}};
  if (cost_only({&z, &m, &sumexp}, {&dz})) return cost;
  for (int64_t t = 0; t < T; ++t) {
    const double mt = m.f32()[t], inv = 1.0 / double(sumexp.f32()[t]);
    const int64_t y = targets[static_cast<size_t>(t)] - v0;
    for (int64_t v = 0; v < vs; ++v) {
      const double p = std::exp(double(z.get(t * vs + v)) - mt) * inv;
      dz.set(t * vs + v, static_cast<float>(double(scale) * (p - (v == y ? 1.0 : 0.0))));
    }
  }
  return cost;
}

}  // namespace shardsim::kernels

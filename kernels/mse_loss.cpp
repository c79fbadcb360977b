#include "kernels/mse_loss.h"

#include <stdexcept>
#include <string>

namespace shardsim::kernels {

namespace {

void check(const runtime::Tensor& y, const runtime::Tensor& t, int64_t n_total, const char* what) {
  if (y.shape() != t.shape() || y.rank() != 2)
    throw std::invalid_argument(std::string(what) + ": output " + runtime::shape_str(y.shape()) + " and target " +
                                runtime::shape_str(t.shape()) + " must be the same [N, h]");
  if (n_total <= 0) throw std::invalid_argument(std::string(what) + ": the loss's row count must be positive");
}

}  // namespace

KernelCost mse_loss(const runtime::Tensor& y, const runtime::Tensor& target, int64_t n_total, double& loss) {
  check(y, target, n_total, "mse_loss");
  const double n = static_cast<double>(y.numel());
  const KernelCost cost{"mse_loss", 3.0 * n,
                        n * static_cast<double>(runtime::dtype_size(y.dtype()) + runtime::dtype_size(target.dtype())),
                        y.dtype(), {}};
  loss = 0;
  if (!y.has_storage() || !target.has_storage()) return cost;
  double sum = 0;
  for (int64_t i = 0; i < y.numel(); ++i) {
    const double d = static_cast<double>(y.get(i)) - static_cast<double>(target.get(i));
    sum += 0.5 * d * d;
  }
  loss = sum / (static_cast<double>(n_total) * static_cast<double>(y.dim(1)));
  return cost;
}

KernelCost mse_loss_backward(const runtime::Tensor& y, const runtime::Tensor& target, int64_t n_total,
                             runtime::Tensor& dy) {
  check(y, target, n_total, "mse_loss_backward");
  if (dy.shape() != y.shape() || dy.dtype() != y.dtype())
    throw std::invalid_argument("mse_loss_backward: the gradient must have the output's shape and dtype");
  const double n = static_cast<double>(y.numel());
  const KernelCost cost{"mse_loss_backward", 2.0 * n,
                        n * static_cast<double>(2 * runtime::dtype_size(y.dtype()) +
                                                runtime::dtype_size(target.dtype())),
                        y.dtype(), {}};
  if (cost_only({&y, &target}, {&dy})) return cost;
  const float scale = 1.0f / (static_cast<float>(n_total) * static_cast<float>(y.dim(1)));
  for (int64_t i = 0; i < y.numel(); ++i) dy.set(i, (y.get(i) - target.get(i)) * scale);
  return cost;
}

}  // namespace shardsim::kernels

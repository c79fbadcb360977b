#include "models/lm_validate.h"

#include <cmath>
#include <stdexcept>

namespace shardsim::models {

LossTolerance loss_tolerance(runtime::DType dtype, int64_t step) {
  if (dtype == runtime::DType::fp32) return {1e-5, false, "fp32: 1e-5 absolute, summation order only"};
  if (dtype != runtime::DType::bf16) throw std::invalid_argument("loss_tolerance: fp32 or bf16 only");
  return {std::ldexp(1.0, -9) * double(std::max<int64_t>(step, 1)), true,
          "bf16: 2^-9 x step relative, one rounding compounding per update"};
}

LossCheck check_losses(runtime::DType dtype, const std::vector<std::pair<int64_t, double>>& losses,
                       const std::vector<double>& reference) {
  LossCheck out;
  double worst_ratio = -1;
  for (const auto& [step, loss] : losses) {
    const double want = reference.at(size_t(step - 1));
    const LossTolerance tol = loss_tolerance(dtype, step);
    const double e = std::fabs(loss - want) / (tol.relative ? std::fabs(want) : 1.0);
    const double ratio = std::isnan(e) ? INFINITY : e / tol.limit;
    ++out.steps;
    if (ratio > worst_ratio) {
      worst_ratio = ratio;
      out.error = e;
      out.tolerance = tol;
      out.step = step;
    }
    if (!(e <= tol.limit)) out.passed = false;
  }
  return out;
}

}  // namespace shardsim::models

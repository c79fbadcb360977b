#include "models/lm_validate.h"

#include <cmath>
#include <limits>
#include <stdexcept>

#include "models/lm_checkpoint.h"

namespace shardsim::models {

LossTolerance loss_tolerance(runtime::DType dtype, int64_t step) {
  if (dtype == runtime::DType::fp32) return {1e-5, false, "fp32: 1e-5 absolute, summation order only"};
  if (dtype != runtime::DType::bf16) throw std::invalid_argument("loss_tolerance: fp32 or bf16 only");
  return {std::ldexp(1.0, -9) * double(std::max<int64_t>(step, 1)), true,
          "bf16: 2^-9 x step relative, one rounding compounding per update"};
}

std::vector<double> reference_losses(const LmConfig& c, const LmTrainConfig& t, const LmTrainSnapshot* resumed) {
  std::vector<double> out;
  LmTrainState ref = resumed ? lm_train_state_from(c, *resumed) : lm_train_init(c);
  LmTrainConfig rest = t;  // lm_train runs STEPS updates from the state's step
  rest.steps = t.steps - ref.step;
  out.assign(static_cast<size_t>(std::max<int64_t>(ref.step, 0)), std::numeric_limits<double>::quiet_NaN());
  if (rest.steps > 0)
    for (const auto& x : lm_train(c, rest, ref)) out.push_back(x.loss);
  return out;
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

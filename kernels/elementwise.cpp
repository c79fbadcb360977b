#include "kernels/elementwise.h"

#include <cmath>
#include <stdexcept>

namespace shardsim::kernels {

using runtime::Tensor;

Activation parse_activation(const std::string& name) {
  if (name == "silu" || name == "swiglu") return Activation::silu;
  if (name == "gelu" || name == "geglu") return Activation::gelu;
  throw std::invalid_argument("unknown activation '" + name + "' (known: silu, gelu)");
}

std::string activation_name(Activation a) { return a == Activation::silu ? "silu" : "gelu"; }

namespace {

inline float act_value(float x, Activation a) {
  if (a == Activation::silu) return x / (1.0f + std::exp(-x));
  return 0.5f * x * (1.0f + std::erf(x * 0.70710678118654752f));
}
inline double act_flops(Activation a) { return a == Activation::silu ? 4.0 : 8.0; }

void check_same(const Tensor& a, const Tensor& b, const char* op) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype())
    throw std::invalid_argument(std::string(op) + ": operands differ: " + runtime::shape_str(a.shape()) + " " +
                                runtime::dtype_name(a.dtype()) + " vs " + runtime::shape_str(b.shape()) + " " +
                                runtime::dtype_name(b.dtype()));
}

}  // namespace

KernelCost activation_inplace(Tensor& x, Activation act) {
  const double n = double(x.numel());
  KernelCost cost{activation_name(act), act_flops(act) * n, 2.0 * n * double(runtime::dtype_size(x.dtype())), x.dtype(), {}};
  if (cost_only({&x}, {&x})) return cost;
  for (int64_t i = 0; i < x.numel(); ++i) x.set(i, act_value(x.get(i), act));
  return cost;
}

KernelCost mul_inplace(Tensor& a, const Tensor& b) {
  check_same(a, b, "mul");
  const double n = double(a.numel());
  KernelCost cost{"mul", n, 3.0 * n * double(runtime::dtype_size(a.dtype())), a.dtype(), {}};
  if (cost_only({&a, &b}, {&a})) return cost;
  for (int64_t i = 0; i < a.numel(); ++i) a.set(i, a.get(i) * b.get(i));
  return cost;
}

KernelCost glu_inplace(Tensor& gate, const Tensor& up, Activation act) {
  check_same(gate, up, "glu");
  const double n = double(gate.numel());
  KernelCost cost{activation_name(act) == "silu" ? "swiglu" : "geglu", (act_flops(act) + 1.0) * n,
                  3.0 * n * double(runtime::dtype_size(gate.dtype())), gate.dtype(), {}};
  if (cost_only({&gate, &up}, {&gate})) return cost;
  for (int64_t i = 0; i < gate.numel(); ++i) gate.set(i, act_value(gate.get(i), act) * up.get(i));
  return cost;
}

}  // namespace shardsim::kernels

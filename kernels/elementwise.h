// Element-wise kernels: activations and products. All compute in fp32 and store in the tensor's dtype.
//
//   silu(x) = x · sigmoid(x)                       (Elfwing et al. 2018; Llama's SwiGLU gate)
//   gelu(x) = 0.5 · x · (1 + erf(x / sqrt(2)))     (Hendrycks & Gimpel 2016; exact form, not the tanh fit)
//   mul:  A[i] *= B[i]  (shapes must match)
//   glu:  A[i] = act(A[i]) · B[i]  fused (SwiGLU / GeGLU, Shazeer 2020), one pass over memory
// Cost: FLOPs as counted per element (silu 4, gelu 8, mul 1); bytes = inputs read + output written.
#pragma once

#include <string>

#include "kernels/kernel_cost.h"
#include "runtime/tensor.h"

namespace shardsim::kernels {

enum class Activation { silu, gelu };
Activation parse_activation(const std::string& name);  // std::invalid_argument on unknown names
std::string activation_name(Activation a);

KernelCost activation_inplace(runtime::Tensor& x, Activation act);
KernelCost mul_inplace(runtime::Tensor& a, const runtime::Tensor& b);
KernelCost glu_inplace(runtime::Tensor& gate, const runtime::Tensor& up, Activation act);

}  // namespace shardsim::kernels

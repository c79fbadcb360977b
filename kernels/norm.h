// Normalisation, rotary embedding and residual kernels of a Llama-style transformer block. All compute in fp32
// and store in the tensor's dtype (one rounding per output element).
//
//   rmsnorm:  y[t, i] = x[t, i] / sqrt(mean_i x[t, i]^2 + eps) * w[i]       (Zhang & Sennrich, NeurIPS 2019)
//             x [T, h], w [h], y [T, h]; each row is independent, so a sequence-sharded x needs no communication.
//   layernorm: y[t, i] = (x[t, i] − μ_t) / sqrt(σ²_t + eps) * w[i] + b[i], μ_t and σ²_t the row's mean and
//             (biased) variance (Ba et al. 2016; GPT-2/3's norm, with its bias); rows independent as rmsnorm.
//   rope:     rotary position embedding in place on x [T, H, d] (d even), token t at global position
//             positions[t]; pairs (2i, 2i+1) rotate by angle pos * theta^(-2i/d)     (Su et al., RoFormer, 2021)
//   add:      a[i] += b[i] (residual connection; shapes must match)
// Cost: rmsnorm 4 FLOPs per element (square, add, scale, weight); layernorm 7 (mean, centre, square, add, scale,
// weight, bias); rope 3 per element (6 per rotated pair); add 1;
// bytes = inputs read + outputs written.
// Errors: std::invalid_argument naming the shapes when they do not fit.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/kernel_cost.h"
#include "runtime/tensor.h"

namespace shardsim::kernels {

KernelCost rmsnorm(const runtime::Tensor& x, const runtime::Tensor& w, runtime::Tensor& y, float eps = 1e-5f);
KernelCost layernorm(const runtime::Tensor& x, const runtime::Tensor& w, const runtime::Tensor& b, runtime::Tensor& y,
                     float eps = 1e-5f);
KernelCost rope_inplace(runtime::Tensor& x, const std::vector<int64_t>& positions, float theta = 10000.0f);
KernelCost add_inplace(runtime::Tensor& a, const runtime::Tensor& b);

}  // namespace shardsim::kernels

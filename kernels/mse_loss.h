// The regression loss of a stack of blocks without a vocabulary (model.vocab 0, e.g. model.kind
// transformer_block): the mean squared error of the output Y [N, h] against a target T [N, h],
//   loss = (1 / (N_total · h)) · Σ ½ (y − t)²      over the rows this call sees
// (N_total: the rows of the whole loss, so a sharded caller's partial sums add up to the global mean), and its
// gradient dY = (y − t) / (N_total · h). Y in the compute dtype (fp32 or bf16), T fp32; the sum is accumulated in
// fp64. A NaN or infinity in Y or T propagates into the loss and the gradient.
// Errors: std::invalid_argument when the shapes differ or N_total·h is not positive.
#pragma once

#include <cstdint>

#include "kernels/kernel_cost.h"
#include "runtime/tensor.h"

namespace shardsim::kernels {

// LOSS receives this call's part of the mean (0 for shape-only tensors). Cost: 3 FLOPs per element (sub, mul,
// add), Y and T read once.
KernelCost mse_loss(const runtime::Tensor& y, const runtime::Tensor& target, int64_t n_total, double& loss);
// DY [N, h] in Y's dtype (overwritten). Cost: 2 FLOPs per element, Y and T read, DY written.
KernelCost mse_loss_backward(const runtime::Tensor& y, const runtime::Tensor& target, int64_t n_total,
                             runtime::Tensor& dy);

}  // namespace shardsim::kernels

// Backward (vector-Jacobian product) kernels of the Llama block's dense pieces: GEMM, SwiGLU, RMSNorm, RoPE and
// the residual add. Each takes the forward's saved inputs and the gradient of the loss with respect to the
// forward's output (dY), and writes the gradients with respect to the forward's inputs. All arithmetic is fp32
// (the RMSNorm row statistics in fp64, as the forward); fp32 or bf16 tensors, each output rounded once to its
// dtype. Attention backward is in kernels/attention_backward.h, cross-entropy and embedding in
// kernels/cross_entropy.h and kernels/embedding.h.
//
// Outputs are overwritten (not accumulated into); a caller that sums gradients (residual branches, GQA, weight
// gradients over micro-batches) adds them with add_inplace, whose cost is reported separately.
//
// Special values: nothing is masked or clamped, so a NaN or ±Inf in an input or in dY reaches the gradients
// through ordinary IEEE arithmetic (tests/unit/backward_test.cpp checks that a NaN propagates).
//
// Cost (KernelCost, for sim::Timeline::compute): FLOPs as listed per function; bytes = every input read once and
// every output written once (element size of the tensors' dtype), as for the forward kernels.
// Errors: std::invalid_argument naming the shapes when they do not fit.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/gemm.h"
#include "kernels/kernel_cost.h"
#include "runtime/tensor.h"

namespace shardsim::kernels {

// Y = X · W with X [M, K], W [K, N], Y [M, N] (gemm() without transposes). Given dY [M, N]:
//   dX = dY · W^T   [M, K]          dW = X^T · dY   [K, N]
// Either output may be skipped by passing nullptr (e.g. no dX for the first layer's input).
// Cost: two GEMMs, 2·M·N·K FLOPs each (4·M·N·K together), their bytes summed; name "gemm_backward".
KernelCost gemm_backward(const runtime::Tensor& x, const runtime::Tensor& w, const runtime::Tensor& dy,
                         runtime::Tensor* dx, runtime::Tensor* dw);

// Forward: out = silu(gate) · up (glu_inplace with Activation::silu), silu(g) = g·σ(g). Given dOut:
//   dGate = dOut · up · σ(g)·(1 + g·(1 − σ(g)))        dUp = dOut · silu(g)
// gate, up, dout, dgate, dup: one shape and one dtype. Cost: 10 FLOPs per element (σ 4, silu' 4, products 2);
// bytes = 3 tensors read + 2 written.
KernelCost swiglu_backward(const runtime::Tensor& gate, const runtime::Tensor& up, const runtime::Tensor& dout,
                           runtime::Tensor& dgate, runtime::Tensor& dup);

// Forward: y[t, i] = x[t, i] · r_t · w[i], r_t = 1/sqrt(mean_i x[t, i]² + eps) (rmsnorm()). Given dY [T, h]:
//   dw[i]    = Σ_t dY[t, i] · x[t, i] · r_t                               (summed over the T rows; fp64 sums)
//   dx[t, i] = r_t · w[i] · dY[t, i] − x[t, i] · r_t³ / h · Σ_j dY[t, j] · w[j] · x[t, j]
// x, dy, dx [T, h]; w, dw [h]; dw may be nullptr (frozen weight). Cost: 12 FLOPs per element of x (2 for the
// row statistic, 3 for the dot term, 4 for dx, 3 for dw); bytes = x, dY, w read, dx and dw written.
KernelCost rmsnorm_backward(const runtime::Tensor& x, const runtime::Tensor& w, const runtime::Tensor& dy,
                            runtime::Tensor& dx, runtime::Tensor* dw, float eps = 1e-5f);

// Forward: y = layernorm(x, w, b) (norm.h): x̂[t, i] = (x[t, i] − μ_t)·r_t, r_t = 1/sqrt(σ²_t + eps), y = x̂·w + b.
// Given dY [T, h] (g = dY·w):
//   dw[i] = Σ_t dY[t, i]·x̂[t, i]      db[i] = Σ_t dY[t, i]                     (fp64 sums over the rows)
//   dx[t, i] = r_t·(g[t, i] − mean_j g[t, j] − x̂[t, i]·mean_j g[t, j]·x̂[t, j])
// dw and db may be nullptr. Cost: 14 FLOPs per element of x (statistics 4, the two row means 4, dx 4, dw and db 2);
// bytes = x, dY, w read, dx, dw, db written.
KernelCost layernorm_backward(const runtime::Tensor& x, const runtime::Tensor& w, const runtime::Tensor& dy,
                              runtime::Tensor& dx, runtime::Tensor* dw, runtime::Tensor* db, float eps = 1e-5f);

// Forward: y = gelu(x) (elementwise.h, the exact erf form). Given dY: dX = dY·(Φ(x) + x·φ(x)), Φ and φ the
// standard normal CDF and density. x, dy, dx one shape and dtype. Cost: 10 FLOPs per element; bytes = 2 read, 1
// written.
KernelCost gelu_backward(const runtime::Tensor& x, const runtime::Tensor& dy, runtime::Tensor& dx);

// RoPE is a rotation R(pos) of each pair (2i, 2i+1), so its transpose is the rotation by −pos: dX = R(pos)^T dY,
// in place on dx [T, H, d] (holding dY on entry). Same positions and theta as the forward; same cost as rope.
KernelCost rope_backward_inplace(runtime::Tensor& dx, const std::vector<int64_t>& positions,
                                 float theta = 10000.0f);

// Residual add y = a + b (add_inplace): da = dy and db = dy. Writes dy into both (one shape and dtype each).
// Cost: 0 FLOPs; bytes = dy read once, da and db written.
KernelCost add_backward(const runtime::Tensor& dy, runtime::Tensor& da, runtime::Tensor& db);

}  // namespace shardsim::kernels

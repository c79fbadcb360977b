// Optimizer kernels: the AdamW update with fp32 master weights, and global-norm gradient clipping whose norm is
// assembled from per-shard pieces on a device mesh.
//
// AdamW (Loshchilov & Hutter, "Decoupled Weight Decay Regularization", ICLR 2019; Kingma & Ba, "Adam", ICLR 2015;
// the update order of PyTorch's torch.optim.AdamW), for step t >= 1 (the number of updates including this one)
// and every element, with g = grad_scale · grad:
//   p ← p · (1 − lr · weight_decay)                       decoupled decay, not added to g
//   m ← β1 · m + (1 − β1) · g          v ← β2 · v + (1 − β2) · g²
//   p ← p − lr · (m / (1 − β1^t)) / (sqrt(v / (1 − β2^t)) + eps)      (bias-corrected moments)
// Mixed precision (Micikevicius et al., "Mixed Precision Training", ICLR 2018): p, m and v are fp32 (the master
// copy and the moments); the forward/backward use a bf16 compute copy, which the step refreshes when given
// (rounded once from the updated master), and may pass bf16 gradients (widened exactly).
// Arithmetic is fp32 per element except the bias corrections 1 − β^t, computed in fp64 and rounded once.
// Cost: 14 FLOPs per element; bytes = master, m, v read and written (fp32), grad read, the copy written.
// Errors: std::invalid_argument naming the shapes/dtypes, a step < 1 or a hyper-parameter outside its range
// (lr >= 0, 0 <= β < 1, eps > 0, weight_decay >= 0, all finite).
//
// Gradient clipping by the global norm (Pascanu, Mikolov & Bengio, ICML 2013; torch.nn.utils.clip_grad_norm_;
// Megatron-LM's clip_grad_norm_fp32): ‖g‖² = Σ_parameters Σ_elements g². On a mesh a chip holds a piece of
// each parameter's gradient: the parameter is *sharded* over some mesh axes (the chips along such an axis hold
// disjoint pieces) and *replicated* over the others (they hold identical copies, e.g. a norm weight over tp, or
// any parameter over dp after the gradient all_reduce). The rule:
//   1. every chip sums the squares of its pieces, counting a parameter only if its coordinate is 0 on every
//      mesh axis that replicates that parameter (grad_sq_norm_local, fp64);
//   2. the caller all_reduce(sum)s that number over every axis of the mesh (the axes that shard something);
//   3. norm = sqrt of the sum; every chip scales its gradients by clip_coefficient(norm, max_norm).
// Every element is counted exactly once. Summing every chip's pieces without step 1 counts a parameter
// replicated r times r times (e.g. RMSNorm weights tp times under tensor parallelism): the double-count bug that
// tests/unit/optimizer_test.cpp (GradClip.ReplicatedParametersAreCountedOnce) demonstrates.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/kernel_cost.h"
#include "runtime/tensor.h"

namespace shardsim::kernels {

struct AdamWConfig {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.01f;
};

// master, m, v: fp32, one shape; grad: fp32 or bf16 of that shape; compute_copy: nullptr or that shape (any
// floating dtype, usually bf16).
KernelCost adamw_step(runtime::Tensor& master, runtime::Tensor& m, runtime::Tensor& v, const runtime::Tensor& grad,
                      int64_t step, const AdamWConfig& config, float grad_scale = 1.0f,
                      runtime::Tensor* compute_copy = nullptr);

// One parameter's gradient piece on this chip, and this chip's coordinate on each mesh axis that replicates the
// parameter (empty when no axis replicates it: unsplit on a single chip, or sharded on every axis).
struct GradNormTerm {
  const runtime::Tensor* grad = nullptr;
  std::vector<int64_t> replica_coords;
};

// Step 1 of the rule above: Σ g² over the terms this chip counts, accumulated in fp64. A NaN or Inf in a counted
// gradient gives NaN or Inf. A shape-only gradient (no storage, no values) contributes 0, so a shape-only run's
// norm is 0 and its clip coefficient 1 (the schedule, which is all such a run measures, does not depend on it).
double grad_sq_norm_local(const std::vector<GradNormTerm>& terms);

// min(1, max_norm / (norm + 1e-6)) (PyTorch's formula); NaN when norm is NaN or Inf, so the caller can skip the
// step or fail instead of scaling by 0. std::invalid_argument when max_norm is not finite and > 0.
double clip_coefficient(double global_norm, double max_norm);

// Multi-tensor launches: how NVIDIA Apex's and Transformer Engine's multi_tensor_apply (csrc/multi_tensor_apply.cuh;
// Megatron-LM's optimizer step (FusedAdam) and gradient norm (multi_tensor_l2norm) run through it) cut a list of
// tensors into kernels. Each tensor is cut into chunks of kMultiTensorChunk elements (MultiTensorApply(2048 * 32)),
// one thread block per chunk; a launch holds at most kMultiTensorBlocks blocks and at most
// multi_tensor_max_tensors(DEPTH) tensors (the 4 KB kernel-argument limit: {110, 64, 48, 36, 30} for 1..5 lists),
// and the next launch starts when either fills (a tensor cut by a full launch continues in the next). DEPTH: the
// tensor lists each launch reads (l2norm 1; Adam 4: grad, param, m, v; Adam writing a low-precision copy of fp32
// master weights 5). NUMELS: the tensors' element counts in order (zero-sized ones are skipped, as Apex does).
// Returns the elements each launch covers, in order (empty when there are none). std::invalid_argument for a DEPTH
// outside 1..5 or a negative count.
inline constexpr int64_t kMultiTensorChunk = 65536;
inline constexpr int kMultiTensorBlocks = 320;
int multi_tensor_max_tensors(int depth);
std::vector<int64_t> multi_tensor_launches(const std::vector<int64_t>& numels, int depth);
// WHOLE cut into one kernel per launch: each launch gets WHOLE's FLOPs and bytes in proportion to its elements
// (so the sums are WHOLE's), WHOLE's name and dtype. No launches: no kernels.
std::vector<KernelCost> split_launches(const KernelCost& whole, const std::vector<int64_t>& launches);
// The second kernel of Apex's multi_tensor_l2norm: one block sums the per-block partial sums of the launches
// (kMultiTensorBlocks fp32 values) into the norm. Named "multi_tensor_l2norm.cleanup".
KernelCost l2norm_cleanup_cost();

}  // namespace shardsim::kernels

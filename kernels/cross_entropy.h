// Softmax cross-entropy over a vocabulary, in the vocab-parallel form of Megatron-LM (Shoeybi et al.,
// "Megatron-LM", arXiv:1909.08053, §3; megatron/core/tensor_parallel/cross_entropy.py): the logits of T tokens
// over a vocabulary of V ids are split by columns, a shard holding logits [T, Vs] of ids [v0, v0 + Vs), and no
// shard ever holds a full row. Per token t with target y_t:
//
//   loss_t = log Σ_v exp(z[t, v]) − z[t, y_t] = m_t + log Σ_v exp(z[t, v] − m_t) − z[t, y_t],   m_t = max_v z[t, v]
//
// computed in four kernel calls around two collectives the caller issues over the vocabulary's mesh axis:
//   1. ce_shard_max        m_local[t] = max over the shard's columns                 -> all_reduce(max) -> m
//   2. ce_shard_stats      sumexp_local[t] = Σ_{v in shard} exp(z[t, v] − m_t)       -> all_reduce(sum) -> sumexp
//                          target_local[t] = z[t, y_t] if v0 <= y_t < v0 + Vs else 0 -> all_reduce(sum) -> target
//   3. ce_loss             loss[t] = m_t + log(sumexp_t) − target_t (the same on every shard)
//   4. ce_backward         dz[t, v] = scale · (exp(z[t, v] − m_t) / sumexp_t − [v == y_t])   (its own columns only)
// With one shard (v0 = 0, Vs = V) this is the ordinary single-device cross-entropy; the two collectives are then
// identities. The mean loss over T tokens has scale = 1/T.
//
// Tensors: logits and dlogits fp32 or bf16 [T, Vs] (one dtype; dlogits rounded once); m, sumexp, target, loss fp32
// [T]. targets: T ids in [0, V) (there is no ignore index). Sums of exponentials are accumulated in fp64 and
// stored in fp32; every exponent is <= 0, so nothing overflows.
// Special values: a NaN logit makes its row's m (hence loss and every gradient of that row) NaN; a +Inf logit
// makes m = +Inf and the row's loss and gradients NaN (Inf − Inf), as in PyTorch's cross_entropy.
// Cost: max 1 FLOP per logit; stats 3 (subtract, exp counted as 1, add); loss 3 per token; backward 4 per logit.
// Bytes: logits read once per call that reads them, per-token statistics read/written as fp32.
// Errors: std::invalid_argument naming the shapes, or the token index and id of a target outside [0, V).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/kernel_cost.h"
#include "runtime/tensor.h"

namespace shardsim::kernels {

// m_local: fp32 [T].
KernelCost ce_shard_max(const runtime::Tensor& logits, runtime::Tensor& m_local);

// m: the reduced row maxima [T]; outputs sumexp_local and target_local fp32 [T]. vocab = V (the global size).
KernelCost ce_shard_stats(const runtime::Tensor& logits, const runtime::Tensor& m,
                          const std::vector<int64_t>& targets, int64_t v0, int64_t vocab,
                          runtime::Tensor& sumexp_local, runtime::Tensor& target_local);

// loss fp32 [T] from the reduced statistics.
KernelCost ce_loss(const runtime::Tensor& m, const runtime::Tensor& sumexp, const runtime::Tensor& target,
                   runtime::Tensor& loss);

// dlogits [T, Vs] for this shard; scale multiplies every gradient (1/T for a mean over T tokens).
KernelCost ce_backward(const runtime::Tensor& logits, const runtime::Tensor& m, const runtime::Tensor& sumexp,
                       const std::vector<int64_t>& targets, int64_t v0, int64_t vocab, float scale,
                       runtime::Tensor& dlogits);

}  // namespace shardsim::kernels

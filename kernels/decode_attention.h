// Attention of a sequence's new tokens over its KV cache (serving: prefill chunks and decode steps), one chip.
//
// A sequence holds PAST tokens in its cache (keys and values of positions [0, past)); an iteration brings ROWS new
// tokens at positions [past, past + rows), whose keys and values the caller has appended, so K, V hold positions
// [0, past + rows). Each new row attends causally over every cached key up to its own position:
//   O[i, h, :] = softmax_j( <Q[i,h,:], K[j,g,:]> / sqrt(d) ) · V[j,g,:],  j <= past + i,  g = h / (Hq / Hkv)
// which is kernels::attention (flash-style, fp32 arithmetic) with causal masking and q_offset = past, k_offset = 0;
// the numbers are that kernel's, this file adds the serving cost model.
//
// Shapes: Q, O [rows, Hq, d]; K, V [past + rows, Hkv, d] (row-major, kernels/attention.h's layout), fp32 or bf16,
// O in Q's dtype. Shape-only tensors (runtime/tensor.h): the cost alone.
//
// Cost (kernels::KernelCost; one kernel per batch, cached_attention_batch):
//   decode (rows = 1): bandwidth-bound, as vLLM's PagedAttention and Flash-Decoding run it (Kwon et al. 2023,
//     arXiv 2309.06180; Dao et al. 2023, "Flash-Decoding for long-context inference", crfm.stanford.edu): the query
//     heads of one GQA group share each K/V tile, so the cache is read once per kv head:
//       bytes = 2·L·Hkv·d·e (K and V, L = past + 1) + 2·Hq·d·e (Q read, O written),  flops = 4·d·Hq·L
//     shape (sim/kernel_model.h, attention_forward): M = Hq/Hkv rows per item (the group's heads packed as rows),
//     N = the split's keys, K = d, BATCH = Hkv·splits work items, splits = ceil(L / 256): Flash-Decoding splits the
//     keys so that a batch of few sequences still fills the device (the 256-key split is an assumption).
//   prefill (rows > 1): kernels::attention_cost with the offsets (the training forward's flash model: every query
//     tile re-reads the keys it sees, per query head).
// Errors: those of kernels::attention; std::invalid_argument when K, V do not hold past + rows rows.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/kernel_cost.h"
#include "runtime/tensor.h"

namespace shardsim::kernels {

inline constexpr int64_t kDecodeKeySplit = 256;  // keys per Flash-Decoding split (assumption, see above)

// One sequence: computes O (when every tensor has storage) and returns its cost.
KernelCost cached_attention(const runtime::Tensor& q, const runtime::Tensor& k, const runtime::Tensor& v,
                            runtime::Tensor& out, int64_t past);
// The cost cached_attention reports for these shapes, without running it.
KernelCost cached_attention_cost(int64_t rows, int64_t past, int64_t hq, int64_t hkv, int64_t d, runtime::DType dtype);
// Several sequences' costs as one launch (vLLM runs a batch's decodes in one kernel, its prefills in another):
// FLOPs and bytes summed, the shape's work items summed (M and N: the first cost's). NAME names it. Empty: zero.
KernelCost cached_attention_batch(const std::vector<KernelCost>& costs, const char* name);

}  // namespace shardsim::kernels

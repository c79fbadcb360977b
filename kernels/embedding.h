// Token embedding lookup and its backward, in the vocab-parallel form of Megatron-LM's VocabParallelEmbedding
// (Shoeybi et al., arXiv:1909.08053): a shard holds rows [v0, v0 + Vs) of the embedding table [V, h]. Its lookup
// writes the rows of the tokens it holds and zeros for the others, so the all_reduce(sum) of the shards' outputs
// (issued by the caller over the vocabulary's mesh axis) is the full lookup; one shard (v0 = 0, Vs = V) is the
// single-device embedding.
//
//   embedding_forward:   out[t, :] = table[tokens[t] − v0, :] if v0 <= tokens[t] < v0 + Vs, else 0
//   embedding_backward:  dtable = 0; then dtable[tokens[t] − v0, :] += dout[t, :] for the tokens in the shard
//                        (scatter-add, in token order, fp32 accumulation; a token repeated n times gets n adds)
//
// Tensors: table, dtable [Vs, h]; out, dout [T, h]; fp32 or bf16, one dtype per call. tokens: T ids in [0, V).
// Special values: copied/added as they are (a NaN row of dout reaches its token's row of dtable).
// Cost: forward 0 FLOPs, bytes = T·h read + T·h written + 8 bytes per token id; backward T·h FLOPs (the adds),
// bytes = dout read, dtable written (Vs·h) and the T touched rows read back.
// Errors: std::invalid_argument naming the shapes, or the index and id of a token outside [0, V).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/kernel_cost.h"
#include "runtime/tensor.h"

namespace shardsim::kernels {

KernelCost embedding_forward(const runtime::Tensor& table, const std::vector<int64_t>& tokens, int64_t v0,
                             int64_t vocab, runtime::Tensor& out);

KernelCost embedding_backward(const runtime::Tensor& dout, const std::vector<int64_t>& tokens, int64_t v0,
                              int64_t vocab, runtime::Tensor& dtable);

}  // namespace shardsim::kernels

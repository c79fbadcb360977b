// Flash-attention backward on one chip: the gradients dQ, dK, dV of attention() (kernels/attention.h) from the
// forward's inputs, its output O, its saved log-sum-exp and dO, recomputing each score tile from lse instead of
// storing the seq_q x seq_k probabilities (FlashAttention-2, Dao 2023, arXiv:2307.08691, Algorithm 2).
//
// Per query head h (kv head g = h / (Hq / Hkv)) and visible pair (i, j) (the forward's causal rule and offsets):
//   D[i]     = Σ_c dO[i,h,c] · O[i,h,c]
//   P[i][j]  = exp(scale · <Q[i,h], K[j,g]> − lse[h][i])          (0 for masked pairs and rows with lse = −inf)
//   dV[j,g] += P[i][j] · dO[i,h]
//   dP[i][j] = <dO[i,h], V[j,g]>
//   dS[i][j] = P[i][j] · (dP[i][j] − D[i])
//   dQ[i,h] += scale · dS[i][j] · K[j,g]          dK[j,g] += scale · dS[i][j] · Q[i,h]
// so with grouped-query attention dK and dV of a kv head sum the contributions of all its query heads.
//
// Layouts as attention(): Q, O, dO, dQ [seq_q, Hq, d]; K, V, dK, dV [seq_k, Hkv, d]; lse fp32 [Hq, seq_q] exactly
// as the forward wrote it (the forward already saves it; nothing else is kept from the forward).
// Dtypes: Q, K, V, O, dO fp32 or bf16 (Q, K, V one dtype; O and dO may be fp32 with bf16 inputs); dQ, dK, dV fp32
// or Q's dtype. Arithmetic is fp32 (cblas_sgemm on tiles); bf16 inputs are widened once, outputs rounded once.
// Options: causal, q_offset, k_offset, scale, block_q, block_k as for attention(); head_begin/head_end must be
// the full range (the gradient of a kv head needs all of its query heads).
//
// Memory: O(seq·d), never O(seq_q·seq_k): one score tile and one dP tile (Br·Bc), a dQ tile accumulator (Br·d),
// D for one head (seq_q), and fp32 dK, dV accumulators of one kv head (2·seq_k·d); bf16 inputs add fp32 copies of
// the inputs (linear in seq). attention_backward_workspace_bytes() gives the figure for fp32 inputs.
//
// Cost (KernelCost, name "attention_backward[_causal]"): 10·d FLOPs per visible pair per query head (recomputed
// Q·K^T 2d, dV 2d, dP 2d, dQ 2d, dK 2d: 2.5× the forward's 4d, as the FlashAttention papers count it). Bytes:
// the HBM traffic of FlashAttention-2's loop order (outer loop over key tiles of Bc = block_k rows, dK and dV held
// on chip): per query head, O and dO read once for D; K and V read and dK, dV written once; for every key tile,
// the query rows that see any of its keys read Q, dO, lse, D and read-modify-write an fp32 dQ.
//
// Special values: a NaN in Q, K, V, O or dO reaches the gradients through IEEE arithmetic (no crash). As in the
// forward, masked probabilities are 0 but still enter the tile GEMMs, so a NaN in a key or value row can also
// reach queries in the same tile that do not see it (0 · NaN = NaN, as with PyTorch's softmax-then-matmul). Errors: std::invalid_argument with the shapes, as attention().
#pragma once

#include <cstdint>

#include "kernels/attention.h"
#include "kernels/kernel_cost.h"
#include "runtime/tensor.h"

namespace shardsim::kernels {

KernelCost attention_backward(const runtime::Tensor& q, const runtime::Tensor& k, const runtime::Tensor& v,
                              const runtime::Tensor& out, const runtime::Tensor& lse, const runtime::Tensor& dout,
                              runtime::Tensor& dq, runtime::Tensor& dk, runtime::Tensor& dv,
                              const AttentionOptions& options = {});

// The cost attention_backward() reports for these shapes, without running it.
KernelCost attention_backward_cost(int64_t seq_q, int64_t seq_k, int64_t hq, int64_t hkv, int64_t d,
                                   runtime::DType in_dtype, runtime::DType grad_dtype,
                                   const AttentionOptions& options = {});

// Host bytes of fp32 scratch attention_backward() allocates for fp32 inputs.
int64_t attention_backward_workspace_bytes(int64_t seq_q, int64_t seq_k, int64_t d,
                                           const AttentionOptions& options = {});

}  // namespace shardsim::kernels

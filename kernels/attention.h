// Local (one chip) multi-head attention forward, flash-attention style: the key/value sequence is walked in
// tiles and the softmax is computed online (running row max m and running sum l of exp(s - m)), so the
// seq_q x seq_k score matrix never exists; only one Br x Bc score tile per call does.
//
//   Tri Dao, Daniel Y. Fu, Stefano Ermon, Atri Rudra, Christopher Ré. "FlashAttention: Fast and Memory-Efficient
//     Exact Attention with IO-Awareness", NeurIPS 2022 (arXiv:2205.14135).
//   Tri Dao. "FlashAttention-2: Faster Attention with Better Parallelism and Work Partitioning", 2023
//     (arXiv:2307.08691) -- the loop order used here: outer loop over query tiles, inner loop over key tiles,
//     the output accumulator is rescaled per key tile and divided by l once at the end.
//   Online softmax: Milakov & Gimelshein, "Online normalizer calculation for softmax", 2018 (arXiv:1805.02867).
//
// What is computed, per query head h (kv head g = h / (Hq / Hkv): grouped-query attention, Ainslie et al. 2023;
// Hkv = 1 is multi-query attention, Shazeer 2019; Hkv = Hq is ordinary multi-head attention):
//   s[i][j]   = scale · <Q[i,h,:], K[j,g,:]>                          (scale defaults to 1/sqrt(d))
//   visible   = all j, or with causal: q_offset + i >= k_offset + j   (masked iff q_offset+i < k_offset+j)
//   lse[h][i] = log(sum_{visible j} exp(s[i][j]))                     (natural log, fp32)
//   O[i,h,:]  = sum_{visible j} exp(s[i][j] - lse[h][i]) · V[j,g,:]
// A row with no visible key (possible with offsets, or seq_k = 0) gets lse = -inf and O = 0; such a partial
// merges as "no contribution" in merge_attention_partials.
//
// Layouts (row-major, dense, no padding; element strides in brackets):
//   Q   [seq_q, Hq,  d]   Q[i,h,c]  at (i·Hq  + h)·d + c
//   K,V [seq_k, Hkv, d]   K[j,g,c]  at (j·Hkv + g)·d + c     (K and V share one shape)
//   O   [seq_q, Hq,  d]   same layout as Q
//   lse [Hq, seq_q]       lse[h][i] at h·seq_q + i, always fp32 (FlashAttention's softmax_lse layout)
// This is the "[tokens, heads, head_dim]" layout a QKV projection produces, so per-head tiles are strided
// views fed to BLAS with a leading dimension of H·d; nothing is transposed.
//
// Position offsets: Q row i sits at global position q_offset + i and K/V row j at k_offset + j. A chip holding a
// chunk of the sequence (context parallel / ring attention) passes its chunk's start for q_offset and the start
// of the KV block it currently holds for k_offset; the offsets only matter with causal = true.
//
// Dtypes: Q, K, V share one dtype, fp32 or bf16. O is fp32 or Q's dtype (so a bf16 ring-attention step can keep
// fp32 partials). All arithmetic is fp32 (cblas_sgemm for the Q·K^T and P·V tiles, fp32 softmax state); bf16
// inputs are widened exactly and a bf16 O is rounded once at the end (round to nearest even).
//
// Memory: workspace = one score tile Br·Bc + output accumulator Br·d + 2·Br row stats (fp32), plus for bf16
// inputs a widened Q tile (Br·d) and widened K and V of one kv head (2·seq_k·d): O(seq·d) per head, never
// O(seq_q·seq_k). attention_workspace_bytes() returns the exact figure.
//
// Cost (KernelCost): FLOPs are the standard matmul count, 4·d per *visible* (i, j) pair per query head
// (2·d for Q·K^T, 2·d for P·V): 4·seq_q·seq_k·d per head non-causal, 4·d·s(s+1)/2 per head for causal with
// seq_q = seq_k = s and equal offsets. The softmax's exps and the masked entries of diagonal tiles that the
// host computes and throws away are not counted (as in the FlashAttention papers' FLOP/s figures).
// Bytes (HBM traffic of the tiled algorithm, per query head): Q read once, O written once, lse (fp32) written
// once, and for every query tile of Br = options.block_q rows the K and V rows it needs read once: all seq_k
// rows, or with causal only rows up to the last visible key of the tile's last row (keys wholly in the tile's
// future are skipped). With GQA every query head re-reads its kv head (no sharing across the group).
//
// Errors: std::invalid_argument with the offending shapes for: tensors not 3-D, K/V shape mismatch, head_dim
// mismatch or 0, Hkv = 0 or Hq not a multiple of Hkv, dtypes not fp32/bf16 or not shared by Q, K, V, O of the
// wrong shape/dtype, lse not fp32 [Hq, seq_q], a bad head range, block sizes < 1, a non-finite scale.
// Threads: the kernel itself is single-threaded; the sgemm calls use however many threads OpenBLAS has
// (kernels::set_blas_threads; shardsim runs 1 per rank).
#pragma once

#include <cstdint>
#include <optional>

#include "kernels/kernel_cost.h"
#include "runtime/tensor.h"

namespace shardsim::kernels {

struct AttentionOptions {
  bool causal = false;
  int64_t q_offset = 0;         // global position of Q row 0 (causal masking only)
  int64_t k_offset = 0;         // global position of K/V row 0 (causal masking only)
  std::optional<float> scale;   // softmax scale; default 1/sqrt(d)
  // Query heads to compute: [head_begin, head_end); head_end = -1 means Hq. O and lse rows of other heads are
  // left untouched (lets a caller split heads across calls or chips without copying Q).
  int64_t head_begin = 0;
  int64_t head_end = -1;
  // Tile sizes: Br query rows x Bc key rows per step. The defaults come from the tile sweep in docs/performance/host.md
  // ("Local attention kernel": within noise of the best, 128 KiB score tile); any values >= 1 give the same
  // result up to fp32 rounding. block_q also sets the K/V re-read count in the reported bytes.
  int64_t block_q = 128;
  int64_t block_k = 256;
};

// out: [seq_q, Hq, d] (fp32 or Q's dtype), lse: fp32 [Hq, seq_q]; both must already have these shapes.
KernelCost attention(const runtime::Tensor& q, const runtime::Tensor& k, const runtime::Tensor& v,
                     runtime::Tensor& out, runtime::Tensor& lse, const AttentionOptions& options = {});

// The cost attention() reports for these shapes, without running it (for planning in the simulator).
// in_dtype: Q/K/V dtype, out_dtype: O's dtype. Same validation of the numbers as attention().
KernelCost attention_cost(int64_t seq_q, int64_t seq_k, int64_t hq, int64_t hkv, int64_t d, runtime::DType in_dtype,
                          runtime::DType out_dtype, const AttentionOptions& options = {});

// The number of visible (query row, key row) pairs of one head: seq_q·seq_k, or with causal masking
// Σ_i clamp(q_offset + i − k_offset + 1, 0, seq_k), in closed form (O(1): the cost of a long sequence is charged
// many times per run in shape-only mode). The FLOPs of attention() are 4·d times this per query head.
int64_t attention_visible_pairs(int64_t seq_q, int64_t seq_k, const AttentionOptions& options = {});

// Host bytes of scratch attention() allocates for these shapes (score tile, accumulator, row stats, bf16
// widening buffers). Independent of the number of heads; linear in seq_k only for bf16 inputs.
int64_t attention_workspace_bytes(int64_t seq_k, int64_t d, runtime::DType in_dtype,
                                  const AttentionOptions& options = {});

// Merges two attention partials of the same queries computed over disjoint key sets A and B (e.g. two KV blocks
// of ring attention) into the attention over A ∪ B, in place into (out_a, lse_a). Per row, with
// m = max(lse_a, lse_b):
//   w_a = e^{lse_a - m},  w_b = e^{lse_b - m}
//   out = (w_a·out_a + w_b·out_b) / (w_a + w_b),   lse = m + log(w_a + w_b)
// which never overflows (the larger weight is 1). A row with lse = -inf (no visible key) contributes nothing;
// if both are -inf the result is out = 0, lse = -inf. Merging is commutative and, up to rounding, associative,
// so blocks may arrive in any order.
// Shapes: out_a, out_b [seq, H, d] (fp32 or bf16, each computed in fp32 and out_a stored in its own dtype),
// lse_a, lse_b fp32 [H, seq]. std::invalid_argument when the shapes differ or are not of this form.
// Cost: 3 FLOPs per output element; bytes = both outs and lses read, out_a and lse_a written.
KernelCost merge_attention_partials(runtime::Tensor& out_a, runtime::Tensor& lse_a, const runtime::Tensor& out_b,
                                    const runtime::Tensor& lse_b);

}  // namespace shardsim::kernels

// The block program: one transformer block's forward on one chip, written once and composed from the plan units,
// for every mode of the one executor (models/lm_tp.h: `run`'s forward mode, `train`'s forward and recomputation)
// and every plan (tp, sp, fused, cp ring attention, Ulysses, and their products on the device mesh).
//
//   a   = norm(x)                                  rmsnorm or layernorm (ModelSpec::norm), on this chip's residual
//                                                  rows (its sp shard with sp)
//   q,k,v = column_parallel(a; Wq, Wk, Wv)         tensor_parallel.h (sp all_gather / fused all_gather_gemm)
//   rope(q), rope(k) at the tokens' global positions
//   o   = attention(q, k, v)                       local (one kernel per sequence), ring attention over cp
//                                                  (context_parallel.h) or Ulysses all_to_alls (ulysses.h)
//   x1  = x + row_parallel(o; Wo)                  tp all_reduce / sp reduce_scatter / fused
//   out = x1 + mlp_layer(rmsnorm(x1))              column-parallel W_gate, W_up; GLU; row-parallel W_down
//     or  x1 + moe(rmsnorm(x1))                    a layer of model.moe: the routed experts over the ep group
//                                                  (expert_parallel.h, ep_moe_forward; ep 1 included)
//
// Token layout of a chip (TokenLayout): BATCH sequences, of each SEQ_LOCAL tokens (its cp chunks concatenated:
// cp_chunks of the cp axis, which Ulysses shares with a contiguous split), rows b·SEQ_LOCAL + i; POS their global
// positions (RoPE). With sp the residual stream holds rows [t·N/tp, (t+1)·N/tp) of the N = BATCH·SEQ_LOCAL rows.
// Shapes: x, out [rows of the residual stream, hidden]; weights this chip's shards (Wq [hidden, nq·d], Wk and Wv
// [hidden, nkv·d], Wo [nq·d, hidden], W_gate and W_up [hidden, ffn_r], W_down [ffn_r, hidden], norms [hidden]).
// Every kernel is charged to ctx.chip, every collective to the plan's sub-groups with ParallelPlan::algorithm_for,
// bytes per collective to ctx.comm. Shape-only tensors (runtime/tensor.h) charge the same schedule.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "kernels/bias_dropout.h"
#include "kernels/elementwise.h"
#include "sharding/plans/block_ops.h"
#include "sharding/plans/expert_parallel.h"
#include "sharding/plans/tensor_parallel.h"
#include "sim/memory.h"

namespace shardsim::sharding::plans {

// A block's mixture-of-experts MLP (ModelSpec::moe): this chip's weights (its ep shard of the experts, their etp
// shard), its expert groups, and the model layer (the stream of a shape-only run's declared routing). EP_TOKENS
// (optional): the rows every ep rank routes, in ep rank order, when they differ (serving: each ep rank attends its
// own sequences, models/lm_tp.h serve_step); null: every rank routes as many rows as this chip.
struct BlockMoe {
  const kernels::MoeWeights* w = nullptr;
  const EpGroups* groups = nullptr;
  int64_t layer = 0;
  const std::vector<int64_t>* ep_tokens = nullptr;
};

struct BlockWeights {
  const Tensor *norm1 = nullptr, *wq = nullptr, *wk = nullptr, *wv = nullptr, *wo = nullptr, *norm2 = nullptr,
               *w_gate = nullptr, *w_up = nullptr, *w_down = nullptr;
  const Tensor *norm1_b = nullptr, *norm2_b = nullptr;  // layernorm biases (ModelSpec::norm layernorm)
  BlockMoe moe;  // moe.w set: the MLP sublayer is the MoE MLP (w_gate, w_up, w_down unused)
};

// What a block's forward keeps for its backward (training): the input x_in and x_mid (after attention), the
// normed inputs a and m as the column-parallel GEMMs read them (gathered with sp; this chip's rows when fused),
// q, k, v after RoPE (Ulysses: head-sharded, with o_heads the attention output in that layout), o [N, nq, d] in
// the token layout, lse per (sequence[, cp chunk]) fp32 [heads, len], gate and up, act = glu(gate, up). With
// the unfused attention core (ModelSpec::attention_impl): probs, the softmax output per sequence [nq, T, T] (none
// under selective recomputation: the backward recomputes it), and no lse. CHARGED_BYTES: what the charged dropout
// would keep (kernels/bias_dropout.h: the hidden masks; the attention dropout's mask and output when probs is kept).
struct BlockActivations {
  Tensor x_in, a, q, k, v, o, x_mid, m, gate, up, act;
  std::vector<Tensor> lse;
  Tensor o_heads;
  std::vector<Tensor> probs;
  double charged_bytes = 0;
  // A MoE layer: the executor's (ep_moe_forward; m is its input) or the single-device reference's
  // (kernels::moe_forward, models/lm_model.cpp).
  EpActivations moe;
  kernels::MoeActivations moe_ref;
};

struct TokenLayout {
  int64_t batch = 1;          // sequences on this chip
  int64_t seq_local = 0;      // tokens of each sequence on this chip
  std::vector<int64_t> pos;   // global position of every row, [batch·seq_local]
};
// The layout of cp-axis rank C_IDX of CP_AXIS (cp or Ulysses size) for BATCH sequences of SEQ tokens (ZIGZAG: the
// cp split; Ulysses passes false).
TokenLayout token_layout(int64_t seq, int64_t batch, int cp_axis, int c_idx, bool zigzag);

// Simulated HBM held during the block's phases (bytes; run's BlockMemory): q/k/v activations through attention,
// the ring's receive buffers during ring attention, the MLP activations. MEMORY null: none recorded.
struct BlockMemoryScopes {
  sim::Memory* memory = nullptr;
  uint64_t qkv = 0, ring = 0, mlp = 0;
};

// One block on this chip (see above); KEEP (optional) receives what the backward reads.
Tensor block_forward(PlanContext& ctx, const TokenLayout& layout, const BlockWeights& w, const Tensor& x,
                     BlockActivations* keep = nullptr, const BlockMemoryScopes& memory = {});

// A block's weight gradients (the shapes of BlockWeights'), written by block_backward: norm1_b / norm2_b with
// layernorm only (else unused); MOE (a MoE layer, BlockWeights::moe set): the router's, the local experts' and the
// shared experts' gradients, zeroed first (an expert without tokens gets zeros), and MOE_AUX_GRAD, d loss / d the
// layer's aux loss (the trainer's 1 / micro-batches).
struct BlockGrads {
  Tensor *norm1 = nullptr, *wq = nullptr, *wk = nullptr, *wv = nullptr, *wo = nullptr, *norm2 = nullptr,
         *w_gate = nullptr, *w_up = nullptr, *w_down = nullptr;
  Tensor *norm1_b = nullptr, *norm2_b = nullptr;
  kernels::MoeWeights* moe = nullptr;
  double moe_aux_grad = 1;
};

// The block's backward on this chip (training), block_forward's mirror through the same plan units:
//   dMLP: row-parallel W_down (tp_gather of dY / sp all_gather / fused), GLU or GELU backward, column-parallel
//         W_gate, W_up (tp reduction of dX) or the MoE MLP's backward (expert_parallel.h, ep_moe_backward);
//         norm2's backward; + the residual
//   dattn: row-parallel Wo; the attention core's backward: local (one flash backward per sequence from the saved
//         lse, or the unfused core's from its kept / recomputed softmax output), ring attention over cp
//         (context_parallel.h) or Ulysses (ulysses.h); RoPE's backward at the tokens' global positions;
//         column-parallel Wq, Wk, Wv; norm1's backward; + the residual
// and the charged bias / dropout gradients (kernels/bias_dropout.h). DX: in, the gradient of the block's output
// [rows of the residual stream, hidden] (compute dtype); out, of its input. KEEP: what block_forward kept.
// Activation recomputation (one unit: ParallelPlan::recompute / selective_recompute): full (ctx.p.recompute) keeps
// only KEEP.x_in from the forward; the block's forward runs again from it first (its kernels and tp collectives
// charged, KEEP refilled), and KEEP is dropped back to x_in at the end; selective rebuilds the unfused core's
// softmax output inside its backward (unfused_attention_backward); none reads what the forward kept.
// DEFER (zero-bubble pipelines' BI pass, tensor_parallel.h): the weight-gradient GEMMs are appended there instead
// of run (the norms' weight gradients, cheap, are computed here). Kernels are charged to ctx.chip from ctx.chip.t.
void block_backward(PlanContext& ctx, const TokenLayout& layout, const BlockWeights& w, BlockActivations& keep,
                    const BlockGrads& g, Tensor& dx, WeightGradGemms* defer = nullptr);

// The gated MLP y = (act(x·W_gate) ⊙ x·W_up)·W_down: the MLP workload's layer and the block's MLP sublayer; with
// W.w_gate null the GELU MLP y = gelu(x·W_up)·W_down (KEEP: up = x·W_up, act = gelu(up); ACTIVATION unused).
// CTX null: one device (the single-device reference), charged to CHIP; else sharded by the tp unit (column-parallel
// gate/up, row-parallel down and its reduction; sp and fused variants) and charged to ctx.chip. Returns the full
// output (this chip's Shard(0) rows with sp). KEEP (with CTX): gate, up, act and m (the input as the GEMMs read it).
Tensor mlp_layer(Chip& chip, PlanContext* ctx, const Tensor& in, const BlockWeights& w, kernels::Activation activation,
                 BlockActivations* keep = nullptr);
const char* glu_label(kernels::Activation activation);  // "swiglu" | "geglu"

// Attention of Q [B·T, nq, d] against K, V [B·T, nkv, d] (GQA), BATCH whole sequences of T tokens, one flash
// kernel per sequence (causal per S.causal), charged to CHIP as attention. Returns O [B·T, nq, d] in the compute
// dtype; LSE receives each sequence's fp32 [nq, T] log-sum-exp. With S.attention_impl unfused: Megatron's core
// (kernels/attention_unfused.h) per sequence, LSE left empty; PROBS (optional) receives each sequence's softmax
// output [nq, T, T].
Tensor local_attention(Chip& chip, const ModelSpec& s, const Tensor& q, const Tensor& k, const Tensor& v,
                       int64_t batch, int64_t T, std::vector<Tensor>& lse, std::vector<Tensor>* probs = nullptr);
// The flash core's backward (kernels/attention_backward.h) for BATCH sequences of T tokens, one kernel per
// sequence from the saved O and LSE (local_attention's), charged to CHIP; DQ [B·T, nq, d], DK, DV [B·T, nkv, d]
// are written. Ulysses runs it on its head-sharded whole sequences (ulysses.h).
void local_attention_backward(Chip& chip, const ModelSpec& s, const Tensor& q, const Tensor& k, const Tensor& v,
                              const Tensor& o, const std::vector<Tensor>& lse, const Tensor& dout, Tensor& dq,
                              Tensor& dk, Tensor& dv, int64_t batch, int64_t T);
// The unfused core's backward for BATCH sequences of T tokens (kernels/attention_unfused.h), charged through
// CHARGE: from PROBS per sequence, or, when PROBS is empty (selective recomputation), from a softmax output
// recomputed first (the core's forward again, charged). DQ, DK, DV [B·T, heads, d] are written.
void unfused_attention_backward(const ModelSpec& s, const Tensor& q, const Tensor& k, const Tensor& v,
                                const std::vector<Tensor>& probs, const Tensor& dout, Tensor& dq, Tensor& dk,
                                Tensor& dv, int64_t batch, int64_t T,
                                const std::function<void(const kernels::KernelCost&)>& charge);
// The block's charged bias and dropout work (kernels/bias_dropout.h) for S on a chip with ROWS GEMM rows,
// RESIDUAL_ROWS residual rows and its local q/k/v and MLP columns.
kernels::BlockExtras block_extras(const ModelSpec& s, int64_t rows, int64_t residual_rows, int64_t qkv_cols,
                                  int64_t ffn_cols);

// The plan registry's descriptors of the units in this file (sharding/plans/registry.h; listed once by
// make_registry() in registry.cpp).
struct PlanDescriptor;
PlanDescriptor recompute_plan_descriptor();

}  // namespace shardsim::sharding::plans

// Plan unit: Megatron-LM tensor parallelism (Shoeybi et al. 2019) on the mesh's tp axis, with sequence
// parallelism (sequence_parallel.h) and fused collectives (sharding/fused.h) as its variants.
//   column_parallel  weights Shard(1) over tp: Y_i = X · W_i for the chip's columns; X is Replicate over tp (with
//                    sp first all_gathered from its Shard(0) shard; fused: one all_gather_gemm feeds every W_i)
//   row_parallel     weight Shard(0) over tp: the output X · W is Partial(sum) over tp, then all_reduced (or
//                    reduce_scattered with sp; fused: gemm_all_reduce / gemm_reduce_scatter)
// With tp = 1 the weights are Replicate and no collective runs. GEMM labels in the trace follow the placements
// (" (column-parallel)", " (row-parallel)", " (replicated)": placement.h's parallel_style).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "sharding/placement.h"
#include "sharding/plans/block_ops.h"

namespace shardsim::sharding::plans {

// The placements of the column- and row-parallel weights on tp (Replicate when tp = 1).
Placement column_weight_placement(const ParallelPlan& p);
Placement row_weight_placement(const ParallelPlan& p);

// IN: this chip's rows of the input (its sp shard with sp). Returns X · W_i for each weight, [n_attn or rows of IN,
// cols of W_i]. NAMES: the GEMMs' names ("gemm.q", ...); GATHER_WHAT: the sp all_gather's label ("before QKV");
// FUSED_OP / FUSED_NAME: the fused all_gather_gemm's op label and its report name. USED (optional) receives the
// input as the GEMMs read it (gathered with sp; IN itself when fused or without sp): what their backward reads.
std::vector<Tensor> column_parallel(PlanContext& ctx, const Tensor& in, const std::vector<const Tensor*>& weights,
                                    const std::vector<std::string>& names, const std::string& gather_what,
                                    const std::string& fused_op, const std::string& fused_name,
                                    Tensor* used = nullptr);

// IN · W and its reduction over tp, "GNAME + tp all_reduce (WHAT)" etc. Returns the full (Replicate) output, or
// with sp this chip's Shard(0) rows.
Tensor row_parallel(PlanContext& ctx, const Tensor& in, const Tensor& w, const std::string& gname,
                    const std::string& what);

// The tp reduction of a Partial(sum) [n_attn, hidden] (a row-parallel output, or a column-parallel layer's input
// gradient): all_reduce (Replicate), or with sp reduce_scatter to this chip's rows. Identity with tp = 1.
Tensor tp_reduce(PlanContext& ctx, Tensor partial, const std::string& what);
// The residual stream's rows to the Replicate [n_attn, hidden] a column-parallel GEMM reads: identity, or with sp
// all_gather (a row-parallel layer's output gradient in backward).
Tensor tp_gather(PlanContext& ctx, const Tensor& rows, const std::string& what);

// ---- Backward (training; models/lm_tp.h) ----
// Of row_parallel (Y = X·W, W Shard(0)): DY the output's gradient on the residual stream (this chip's rows with sp),
// X the GEMM's input, W. DX = dY·W^T and DW = X^T·dY are local once dY is whole: tp_gather (sp: all_gather), or
// fused with the dX GEMM's row chunks (all_gather_gemm_backward, sharding/fused.h).
// DEFER (the zero-bubble split, below): the dW GEMMs are not run but appended to DEFER with their operands.
struct WeightGradGemm;
using WeightGradGemms = std::vector<WeightGradGemm>;
void row_parallel_backward(PlanContext& ctx, const Tensor& x, const Tensor& w, const Tensor& dy, Tensor& dx, Tensor& dw,
                           const std::string& what, WeightGradGemms* defer = nullptr);
// Of column_parallel (Y_i = X·W_i, W_i Shard(1)): IN the input as the forward's GEMMs read it (column_parallel's
// USED), DYS the outputs' gradients, DWS receive X^T·dY_i. The input gradient sum_i dY_i·W_i^T is Partial(sum)
// over tp: returned reduced to the residual stream (tp_reduce), or fused (gemm_reduce_scatter_backward, which
// re-gathers IN, this chip's rows, for the dW GEMMs).
Tensor column_parallel_backward(PlanContext& ctx, const Tensor& in, const std::vector<const Tensor*>& weights,
                                const std::vector<const Tensor*>& dys, const std::vector<Tensor*>& dws,
                                const std::string& what, WeightGradGemms* defer = nullptr);

// The zero-bubble split of a linear layer's backward (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024,
// arXiv:2401.10241 §2): B computes dX = dY·W^T, what the previous stage waits for; the weight gradient
// dW = X^T·dY is deferred to the W pass, which needs only X (the GEMM's input as the forward read it, gathered with
// sp) and dY (whole over tp), kept until then. Not with fused collectives (their dW GEMM is part of the fused op).
struct WeightGradGemm {
  std::shared_ptr<const Tensor> x;  // the input, kept once for the GEMMs that share it (q/k/v, gate/up)
  Tensor dy;                        // the output gradient, kept
  Tensor* dw;                       // receives X^T·dY
};
// Runs GEMMS in order on CHIP (each a gemm_backward with dW only).
void run_weight_grads(Chip& chip, const WeightGradGemms& gemms);

// Tensor parallelism above the KV heads (tp a multiple of kv_heads; NxD's GQA QKV linear with a KV size
// multiplier): tp chip t holds the one KV head t / R of its query heads' GQA group, R = tp / kv_heads, so Wk and Wv
// are replicated over the R consecutive tp chips of a KV group, which each compute the head's K and V. In backward
// each chip's dK and dV hold its own query heads' share only; the column-parallel input gradient needs nothing more
// (the tp reduction sums every chip's dK·Wk^T), but the replicas' weight gradients X^T·dK are partial sums over the
// group. kv_replica_group is that group (a split of the tp sub-group: color t / R, key t % R; collective over TP,
// made once per transport); kv_replica_grads_reduce all_reduces GRADS (the layer's dWk and dWv, packed into one
// buffer) over it, "all_reduce.kv_grads" with ALGORITHM from READY, and returns the end; each replica then holds
// the head's whole gradient, so replicas stay equal. (NxD all_reduces the activations' dK and dV over the same
// group inside the linear's backward and scales dX's K/V part by 1 / R; the sums are the same, the bytes are
// hidden x 2·head_dim per layer and step here against tokens x 2·head_dim per layer and micro-batch there.)
runtime::Transport& kv_replica_group(runtime::Transport& tp, int replicas);
sim::TimeNs kv_replica_grads_reduce(runtime::Transport& group, const std::vector<Tensor*>& grads,
                                    const std::string& algorithm, sim::TimeNs ready);

// The vocab-parallel embedding (Megatron-LM's VocabParallelEmbedding; kernels/embedding.h): TABLE is this chip's
// shard [V/tp, hidden] of the VOCAB-row table, rows [V0, V0 + V/tp). Forward: the rows of TOKENS' ids into OUT
// [tokens, hidden] (ids outside the shard give zero rows), then summed over tp (tp_reduce: all_reduce, or with sp
// reduce_scatter to this chip's rows, the residual stream's); returns them. Identity reduction at tp 1.
Tensor vocab_parallel_embedding(PlanContext& ctx, const Tensor& table, const std::vector<int64_t>& tokens, int64_t v0,
                                int64_t vocab, Tensor out);
// Its backward: DX the looked-up rows' gradient [tokens, hidden] (whole over tp) scattered into DTABLE, this shard's
// rows (kernels::embedding_backward: DTABLE is overwritten); local, no collective (each chip owns its rows).
void vocab_parallel_embedding_backward(Chip& chip, const Tensor& dx, const std::vector<int64_t>& tokens, int64_t v0,
                                       int64_t vocab, Tensor& dtable);

// Vocab-parallel cross-entropy (Megatron-LM; the trainer's, models/lm_tp.h): LOGITS [N, V/T] are this rank's
// vocabulary slice [V0, V0 + V/T) of V (column-parallel head), TARGETS N token ids. The row maxima are
// all_reduce(max)ed over TP ("all_reduce.ce_max"), then the sums of exponentials and the target logits in one
// [2N] all_reduce(sum) ("all_reduce.ce_stats"), so no rank holds the full logits; with one tp rank no collective
// runs. Kernels and collectives are charged to TL from T (T = the end). Fills ROW_MAX and SUMEXP (fp32 [N], what
// kernels::ce_backward reads: the backward is local) and returns the mean loss (per-token fp32 losses summed in
// fp64), NaN when the logits are shape-only.
double vocab_parallel_cross_entropy(runtime::Transport& tp, sim::Timeline& tl, const std::string& algorithm,
                                    const Tensor& logits, const std::vector<int64_t>& targets, int64_t v0, int64_t V,
                                    Tensor& row_max, Tensor& sumexp, sim::TimeNs& t);

// The plan registry's descriptors of the units in this file (sharding/plans/registry.h; listed once by
// make_registry() in registry.cpp).
struct PlanDescriptor;
PlanDescriptor tp_plan_descriptor();
PlanDescriptor fused_plan_descriptor();

}  // namespace shardsim::sharding::plans

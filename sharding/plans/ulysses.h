// Plan unit: DeepSpeed-Ulysses (Jacobs et al., 2023) on the mesh's cp axis. Activations outside attention are
// Shard(0) over the sequence (n = seq/u rows per chip); an all_to_all turns q, k, v [n, heads, d] into
// [seq, heads/u, d] (Shard over heads), attention runs on whole sequences of the chip's heads, and a fourth
// all_to_all brings o back to [n, heads·d]. Its GEMM weights are not sharded by this unit (Replicate over cp);
// with tp the heads are first split by the tp unit (tensor_parallel.h), then by ulysses within each tp shard.
// Bytes per chip: (u-1)/u of each local q, k, v, o (direct all_to_all).
#pragma once

#include "sharding/plans/block.h"
#include "sharding/plans/block_ops.h"

namespace shardsim::sharding::plans {

// ---- The layout changes of Ulysses, forward (every mode: sharding/plans/block.h) and backward (training) ----
// GROUP: the chip's cp sub-group (U = its size). X [B·Tl, H, d]: this chip's contiguous chunk (Tl tokens) of each of
// its B sequences, all heads. seq_to_heads returns [B·Tl·U, hu, d]: every token of each sequence (sequence-major),
// this chip's heads: hu = H/U (heads [j·H/U, ...) on chip j), or 1 when H < U (kv heads replicated: chip j takes
// head j·H/U, its GQA group's). One all_to_all of ALGORITHM (ParallelPlan::algorithm_for) named "ulysses all_to_all
// (NAME)", issued at T, T = its end; COMM (optional) counts it as "ulysses all_to_all" (formula (U-1)/U of X's
// bytes). STORE false: shape-only (headers only).
Tensor ulysses_seq_to_heads(runtime::Transport& group, const Tensor& x, int64_t batch, int64_t seq_local, bool store,
                            sim::TimeNs& t, const std::string& name, const std::string& algorithm,
                            Comm* comm = nullptr);
// The inverse: Y [B·Tl·U, hu, d] back to [B·Tl, H, d]. With H < U (replicated heads) the U/H chips' blocks of each
// head are summed in chip order (the partial dK / dV of a replicated kv head).
Tensor ulysses_heads_to_seq(runtime::Transport& group, const Tensor& y, int64_t H, int64_t batch, int64_t seq_local,
                            bool store, sim::TimeNs& t, const std::string& name, const std::string& algorithm,
                            Comm* comm = nullptr);

// ---- Ulysses' attention (the block program's attention on the cp axis when ParallelPlan::ulysses > 1) ----
// Forward: Q [N, nq, d], K, V [N, nkv, d] in LAYOUT's token layout (N = batch·seq_local) to heads, the local core
// (local_attention: flash, or the unfused core keeping nothing for the backward) on whole sequences of ctx.s.seq
// tokens, O back to tokens: returns O [N, nq, d]. The four all_to_alls run ParallelPlan::algorithm_for(
// ulysses_all_to_all) on ctx.cp from ctx.chip.t and are counted in ctx.comm. LSE: per sequence fp32 [hu, seq].
// O_HEADS (training): receives O in the head layout and Q, K, V are replaced by their head-sharded forms, what
// the backward reads.
Tensor ulysses_attention_forward(PlanContext& ctx, const TokenLayout& layout, Tensor& q, Tensor& k, Tensor& v,
                                 std::vector<Tensor>& lse, Tensor* o_heads);
// Backward from the head-sharded Q, K, V, O_HEADS and LSE the forward kept and DOUT [N, nq, d] (token layout):
// dO to heads, the flash backward per whole sequence (local_attention_backward), dQ, dK, dV back to tokens
// (replicated kv heads: the Ulysses ranks' partial dK / dV summed). DQ [N, nq, d], DK, DV [N, nkv, d] are
// replaced; their head counts are read from them. Four all_to_alls as in the forward (not counted in ctx.comm).
void ulysses_attention_backward(PlanContext& ctx, const TokenLayout& layout, const Tensor& q, const Tensor& k,
                                const Tensor& v, const Tensor& o_heads, const std::vector<Tensor>& lse,
                                const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv);

// The plan registry's descriptors of the units in this file (sharding/plans/registry.h; listed once by
// make_registry() in registry.cpp).
struct PlanDescriptor;
PlanDescriptor ulysses_plan_descriptor();

}  // namespace shardsim::sharding::plans

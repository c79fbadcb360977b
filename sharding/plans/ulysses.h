// Plan unit: DeepSpeed-Ulysses (Jacobs et al., 2023) on the mesh's cp axis. Activations outside attention are
// Shard(0) over the sequence (n = seq/u rows per chip); an all_to_all turns q, k, v [n, heads, d] into
// [seq, heads/u, d] (Shard over heads), attention runs on whole sequences of the chip's heads, and a fourth
// all_to_all brings o back to [n, heads·d]. Its GEMM weights are not sharded by this unit (Replicate over cp);
// with tp the heads are first split by the tp unit (tensor_parallel.h), then by ulysses within each tp shard.
// Bytes per chip: (u-1)/u of each local q, k, v, o (direct all_to_all).
#pragma once

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

}  // namespace shardsim::sharding::plans

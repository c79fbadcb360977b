// Plan unit: DeepSpeed-Ulysses (Jacobs et al., 2023) on the mesh's cp axis. Activations outside attention are
// Shard(0) over the sequence (n = seq/u rows per chip); an all_to_all turns q, k, v [n, heads, d] into
// [seq, heads/u, d] (Shard over heads), attention runs on whole sequences of the chip's heads, and a fourth
// all_to_all brings o back to [n, heads·d]. Its GEMM weights are not sharded by this unit (Replicate over cp);
// with tp the heads are first split by the tp unit (tensor_parallel.h), then by ulysses within each tp shard.
// Bytes per chip: (u-1)/u of each local q, k, v, o (direct all_to_all).
#pragma once

#include "sharding/plans/block_ops.h"

namespace shardsim::sharding::plans {

// Q [n, nq, d], K and V [n, nkv, d]: this chip's rows and its tp shard's heads. Returns o [n, nq·d].
Tensor ulysses_attention(PlanContext& ctx, const Tensor& q, const Tensor& k, const Tensor& v);

}  // namespace shardsim::sharding::plans

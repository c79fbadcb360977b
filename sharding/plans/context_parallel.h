// Plan unit: context parallelism by ring attention (Liu et al., "Ring Attention with Blockwise Transformers",
// 2023) on the mesh's cp axis. The sequence is Shard(0) over cp: chip c holds the token chunks cp_chunks gives
//   zigzag      chunks c and 2cp-1-c of 2cp (Megatron-LM's causal load balance)
//   contiguous  chunk c of cp
// and its K/V block travels around the cp ring (cp-1 sendrecv steps of K and V: 2(cp-1)/cp·seq·Hkv·d·elem bytes
// per chip) while each chip attends its queries to the block it holds; partials merge by log-sum-exp. The send
// of the next block is posted before the compute on the current one, so they overlap in simulated time.
#pragma once

#include <string>
#include <vector>

#include "sharding/plans/block_ops.h"

namespace shardsim::sharding::plans {

// The token chunks (global positions) of cp rank C of CP over a sequence of T tokens; {0, 0, T} for CP = 1.
std::vector<Chunk> cp_chunks(int64_t T, int cp, int c, bool zigzag);

// Attention of this chip's Q [n_attn, nq, d] (rows in CHUNKS) against every chip's K/V [n_attn, nkv, d] around the
// cp ring (cp rank C_IDX), or locally when cp = 1. RING_BUFFERS: the simulated HBM of the two receive buffers,
// held in MEMORY for the ring's duration. Returns o [n_attn, nq·d].
Tensor ring_attention(PlanContext& ctx, const Tensor& q, const Tensor& k, const Tensor& v,
                      const std::vector<Chunk>& chunks, int c_idx, sim::Memory& memory, uint64_t ring_buffers);

}  // namespace shardsim::sharding::plans

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

// ---- Ring attention forward AND backward for training (the trainer's, models/lm_tp.h) ----
// A chip's shard of a batch of sequences: BATCH local sequences, of each SEQ tokens (its cp chunks, concatenated:
// local row b·SEQ + chunk.local + i is global position chunk.global + i), HEADS / KV_HEADS of HEAD_DIM in DTYPE
// (the compute dtype; per-token statistics fp32).
struct SeqShard {
  int64_t batch = 1, seq = 1, heads = 1, kv_heads = 1, head_dim = 1;
  runtime::DType dtype = runtime::DType::fp32;
};
// The cp ring of one chip: its cp sub-group (rank = cp coordinate), the split, the global sequence length, the
// chip's timeline (kernels and ring regions are charged there) and STORE (false: shape-only, headers only).
struct CpRing {
  runtime::Transport& group;
  bool zigzag = true;
  int64_t global_seq = 1;
  sim::Timeline& tl;
  bool store = true;
};
// Forward: Q [B·seq, Hq, d], K and V [B·seq, Hkv, d] (this chip's tokens). The chip's K/V block travels the cp
// ring in cp-1 sendrecv steps, each posted before the compute on the block in hand; every visible (query chunk,
// key chunk) pair is attended with its global offsets into fp32 partials merged by log-sum-exp (one attention
// and one merge launch per ring step and sequence). Returns O [B·seq, Hq, d] (rounded once to the compute dtype)
// and LSE, per (sequence, chunk) the merged fp32 [Hq, len]: what the backward reads. T: the chip's clock.
Tensor ring_attention_forward(CpRing& ring, const SeqShard& s, const Tensor& q, const Tensor& k, const Tensor& v,
                              std::vector<Tensor>& lse, sim::TimeNs& t);
// Backward from the saved Q, K, V, O, LSE and the output gradient DOUT (kernels/attention_backward.h with the final
// lse, exact for any split): the K/V blocks go round the ring again, and with each its fp32 dK/dV accumulators, to
// which every chip adds its queries' contributions; after cp steps (the last a dK/dV-only send) they are back at
// their owner. dQ stays local. Traffic per chip: cp-1 K/V blocks + cp fp32 dK/dV blocks.
void ring_attention_backward(CpRing& ring, const SeqShard& s, const Tensor& q, const Tensor& k, const Tensor& v,
                             const Tensor& o, const std::vector<Tensor>& lse, const Tensor& dout, Tensor& dq,
                             Tensor& dk, Tensor& dv, sim::TimeNs& t);

}  // namespace shardsim::sharding::plans

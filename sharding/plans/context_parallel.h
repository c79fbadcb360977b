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

// ---- Ring attention, forward (every mode: sharding/plans/block.h) and backward (training, models/lm_tp.h) ----
// A chip's shard of a batch of sequences: BATCH local sequences, of each SEQ tokens (its cp chunks, concatenated:
// local row b·SEQ + chunk.local + i is global position chunk.global + i), HEADS / KV_HEADS of HEAD_DIM in DTYPE
// (the compute dtype; per-token statistics fp32).
struct SeqShard {
  int64_t batch = 1, seq = 1, heads = 1, kv_heads = 1, head_dim = 1;
  runtime::DType dtype = runtime::DType::fp32;
};
// The cp ring of one chip: its cp sub-group (rank = cp coordinate), the split, the global sequence length, STORE
// (false: shape-only, headers only) and COMM (optional): the forward's K/V steps are counted there as "cp ring
// K/V" (bytes sent; formula 2·(K/V block bytes) per step).
struct CpRing {
  runtime::Transport& group;
  bool zigzag = true;
  int64_t global_seq = 1;
  bool store = true;
  Comm* comm = nullptr;
};
// Forward: Q [B·seq, Hq, d], K and V [B·seq, Hkv, d] (this chip's tokens). The chip's K/V block travels the cp
// ring in cp-1 sendrecv steps, each posted before the compute on the block in hand; every visible (query chunk,
// key chunk) pair is attended with its global offsets into fp32 partials merged by log-sum-exp. Charged to CHIP as
// attention: one fused masked kernel per ring step and sequence (the visible pairs' FLOPs, the bytes of one call
// over the chip's rows scaled by the visible fraction, one merge per query chunk). Returns O [B·seq, Hq, d] (rounded
// once to the compute dtype) and LSE, per (sequence, chunk) the merged fp32 [Hq, len]: what the backward reads.
Tensor ring_attention_forward(CpRing& ring, const SeqShard& s, const Tensor& q, const Tensor& k, const Tensor& v,
                              std::vector<Tensor>& lse, Chip& chip);
// Backward from the saved Q, K, V, O, LSE and the output gradient DOUT (kernels/attention_backward.h with the final
// lse, exact for any split): the K/V blocks go round the ring again, and with each its fp32 dK/dV accumulators, to
// which every chip adds its queries' contributions; after cp steps (the last a dK/dV-only send) they are back at
// their owner. dQ stays local. Traffic per chip: cp-1 K/V blocks + cp fp32 dK/dV blocks.
void ring_attention_backward(CpRing& ring, const SeqShard& s, const Tensor& q, const Tensor& k, const Tensor& v,
                             const Tensor& o, const std::vector<Tensor>& lse, const Tensor& dout, Tensor& dq,
                             Tensor& dk, Tensor& dv, Chip& chip);

// The plan registry's descriptors of the units in this file (sharding/plans/registry.h; listed once by
// make_registry() in registry.cpp).
struct PlanDescriptor;
PlanDescriptor cp_plan_descriptor();

}  // namespace shardsim::sharding::plans

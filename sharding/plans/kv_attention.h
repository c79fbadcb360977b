// The block program's attention in serving mode: each sequence of an iteration's batch brings new tokens whose keys
// and values are appended to its KV cache, and its queries attend over everything the cache holds
// (kernels/decode_attention.h). Prefill (the prompt, or a chunk of it) and decode (one token) are the same step
// with different row counts, so one iteration may mix them (continuous batching, chunked prefill).
//
// Under tp every chip holds its kv heads' cache (the column-parallel Wk, Wv give it whole kv heads, the GQA
// groups stay local); under pp each stage holds its layers'; dp replicas hold their own sequences'. Context
// parallelism and Ulysses are not serving plans here (refused by the executor).
//
// Batch layout: the iteration's rows are the sequences' new tokens concatenated, sequence-major; KvSeq gives each
// sequence's cache slot, the tokens it already holds (PAST) and its new rows. The caller's TokenLayout.pos holds
// every row's global position (past + i), which RoPE reads.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "runtime/tensor.h"
#include "sharding/plans/block_ops.h"

namespace shardsim::sharding::plans {

struct KvSeq {
  int64_t slot = 0;  // the sequence's cache slot (any id; KvCache allocates per slot)
  int64_t past = 0;  // tokens already in the cache
  int64_t rows = 1;  // new tokens this iteration
};

// The cached keys and values of one chip's layers, per sequence slot: K and V [capacity, kv heads, head_dim] per
// layer in the compute dtype, allocated when a slot is first written. STORE false (shape-only runs): nothing is
// held, every call checks bounds only. The paged accounting of a serving run (serving/kv_cache.h) is separate:
// this is the data the real-data runs attend over.
// Errors: std::out_of_range when a write goes past CAPACITY tokens.
class KvCache {
 public:
  KvCache(int64_t layers, int64_t kv_heads, int64_t head_dim, runtime::DType dtype, int64_t capacity, bool store);
  // Rows [0, n) of K and V (each [n, kv heads, d]) at positions [pos, pos + n) of SLOT's LAYER.
  void append(int64_t layer, int64_t slot, int64_t pos, const Tensor& k, const Tensor& v);
  // The first LEN positions of SLOT's LAYER (copies; shape-only without storage).
  Tensor keys(int64_t layer, int64_t slot, int64_t len) const;
  Tensor values(int64_t layer, int64_t slot, int64_t len) const;
  void release(int64_t slot) { slots_.erase(slot); }
  int64_t capacity() const { return capacity_; }
  bool stores() const { return store_; }

 private:
  struct Layer {
    Tensor k, v;
  };
  const std::vector<Layer>& slot(int64_t s) const;
  int64_t layers_, kv_heads_, head_dim_;
  runtime::DType dtype_;
  int64_t capacity_;
  bool store_;
  mutable std::map<int64_t, std::vector<Layer>> slots_;
};

// What the block program's attention reads in serving mode (PlanContext::kv): the cache, the local layer index
// the block runs, the batch's sequences.
struct KvAttention {
  KvCache* cache = nullptr;
  int64_t layer = 0;
  const std::vector<KvSeq>* seqs = nullptr;
};

// Q [N, nq, d], K, V [N, nkv, d] of the batch's new rows (after RoPE): K, V appended to the cache, O [N, nq, d]
// (compute dtype) of every sequence over its cache; charged to ctx.chip as two kernels, the decode rows'
// (attention.decode) and the prefill rows' (attention.prefill). std::invalid_argument when the rows of ctx.kv's
// sequences do not add up to N.
Tensor kv_attention(PlanContext& ctx, const Tensor& q, const Tensor& k, const Tensor& v);

}  // namespace shardsim::sharding::plans

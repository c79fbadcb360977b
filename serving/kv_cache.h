// The paged KV cache of a serving run (PagedAttention, Kwon et al. 2023, arXiv 2309.06180; vLLM's block manager):
// the cache is cut into blocks of BLOCK_SIZE tokens; a sequence holds ceil(tokens / block_size) blocks, allocated as
// it grows and freed when it finishes or is preempted. Accounting only: the real-data runs' keys and values live in
// sharding/plans/kv_attention.h's KvCache.
//
// Capacity (per chip; every chip of a tp x pp replica holds the same share, so the replica's capacity is one chip's):
//   bytes_per_token = 2 · layers_on_chip · kv_heads_on_chip · head_dim · dtype bytes           (K and V)
//   free            = memory_fraction · HBM − weights_on_chip − activations_on_chip
//   blocks          = floor(free / (block_size · bytes_per_token)),   tokens = blocks · block_size
// as vLLM's gpu_memory_utilization (default 0.9) of HBM after the weights and the profiled activation peak.
// std::invalid_argument (the caller maps it to exit 2 naming the key) when no block fits.
// Shards (expert-parallel serving, models/lm_tp.h LmServeBatch): a replica's ep chips each hold the cache of their
// own sequences, so its pool is SHARDS separate pools of blocks / shards blocks; sequence s takes its blocks from
// pool s mod shards (the chip that attends it) and must fit one.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace shardsim::serving {

struct KvCapacity {
  double hbm = 0, fraction = 0.9, weights = 0, activations = 0;  // bytes per chip
  double bytes_per_token = 0;
  int64_t block_size = 16;
  int64_t blocks = 0;  // every shard's
  int shards = 1;
  int64_t shard_blocks() const { return blocks / shards; }
  int64_t tokens() const { return blocks * block_size; }
  double free_bytes() const { return fraction * hbm - weights - activations; }
  std::string formula() const;  // the numbers in the formula above, one line
};

KvCapacity kv_capacity(double hbm, double fraction, double weights, double activations, double bytes_per_token,
                       int64_t block_size);

// Blocks per sequence id (from its shard's pool).
class PagedKvCache {
 public:
  explicit PagedKvCache(const KvCapacity& cap);
  int64_t blocks_for(int64_t tokens) const { return (tokens + cap_.block_size - 1) / cap_.block_size; }
  // Blocks SEQ needs beyond what it holds to hold TOKENS.
  int64_t extra(int64_t seq, int64_t tokens) const;
  bool can_grow(int64_t seq, int64_t tokens) const { return extra(seq, tokens) <= free_[shard(seq)]; }
  void grow(int64_t seq, int64_t tokens);  // std::logic_error when the blocks are not free
  void release(int64_t seq);
  int64_t used_blocks() const;
  int64_t free_blocks() const { return cap_.blocks - used_blocks(); }
  double utilisation() const { return cap_.blocks > 0 ? double(used_blocks()) / double(cap_.blocks) : 0; }
  const KvCapacity& capacity() const { return cap_; }

 private:
  size_t shard(int64_t seq) const { return size_t(((seq % cap_.shards) + cap_.shards) % cap_.shards); }
  KvCapacity cap_;
  std::vector<int64_t> free_;  // per shard
  std::map<int64_t, int64_t> held_;
};

}  // namespace shardsim::serving

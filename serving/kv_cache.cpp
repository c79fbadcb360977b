#include "serving/kv_cache.h"

#include <cmath>
#include <cstdio>
#include <stdexcept>

namespace shardsim::serving {

std::string KvCapacity::formula() const {
  char b[512];
  std::snprintf(b, sizeof b,
                "floor((%.2f x %.3f GiB HBM - %.3f GiB weights - %.3f GiB activations) / (%lld tokens x %.0f B per "
                "token)) = %lld blocks = %lld tokens",
                fraction, hbm / 1073741824.0, weights / 1073741824.0, activations / 1073741824.0,
                (long long)block_size, bytes_per_token, (long long)blocks, (long long)tokens());
  return b;
}

KvCapacity kv_capacity(double hbm, double fraction, double weights, double activations, double bytes_per_token,
                       int64_t block_size) {
  KvCapacity c;
  c.hbm = hbm;
  c.fraction = fraction;
  c.weights = weights;
  c.activations = activations;
  c.bytes_per_token = bytes_per_token;
  c.block_size = block_size;
  const double per_block = double(block_size) * bytes_per_token;
  const double blocks = std::floor(c.free_bytes() / per_block);
  c.blocks = blocks > 0 ? int64_t(std::min(blocks, 1e15)) : 0;
  if (c.blocks < 1) throw std::invalid_argument("no KV cache block fits: " + c.formula());
  return c;
}

PagedKvCache::PagedKvCache(const KvCapacity& cap) : cap_(cap) {
  if (cap_.shards < 1) throw std::invalid_argument("paged kv cache: shards must be >= 1");
  cap_.blocks = cap_.shard_blocks() * cap_.shards;  // whole pools only
  free_.assign(size_t(cap_.shards), cap_.shard_blocks());
}

int64_t PagedKvCache::used_blocks() const {
  int64_t used = cap_.blocks;
  for (const int64_t f : free_) used -= f;
  return used;
}

int64_t PagedKvCache::extra(int64_t seq, int64_t tokens) const {
  auto it = held_.find(seq);
  const int64_t have = it == held_.end() ? 0 : it->second;
  return std::max<int64_t>(0, blocks_for(tokens) - have);
}

void PagedKvCache::grow(int64_t seq, int64_t tokens) {
  const int64_t e = extra(seq, tokens);
  if (e > free_[shard(seq)]) throw std::logic_error("paged kv cache: growing past the free blocks");
  free_[shard(seq)] -= e;
  held_[seq] += e;
}

void PagedKvCache::release(int64_t seq) {
  auto it = held_.find(seq);
  if (it == held_.end()) return;
  free_[shard(seq)] += it->second;
  held_.erase(it);
}

}  // namespace shardsim::serving

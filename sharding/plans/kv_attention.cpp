#include "sharding/plans/kv_attention.h"

#include <stdexcept>
#include <string>

#include "kernels/decode_attention.h"

namespace shardsim::sharding::plans {

KvCache::KvCache(int64_t layers, int64_t kv_heads, int64_t head_dim, runtime::DType dtype, int64_t capacity, bool store)
    : layers_(layers), kv_heads_(kv_heads), head_dim_(head_dim), dtype_(dtype), capacity_(capacity), store_(store) {}

const std::vector<KvCache::Layer>& KvCache::slot(int64_t s) const {
  auto it = slots_.find(s);
  if (it != slots_.end()) return it->second;
  std::vector<Layer> ls(static_cast<size_t>(layers_));
  for (auto& l : ls) {
    l.k = Tensor::make(dtype_, {capacity_, kv_heads_, head_dim_}, true);
    l.v = Tensor::make(dtype_, {capacity_, kv_heads_, head_dim_}, true);
  }
  return slots_.emplace(s, std::move(ls)).first->second;
}

void KvCache::append(int64_t layer, int64_t s, int64_t pos, const Tensor& k, const Tensor& v) {
  if (pos < 0 || pos + k.dim(0) > capacity_)
    throw std::out_of_range("kv cache: positions [" + std::to_string(pos) + ", " + std::to_string(pos + k.dim(0)) +
                            ") of sequence slot " + std::to_string(s) + " exceed its capacity of " +
                            std::to_string(capacity_) + " tokens");
  if (!store_ || !k.has_storage()) return;
  auto& l = const_cast<Layer&>(slot(s)[static_cast<size_t>(layer)]);
  l.k.set_rows(pos, k);
  l.v.set_rows(pos, v);
}

Tensor KvCache::keys(int64_t layer, int64_t s, int64_t len) const {
  if (!store_) return Tensor::make(dtype_, {len, kv_heads_, head_dim_}, false);
  return slot(s)[static_cast<size_t>(layer)].k.rows(0, len);
}

Tensor KvCache::values(int64_t layer, int64_t s, int64_t len) const {
  if (!store_) return Tensor::make(dtype_, {len, kv_heads_, head_dim_}, false);
  return slot(s)[static_cast<size_t>(layer)].v.rows(0, len);
}

Tensor kv_attention(PlanContext& ctx, const Tensor& q, const Tensor& k, const Tensor& v) {
  const KvAttention& kv = *ctx.kv;
  const int64_t n = q.dim(0), nq = q.dim(1), nkv = k.dim(1), d = q.dim(2);
  int64_t total = 0;
  for (const KvSeq& s : *kv.seqs) total += s.rows;
  if (total != n)
    throw std::invalid_argument("kv_attention: the batch's sequences hold " + std::to_string(total) +
                                " new rows, the block has " + std::to_string(n));
  const bool store = q.has_storage() && kv.cache->stores();
  Tensor o = Tensor::make(ctx.s.dtype, {n, nq, d}, store);
  std::vector<kernels::KernelCost> decode, prefill;
  int64_t r0 = 0;
  for (const KvSeq& s : *kv.seqs) {
    const Tensor kb = k.rows(r0, s.rows), vb = v.rows(r0, s.rows);
    kv.cache->append(kv.layer, s.slot, s.past, kb, vb);
    const int64_t len = s.past + s.rows;
    Tensor ob = Tensor::make(ctx.s.dtype, {s.rows, nq, d}, store);
    const Tensor keys = kv.cache->keys(kv.layer, s.slot, len), values = kv.cache->values(kv.layer, s.slot, len);
    const auto cost = kernels::cached_attention(q.rows(r0, s.rows), keys, values, ob, s.past);
    (s.rows == 1 ? decode : prefill).push_back(cost);
    if (store) o.set_rows(r0, ob);
    r0 += s.rows;
  }
  if (!prefill.empty()) {
    const auto c = kernels::cached_attention_batch(prefill, "attention.prefill");
    ctx.chip.charge(c, c.name, true);
  }
  if (!decode.empty()) {
    const auto c = kernels::cached_attention_batch(decode, "attention.decode");
    ctx.chip.charge(c, c.name, true);
  }
  return o;
}

}  // namespace shardsim::sharding::plans

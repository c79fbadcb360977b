#include "sharding/plans/block_ops.h"

#include <algorithm>
#include <limits>

#include "kernels/gemm.h"
#include "kernels/norm.h"

namespace shardsim::sharding::plans {

Tensor gemm(Chip& chip, const Tensor& a, const Tensor& b, const std::string& name) {
  Tensor c = Tensor::make(a.dtype(), {a.dim(0), b.dim(1)}, a.has_storage() && b.has_storage());
  chip.charge(kernels::gemm(a, b, c), name);
  return c;
}

Tensor rmsnorm(Chip& chip, const Tensor& x, const Tensor& w, const std::string& name) {
  Tensor y = Tensor::make(x.dtype(), x.shape(), x.has_storage() && w.has_storage());
  chip.charge(kernels::rmsnorm(x, w, y), name);
  return y;
}

std::vector<int64_t> positions_of(const std::vector<Chunk>& chunks) {
  std::vector<int64_t> p;
  for (const auto& c : chunks)
    for (int64_t i = 0; i < c.len; ++i) p.push_back(c.global + i);
  return p;
}

// Local attention of Q (rows in Q_CHUNKS) against K/V (rows in K_CHUNKS), merged into ACC/LSE (fp32). On the
// host it runs one kernel call per (q chunk, kv chunk) pair that is not fully masked. The simulated chip runs it
// as ONE fused kernel with a per-token position mask, as a chip-side ring-attention kernel would: one launch;
// the FLOPs of the visible pairs; the HBM bytes of one call over all q rows x all kv rows, scaled by the visible
// fraction (so cutting the rows into zig-zag chunks does not lower the tiles' arithmetic intensity); one merge
// per q chunk.
void attend(Chip& chip, const ModelSpec& s, const Tensor& q, const std::vector<Chunk>& q_chunks, const Tensor& k,
            const Tensor& v, const std::vector<Chunk>& k_chunks, std::vector<Tensor>& acc, std::vector<Tensor>& lse,
            const std::string& name) {
  const int64_t nq = q.dim(1);
  double flops = 0, merge_flops = 0, merge_bytes = 0;
  int64_t q_rows = 0, k_rows = 0;
  for (const auto& c : q_chunks) q_rows += c.len;
  for (const auto& c : k_chunks) k_rows += c.len;
  for (size_t a = 0; a < q_chunks.size(); ++a) {
    const Chunk& qc = q_chunks[a];
    const Tensor qa = q.rows(qc.local, qc.len);
    bool merged = false;
    for (const Chunk& kc : k_chunks) {
      if (s.causal && qc.global + qc.len - 1 < kc.global) continue;  // fully masked: nothing to compute
      kernels::AttentionOptions o;
      o.causal = s.causal;
      o.q_offset = qc.global;
      o.k_offset = kc.global;
      const bool real = q.has_storage() && k.has_storage() && v.has_storage();
      Tensor out = Tensor::make(DType::fp32, {qc.len, nq, q.dim(2)}, real), l = Tensor::make(DType::fp32, {nq, qc.len}, real);
      const Tensor kb = k.rows(kc.local, kc.len), vb = v.rows(kc.local, kc.len);
      flops += kernels::attention(qa, kb, vb, out, l, o).flops;
      const auto m = kernels::merge_attention_partials(acc[a], lse[a], out, l);
      if (!merged) {  // the fused kernel merges each q chunk once per call
        merge_flops += m.flops;
        merge_bytes += m.bytes;
        merged = true;
      }
    }
  }
  if (flops <= 0) return;
  const auto full = kernels::attention_cost(q_rows, k_rows, nq, k.dim(1), q.dim(2), q.dtype(), DType::fp32);
  const double visible = full.flops > 0 ? flops / full.flops : 1.0;
  chip.charge(kernels::KernelCost{name, flops + merge_flops, full.bytes * visible + merge_bytes, q.dtype(), full.shape},
              name, true);
}

void init_acc(const std::vector<Chunk>& q_chunks, int64_t nq, int64_t d, std::vector<Tensor>& acc,
              std::vector<Tensor>& lse, bool storage) {
  for (const auto& c : q_chunks) {
    acc.push_back(Tensor::make(DType::fp32, runtime::Shape{c.len, nq, d}, storage));
    Tensor l = Tensor::make(DType::fp32, {nq, c.len}, storage);
    if (storage)
      for (int64_t i = 0; i < l.numel(); ++i) l.f32()[i] = -std::numeric_limits<float>::infinity();
    lse.push_back(std::move(l));
  }
}

Tensor finish_acc(const std::vector<Chunk>& q_chunks, std::vector<Tensor>& acc, DType dtype, int64_t rows) {
  const bool storage = std::all_of(acc.begin(), acc.end(), [](const Tensor& t) { return t.has_storage(); });
  Tensor o = Tensor::make(dtype, {rows, acc.empty() ? 0 : acc[0].dim(1), acc.empty() ? 0 : acc[0].dim(2)}, storage);
  if (!storage) return o;
  for (size_t a = 0; a < q_chunks.size(); ++a) {
    const auto f = acc[a].to_float();
    const int64_t off = q_chunks[a].local * o.dim(1) * o.dim(2);
    for (size_t i = 0; i < f.size(); ++i) o.set(off + static_cast<int64_t>(i), f[i]);
  }
  return o;
}


collectives::CollectiveOptions ring_opts(const std::string& name, const std::string& algorithm) {
  collectives::CollectiveOptions o;
  o.algorithm = algorithm;
  o.name = name;
  return o;
}


}  // namespace shardsim::sharding::plans

#include "kernels/decode_attention.h"

#include <stdexcept>
#include <string>

#include "kernels/attention.h"

namespace shardsim::kernels {

namespace {

AttentionOptions options_at(int64_t past) {
  AttentionOptions o;
  o.causal = true;
  o.q_offset = past;
  o.k_offset = 0;
  return o;
}

}  // namespace

KernelCost cached_attention_cost(int64_t rows, int64_t past, int64_t hq, int64_t hkv, int64_t d, runtime::DType dtype) {
  if (rows < 1 || past < 0 || hq < 1 || hkv < 1 || d < 1 || hq % hkv != 0)
    throw std::invalid_argument("cached_attention: rows " + std::to_string(rows) + ", past " + std::to_string(past) +
                                ", heads " + std::to_string(hq) + "/" + std::to_string(hkv) + ", head_dim " +
                                std::to_string(d));
  const int64_t L = past + rows;
  if (rows > 1) {
    KernelCost c = attention_cost(rows, L, hq, hkv, d, dtype, dtype, options_at(past));
    c.name = "attention.prefill";
    return c;
  }
  const double e = double(runtime::dtype_size(dtype));
  KernelCost c;
  c.name = "attention.decode";
  c.dtype = dtype;
  c.flops = 4.0 * double(d) * double(hq) * double(L);
  c.bytes = 2.0 * double(L) * double(hkv) * double(d) * e + 2.0 * double(hq) * double(d) * e;
  const int64_t splits = (L + kDecodeKeySplit - 1) / kDecodeKeySplit;
  c.shape = {sim::KernelClass::attention_forward, hq / hkv, (L + splits - 1) / splits, d, hkv * splits};
  return c;
}

KernelCost cached_attention(const runtime::Tensor& q, const runtime::Tensor& k, const runtime::Tensor& v,
                            runtime::Tensor& out, int64_t past) {
  if (q.rank() != 3 || k.rank() != 3 || v.rank() != 3)
    throw std::invalid_argument("cached_attention: Q, K, V must be [rows, heads, head_dim]");
  const int64_t rows = q.dim(0);
  if (k.dim(0) != past + rows || v.dim(0) != past + rows)
    throw std::invalid_argument("cached_attention: K/V hold " + std::to_string(k.dim(0)) + " rows, need past " +
                                std::to_string(past) + " + rows " + std::to_string(rows));
  KernelCost c = cached_attention_cost(rows, past, q.dim(1), k.dim(1), q.dim(2), q.dtype());
  if (q.has_storage() && k.has_storage() && v.has_storage() && out.has_storage()) {
    runtime::Tensor lse(runtime::DType::fp32, {q.dim(1), rows});
    (void)attention(q, k, v, out, lse, options_at(past));
  } else if (out.has_storage()) {
    out.drop_storage();
  }
  return c;
}

KernelCost cached_attention_batch(const std::vector<KernelCost>& costs, const char* name) {
  KernelCost c;
  c.name = name;
  if (costs.empty()) return c;
  c.dtype = costs.front().dtype;
  c.shape = costs.front().shape;
  c.shape.batch = 0;
  for (const auto& x : costs) {
    c.flops += x.flops;
    c.bytes += x.bytes;
    c.shape.batch += x.shape.batch;
  }
  return c;
}

}  // namespace shardsim::kernels

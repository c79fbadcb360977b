#include "sharding/plans/ulysses.h"

#include <cstring>

namespace shardsim::sharding::plans {

Tensor ulysses_attention(PlanContext& ctx, const Tensor& q, const Tensor& k, const Tensor& v) {
  const auto& s = ctx.s;
  Chip& chip = ctx.chip;
  const int u = ctx.p.ulysses;
  const int64_t n = q.dim(0), nq = q.dim(1), nkv = k.dim(1), d = q.dim(2), T = s.seq;
  const size_t es = runtime::dtype_size(s.dtype);
  const bool real = q.has_storage();  // shape-only: no copies, null buffers (block_ops.h)
  // Sequence-sharded [n, H, d] -> head-sharded [T, H/u, d]: block j = my rows x heads of rank j.
  auto to_heads = [&](const Tensor& t, int64_t heads, const std::string& what) {
    const int64_t hpu = heads / u;
    Tensor send = Tensor::make(s.dtype, {static_cast<int64_t>(u) * n, hpu, d}, real),
           recv = Tensor::make(s.dtype, {T, hpu, d}, real);
    for (int j = 0; real && j < u; ++j)
      for (int64_t i = 0; i < n; ++i)
        std::memcpy(static_cast<unsigned char*>(send.data()) + ((j * n + i) * hpu) * d * es,
                    static_cast<const unsigned char*>(t.data()) + ((i * heads) + j * hpu) * d * es,
                    static_cast<size_t>(hpu * d) * es);
    const auto r = collectives::all_to_all(ctx.cp, send.data_if_stored(), recv.data_if_stored(),
                                           static_cast<size_t>(send.numel()),
                                           s.dtype, chip.t, ring_opts("ulysses all_to_all (" + what + ")", "direct"));
    chip.t = r.span.end;
    ctx.comm.add("ulysses all_to_all", r.bytes_sent, (u - 1.0) / u * static_cast<double>(t.nbytes()));
    return recv;
  };
  Tensor qh = to_heads(q, nq, "q"), kh = to_heads(k, nkv, "k"), vh = to_heads(v, nkv, "v");
  std::vector<Chunk> all{{0, 0, T}};
  std::vector<Tensor> acc, lse;
  init_acc(all, nq / u, d, acc, lse, real);
  attend(chip, s, qh, all, kh, vh, all, acc, lse, "attention (ulysses heads)");
  Tensor oh = finish_acc(all, acc, s.dtype, T);  // [T, H/u, d]: block j = rows of rank j
  Tensor back = Tensor::make(s.dtype, {static_cast<int64_t>(u) * n, nq / u, d}, real);
  const auto r = collectives::all_to_all(ctx.cp, oh.data_if_stored(), back.data_if_stored(),
                                         static_cast<size_t>(oh.numel()), s.dtype,
                                         chip.t, ring_opts("ulysses all_to_all (o)", "direct"));
  chip.t = r.span.end;
  ctx.comm.add("ulysses all_to_all", r.bytes_sent, (u - 1.0) / u * static_cast<double>(oh.nbytes()));
  Tensor o = Tensor::make(s.dtype, {n, nq * d}, real);
  const int64_t hpu = nq / u;
  for (int j = 0; real && j < u; ++j)
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(static_cast<unsigned char*>(o.data()) + (i * nq + j * hpu) * d * es,
                  static_cast<const unsigned char*>(back.data()) + ((j * n + i) * hpu) * d * es,
                  static_cast<size_t>(hpu * d) * es);
  return o;
}

}  // namespace shardsim::sharding::plans

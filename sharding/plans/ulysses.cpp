#include "sharding/plans/ulysses.h"

#include <algorithm>
#include <cstring>

namespace shardsim::sharding::plans {

Tensor ulysses_attention(PlanContext& ctx, const Tensor& q, const Tensor& k, const Tensor& v) {
  const auto& s = ctx.s;
  Chip& chip = ctx.chip;
  const int u = ctx.p.ulysses;
  const std::string a2a = ctx.p.algorithm_for(PlanCollective::ulysses_all_to_all);
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
                                           s.dtype, chip.t, ring_opts("ulysses all_to_all (" + what + ")", a2a));
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
                                         chip.t, ring_opts("ulysses all_to_all (o)", a2a));
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

namespace shardsim::sharding::plans {

Tensor ulysses_seq_to_heads(runtime::Transport& group, const Tensor& x, int64_t batch, int64_t seq_local, bool store,
                            sim::TimeNs& t, const std::string& name) {
  const int U = group.size();
  const int64_t n = x.dim(0), H = x.dim(1), d = x.dim(2), hu = std::max<int64_t>(1, H / U), B = batch,
                Tl = seq_local;
  const size_t es = runtime::dtype_size(x.dtype()), row = size_t(hu * d) * es;
  Tensor send = Tensor::make(x.dtype(), {int64_t(U) * n, hu, d}, store),
         recv = Tensor::make(x.dtype(), {int64_t(U) * n, hu, d}, store);
  if (store)  // block j: this chip's tokens, heads [j·H/U, j·H/U + hu)
    for (int j = 0; j < U; ++j)
      for (int64_t i = 0; i < n; ++i)
        std::memcpy(static_cast<char*>(send.data()) + size_t(j * n + i) * row,
                    static_cast<const char*>(x.data()) + (size_t(i * H + (j * H) / U) * size_t(d)) * es, row);
  collectives::CollectiveOptions o;
  o.algorithm = "auto";
  o.name = "all_to_all.ulysses_" + name;
  t = collectives::all_to_all(group, send.data_if_stored(), recv.data_if_stored(), size_t(send.numel()), x.dtype(), t,
                              o)
          .span.end;
  // Block i holds chip i's tokens (its contiguous chunk of every local sequence) for this chip's heads.
  Tensor y = Tensor::make(x.dtype(), {B * Tl * U, hu, d}, store);
  if (store)
    for (int i = 0; i < U; ++i)
      for (int64_t b = 0; b < B; ++b)
        std::memcpy(static_cast<char*>(y.data()) + size_t(b * Tl * U + i * Tl) * row,
                    static_cast<const char*>(recv.data()) + size_t(i * n + b * Tl) * row, size_t(Tl) * row);
  return y;
}

Tensor ulysses_heads_to_seq(runtime::Transport& group, const Tensor& y, int64_t H, int64_t batch, int64_t seq_local,
                            bool store, sim::TimeNs& t, const std::string& name) {
  const int U = group.size();
  const int64_t hu = y.dim(1), d = y.dim(2), B = batch, Tl = seq_local, n = B * Tl;
  const size_t es = runtime::dtype_size(y.dtype()), row = size_t(hu * d) * es;
  Tensor send = Tensor::make(y.dtype(), {int64_t(U) * n, hu, d}, store),
         recv = Tensor::make(y.dtype(), {int64_t(U) * n, hu, d}, store);
  if (store)  // block i: chip i's tokens of every sequence, this chip's heads
    for (int i = 0; i < U; ++i)
      for (int64_t b = 0; b < B; ++b)
        std::memcpy(static_cast<char*>(send.data()) + size_t(i * n + b * Tl) * row,
                    static_cast<const char*>(y.data()) + size_t(b * Tl * U + i * Tl) * row, size_t(Tl) * row);
  collectives::CollectiveOptions o;
  o.algorithm = "auto";
  o.name = "all_to_all.ulysses_" + name;
  t = collectives::all_to_all(group, send.data_if_stored(), recv.data_if_stored(), size_t(send.numel()), y.dtype(), t,
                              o)
          .span.end;
  Tensor x = Tensor::make(y.dtype(), {n, H, d}, store);
  if (store && H >= U)  // block j: this chip's tokens, heads [j·H/U, ...)
    for (int j = 0; j < U; ++j)
      for (int64_t i = 0; i < n; ++i)
        std::memcpy(static_cast<char*>(x.data()) + (size_t(i * H + (j * H) / U) * size_t(d)) * es,
                    static_cast<const char*>(recv.data()) + size_t(j * n + i) * row, row);
  else if (store)  // replicated heads (H < U): U/H chips hold partial gradients of one head; summed in chip order
    for (int j = 0; j < U; ++j)
      for (int64_t i = 0; i < n; ++i)
        for (int64_t e = 0; e < d; ++e) {
          const int64_t at = (i * H + (j * H) / U) * d + e;
          x.set(at, x.get(at) + recv.get((j * n + i) * d + e));
        }
  return x;
}

}  // namespace shardsim::sharding::plans

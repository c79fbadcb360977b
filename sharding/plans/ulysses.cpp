#include "sharding/plans/ulysses.h"

#include "sharding/plans/registry.h"

#include <algorithm>
#include <cstring>

namespace shardsim::sharding::plans {

Tensor ulysses_seq_to_heads(runtime::Transport& group, const Tensor& x, int64_t batch, int64_t seq_local, bool store,
                            sim::TimeNs& t, const std::string& name, const std::string& algorithm, Comm* comm) {
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
  const auto r = collectives::all_to_all(group, send.data_if_stored(), recv.data_if_stored(), size_t(send.numel()),
                                         x.dtype(), t, ring_opts("ulysses all_to_all (" + name + ")", algorithm));
  t = r.span.end;
  if (comm) comm->add("ulysses all_to_all", r.bytes_sent, (U - 1.0) / U * static_cast<double>(x.nbytes()));
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
                            bool store, sim::TimeNs& t, const std::string& name, const std::string& algorithm,
                            Comm* comm) {
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
  const auto r = collectives::all_to_all(group, send.data_if_stored(), recv.data_if_stored(), size_t(send.numel()),
                                         y.dtype(), t, ring_opts("ulysses all_to_all (" + name + ")", algorithm));
  t = r.span.end;
  if (comm) comm->add("ulysses all_to_all", r.bytes_sent, (U - 1.0) / U * static_cast<double>(y.nbytes()));
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

Tensor ulysses_attention_forward(PlanContext& ctx, const TokenLayout& lay, Tensor& q, Tensor& k, Tensor& v,
                                 std::vector<Tensor>& lse, Tensor* o_heads) {
  const bool store = q.has_storage();
  const int64_t nq = q.dim(1);
  const std::string a2a = ctx.p.algorithm_for(PlanCollective::ulysses_all_to_all);
  const auto to_heads = [&](const Tensor& x, const char* name) {
    return ulysses_seq_to_heads(ctx.cp, x, lay.batch, lay.seq_local, store, ctx.chip.t, name, a2a, &ctx.comm);
  };
  Tensor qh = to_heads(q, "q"), kh = to_heads(k, "k"), vh = to_heads(v, "v");
  Tensor oh = local_attention(ctx.chip, ctx.s, qh, kh, vh, lay.batch, ctx.s.seq, lse);
  Tensor o = ulysses_heads_to_seq(ctx.cp, oh, nq, lay.batch, lay.seq_local, store, ctx.chip.t, "o", a2a, &ctx.comm);
  if (o_heads) {
    q = std::move(qh);
    k = std::move(kh);
    v = std::move(vh);
    *o_heads = std::move(oh);
  }
  return o;
}

void ulysses_attention_backward(PlanContext& ctx, const TokenLayout& lay, const Tensor& q, const Tensor& k,
                                const Tensor& v, const Tensor& o_heads, const std::vector<Tensor>& lse,
                                const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv) {
  const int U = ctx.cp.size();
  const bool store = dout.has_storage();
  const int64_t Tg = ctx.s.seq, B = lay.batch, hq = dq.dim(1), hkv = dk.dim(1), d = dq.dim(2);
  const int64_t hu = hq / U, hku = std::max<int64_t>(1, hkv / U);
  const std::string a2a = ctx.p.algorithm_for(PlanCollective::ulysses_all_to_all);
  sim::TimeNs& t = ctx.chip.t;
  const Tensor doh = ulysses_seq_to_heads(ctx.cp, dout, B, lay.seq_local, store, t, "do", a2a);
  Tensor dqh = Tensor::make(dq.dtype(), {B * Tg, hu, d}, store), dkh = Tensor::make(dk.dtype(), {B * Tg, hku, d}, store),
         dvh = Tensor::make(dv.dtype(), {B * Tg, hku, d}, store);
  local_attention_backward(ctx.chip, ctx.s, q, k, v, o_heads, lse, doh, dqh, dkh, dvh, B, Tg);
  dq = ulysses_heads_to_seq(ctx.cp, dqh, hq, B, lay.seq_local, store, t, "dq", a2a);
  dk = ulysses_heads_to_seq(ctx.cp, dkh, hkv, B, lay.seq_local, store, t, "dk", a2a);  // replicated: summed
  dv = ulysses_heads_to_seq(ctx.cp, dvh, hkv, B, lay.seq_local, store, t, "dv", a2a);
}

}  // namespace shardsim::sharding::plans

// ==== plan registration (sharding/plans/registry.h: the descriptor make_registry() lists) ====

namespace shardsim::sharding::plans {

namespace {

// ---- ulysses: DeepSpeed-Ulysses all_to_all attention on the cp axis (ulysses.h) ----
void ulysses_read(const PlanParse& c, ParallelPlan& p) {
  if (p.ulysses == 1) return;
  if (p.cp > 1) c.fail("ulysses", "ulysses and cp both shard the sequence on the mesh's cp axis; use one of them");
  if (c.use == SpecUse::mlp) c.not_implemented("ulysses", "ulysses: the MLP shards no sequence");
  refuse_unfused_attention(c, "ulysses");
}
void ulysses_check(const PlanParse& c, const ParallelPlan& p) {
  if (p.ulysses == 1) return;
  const ModelSpec& s = c.model;
  if (s.seq % p.ulysses != 0)
    c.fail("ulysses", "seq " + std::to_string(s.seq) + " is not divisible by " + std::to_string(p.ulysses));
  // Each tp shard's heads are split over the ulysses ranks; KV heads split, or replicated when fewer.
  const int64_t hq = s.heads / p.tp, hkv = s.kv_heads % p.tp == 0 ? s.kv_heads / p.tp : 0;
  const std::string per = p.tp > 1 ? " per tp shard" : "";
  if (hq % p.ulysses != 0)
    c.fail("ulysses", std::to_string(hq) + " query heads" + per + " are not divisible by " + std::to_string(p.ulysses));
  if (hkv == 0 || (hkv % p.ulysses != 0 && p.ulysses % hkv != 0))
    c.fail("ulysses", std::to_string(hkv) + " KV heads" + per + " are neither a multiple nor a divisor of " +
                          std::to_string(p.ulysses) + " (Ulysses splits or replicates them)");
  if (hkv % p.ulysses != 0 && c.use == SpecUse::block)
    c.not_implemented(
        "ulysses", "ulysses: ulysses above the " + std::to_string(hkv) + " KV heads" + per + " (replicated KV heads)");
}
std::string ulysses_text(const ModelSpec&, const ParallelPlan& p, bool train_mode) {
  return "Ulysses ulysses=" + std::to_string(p.ulysses) + " (all_to_all sequence <-> heads" +
         (train_mode ? ", forward and backward)" : ")");
}

}  // namespace

PlanDescriptor ulysses_plan_descriptor() {
  PlanDescriptor d;
  d.name = "ulysses";
  d.title = "DeepSpeed-Ulysses";
  d.summary =
      "all_to_all attention on the cp axis: tokens -> heads before attention, heads -> tokens after "
      "(Jacobs et al. 2023; sharding/plans/ulysses.h)";
  d.axis = "cp";
  d.size = &ParallelPlan::ulysses;
  d.keys = {{"ulysses", PlanValue::size, kPlanSizes, "1", "Ulysses size (on the mesh's cp axis)", true}};
  d.excludes = {"cp"};
  d.needs_attention = true;
  d.modes = {ModeUse::runs, ModeUse::runs, ModeUse::refused,
             "context parallelism is not a serving plan (serve runs tp, pp, dp and ep)"};
  d.read = ulysses_read;
  d.check = ulysses_check;
  d.text = ulysses_text;
  d.example = {plan_test_model("", "ulysses: 2"), SpecUse::train, 2, ""};
  d.bad_cases = {{plan_test_model("", "ulysses: 3"), SpecUse::train, 3, "ulysses"},
                 {plan_test_model("", "ulysses: 2, cp: 2"), SpecUse::train, 4, "ulysses"}};
  return d;
}

}  // namespace shardsim::sharding::plans

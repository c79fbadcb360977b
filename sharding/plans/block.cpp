#include "sharding/plans/block.h"

#include "sharding/plans/registry.h"

#include <cstring>

#include "kernels/attention.h"
#include "kernels/attention_backward.h"
#include "kernels/backward.h"
#include "kernels/attention_unfused.h"
#include "kernels/norm.h"
#include "sharding/plans/context_parallel.h"
#include "sharding/plans/kv_attention.h"
#include "sharding/plans/sequence_parallel.h"
#include "sharding/plans/tensor_parallel.h"
#include "sharding/plans/ulysses.h"

namespace shardsim::sharding::plans {

TokenLayout token_layout(int64_t seq, int64_t batch, int cp_axis, int c_idx, bool zigzag) {
  TokenLayout l;
  l.batch = batch;
  const auto chunks = cp_chunks(seq, cp_axis, c_idx, zigzag && cp_axis > 1);
  for (const auto& c : chunks) l.seq_local += c.len;
  l.pos.resize(static_cast<size_t>(batch * l.seq_local));
  for (int64_t b = 0; b < batch; ++b)
    for (const auto& c : chunks)
      for (int64_t i = 0; i < c.len; ++i) l.pos[static_cast<size_t>(b * l.seq_local + c.local + i)] = c.global + i;
  return l;
}

const char* glu_label(kernels::Activation a) { return a == kernels::Activation::silu ? "swiglu" : "geglu"; }

namespace {

// The block's norm of X (rmsnorm, or layernorm with bias B), charged to CHIP as NAME's kind + SUFFIX.
Tensor block_norm(Chip& chip, const ModelSpec& s, const Tensor& x, const Tensor& w, const Tensor* b,
                  const std::string& suffix) {
  if (s.norm == NormKind::rmsnorm) return rmsnorm(chip, x, w, "rmsnorm" + suffix, s.norm_eps);
  Tensor y = Tensor::make(x.dtype(), x.shape(), x.has_storage() && w.has_storage());
  chip.charge(kernels::layernorm(x, w, *b, y, static_cast<float>(s.norm_eps)), "layernorm" + suffix);
  return y;
}

}  // namespace

Tensor mlp_layer(Chip& chip, PlanContext* ctx, const Tensor& in, const BlockWeights& w, kernels::Activation activation,
                 BlockActivations* keep) {
  if (!ctx) {  // one device
    auto gu = column_gemms(chip, in, {w.w_gate, w.w_up}, {"gemm.gate", "gemm.up"}, "gemm.gate_up");
    chip.charge(kernels::glu_inplace(gu[0], gu[1], activation), glu_label(activation));
    return gemm(chip, gu[0], *w.w_down, "gemm.down");
  }
  if (!w.w_gate) {  // GELU MLP
    auto u = column_parallel(*ctx, in, {w.w_up}, {"gemm.up"}, "before MLP", "sp all_gather + gemm.up",
                             "sp all_gather + gemm.up", keep ? &keep->m : nullptr);
    if (keep) keep->up = u[0];
    ctx->chip.charge(kernels::activation_inplace(u[0], kernels::Activation::gelu), "gelu");
    if (keep) keep->act = u[0];
    return row_parallel(*ctx, u[0], *w.w_down, "gemm.down", "MLP output");
  }
  auto gu = column_parallel(*ctx, in, {w.w_gate, w.w_up}, {"gemm.gate", "gemm.up"}, "before MLP",
                            "sp all_gather + gemm.gate/up", "sp all_gather + gemm.gate/up", keep ? &keep->m : nullptr);
  if (keep) {
    keep->gate = gu[0];
    keep->up = gu[1];
  }
  ctx->chip.charge(kernels::glu_inplace(gu[0], gu[1], activation), glu_label(activation));
  if (keep) keep->act = gu[0];
  return row_parallel(*ctx, gu[0], *w.w_down, "gemm.down", "MLP output");
}

Tensor local_attention(Chip& chip, const ModelSpec& s, const Tensor& q, const Tensor& k, const Tensor& v,
                       int64_t batch, int64_t T, std::vector<Tensor>& lse, std::vector<Tensor>* probs) {
  const bool store = q.has_storage() && k.has_storage() && v.has_storage();
  const int64_t nq = q.dim(1), d = q.dim(2);
  Tensor o = Tensor::make(s.dtype, {batch * T, nq, d}, store);
  kernels::AttentionOptions opt;
  opt.causal = s.causal;
  lse.clear();
  if (probs) probs->clear();
  const bool unfused = s.attention_impl == AttentionImpl::unfused;
  for (int64_t b = 0; b < batch; ++b) {
    Tensor ob = Tensor::make(s.dtype, {T, nq, d}, store);
    if (unfused) {
      Tensor p = Tensor::make(s.dtype, {nq, T, T}, store);
      for (const auto& cost :
           kernels::attention_unfused(q.rows(b * T, T), k.rows(b * T, T), v.rows(b * T, T), ob, p, opt, s.dropout))
        chip.charge(cost, cost.name, true);
      if (probs) probs->push_back(std::move(p));
    } else {
      Tensor l = Tensor::make(DType::fp32, {nq, T}, store);
      const auto cost = kernels::attention(q.rows(b * T, T), k.rows(b * T, T), v.rows(b * T, T), ob, l, opt);
      chip.charge(cost, cost.name, true);
      lse.push_back(std::move(l));
    }
    if (store) o.set_rows(b * T, ob);
  }
  return o;
}

void local_attention_backward(Chip& chip, const ModelSpec& s, const Tensor& q, const Tensor& k, const Tensor& v,
                              const Tensor& o, const std::vector<Tensor>& lse, const Tensor& dout, Tensor& dq,
                              Tensor& dk, Tensor& dv, int64_t batch, int64_t T) {
  const bool store = dout.has_storage();
  const int64_t nq = dq.dim(1), nkv = dk.dim(1), d = dq.dim(2);
  kernels::AttentionOptions opt;
  opt.causal = s.causal;
  for (int64_t b = 0; b < batch; ++b) {
    Tensor dqb = Tensor::make(dq.dtype(), {T, nq, d}, store), dkb = Tensor::make(dk.dtype(), {T, nkv, d}, store),
           dvb = Tensor::make(dv.dtype(), {T, nkv, d}, store);
    const auto cost = kernels::attention_backward(q.rows(b * T, T), k.rows(b * T, T), v.rows(b * T, T), o.rows(b * T, T),
                                                  lse[size_t(b)], dout.rows(b * T, T), dqb, dkb, dvb, opt);
    chip.charge(cost, cost.name);
    dq.set_rows(b * T, dqb);
    dk.set_rows(b * T, dkb);
    dv.set_rows(b * T, dvb);
  }
}

void unfused_attention_backward(const ModelSpec& s, const Tensor& q, const Tensor& k, const Tensor& v,
                                const std::vector<Tensor>& probs, const Tensor& dout, Tensor& dq, Tensor& dk,
                                Tensor& dv, int64_t batch, int64_t T,
                                const std::function<void(const kernels::KernelCost&)>& charge) {
  const bool store = q.has_storage() && dout.has_storage();
  const int64_t nq = q.dim(1), nkv = k.dim(1), d = q.dim(2);
  kernels::AttentionOptions opt;
  opt.causal = s.causal;
  for (int64_t b = 0; b < batch; ++b) {
    const Tensor qb = q.rows(b * T, T), kb = k.rows(b * T, T), vb = v.rows(b * T, T);
    Tensor recomputed;
    if (probs.empty()) {  // selective recomputation: the core's forward again, for P
      recomputed = Tensor::make(s.dtype, {nq, T, T}, store);
      Tensor ob = Tensor::make(s.dtype, {T, nq, d}, store);
      for (const auto& c : kernels::attention_unfused(qb, kb, vb, ob, recomputed, opt, s.dropout)) charge(c);
    }
    const Tensor& p = probs.empty() ? recomputed : probs[size_t(b)];
    Tensor dqb = Tensor::make(dq.dtype(), {T, nq, d}, store), dkb = Tensor::make(dk.dtype(), {T, nkv, d}, store),
           dvb = Tensor::make(dv.dtype(), {T, nkv, d}, store);
    for (const auto& c :
         kernels::attention_unfused_backward(qb, kb, vb, p, dout.rows(b * T, T), dqb, dkb, dvb, opt, s.dropout))
      charge(c);
    if (store) {
      dq.set_rows(b * T, dqb);
      dk.set_rows(b * T, dkb);
      dv.set_rows(b * T, dvb);
    }
  }
}

kernels::BlockExtras block_extras(const ModelSpec& s, int64_t rows, int64_t residual_rows, int64_t qkv_cols,
                                  int64_t ffn_cols) {
  kernels::BlockExtras x;
  x.rows = rows;
  x.residual_rows = residual_rows;
  x.qkv_cols = qkv_cols;
  x.ffn_cols = ffn_cols;
  x.hidden = s.hidden;
  x.dtype = s.dtype;
  x.dropout = s.dropout;
  x.bias = s.linear_bias;
  return x;
}

namespace {

sim::Memory::Scoped hold(const BlockMemoryScopes& m, const char* what, uint64_t bytes) {
  return m.memory ? m.memory->scoped(what, bytes) : sim::Memory::Scoped{};
}

// The attention of the cp axis's unit: Ulysses, ring attention, or local. Q, K, V in the token layout; returns O
// [N, nq, d] in the token layout. KEEP: Ulysses' head-sharded q, k, v and o_heads replace q, k, v.
Tensor attention(PlanContext& ctx, const TokenLayout& lay, Tensor& q, Tensor& k, Tensor& v, std::vector<Tensor>& lse,
                 Tensor* o_heads, const BlockMemoryScopes& mem, std::vector<Tensor>* probs) {
  const ModelSpec& s = ctx.s;
  const ParallelPlan& p = ctx.p;
  if (ctx.kv) return kv_attention(ctx, q, k, v);  // serving: the new rows over each sequence's KV cache
  const bool store = q.has_storage();
  const int64_t nq = q.dim(1), nkv = k.dim(1), d = q.dim(2);
  if (p.ulysses > 1) return ulysses_attention_forward(ctx, lay, q, k, v, lse, o_heads);
  if (p.cp > 1) {
    auto ring_mem = hold(mem, "ring K/V receive buffers", mem.ring);
    CpRing ring{ctx.cp, p.zigzag, s.seq, store, &ctx.comm};
    return ring_attention_forward(ring, SeqShard{lay.batch, lay.seq_local, nq, nkv, d, s.dtype}, q, k, v, lse,
                                  ctx.chip);
  }
  return local_attention(ctx.chip, s, q, k, v, lay.batch, lay.seq_local, lse, probs);
}

// etp with sp: the experts' inner size is split over the tp chips, so each needs every row of the tp group (an sp
// all_gather before the experts, of DY in the backward) and the summed output goes back to each chip's rows by a
// reduce_scatter (EpOptions::etp_scatter). With etp 1 each tp chip routes its own rows instead.
bool etp_over_sp(const PlanContext& ctx, const BlockMoe& moe) {
  return moe.groups->etp_size() > 1 && ctx.n_resid < ctx.n_attn;
}

// The MoE MLP on this chip's normed rows B (its tokens: the tp group's replicated rows, with sp its own rows, or
// with etp and sp the tp group's gathered rows), through the ep unit; a shape-only run routes by the model's
// declared distribution. KEEP: m = the rows routed and the layer's EpActivations.
Tensor moe_sublayer(PlanContext& ctx, const Tensor& b, const BlockMoe& moe, BlockActivations* keep) {
  const kernels::MoeConfig& mc = *ctx.s.moe;
  kernels::MoeSpec spec = mc.spec;
  spec.capacity.groups = 1;  // this chip's tokens are one group
  EpOptions o;
  o.algorithm = ctx.p.algorithm.empty() ? "auto" : ctx.p.algorithm;
  o.etp_scatter = etp_over_sp(ctx, moe);
  const Tensor rows = o.etp_scatter ? sp_all_gather(ctx, b, "before the experts") : b;
  std::vector<kernels::Routing> declared;
  if (!rows.has_storage())
    declared = declared_ep_routing(spec, moe.ep_tokens ? *moe.ep_tokens
                                                       : std::vector<int64_t>(size_t(moe.groups->ep.size()), rows.dim(0)),
                                   mc.routing, moe.layer);
  if (mc.balance_placement && moe.groups->ep.size() > 1) {
    if (rows.has_storage())
      throw std::invalid_argument("model.moe.placement: balanced places the experts by the declared routing's "
                                  "load, in shape-only runs (a real-data run's placement is not yet modelled)");
    o.placement = placement_by_layer_load(declared, moe.groups->ep.size(), moe.layer);
  }
  EpActivations local;
  EpActivations& k = keep ? keep->moe : local;
  if (keep) keep->m = rows;
  return ep_moe_forward(*moe.groups, spec, *moe.w, rows, ctx.chip, ctx.comm, k,
                        declared.empty() ? nullptr : &declared, o);
}

}  // namespace

Tensor block_forward(PlanContext& ctx, const TokenLayout& lay, const BlockWeights& w, const Tensor& x,
                     BlockActivations* keep, const BlockMemoryScopes& mem) {
  const ModelSpec& s = ctx.s;
  Chip& chip = ctx.chip;
  const int64_t d = s.head_dim;
  if (keep) keep->x_in = x;
  // ---- attention sublayer (none in an MLP-only block: S.attention false) ----
  Tensor x1 = s.attention ? Tensor() : x;
  int64_t n = ctx.n_attn, nq = 0, nkv = 0;
  // The unfused core's softmax output is kept for the backward unless selective recomputation rebuilds it.
  const bool keep_probs = keep && s.attention_impl == AttentionImpl::unfused && !ctx.p.selective_recompute;
  if (s.attention) {
    Tensor a = block_norm(chip, s, x, *w.norm1, w.norm1_b, ".attn");
    auto qkv_mem = hold(mem, "activations q/k/v", mem.qkv);
    auto qkv = column_parallel(ctx, a, {w.wq, w.wk, w.wv}, {"gemm.q", "gemm.k", "gemm.v"}, "before QKV",
                               "sp all_gather + gemm.qkv", "sp all_gather + gemm.q/k/v", keep ? &keep->a : nullptr);
    n = qkv[0].dim(0), nq = w.wq->dim(1) / d, nkv = w.wk->dim(1) / d;
    Tensor q = std::move(qkv[0]).reshaped({n, nq, d});
    Tensor k = std::move(qkv[1]).reshaped({n, nkv, d});
    Tensor v = std::move(qkv[2]).reshaped({n, nkv, d});
    if (s.has_rope()) {
      const auto theta = static_cast<float>(s.rope_theta);
      chip.charge(kernels::rope_inplace(q, lay.pos, theta), "rope.q");
      chip.charge(kernels::rope_inplace(k, lay.pos, theta), "rope.k");
    }
    std::vector<Tensor> lse, probs;
    Tensor o = attention(ctx, lay, q, k, v, lse, keep ? &keep->o_heads : nullptr, mem, keep_probs ? &probs : nullptr);
    x1 = row_parallel(ctx, Tensor(o).reshaped({n, nq * d}), *w.wo, "gemm.o", "attention output");
    chip.charge(kernels::add_inplace(x1, x), "residual");
    qkv_mem.release();
    if (keep) {
      keep->q = std::move(q);
      keep->k = std::move(k);
      keep->v = std::move(v);
      keep->o = std::move(o);
      keep->lse = std::move(lse);
      keep->probs = std::move(probs);
      keep->x_mid = x1;
    }
  } else if (keep) {
    keep->x_mid = x1;
  }
  // ---- MLP sublayer ----
  Tensor b = block_norm(chip, s, x1, *w.norm2, w.norm2_b, ".mlp");
  auto mlp_mem = hold(mem, "activations mlp", mem.mlp);
  Tensor out = w.moe.w ? moe_sublayer(ctx, b, w.moe, keep) : mlp_layer(chip, &ctx, b, w, s.glu_activation(), keep);
  chip.charge(kernels::add_inplace(out, x1), "residual");
  // Megatron's bias and dropout work, charged (kernels/bias_dropout.h).
  const auto extras = block_extras(s, n, x.dim(0), (nq + 2 * nkv) * d, w.moe.w ? 0 : w.w_up->dim(1));
  for (const auto& c : kernels::block_extras_forward(extras)) chip.charge(c, c.name);
  if (keep) {
    keep->charged_bytes = kernels::block_extras_activation_bytes(extras);
    if (keep_probs && s.dropout > 0)  // the attention dropout's mask (1 byte) and output (e) per score
      for (const auto& p : keep->probs) keep->charged_bytes += double(p.numel()) + double(p.nbytes());
  }
  return out;
}

namespace {

// The block's norm backward (rmsnorm, or layernorm with its bias gradient DB), charged to CHIP.
void norm_backward(Chip& chip, const ModelSpec& s, const Tensor& x, const Tensor& w, const Tensor& dy, Tensor& dx,
                   Tensor* dw, Tensor* db) {
  const auto eps = static_cast<float>(s.norm_eps);
  const auto k = s.norm == NormKind::layernorm ? kernels::layernorm_backward(x, w, dy, dx, dw, db, eps)
                                               : kernels::rmsnorm_backward(x, w, dy, dx, dw, eps);
  chip.charge(k, k.name);
}

// The MLP sublayer's backward from DX (its output's gradient, the residual rows): returns the gradient of its
// normed input, reduced to the residual stream (the tp unit's column-parallel backward, or the ep unit's).
Tensor mlp_backward(PlanContext& ctx, const BlockWeights& w, const BlockActivations& S, const BlockGrads& g,
                    const Tensor& dx, WeightGradGemms* dl) {
  if (w.moe.w) {  // the MoE MLP through the ep unit
    const auto zero = [](Tensor& x) {
      if (x.rank() > 0 && x.has_storage()) std::memset(x.data(), 0, x.nbytes());
    };
    zero(g.moe->router);
    zero(g.moe->shared.w_gate), zero(g.moe->shared.w_up), zero(g.moe->shared.w_down);
    for (auto& e : g.moe->experts) zero(e.w_gate), zero(e.w_up), zero(e.w_down);
    EpOptions o;
    o.algorithm = ctx.p.algorithm;
    o.etp_scatter = etp_over_sp(ctx, w.moe);
    const Tensor dy = o.etp_scatter ? sp_all_gather(ctx, dx, "dexperts_out") : dx;
    return ep_moe_backward(*w.moe.groups, ctx.s.moe->spec, *w.moe.w, S.m, S.moe, dy, g.moe_aux_grad, *g.moe,
                           ctx.chip, ctx.comm, o);
  }
  const bool store = dx.has_storage();
  const auto act = [&](int64_t cols) { return Tensor::make(dx.dtype(), {ctx.n_attn, cols}, store); };
  const int64_t f = w.w_up->dim(1);
  Tensor dact = act(f), dgate = act(f), dup = act(f);
  row_parallel_backward(ctx, S.act, *w.w_down, dx, dact, *g.w_down, "dmlp_out", dl);
  if (!w.w_gate) {  // GELU MLP
    const auto k = kernels::gelu_backward(S.up, dact, dup);
    ctx.chip.charge(k, k.name);
    return column_parallel_backward(ctx, S.m, {w.w_up}, {&dup}, {g.w_up}, "dmlp_in", dl);
  }
  const auto k = kernels::swiglu_backward(S.gate, S.up, dact, dgate, dup);
  ctx.chip.charge(k, k.name);
  return column_parallel_backward(ctx, S.m, {w.w_gate, w.w_up}, {&dgate, &dup}, {g.w_gate, g.w_up}, "dmlp_in", dl);
}

// The attention sublayer's backward from DX (its output's gradient): returns the gradient of its normed input,
// reduced to the residual stream.
Tensor attention_backward(PlanContext& ctx, const TokenLayout& lay, const BlockWeights& w, const BlockActivations& S,
                          const BlockGrads& g, const Tensor& dx, WeightGradGemms* dl) {
  const ModelSpec& s = ctx.s;
  const ParallelPlan& p = ctx.p;
  const bool store = dx.has_storage();
  const int64_t N = ctx.n_attn, d = s.head_dim, hq = w.wq->dim(1) / d, hkv = w.wk->dim(1) / d;
  const auto act = [&](runtime::Shape sh) { return Tensor::make(dx.dtype(), std::move(sh), store); };
  const Tensor o2 = Tensor(S.o).reshaped({N, hq * d});
  Tensor do2 = act({N, hq * d});
  row_parallel_backward(ctx, o2, *w.wo, dx, do2, *g.wo, "dattn_out", dl);
  const Tensor dout = std::move(do2).reshaped({N, hq, d});
  Tensor dq = act({N, hq, d}), dk = act({N, hkv, d}), dv = act({N, hkv, d});
  if (p.ulysses > 1) {
    ulysses_attention_backward(ctx, lay, S.q, S.k, S.v, S.o_heads, S.lse, dout, dq, dk, dv);
  } else if (p.cp > 1) {
    CpRing ring{ctx.cp, p.zigzag, s.seq, store};
    ring_attention_backward(ring, SeqShard{lay.batch, lay.seq_local, hq, hkv, d, s.dtype}, S.q, S.k, S.v, S.o, S.lse,
                            dout, dq, dk, dv, ctx.chip);
  } else if (s.attention_impl == AttentionImpl::unfused) {  // Megatron's core, from the kept (or recomputed) softmax
    unfused_attention_backward(s, S.q, S.k, S.v, S.probs, dout, dq, dk, dv, lay.batch, lay.seq_local,
                               [&](const kernels::KernelCost& k) { ctx.chip.charge(k, k.name); });
  } else {
    local_attention_backward(ctx.chip, s, S.q, S.k, S.v, S.o, S.lse, dout, dq, dk, dv, lay.batch, lay.seq_local);
  }
  if (s.has_rope()) {
    const auto theta = static_cast<float>(s.rope_theta);
    const auto kq = kernels::rope_backward_inplace(dq, lay.pos, theta);
    ctx.chip.charge(kq, kq.name);
    const auto kk = kernels::rope_backward_inplace(dk, lay.pos, theta);
    ctx.chip.charge(kk, kk.name);
  }
  const Tensor dq2 = std::move(dq).reshaped({N, hq * d}), dk2 = std::move(dk).reshaped({N, hkv * d}),
               dv2 = std::move(dv).reshaped({N, hkv * d});
  return column_parallel_backward(ctx, S.a, {w.wq, w.wk, w.wv}, {&dq2, &dk2, &dv2}, {g.wq, g.wk, g.wv}, "dattn_in",
                                  dl);
}

}  // namespace

void block_backward(PlanContext& ctx, const TokenLayout& lay, const BlockWeights& w, BlockActivations& S,
                    const BlockGrads& g, Tensor& dx, WeightGradGemms* defer) {
  const ModelSpec& s = ctx.s;
  Chip& chip = ctx.chip;
  if (ctx.p.recompute) {  // full recomputation: the block's forward again from its saved input
    const Tensor x = S.x_in;
    (void)block_forward(ctx, lay, w, x, &S);
  }
  const int64_t d = s.head_dim, nq = s.attention ? w.wq->dim(1) / d : 0, nkv = s.attention ? w.wk->dim(1) / d : 0;
  for (const auto& k : kernels::block_extras_backward(
           block_extras(s, ctx.n_attn, ctx.n_resid, (nq + 2 * nkv) * d, w.moe.w ? 0 : w.w_up->dim(1))))
    chip.charge(k, k.name);  // the charged bias / dropout gradients
  Tensor dnorm = Tensor::make(dx.dtype(), {ctx.n_resid, s.hidden}, dx.has_storage());
  const Tensor dm = mlp_backward(ctx, w, S, g, dx, defer);
  norm_backward(chip, s, S.x_mid, *w.norm2, dm, dnorm, g.norm2, g.norm2_b);
  const auto add = kernels::add_inplace(dx, dnorm);
  chip.charge(add, add.name);
  if (s.attention) {  // the attention sublayer's (none in an MLP-only block)
    const Tensor da = attention_backward(ctx, lay, w, S, g, dx, defer);
    norm_backward(chip, s, S.x_in, *w.norm1, da, dnorm, g.norm1, g.norm1_b);
    const auto add1 = kernels::add_inplace(dx, dnorm);
    chip.charge(add1, add1.name);
  }
  if (ctx.p.recompute) {  // the rebuilt block is freed again after its backward
    Tensor keep = std::move(S.x_in);
    S = BlockActivations{};
    S.x_in = std::move(keep);
  }
}

}  // namespace shardsim::sharding::plans

// ==== plan registration (sharding/plans/registry.h: the descriptor make_registry() lists) ====

namespace shardsim::sharding::plans {

namespace {

// ---- recompute: activation recomputation none | selective | full ----
void recompute_read(const PlanParse& c, ParallelPlan& p) {
  if (c.has("recompute")) {
    if (c.root.has("train") && c.root.child("train").is_map() && c.root.child("train").has("recompute"))
      c.fail("recompute", "and train.recompute: are the same key; keep parallel.recompute");
    // none | selective | full; true and false (the older spellings) are full and none.
    const std::string r = c.par.get_string("recompute");
    if (r == "true" || r == "full")
      p.recompute = true;
    else if (r == "selective")
      p.selective_recompute = true;
    else if (r == "false" || r == "none")
      p.recompute = false;
    else
      c.fail("recompute", "'" + r + "' (none | selective | full; true = full, false = none)");
  }
  if ((p.recompute || p.selective_recompute) && !c.train()) c.fail("recompute", "training only");
}
std::string recompute_text(const ModelSpec& s, const ParallelPlan& p, bool) {
  if (p.recompute) return "recompute: full (each block's forward again right before its backward)";
  return s.attention_impl == AttentionImpl::unfused
             ? "recompute: selective (the unfused attention core's forward again in the backward)"
             : "recompute: selective (the attention core recomputed in the backward, as flash attention always does)";
}

}  // namespace

PlanDescriptor recompute_plan_descriptor() {
  PlanDescriptor d;
  d.name = "recompute";
  d.title = "activation recomputation";
  d.summary =
      "none | selective (the attention core recomputed in the backward; Korthikanti et al. 2022) | full "
      "(each block's forward again right before its backward)";
  d.keys = {{"recompute", PlanValue::choice, "none | selective | full (true = full, false = none)", "none",
             "activation recomputation"}};
  d.modes = {ModeUse::no_effect, ModeUse::runs, ModeUse::no_effect, "no backward to recompute for"};
  d.active = [](const ParallelPlan& p) { return p.recompute || p.selective_recompute; };
  d.read = recompute_read;
  d.text = recompute_text;
  d.example = {plan_test_model("", "recompute: selective"), SpecUse::train, 1, ""};
  d.bad_cases = {{plan_test_model("", "recompute: partial"), SpecUse::train, 1, "recompute"}};
  return d;
}

}  // namespace shardsim::sharding::plans

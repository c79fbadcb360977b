#include "models/lm_tp.h"

#include <mpi.h>

#include <cmath>
#include <cstring>
#include <sstream>
#include <stdexcept>

#include "collectives/all_gather.h"
#include "collectives/all_reduce.h"
#include "collectives/reduce_scatter.h"
#include "kernels/attention.h"
#include "kernels/attention_backward.h"
#include "kernels/backward.h"
#include "kernels/cross_entropy.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/gemm.h"
#include "kernels/norm.h"
#include "models/lm_data.h"
#include "runtime/world.h"

namespace shardsim::models {

using runtime::DType;
using runtime::Tensor;

namespace {

kernels::AttentionOptions causal() {
  kernels::AttentionOptions o;
  o.causal = true;
  return o;
}

bool is_norm(const std::string& name) { return name.find("norm") != std::string::npos; }

}  // namespace

LmTpTrainer::Split LmTpTrainer::split_of(const std::string& name) {
  if (is_norm(name)) return Split::replicate;
  if (name == "embed") return Split::rows;
  const auto dot = name.rfind('.');
  const std::string leaf = dot == std::string::npos ? name : name.substr(dot + 1);
  if (leaf == "wo" || leaf == "w_down") return Split::rows;
  return Split::cols;  // wq, wk, wv, w_gate, w_up, head
}

LmTpTrainer::LmTpTrainer(const LmConfig& global, const LmTrainConfig& train, sharding::DeviceMesh& mesh,
                         runtime::Transport& world, sim::Timeline& timeline, std::string algorithm, bool sequence_parallel)
    : global_(global), local_(global), train_(train), mesh_(mesh), world_(world), tl_(timeline),
      algorithm_(std::move(algorithm)), sp_(sequence_parallel) {
  check_lm_config(global);
  for (const auto& a : mesh.axes())
    if (a.size > 1 && a.name != "tp" && a.name != "dp")
      throw std::invalid_argument("parallel: train's tensor parallelism runs on dp x tp meshes only (got " +
                                  mesh.describe() + ")");
  tp_size_ = mesh.size("tp");
  dp_size_ = mesh.size("dp");
  const int r = world.rank();
  tp_rank_ = mesh.coordinate("tp", r);
  dp_rank_ = mesh.coordinate("dp", r);
  auto need = [&](int64_t v, const char* field) {
    if (v % tp_size_ != 0)
      throw std::invalid_argument(std::string("model.") + field + ": " + std::to_string(v) +
                                  " must be a multiple of parallel.tp (" + std::to_string(tp_size_) + ")");
  };
  need(global.heads, "heads");
  need(global.kv_heads, "kv_heads");
  need(global.ffn, "ffn");
  need(global.vocab, "vocab");
  if (global.batch % dp_size_ != 0)
    throw std::invalid_argument("model.batch: the global batch (" + std::to_string(global.batch) +
                                " sequences) must be a multiple of dp (" + std::to_string(dp_size_) + ")");
  if (sp_ && global.seq % tp_size_ != 0)
    throw std::invalid_argument("model.seq: " + std::to_string(global.seq) +
                                " must be a multiple of parallel.tp (" + std::to_string(tp_size_) +
                                ") for sequence parallelism");
  local_.heads /= tp_size_;
  local_.kv_heads /= tp_size_;
  local_.ffn /= tp_size_;
  local_.vocab /= tp_size_;
  local_.batch /= dp_size_;
  // Sub-groups are made collectively on first use: every rank asks for the same axes in the same order.
  (void)mesh_["tp"];
  (void)mesh_["dp"];

  master_ = shard(lm_init(global));
  m_ = lm_zeros(local_, DType::fp32);
  v_ = lm_zeros(local_, DType::fp32);
  work_ = lm_compute_copy(local_, master_);
  grads_ = lm_zeros(local_, global.dtype);
}

LmWeights LmTpTrainer::shard(const LmWeights& whole) const {
  LmWeights out = lm_zeros(local_, whole.embed.dtype());
  auto dst = out.named_weights();
  const auto src = whole.named_weights();
  const size_t es = runtime::dtype_size(whole.embed.dtype());
  for (size_t i = 0; i < dst.size(); ++i) {
    const Tensor& g = *src[i].second;
    Tensor& l = *dst[i].second;
    switch (split_of(dst[i].first)) {
      case Split::replicate:
        l = g;
        break;
      case Split::rows:
        l = g.rows(tp_rank_ * l.dim(0), l.dim(0));
        break;
      case Split::cols: {
        const int64_t rows = g.dim(0), lc = l.dim(1), gc = g.dim(1);
        for (int64_t i0 = 0; i0 < rows; ++i0)
          std::memcpy(static_cast<char*>(l.data()) + size_t(i0 * lc) * es,
                      static_cast<const char*>(g.data()) + size_t(i0 * gc + tp_rank_ * lc) * es, size_t(lc) * es);
        break;
      }
    }
  }
  return out;
}

LmWeights LmTpTrainer::gather(const LmWeights& local) {
  const DType dt = local.embed.dtype();
  LmWeights out = lm_zeros(global_, dt);
  auto dst = out.named_weights();
  const auto src = local.named_weights();
  const size_t es = runtime::dtype_size(dt);
  runtime::Transport& tp = mesh_["tp"];
  for (size_t i = 0; i < dst.size(); ++i) {
    const Tensor& l = *src[i].second;
    Tensor& g = *dst[i].second;
    const Split s = split_of(src[i].first);
    if (s == Split::replicate) {
      g = l;
      continue;
    }
    Tensor all(dt, {int64_t(l.numel()) * tp_size_});
    collectives::CollectiveOptions o;
    o.algorithm = algorithm_;
    o.name = "all_gather.state";
    collectives::all_gather(tp, l.data(), all.data(), size_t(all.numel()), dt, tl_.end_time(), o);  // count: the whole
    if (s == Split::rows) {
      std::memcpy(g.data(), all.data(), size_t(g.numel()) * es);
    } else {
      const int64_t rows = l.dim(0), lc = l.dim(1), gc = g.dim(1);
      for (int p = 0; p < tp_size_; ++p)
        for (int64_t i0 = 0; i0 < rows; ++i0)
          std::memcpy(static_cast<char*>(g.data()) + size_t(i0 * gc + p * lc) * es,
                      static_cast<const char*>(all.data()) + size_t(p * l.numel() + i0 * lc) * es, size_t(lc) * es);
    }
  }
  return out;
}

LmWeights LmTpTrainer::gather_master() { return gather(master_); }

LmTrainSnapshot LmTpTrainer::gather_state() {
  LmTrainSnapshot s;
  s.master = gather(master_);
  s.m = gather(m_);
  s.v = gather(v_);
  s.step = step_;
  return s;
}

void LmTpTrainer::restore(const LmTrainSnapshot& s) {
  const LmWeights want = lm_zeros(global_, DType::fp32);
  const auto wn = want.named_weights();
  for (const LmWeights* w : {&s.master, &s.m, &s.v}) {
    const auto got = w->named_weights();
    if (got.size() != wn.size()) throw std::invalid_argument("lm_tp restore: tensor count differs from the model's");
    for (size_t i = 0; i < wn.size(); ++i)
      if (got[i].second->dtype() != DType::fp32 || got[i].second->shape() != wn[i].second->shape())
        throw std::invalid_argument("lm_tp restore: " + wn[i].first + " has shape " +
                                    runtime::shape_str(got[i].second->shape()));
  }
  master_ = shard(s.master);
  m_ = shard(s.m);
  v_ = shard(s.v);
  work_ = lm_compute_copy(local_, master_);
  step_ = s.step;
}

void LmTpTrainer::charge(const kernels::KernelCost& k, sim::TimeNs& t) {
  t = tl_.compute(k.name, k.flops, k.bytes, runtime::precision_of(k.dtype), t).end;
}

void LmTpTrainer::all_reduce_tp(Tensor& x, collectives::ReduceOp op, sim::TimeNs& t, const char* name) {
  if (tp_size_ == 1) return;
  collectives::CollectiveOptions o;
  o.algorithm = algorithm_;
  o.name = name;
  t = collectives::all_reduce(mesh_["tp"], x.data(), x.data(), size_t(x.numel()), x.dtype(), op, t, o).span.end;
}

Tensor LmTpTrainer::to_seq(Tensor partial, sim::TimeNs& t, const char* name) {
  if (!sp_) {
    all_reduce_tp(partial, collectives::ReduceOp::sum, t, name);
    return partial;
  }
  // Sequence parallel: reduce_scatter(sum) over tp; rank r keeps token rows [r·N/T, (r+1)·N/T).
  const int64_t rows = partial.dim(0) / tp_size_;
  Tensor out(partial.dtype(), {rows, partial.dim(1)});
  collectives::CollectiveOptions o;
  o.algorithm = algorithm_;
  o.name = std::string("reduce_scatter.") + name;
  t = collectives::reduce_scatter(mesh_["tp"], partial.data(), out.data(), size_t(partial.numel()), partial.dtype(),
                                  collectives::ReduceOp::sum, t, o)
          .span.end;
  return out;
}

Tensor LmTpTrainer::from_seq(const Tensor& shard, sim::TimeNs& t, const char* name) {
  if (!sp_) return shard;
  Tensor out(shard.dtype(), {shard.dim(0) * tp_size_, shard.dim(1)});
  collectives::CollectiveOptions o;
  o.algorithm = algorithm_;
  o.name = std::string("all_gather.") + name;
  t = collectives::all_gather(mesh_["tp"], shard.data(), out.data(), size_t(out.numel()), shard.dtype(), t, o).span.end;
  return out;
}

double LmTpTrainer::forward(const LmBatch& batch, LmCache& C, sim::TimeNs& t) {
  const LmConfig& c = local_;
  const LmWeights& w = work_;
  const int64_t N = c.batch * c.seq, h = c.hidden, T = c.seq, hq = c.heads, hkv = c.kv_heads, d = c.head_dim;
  const int64_t v0 = tp_rank_ * c.vocab, V = global_.vocab;
  std::vector<int64_t> pos(static_cast<size_t>(N));
  for (size_t i = 0; i < pos.size(); ++i) pos[i] = int64_t(i) % c.seq;
  auto act = [&c](runtime::Shape sh) { return Tensor(c.dtype, std::move(sh)); };
  auto mm = [&](const Tensor& x, const Tensor& wt) {
    Tensor y(x.dtype(), {x.dim(0), wt.dim(1)});
    charge(kernels::gemm(x, wt, y), t);
    return y;
  };
  using collectives::ReduceOp;
  C.layers.assign(size_t(c.layers), {});
  const int64_t Nr = sp_ ? N / tp_size_ : N;  // rows of the residual stream on this rank
  Tensor x = act({N, h});
  charge(kernels::embedding_forward(w.embed, batch.inputs, v0, V, x), t);
  x = to_seq(std::move(x), t, "embed");
  for (int64_t l = 0; l < c.layers; ++l) {
    const LmLayer& L = w.layers[size_t(l)];
    auto& S = C.layers[size_t(l)];
    S.x_in = x;
    Tensor a = act({Nr, h});
    charge(kernels::rmsnorm(x, L.attn_norm, a, c.norm_eps), t);
    S.a = from_seq(a, t, "attn_in");
    S.q = mm(S.a, L.wq).reshaped({N, hq, d});
    S.k = mm(S.a, L.wk).reshaped({N, hkv, d});
    S.v = mm(S.a, L.wv).reshaped({N, hkv, d});
    charge(kernels::rope_inplace(S.q, pos, c.rope_theta), t);
    charge(kernels::rope_inplace(S.k, pos, c.rope_theta), t);
    S.o = act({N, hq, d});
    S.lse.clear();
    for (int64_t b = 0; b < c.batch; ++b) {
      Tensor ob = act({T, hq, d}), lse(DType::fp32, {hq, T});
      charge(kernels::attention(S.q.rows(b * T, T), S.k.rows(b * T, T), S.v.rows(b * T, T), ob, lse, causal()), t);
      S.o.set_rows(b * T, ob);
      S.lse.push_back(std::move(lse));
    }
    const Tensor attn = to_seq(mm(Tensor(S.o).reshaped({N, hq * d}), L.wo), t, "attn_out");
    charge(kernels::add_inplace(x, attn), t);
    S.x_mid = x;
    Tensor m = act({Nr, h});
    charge(kernels::rmsnorm(x, L.mlp_norm, m, c.norm_eps), t);
    S.m = from_seq(m, t, "mlp_in");
    S.gate = mm(S.m, L.w_gate);
    S.up = mm(S.m, L.w_up);
    S.act = S.gate;
    charge(kernels::glu_inplace(S.act, S.up, kernels::Activation::silu), t);
    const Tensor mlp = to_seq(mm(S.act, L.w_down), t, "mlp_out");
    charge(kernels::add_inplace(x, mlp), t);
  }
  C.x_final = x;
  Tensor xf = act({Nr, h});
  charge(kernels::rmsnorm(x, w.final_norm, xf, c.norm_eps), t);
  C.xf = from_seq(xf, t, "head_in");
  C.logits = mm(C.xf, w.head);  // [N, V/T]: this rank's vocabulary slice
  C.row_max = Tensor(DType::fp32, {N});
  C.sumexp = Tensor(DType::fp32, {N});
  Tensor target(DType::fp32, {N}), loss(DType::fp32, {N});
  charge(kernels::ce_shard_max(C.logits, C.row_max), t);
  all_reduce_tp(C.row_max, ReduceOp::max, t, "all_reduce.ce_max");
  charge(kernels::ce_shard_stats(C.logits, C.row_max, batch.targets, v0, V, C.sumexp, target), t);
  if (tp_size_ > 1) {  // sum of exponentials and the target logit in one buffer
    Tensor both(DType::fp32, {2 * N});
    std::memcpy(both.f32(), C.sumexp.f32(), size_t(N) * 4);
    std::memcpy(both.f32() + N, target.f32(), size_t(N) * 4);
    all_reduce_tp(both, ReduceOp::sum, t, "all_reduce.ce_stats");
    std::memcpy(C.sumexp.f32(), both.f32(), size_t(N) * 4);
    std::memcpy(target.f32(), both.f32() + N, size_t(N) * 4);
  }
  charge(kernels::ce_loss(C.row_max, C.sumexp, target, loss), t);
  double total = 0;
  for (int64_t i = 0; i < N; ++i) total += loss.f32()[i];
  return total / double(N);
}

void LmTpTrainer::backward(const LmBatch& batch, const LmCache& C, sim::TimeNs& t) {
  const LmConfig& c = local_;
  const LmWeights& w = work_;
  LmWeights& g = grads_;
  const int64_t N = c.batch * c.seq, h = c.hidden, T = c.seq, hq = c.heads, hkv = c.kv_heads, d = c.head_dim;
  const int64_t v0 = tp_rank_ * c.vocab, V = global_.vocab;
  std::vector<int64_t> pos(static_cast<size_t>(N));
  for (size_t i = 0; i < pos.size(); ++i) pos[i] = int64_t(i) % c.seq;
  auto act = [&c](runtime::Shape sh) { return Tensor(c.dtype, std::move(sh)); };
  using collectives::ReduceOp;

  Tensor dlogits = act({N, c.vocab});
  charge(kernels::ce_backward(C.logits, C.row_max, C.sumexp, batch.targets, v0, V, 1.0f / float(N), dlogits), t);
  const int64_t Nr = sp_ ? N / tp_size_ : N;
  Tensor dxf = act({N, h});
  charge(kernels::gemm_backward(C.xf, w.head, dlogits, &dxf, &g.head), t);
  // Column-parallel head: a partial input gradient; all_reduce (sp: reduce_scatter to the token rows).
  const Tensor dxf_r = to_seq(std::move(dxf), t, "dhead_in");
  Tensor dx = act({Nr, h});
  charge(kernels::rmsnorm_backward(C.x_final, w.final_norm, dxf_r, dx, &g.final_norm, c.norm_eps), t);
  for (int64_t l = c.layers - 1; l >= 0; --l) {
    const LmLayer& L = w.layers[size_t(l)];
    LmLayer& G = g.layers[size_t(l)];
    const auto& S = C.layers[size_t(l)];
    Tensor dact = act({N, c.ffn}), dgate = act({N, c.ffn}), dup = act({N, c.ffn});
    {
      const Tensor dx_full = from_seq(dx, t, "dmlp_out");  // sp: all_gather (the reduce_scatter's backward)
      charge(kernels::gemm_backward(S.act, L.w_down, dx_full, &dact, &G.w_down), t);  // row-parallel: local
    }
    charge(kernels::swiglu_backward(S.gate, S.up, dact, dgate, dup), t);
    Tensor dm = act({N, h}), dm_up = act({N, h}), dnorm = act({Nr, h});
    charge(kernels::gemm_backward(S.m, L.w_gate, dgate, &dm, &G.w_gate), t);
    charge(kernels::gemm_backward(S.m, L.w_up, dup, &dm_up, &G.w_up), t);
    charge(kernels::add_inplace(dm, dm_up), t);
    const Tensor dm_r = to_seq(std::move(dm), t, "dmlp_in");  // column-parallel gate/up
    charge(kernels::rmsnorm_backward(S.x_mid, L.mlp_norm, dm_r, dnorm, &G.mlp_norm, c.norm_eps), t);
    charge(kernels::add_inplace(dx, dnorm), t);
    const Tensor o2 = Tensor(S.o).reshaped({N, hq * d});
    Tensor do2 = act({N, hq * d});
    {
      const Tensor dx_full = from_seq(dx, t, "dattn_out");
      charge(kernels::gemm_backward(o2, L.wo, dx_full, &do2, &G.wo), t);  // row-parallel: local
    }
    const Tensor dout = std::move(do2).reshaped({N, hq, d});
    Tensor dq = act({N, hq, d}), dk = act({N, hkv, d}), dv = act({N, hkv, d});
    for (int64_t b = 0; b < c.batch; ++b) {
      Tensor dqb = act({T, hq, d}), dkb = act({T, hkv, d}), dvb = act({T, hkv, d});
      charge(kernels::attention_backward(S.q.rows(b * T, T), S.k.rows(b * T, T), S.v.rows(b * T, T),
                                         S.o.rows(b * T, T), S.lse[size_t(b)], dout.rows(b * T, T), dqb, dkb, dvb,
                                         causal()),
             t);
      dq.set_rows(b * T, dqb);
      dk.set_rows(b * T, dkb);
      dv.set_rows(b * T, dvb);
    }
    charge(kernels::rope_backward_inplace(dq, pos, c.rope_theta), t);
    charge(kernels::rope_backward_inplace(dk, pos, c.rope_theta), t);
    const Tensor dq2 = std::move(dq).reshaped({N, hq * d}), dk2 = std::move(dk).reshaped({N, hkv * d}),
                 dv2 = std::move(dv).reshaped({N, hkv * d});
    Tensor da = act({N, h}), da_k = act({N, h}), da_v = act({N, h});
    charge(kernels::gemm_backward(S.a, L.wq, dq2, &da, &G.wq), t);
    charge(kernels::gemm_backward(S.a, L.wk, dk2, &da_k, &G.wk), t);
    charge(kernels::gemm_backward(S.a, L.wv, dv2, &da_v, &G.wv), t);
    charge(kernels::add_inplace(da, da_k), t);
    charge(kernels::add_inplace(da, da_v), t);
    const Tensor da_r = to_seq(std::move(da), t, "dattn_in");  // column-parallel q/k/v
    charge(kernels::rmsnorm_backward(S.x_in, L.attn_norm, da_r, dnorm, &G.attn_norm, c.norm_eps), t);
    charge(kernels::add_inplace(dx, dnorm), t);
  }
  charge(kernels::embedding_backward(from_seq(dx, t, "dembed"), batch.inputs, v0, V, g.embed), t);
  if (sp_) {
    // Each rank differentiated the norms over its token rows only: all_reduce(sum) of the norm weights'
    // gradients over tp (one packed buffer; Megatron's allreduce of sequence-parallel layer norm grads).
    std::vector<Tensor*> norms;
    for (auto& [name, gt] : g.named_weights())
      if (split_of(name) == Split::replicate) norms.push_back(gt);
    int64_t total = 0;
    for (Tensor* n : norms) total += n->numel();
    Tensor flat(c.dtype, {total});
    const size_t es = runtime::dtype_size(c.dtype);
    size_t off = 0;
    for (Tensor* n : norms) {
      std::memcpy(static_cast<char*>(flat.data()) + off * es, n->data(), size_t(n->numel()) * es);
      off += size_t(n->numel());
    }
    all_reduce_tp(flat, collectives::ReduceOp::sum, t, "all_reduce.norm_grads");
    off = 0;
    for (Tensor* n : norms) {
      std::memcpy(n->data(), static_cast<const char*>(flat.data()) + off * es, size_t(n->numel()) * es);
      off += size_t(n->numel());
    }
  }
}

LmDpStepResult LmTpTrainer::step() {
  LmDpStepResult r;
  r.step = step_ + 1;
  tl_.reset();
  sim::TimeNs t = 0;
  const LmBatch gb = lm_synthetic_batch(global_, train_.data_seed, step_);
  LmBatch lb;
  const int64_t first = dp_rank_ * local_.batch * global_.seq, n = local_.batch * global_.seq;
  lb.inputs.assign(gb.inputs.begin() + first, gb.inputs.begin() + first + n);
  lb.targets.assign(gb.targets.begin() + first, gb.targets.begin() + first + n);

  LmCache cache;
  const double local_loss = forward(lb, cache, t);
  if (activation_bytes_ == 0) {
    for (const auto& L : cache.layers) {
      for (const Tensor* x : {&L.x_in, &L.a, &L.q, &L.k, &L.v, &L.o, &L.x_mid, &L.m, &L.gate, &L.up, &L.act})
        activation_bytes_ += double(x->nbytes());
      for (const auto& x : L.lse) activation_bytes_ += double(x.nbytes());
    }
    for (const Tensor* x : {&cache.x_final, &cache.xf, &cache.logits, &cache.row_max, &cache.sumexp})
      activation_bytes_ += double(x->nbytes());
  }
  backward(lb, cache, t);

  collectives::CollectiveOptions o;
  o.algorithm = algorithm_;
  auto named = grads_.named_weights();
  if (dp_size_ > 1) {  // DDP: every local gradient averaged over dp, one flat buffer after backward
    int64_t total = 0;
    for (auto& [name, gt] : named) total += gt->numel();
    Tensor flat(global_.dtype, {total});
    const size_t es = runtime::dtype_size(global_.dtype);
    size_t off = 0;
    for (auto& [name, gt] : named) {
      std::memcpy(static_cast<char*>(flat.data()) + off, gt->data(), gt->nbytes());
      off += gt->nbytes();
    }
    o.name = "all_reduce.grads";
    t = collectives::all_reduce(mesh_["dp"], flat.data(), flat.data(), size_t(total), global_.dtype,
                                collectives::ReduceOp::avg, t, o)
            .span.end;
    off = 0;
    for (auto& [name, gt] : named) {
      std::memcpy(gt->data(), static_cast<const char*>(flat.data()) + off, gt->nbytes());
      off += gt->nbytes();
    }
    (void)es;
  }
  // Global norm (kernels/optimizer.h's rule): replicated over dp (after the average) and, for the norm weights,
  // over tp; counted on coordinate 0 of every axis that replicates the parameter.
  std::vector<kernels::GradNormTerm> terms;
  for (auto& [name, gt] : named) {
    kernels::GradNormTerm term{gt, {dp_rank_}};
    if (split_of(name) == Split::replicate) term.replica_coords.push_back(tp_rank_);
    terms.push_back(term);
  }
  double sq = kernels::grad_sq_norm_local(terms), norm_sq = 0;
  o.name = "all_reduce.grad_norm";
  t = collectives::all_reduce(world_, &sq, &norm_sq, 1, DType::fp64, collectives::ReduceOp::sum, t, o).span.end;
  r.grad_norm = std::sqrt(norm_sq);
  // Reported loss: the dp replicas' means (identical over tp), averaged in dp order (host-side).
  finish_step_loss(r, local_loss, mesh_["dp"].comm(), dp_size_, world_.rank(), "lm_tp loss");
  r.clip = train_.max_grad_norm > 0 ? kernels::clip_coefficient(r.grad_norm, train_.max_grad_norm) : 1.0;
  const bool copy = global_.dtype != DType::fp32;
  auto ms = master_.named_weights(), m1 = m_.named_weights(), m2 = v_.named_weights(), ws = work_.named_weights();
  kernels::KernelCost opt{"adamw", 0, 0, DType::fp32};
  for (size_t k = 0; k < ms.size(); ++k) {
    const auto kc = kernels::adamw_step(*ms[k].second, *m1[k].second, *m2[k].second, *named[k].second, r.step,
                                        train_.adamw, float(r.clip), copy ? ws[k].second : nullptr);
    opt.flops += kc.flops;
    opt.bytes += kc.bytes;
  }
  if (!copy) work_ = master_;  // fp32 computes on the masters
  charge(opt, t);
  step_ = r.step;
  r.breakdown = tl_.breakdown();
  return r;
}

LmDpMemory LmTpTrainer::memory() const {
  LmDpMemory m;
  const bool mixed = global_.dtype != DType::fp32;
  for (const auto& [name, x] : work_.named_weights()) m.params += double(x->nbytes());
  for (const auto& [name, x] : grads_.named_weights()) m.grads += double(x->nbytes());
  for (const LmWeights* w : {&m_, &v_}) for (const auto& [name, x] : w->named_weights()) m.optimizer += double(x->nbytes());
  if (mixed) for (const auto& [name, x] : master_.named_weights()) m.optimizer += double(x->nbytes());
  m.activations = activation_bytes_;
  // Formula: Ψ_local = the shards' element count (replicated norms whole), P and K as in lm_dp.h, no ZeRO division.
  double psi = 0;
  for (const auto& [name, x] : master_.named_weights()) psi += double(x->numel());
  const double P = double(runtime::dtype_size(global_.dtype));
  m.formula_params = P * psi;
  m.formula_grads = P * psi;
  m.formula_optimizer = (mixed ? 12 : 8) * psi;
  return m;
}

}  // namespace shardsim::models

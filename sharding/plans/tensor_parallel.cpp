#include "sharding/plans/tensor_parallel.h"

#include "sharding/plans/registry.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <stdexcept>

#include "kernels/backward.h"
#include "kernels/cross_entropy.h"
#include "kernels/embedding.h"
#include "kernels/norm.h"
#include "sharding/plans/sequence_parallel.h"

namespace shardsim::sharding::plans {

Placement column_weight_placement(const ParallelPlan& p) {
  return p.tp > 1 ? Placement{Shard{1}} : Placement{Replicate{}};
}
Placement row_weight_placement(const ParallelPlan& p) {
  return p.tp > 1 ? Placement{Shard{0}} : Placement{Replicate{}};
}

namespace {

// The fused GEMM's name from its parts' ("gemm.q", "gemm.k", "gemm.v" -> "gemm.qkv"; "gemm.gate", "gemm.up" ->
// "gemm.gate_up"): the common prefix up to its last '.', then the suffixes (joined by '_' unless each is one letter).
std::string fused_gemm_name(const std::vector<std::string>& names) {
  if (names.size() == 1) return names[0];
  const auto dot = names[0].rfind('.');
  const std::string prefix = dot == std::string::npos ? "" : names[0].substr(0, dot + 1);
  bool letters = true;
  for (const auto& n : names) letters = letters && n.size() == prefix.size() + 1;
  std::string out = prefix;
  for (size_t i = 0; i < names.size(); ++i)
    out += (i && !letters ? "_" : "") + names[i].substr(std::min(prefix.size(), names[i].size()));
  return out;
}

}  // namespace

std::vector<Tensor> column_parallel(PlanContext& ctx, const Tensor& in, const std::vector<const Tensor*>& weights,
                                    const std::vector<std::string>& names, const std::string& gather_what,
                                    const std::string& fused_op, const std::string& fused_name, Tensor* used) {
  const auto& s = ctx.s;
  const auto& p = ctx.p;
  std::vector<Tensor> out;
  if (p.sp && p.fused.enabled) {  // one ring all_gather of the normed shard feeds every column-parallel GEMM
    std::vector<Tensor*> outs;
    for (const Tensor* w : weights)
      out.push_back(Tensor::make(s.dtype, runtime::Shape{ctx.n_attn, w->dim(1)}, in.has_storage() && w->has_storage()));
    for (auto& t : out) outs.push_back(&t);
    const sim::TimeNs ready = ctx.chip.t;
    const auto f = all_gather_gemm(ctx.tp, in, weights, outs, ready, fused_op);
    ctx.fused_done(fused_name, f, ready);
    const double P = p.tp;
    ctx.comm.add("sp all_gather", f.bytes_sent,
                 (P - 1) / P * static_cast<double>(ctx.n_attn * s.hidden) * static_cast<double>(runtime::dtype_size(s.dtype)));
    if (used) *used = in;
    return out;
  }
  const Tensor gathered = p.sp ? sp_all_gather(ctx, in, gather_what) : Tensor();
  const Tensor& x = p.sp ? gathered : in;
  const std::string label = " (" + parallel_style(column_weight_placement(p)) + ")";
  std::vector<std::string> labelled;
  for (const auto& n : names) labelled.push_back(n + label);
  out = column_gemms(ctx.chip, x, weights, labelled, fused_gemm_name(names) + label);
  if (used) *used = x;
  return out;
}

Tensor row_parallel(PlanContext& ctx, const Tensor& in, const Tensor& w, const std::string& gname,
                    const std::string& what) {
  const auto& s = ctx.s;
  const auto& p = ctx.p;
  const double P = p.tp;
  const double es = static_cast<double>(runtime::dtype_size(s.dtype));
  if (p.fused.enabled) {  // the GEMM and its reduction as one fused op
    const sim::TimeNs ready = ctx.chip.t;
    if (p.sp) {
      Tensor out = Tensor::make(s.dtype, {ctx.n_resid, s.hidden}, in.has_storage() && w.has_storage());
      const auto f = gemm_reduce_scatter(ctx.tp, in, w, out, ready, gname + " + sp reduce_scatter (" + what + ")");
      ctx.fused_done(gname + " + sp reduce_scatter", f, ready);
      ctx.comm.add("sp reduce_scatter", f.bytes_sent, (P - 1) / P * static_cast<double>(in.dim(0) * s.hidden) * es);
      return out;
    }
    Tensor out = Tensor::make(s.dtype, {in.dim(0), s.hidden}, in.has_storage() && w.has_storage());
    const auto f = gemm_all_reduce(ctx.tp, in, w, out, p.fused.chunks, ready, gname + " + tp all_reduce (" + what + ")",
                                   p.algorithm_for(PlanCollective::tp_all_reduce));
    ctx.fused_done(gname + " + tp all_reduce", f, ready);
    ctx.comm.add("tp all_reduce", f.bytes_sent, 2 * (P - 1) / P * static_cast<double>(out.nbytes()), f.comm_ns,
                 p.algorithm_for(PlanCollective::tp_all_reduce) + " per piece (fused)");
    return out;
  }
  return tp_reduce(ctx, gemm(ctx.chip, in, w, gname + " (" + parallel_style(row_weight_placement(p)) + ")"), what);
}

Tensor tp_gather(PlanContext& ctx, const Tensor& rows, const std::string& what) {
  return ctx.p.sp ? sp_all_gather(ctx, rows, what) : rows;
}

Tensor tp_reduce(PlanContext& ctx, Tensor partial, const std::string& what) {
  const auto& s = ctx.s;
  const auto& p = ctx.p;
  const double P = p.tp;
  if (p.tp == 1) return partial;
  if (p.sp) return sp_reduce_scatter(ctx, partial, what);
  const auto r = collectives::all_reduce(ctx.tp, partial.data_if_stored(), partial.data_if_stored(),
                                         static_cast<size_t>(partial.numel()),
                                         s.dtype, collectives::ReduceOp::sum, ctx.chip.t,
                                         ring_opts("tp all_reduce (" + what + ")", p.algorithm_for(PlanCollective::tp_all_reduce)));
  ctx.chip.t = r.span.end;
  ctx.comm.add("tp all_reduce", r.bytes_sent, 2 * (P - 1) / P * static_cast<double>(partial.nbytes()),
               r.span.duration(), r.algorithm);
  return partial;
}

Tensor vocab_parallel_embedding(PlanContext& ctx, const Tensor& table, const std::vector<int64_t>& tokens, int64_t v0,
                                int64_t vocab, Tensor out) {
  const auto cost = kernels::embedding_forward(table, tokens, v0, vocab, out);
  ctx.chip.charge(cost, cost.name);
  return tp_reduce(ctx, std::move(out), "embed");
}

void vocab_parallel_embedding_backward(Chip& chip, const Tensor& dx, const std::vector<int64_t>& tokens, int64_t v0,
                                       int64_t vocab, Tensor& dtable) {
  const auto cost = kernels::embedding_backward(dx, tokens, v0, vocab, dtable);
  chip.charge(cost, cost.name);
}

void row_parallel_backward(PlanContext& ctx, const Tensor& x, const Tensor& w, const Tensor& dy, Tensor& dx, Tensor& dw,
                           const std::string& what, WeightGradGemms* defer) {
  if (ctx.p.fused.enabled) {
    if (defer) throw std::invalid_argument("row_parallel_backward: a deferred weight gradient with fused collectives");  // the all_gather of dY with the dX GEMM's row chunks, then dW
    const sim::TimeNs ready = ctx.chip.t;
    ctx.fused_done("fused " + what, all_gather_gemm_backward(ctx.tp, dy, x, w, dx, dw, ready, "fused." + what), ready);
    return;
  }
  Tensor dy_full = tp_gather(ctx, dy, what);  // sp: all_gather (the reduce_scatter's backward)
  const auto k = kernels::gemm_backward(x, w, dy_full, &dx, defer ? nullptr : &dw);
  ctx.chip.charge(k, k.name);
  if (defer) defer->push_back({std::make_shared<const Tensor>(x), std::move(dy_full), &dw});
}

runtime::Transport& kv_replica_group(runtime::Transport& tp, int replicas) {
  if (replicas < 1 || tp.size() % replicas != 0)
    throw std::invalid_argument("kv_replica_group: " + std::to_string(replicas) + " replicas do not divide tp " +
                                std::to_string(tp.size()));
  return tp.subgroup("tp.kv_replicas", tp.rank() / replicas, tp.rank() % replicas,
                     [replicas](int q) { return std::pair{q / replicas, q % replicas}; });
}

sim::TimeNs kv_replica_grads_reduce(runtime::Transport& group, const std::vector<Tensor*>& grads,
                                    const std::string& algorithm, sim::TimeNs ready) {
  if (group.size() == 1 || grads.empty()) return ready;
  const DType dt = grads.front()->dtype();
  const bool store = grads.front()->has_storage();
  int64_t total = 0;
  for (const Tensor* g : grads) total += g->numel();
  Tensor flat = Tensor::make(dt, {total}, store);
  const size_t es = runtime::dtype_size(dt);
  size_t off = 0;
  for (const Tensor* g : grads) {  // one packed buffer (Megatron packs a bucket's gradients alike)
    if (store) std::memcpy(static_cast<char*>(flat.data()) + off * es, g->data(), size_t(g->numel()) * es);
    off += size_t(g->numel());
  }
  collectives::CollectiveOptions o;
  o.algorithm = algorithm;
  o.name = "all_reduce.kv_grads";
  const auto r = collectives::all_reduce(group, flat.data_if_stored(), flat.data_if_stored(), size_t(total), dt,
                                         collectives::ReduceOp::sum, ready, o);
  off = 0;
  for (Tensor* g : grads) {
    if (store) std::memcpy(g->data(), static_cast<const char*>(flat.data()) + off * es, size_t(g->numel()) * es);
    off += size_t(g->numel());
  }
  return r.span.end;
}

void run_weight_grads(Chip& chip, const WeightGradGemms& gemms) {
  for (const WeightGradGemm& g : gemms) {
    // gemm_backward reads W for its shape only when dX is not asked for: dW's own shape stands in for it.
    const auto k = kernels::gemm_backward(*g.x, *g.dw, g.dy, nullptr, g.dw);
    chip.charge(k, "gemm_backward.dw");
  }
}

Tensor column_parallel_backward(PlanContext& ctx, const Tensor& in, const std::vector<const Tensor*>& weights,
                                const std::vector<const Tensor*>& dys, const std::vector<Tensor*>& dws,
                                const std::string& what, WeightGradGemms* defer) {
  const bool store = in.has_storage();
  if (ctx.p.fused.enabled) {
    if (defer) throw std::invalid_argument("column_parallel_backward: a deferred weight gradient with fused collectives");  // dX GEMM chunks + reduce_scatter, the re-gathered input for dW (sharding/fused.h)
    Tensor dx = Tensor::make(in.dtype(), {ctx.n_resid, in.dim(1)}, store);
    const sim::TimeNs ready = ctx.chip.t;
    ctx.fused_done("fused " + what, gemm_reduce_scatter_backward(ctx.tp, in, weights, dys, dx, dws, ready, "fused." + what),
                   ready);
    return dx;
  }
  std::vector<Tensor*> dw_now;  // deferred (zero bubble): the weight gradients run in the W pass, one GEMM each
  for (Tensor* dw : dws) dw_now.push_back(defer ? nullptr : dw);
  Tensor dx = column_gemms_backward(ctx.chip, in, weights, dys, dw_now, "gemm_backward");
  if (defer) {
    const auto kept = std::make_shared<const Tensor>(in);
    for (size_t i = 0; i < weights.size(); ++i) defer->push_back({kept, *dys[i], dws[i]});
  }
  return tp_reduce(ctx, std::move(dx), what);
}

}  // namespace shardsim::sharding::plans

namespace shardsim::sharding::plans {

double vocab_parallel_cross_entropy(runtime::Transport& tp, sim::Timeline& tl, const std::string& algorithm,
                                    const Tensor& logits, const std::vector<int64_t>& targets, int64_t v0, int64_t V,
                                    Tensor& row_max, Tensor& sumexp, sim::TimeNs& t) {
  const int64_t N = logits.dim(0);
  const bool store = logits.has_storage();
  auto charge = [&](const kernels::KernelCost& k) {
    t = tl.compute(k.name, k.flops, k.bytes, runtime::precision_of(k.dtype), t, k.shape).end;
  };
  auto all_reduce = [&](Tensor& x, collectives::ReduceOp op, const char* name) {
    if (tp.size() == 1) return;
    collectives::CollectiveOptions o;
    o.algorithm = algorithm;
    o.name = name;
    t = collectives::all_reduce(tp, x.data_if_stored(), x.data_if_stored(), size_t(x.numel()), x.dtype(), op, t, o)
            .span.end;
  };
  row_max = Tensor::make(DType::fp32, {N}, store);
  sumexp = Tensor::make(DType::fp32, {N}, store);
  Tensor target = Tensor::make(DType::fp32, {N}, store), loss = Tensor::make(DType::fp32, {N}, store);
  charge(kernels::ce_shard_max(logits, row_max));
  all_reduce(row_max, collectives::ReduceOp::max, "all_reduce.ce_max");
  charge(kernels::ce_shard_stats(logits, row_max, targets, v0, V, sumexp, target));
  if (tp.size() > 1) {  // sum of exponentials and the target logit in one buffer
    Tensor both = Tensor::make(DType::fp32, {2 * N}, store);
    if (store) {
      std::memcpy(both.f32(), sumexp.f32(), size_t(N) * 4);
      std::memcpy(both.f32() + N, target.f32(), size_t(N) * 4);
    }
    all_reduce(both, collectives::ReduceOp::sum, "all_reduce.ce_stats");
    if (store) {
      std::memcpy(sumexp.f32(), both.f32(), size_t(N) * 4);
      std::memcpy(target.f32(), both.f32() + N, size_t(N) * 4);
    }
  }
  charge(kernels::ce_loss(row_max, sumexp, target, loss));
  if (!store) return std::numeric_limits<double>::quiet_NaN();  // shape-only: no loss
  double total = 0;
  for (int64_t i = 0; i < N; ++i) total += loss.f32()[i];
  return total / double(N);
}

}  // namespace shardsim::sharding::plans

// ==== plan registration (sharding/plans/registry.h: the descriptor make_registry() lists) ====

namespace shardsim::sharding::plans {

namespace {

// Why the training mode refuses fused without sp (fused_read, the fused descriptor's modes, the trainer).
constexpr const char* kFusedTrainNeedsSp =
    "fused without sp does not train: the training mode fuses the sequence-parallel collectives only "
    "(all_gather_gemm / gemm_reduce_scatter and their backward), as Megatron-LM's tp_comm_overlap (which requires "
    "sequence parallelism) and Transformer Engine's userbuffers (all_gather and reduce_scatter overlaps) do";

// ---- tp: tensor parallel (tensor_parallel.h) ----
void tp_check(const PlanParse& c, const ParallelPlan& p) {
  const ModelSpec& s = c.model;
  if (c.use == SpecUse::mlp) {
    if (s.ffn < p.tp)
      c.fail("tp", "model.ffn " + std::to_string(s.ffn) + " is smaller than tp=" + std::to_string(p.tp) +
                       ": some chips would hold no FFN column");
    return;
  }
  // Whole heads per chip; KV heads split, or (tp above their count) replicated whole.
  if (s.heads % p.tp != 0)
    c.fail("tp", std::to_string(s.heads) + " query heads are not divisible by tp " + std::to_string(p.tp) +
                     " (uneven head splits are not supported)");
  if (s.kv_heads % p.tp != 0) {
    if (p.tp % s.kv_heads != 0)
      c.fail("tp", std::to_string(s.kv_heads) + " KV heads and tp " + std::to_string(p.tp) +
                       ": one must divide the other (KV heads are split or replicated whole)");
    // Replicated over tp / kv_heads chips in every mode (kv_replica_group: training sums their weight gradients).
  }
  if (c.train())
    for (const char* k : {"ffn", "vocab"}) {
      const int64_t v = std::string(k) == "ffn" ? s.ffn : s.vocab;
      if (v % p.tp != 0)
        c.fail("tp", std::string("model.") + k + " " + std::to_string(v) + " is not a multiple of tp " +
                         std::to_string(p.tp) + " (the trainer splits whole ffn columns and vocabulary rows)");
    }
}
std::string tp_text(const ModelSpec& s, const ParallelPlan& p, bool) {
  if (!s.has_attention())  // the MLP-only model: the placements of its tensors on the tp axis
    return "tensor parallel tp=" + std::to_string(p.tp) +
           " (Megatron MLP: gate/up column-parallel Shard(1), down row-parallel "
           "Shard(0), all_reduce(sum) of the output)";
  return "tensor parallel tp=" + std::to_string(p.tp) +
         " (Megatron: column-parallel q/k/v, gate/up; row-parallel wo, w_down" +
         (s.has_embedding() ? "; vocab-parallel embedding and cross-entropy)" : ")");
}

// ---- fused: the tp collectives fused with their GEMMs (sharding/fused.h) ----
void fused_read(const PlanParse& c, ParallelPlan& p) {
  if (!c.given) return;
  // The output [this chip's tokens, hidden] is what gemm_all_reduce cuts into chunks.
  p.fused = parse_fused_plan(c.par, p.tp, tokens_per_context_shard(c.model, p), c.model.hidden);
  if (p.fused.enabled && p.sp && c.has("chunks"))
    c.fail("chunks",
           "with sp the fused ops are rings over the tp shards (tp pieces); chunks applies to the "
           "all_reduce form (sp: false)");
  if (!c.train() || c.forward) return;  // the forward mode runs both forms (the plan units')
  // Training fuses the sequence-parallel collectives only, as the systems modelled do: Megatron-LM refuses
  // --tp-comm-overlap without --sequence-parallel, and Transformer Engine's userbuffers overlap a GEMM with an
  // all_gather or a reduce_scatter, never an all_reduce; a gemm_all_reduce has no training form to model.
  if (p.fused.enabled && !p.sp)
    c.fail("fused", std::string(kFusedTrainNeedsSp) + "; set sp: true, or fused: false");
  if (c.has("chunks"))
    c.fail("chunks", "the training mode's fused ops are the sequence-parallel rings of tp pieces (sp: true); chunks "
                     "applies to the forward's gemm_all_reduce");
}
std::string fused_text(const ModelSpec& s, const ParallelPlan& p, bool train_mode) {
  if (p.sp)
    return std::string("fused: all_gather_gemm / gemm_reduce_scatter") + (train_mode ? " and their backward" : "");
  return std::string("fused: ") + (s.has_attention() ? "the row-parallel GEMMs" : "the down projection") +
         " + all_reduce as one gemm_all_reduce (" + p.fused.describe() + ")";
}

}  // namespace

PlanDescriptor tp_plan_descriptor() {
  PlanDescriptor d;
  d.name = "tp";
  d.title = "tensor parallel";
  d.summary =
      "Megatron column/row-parallel GEMMs (q/k/v and gate/up column-, wo and w_down row-parallel), "
      "vocab-parallel embedding and loss; whole query heads per chip, KV heads split or replicated "
      "(sharding/plans/tensor_parallel.h)";
  d.axis = "tp";
  d.size = &ParallelPlan::tp;
  d.keys = {{"tp", PlanValue::size, kPlanSizes, "MLP: chips / dp; else 1", "tensor-parallel size", true}};
  d.check = tp_check;
  d.text = tp_text;
  d.example = {plan_test_model("", "tp: 2"), SpecUse::train, 2, ""};
  d.bad_cases = {{plan_test_model("", "tp: 3"), SpecUse::train, 3, "tp"},
                 {plan_test_model(", heads: 6, kv_heads: 3", "tp: 2"), SpecUse::train, 2, "tp"}};
  return d;
}

PlanDescriptor fused_plan_descriptor() {
  PlanDescriptor d;
  d.name = "fused";
  d.title = "fused tp collectives";
  d.summary =
      "the tp collectives overlapped with their GEMMs: gemm_all_reduce (chunks pieces), or with sp "
      "all_gather_gemm / gemm_reduce_scatter rings (sharding/fused.h)";
  d.axis = "tp";
  d.keys = {
      {"fused", PlanValue::flag, "true | false", "false", "fuse the tp collectives with their GEMMs"},
      {"chunks", PlanValue::number, "auto | 1..4096", "auto", "the fused all_reduce form (sp: false): pieces of the output",
       false, true,
       PlanModes{ModeUse::runs, ModeUse::refused, ModeUse::refused,
                 "the forward's gemm_all_reduce; the trainer fuses the sp rings of tp pieces, serving runs unfused"}}};
  d.needs = {"tp"};
  d.modes = {ModeUse::runs, ModeUse::runs, ModeUse::refused,
             "serving runs the GEMMs and their collectives unfused; train fuses with sp: true only (Megatron-LM's "
             "tp_comm_overlap needs sequence parallelism)"};
  d.active = [](const ParallelPlan& p) { return p.fused.enabled; };
  d.read = fused_read;
  d.text = fused_text;
  d.example = {std::string(kPlanTestBlock) + "parallel: {tp: 2, fused: true, chunks: 2}\n", SpecUse::block, 2, ""};
  d.bad_cases = {
      {std::string(kPlanTestBlock) + "parallel: {tp: 2, fused: true, chunks: 4096}\n", SpecUse::block, 2, "chunks"},
      {plan_test_model("", "fused: true"), SpecUse::train, 2, "fused"}};
  d.mode_cases = {{plan_test_model("", "tp: 2, sp: true, fused: true"), SpecUse::train, 2, ""},
                  {plan_test_model("", "tp: 2, fused: true, chunks: 2"), SpecUse::train, 2, ""}};
  return d;
}

}  // namespace shardsim::sharding::plans

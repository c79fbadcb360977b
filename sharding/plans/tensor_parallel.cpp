#include "sharding/plans/tensor_parallel.h"

#include <cstring>
#include <limits>
#include <stdexcept>

#include "kernels/backward.h"
#include "kernels/cross_entropy.h"
#include "kernels/norm.h"
#include "sharding/plans/sequence_parallel.h"

namespace shardsim::sharding::plans {

Placement column_weight_placement(const ParallelPlan& p) {
  return p.tp > 1 ? Placement{Shard{1}} : Placement{Replicate{}};
}
Placement row_weight_placement(const ParallelPlan& p) {
  return p.tp > 1 ? Placement{Shard{0}} : Placement{Replicate{}};
}

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
  for (size_t i = 0; i < weights.size(); ++i) out.push_back(gemm(ctx.chip, x, *weights[i], names[i] + label));
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
  std::vector<Tensor> dx;
  const auto kept = defer ? std::make_shared<const Tensor>(in) : nullptr;
  for (size_t i = 0; i < weights.size(); ++i) {
    dx.push_back(Tensor::make(in.dtype(), {in.dim(0), in.dim(1)}, store));
    const auto k = kernels::gemm_backward(in, *weights[i], *dys[i], &dx.back(), defer ? nullptr : dws[i]);
    ctx.chip.charge(k, k.name);
    if (defer) defer->push_back({kept, *dys[i], dws[i]});
  }
  for (size_t i = 1; i < dx.size(); ++i) {
    const auto k = kernels::add_inplace(dx[0], dx[i]);
    ctx.chip.charge(k, k.name);
  }
  return tp_reduce(ctx, std::move(dx[0]), what);
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

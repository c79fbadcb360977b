#include "sharding/plans/sequence_parallel.h"

namespace shardsim::sharding::plans {

Tensor sp_all_gather(PlanContext& ctx, const Tensor& local, const std::string& what) {
  const double P = ctx.p.tp;
  Tensor out = Tensor::make(ctx.s.dtype, {ctx.n_attn, ctx.s.hidden}, local.has_storage());
  const auto r = collectives::all_gather(ctx.tp, local.data_if_stored(), out.data_if_stored(), static_cast<size_t>(out.numel()),
                                         ctx.s.dtype, ctx.chip.t, ring_opts("sp all_gather (" + what + ")", ctx.p.algorithm_for(PlanCollective::sp_all_gather)));
  ctx.chip.t = r.span.end;
  ctx.comm.add("sp all_gather", r.bytes_sent, (P - 1) / P * static_cast<double>(out.nbytes()));
  return out;
}

Tensor sp_reduce_scatter(PlanContext& ctx, const Tensor& partial, const std::string& what) {
  const double P = ctx.p.tp;
  Tensor out = Tensor::make(ctx.s.dtype, {ctx.n_resid, ctx.s.hidden}, partial.has_storage());
  const auto r = collectives::reduce_scatter(ctx.tp, partial.data_if_stored(), out.data_if_stored(), static_cast<size_t>(partial.numel()),
                                             ctx.s.dtype, collectives::ReduceOp::sum, ctx.chip.t,
                                             ring_opts("sp reduce_scatter (" + what + ")",
                                                      ctx.p.algorithm_for(PlanCollective::sp_reduce_scatter)));
  ctx.chip.t = r.span.end;
  ctx.comm.add("sp reduce_scatter", r.bytes_sent, (P - 1) / P * static_cast<double>(partial.nbytes()));
  return out;
}

}  // namespace shardsim::sharding::plans

#include "sharding/plans/sequence_parallel.h"

#include "sharding/plans/registry.h"

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

// ==== plan registration (sharding/plans/registry.h: the descriptor make_registry() lists) ====

namespace shardsim::sharding::plans {

namespace {

// ---- sp: sequence parallel (sequence_parallel.h) ----
void sp_read(const PlanParse& c, ParallelPlan& p) {
  if (!c.given) return;
  p.sp = c.par.get_bool("sp", false);
  if (p.sp && p.tp == 1) c.fail("sp", "sequence parallelism needs tp > 1 (it splits the tp axis)");
  if (p.sp && c.use == SpecUse::mlp) c.not_implemented("sp", "sp: the MLP shards no sequence");
  // sp x ulysses: the trainer runs it (sp on the tp axis around the tp GEMMs, the Ulysses all_to_alls on the cp
  // axis around attention); the block's forward does not yet.
  if (p.ulysses > 1 && p.sp && !c.train()) c.not_implemented("sp", "sp with ulysses");
}
void sp_check(const PlanParse& c, const ParallelPlan& p) {
  const int64_t shard = tokens_per_context_shard(c.model, p);
  if (p.sp && shard % p.tp != 0)
    c.fail("sp", "the " + std::to_string(shard) + " tokens per context shard are not divisible by tp " +
                     std::to_string(p.tp));
}
std::string sp_text(const ModelSpec&, const ParallelPlan&, bool) {
  return "sequence parallel (reduce_scatter / all_gather around the norms)";
}

}  // namespace

PlanDescriptor sp_plan_descriptor() {
  PlanDescriptor d;
  d.name = "sp";
  d.title = "sequence parallel";
  d.summary =
      "the tp axis also splits the tokens outside the tp GEMMs: reduce_scatter / all_gather around the "
      "norms instead of the all_reduce (Korthikanti et al. 2022; sharding/plans/sequence_parallel.h)";
  d.axis = "tp";
  d.keys = {{"sp", PlanValue::flag, "true | false", "false", "sequence parallelism on the tp axis", true}};
  d.needs = {"tp"};
  d.modes = {ModeUse::runs, ModeUse::runs, ModeUse::refused, "serving runs without sequence parallelism"};
  d.active = [](const ParallelPlan& p) { return p.sp; };
  d.read = sp_read;
  d.check = sp_check;
  d.text = sp_text;
  d.example = {plan_test_model("", "tp: 2, sp: true"), SpecUse::train, 2, ""};
  d.bad_cases = {{plan_test_model(", seq: 9", "tp: 2, sp: true"), SpecUse::train, 2, "sp"},
                 {plan_test_model("", "sp: true"), SpecUse::train, 2, "sp"}};
  return d;
}

}  // namespace shardsim::sharding::plans

#include "interop/launch.h"

#include <sstream>

#include "common/error.h"
#include "models/lm_model.h"
#include "sharding/engine_config.h"

namespace shardsim::interop {

namespace {

int64_t axes_product(const ConfigNode& root) {
  if (!root.has("parallel")) return 1;
  const ConfigNode p = root.child("parallel");
  int64_t n = 1;
  for (const char* k : {"dp", "tp", "cp", "ulysses", "pp"}) n *= p.get_int_in(k, 1, sharding::SpecBounds::axis, 1);
  return n;
}

PlanSource parse(const ConfigNode& root, int64_t chips) {
  PlanSource s;
  s.where = root.file();
  if (!root.is_map() || !root.has("workload")) root.fail("expected a training config with a model: section");
  s.spec = sharding::parse_model_spec(root.child("workload"), sharding::SpecUse::train);
  if (chips <= 0) {
    chips = root.has("topology") ? sharding::load_workload_topology(root).num_chips() : axes_product(root);
  }
  s.chips = chips;
  s.plan = sharding::parse_parallel_plan(root, s.spec, sharding::SpecUse::train, chips,
                                         sharding::train_section_recompute(root));
  s.train = sharding::parse_train_spec(root);
  return s;
}

}  // namespace

PlanSource load_plan_source(const std::string& file, int64_t chips, const std::string& plan,
                            const std::vector<std::string>& set) {
  sharding::ConfigOverrides o;
  o.plan = plan;
  o.set = set;
  PlanSource s = parse(sharding::load_workload_config(file, o), chips);
  s.where = file + o.describe();
  return s;
}

PlanSource check_loads(const std::string& yaml, const std::string& where, int64_t chips) {
  const ConfigNode root = sharding::workload_config_from_text(yaml, where);
  return parse(root, chips > 0 ? chips : axes_product(root));
}

int64_t param_count(const sharding::ModelSpec& model) { return models::lm_param_count(model); }

std::string first_difference(const PlanSource& a, const PlanSource& b) {
  std::ostringstream os;
  auto cmp = [&](const char* name, const auto& x, const auto& y) {
    if (os.tellp() == 0 && !(x == y)) os << name << ": " << x << " vs " << y;
  };
  const auto &m = a.spec, &n = b.spec;
  cmp("model.vocab", m.vocab, n.vocab);
  cmp("model.hidden", m.hidden, n.hidden);
  cmp("model.layers", m.layers, n.layers);
  cmp("model.heads", m.heads, n.heads);
  cmp("model.kv_heads", m.kv_heads, n.kv_heads);
  cmp("model.head_dim", m.head_dim, n.head_dim);
  cmp("model.ffn", m.ffn, n.ffn);
  cmp("model.seq", m.seq, n.seq);
  cmp("model.batch", m.batch, n.batch);
  // 0 = one micro-batch of the replica's batch: the same schedule as micro_batch = batch / dp.
  cmp("model.micro_batch (per replica)", m.micro_batch > 0 ? m.micro_batch : m.batch / a.plan.dp,
      n.micro_batch > 0 ? n.micro_batch : n.batch / b.plan.dp);
  cmp("model.causal", m.causal, n.causal);
  cmp("model.position", sharding::position_name(m.position), std::string(sharding::position_name(n.position)));
  cmp("model.rope_theta", m.rope_theta, n.rope_theta);
  cmp("model.norm", sharding::norm_name(m.norm), std::string(sharding::norm_name(n.norm)));
  cmp("model.norm_eps", m.norm_eps, n.norm_eps);
  cmp("model.mlp", sharding::mlp_name(m.mlp), std::string(sharding::mlp_name(n.mlp)));
  cmp("model.tied_embeddings", m.tied_embeddings, n.tied_embeddings);
  cmp("model.attention_impl", sharding::attention_impl_name(m.attention_impl),
      std::string(sharding::attention_impl_name(n.attention_impl)));
  cmp("model.dropout", m.dropout, n.dropout);
  cmp("model.linear_bias", m.linear_bias, n.linear_bias);
  cmp("model.dtype", runtime::dtype_name(m.dtype), std::string(runtime::dtype_name(n.dtype)));
  cmp("model.seed", m.seed, n.seed);
  const auto &p = a.plan, &q = b.plan;
  cmp("chips", a.chips, b.chips);
  cmp("parallel.dp", p.dp, q.dp);
  cmp("parallel.tp", p.tp, q.tp);
  cmp("parallel.cp", p.cp, q.cp);
  cmp("parallel.ulysses", p.ulysses, q.ulysses);
  cmp("parallel.pp", p.pp, q.pp);
  cmp("parallel.schedule", p.schedule, q.schedule);
  cmp("parallel.virtual_stages", p.virtual_stages, q.virtual_stages);
  cmp("parallel.pp_layers", p.pp_layers.size(), q.pp_layers.size());
  for (size_t i = 0; i < p.pp_layers.size() && i < q.pp_layers.size(); ++i)
    cmp("parallel.pp_layers[i]", p.pp_layers[i], q.pp_layers[i]);
  cmp("parallel.sp", p.sp, q.sp);
  cmp("parallel.cp_split", p.zigzag, q.zigzag);
  cmp("parallel.fused", p.fused.enabled, q.fused.enabled);
  cmp("parallel.zero", p.zero, q.zero);
  cmp("parallel.bucket_bytes", p.bucket_bytes, q.bucket_bytes);
  cmp("parallel.recompute", p.recompute, q.recompute);
  cmp("parallel.recompute (selective)", p.selective_recompute, q.selective_recompute);
  cmp("parallel.overlap_grad_reduce", p.overlap_grad_reduce, q.overlap_grad_reduce);
  cmp("parallel.overlap_param_gather", p.overlap_param_gather, q.overlap_param_gather);
  cmp("parallel.algorithm", p.algorithm, q.algorithm);
  cmp("parallel.mesh_dims", p.mesh_dims.size(), q.mesh_dims.size());
  const auto &s = a.train, &t = b.train;
  cmp("train.steps", s.steps, t.steps);
  cmp("train.lr", s.adamw.lr, t.adamw.lr);
  cmp("train.beta1", s.adamw.beta1, t.adamw.beta1);
  cmp("train.beta2", s.adamw.beta2, t.adamw.beta2);
  cmp("train.eps", s.adamw.eps, t.adamw.eps);
  cmp("train.weight_decay", s.adamw.weight_decay, t.adamw.weight_decay);
  cmp("train.max_grad_norm", s.max_grad_norm, t.max_grad_norm);
  return os.str();
}

}  // namespace shardsim::interop

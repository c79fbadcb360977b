#include "sharding/plans/expert_parallel_config.h"

#include <algorithm>
#include <cmath>
#include <sstream>

namespace shardsim::sharding::plans {

namespace {

std::string str(int64_t v) { return std::to_string(v); }

std::vector<int64_t> expert_ffn(const ConfigNode& moe, int64_t experts, const std::string& w) {
  const ConfigNode node = moe.child("expert_ffn");
  if (node.yaml().IsSequence()) {
    std::vector<int64_t> v = moe.get_int_list("expert_ffn");
    if (int64_t(v.size()) != experts)
      node.fail(w + "expert_ffn: a list of " + str(int64_t(v.size())) + " sizes for " + str(experts) +
                " experts (give one size, or one per expert)");
    for (int64_t f : v)
      if (f < 1 || f > MoeBounds::ffn)
        node.fail(w + "expert_ffn: every size must be between 1 and " + str(MoeBounds::ffn) + " (got " + str(f) + ")");
    return v;
  }
  return std::vector<int64_t>(size_t(experts), moe.get_int_in("expert_ffn", 1, MoeBounds::ffn));
}

}  // namespace

kernels::MoeConfig parse_moe_config(const ConfigNode& moe, const ModelSpec& model) {
  const std::string w = moe.path() + ".";
  if (!moe.is_map()) moe.fail(moe.path() + ": expected a map of MoE keys");
  moe.expect_keys(kMoeKeys);
  kernels::MoeConfig c;
  kernels::MoeSpec& s = c.spec;
  s.hidden = model.hidden;
  s.dtype = model.dtype;
  s.gated = model.mlp != MlpKind::gelu;
  s.activation = model.mlp == MlpKind::swiglu ? kernels::Activation::silu : kernels::Activation::gelu;
  s.router.experts = moe.get_int_in("experts", 1, MoeBounds::experts);
  s.router.top_k = moe.get_int_in("top_k", 1, s.router.experts);
  s.expert_ffn = expert_ffn(moe, s.router.experts, w);
  const int64_t shared = moe.get_int_in("shared_experts", 0, MoeBounds::experts, 0);
  s.shared_ffn = moe.get_int_in("shared_ffn", 0, MoeBounds::ffn, 0);
  if (s.shared_ffn == 0) s.shared_ffn = shared * s.expert_ffn.front();
  if (s.shared_ffn > MoeBounds::ffn)
    moe.child("shared_experts").fail(w + "shared_experts: shared_experts x expert_ffn above " + str(MoeBounds::ffn));
  const std::string router = moe.get_string("router", "softmax");
  if (router != "softmax" && router != "sigmoid") moe.child("router").fail(w + "router: '" + router + "' (softmax | sigmoid)");
  s.router.score = kernels::parse_router_score(router);
  s.router.normalize = moe.get_bool("normalize", true);
  s.router.scale = moe.has("scale") ? moe.get_positive_double("scale") : 1.0;
  c.bias_update = moe.get_nonnegative_double("bias_update", 0.0);
  if (c.bias_update > 0) s.router.bias.assign(size_t(s.router.experts), 0.0f);
  s.capacity.factor = moe.get_nonnegative_double("capacity_factor", 0.0);
  const std::string policy = moe.get_string("drop_policy", "probs");
  if (policy != "probs" && policy != "position")
    moe.child("drop_policy").fail(w + "drop_policy: '" + policy + "' (probs | position)");
  s.capacity.policy = kernels::parse_drop_policy(policy);
  s.aux_coef = moe.get_nonnegative_double("aux_loss_coef", 0.0);
  c.dense_layers = moe.get_int_in("dense_layers", 0, model.layers, 0);
  c.layer_step = moe.get_int_in("layer_step", 1, std::max<int64_t>(model.layers, 1), 1);
  const std::string routing = moe.get_string("routing", "uniform");
  if (routing != "uniform" && routing != "zipf") moe.child("routing").fail(w + "routing: '" + routing + "' (uniform | zipf)");
  c.routing.skew = routing == "zipf" ? moe.get_nonnegative_double("skew", 1.0) : 0.0;
  if (routing == "uniform" && moe.has("skew")) moe.child("skew").fail(w + "skew: only used with routing: zipf");
  c.routing.seed = uint64_t(moe.get_int_in("routing_seed", 0, INT64_MAX, int64_t(model.seed)));
  return c;
}

std::string moe_text(const kernels::MoeConfig& c) {
  const kernels::MoeSpec& s = c.spec;
  std::ostringstream o;
  o << "moe " << s.experts() << " experts top-" << s.router.top_k << " (expert ffn " << s.expert_ffn.front();
  bool uniform = true;
  for (int64_t f : s.expert_ffn) uniform = uniform && f == s.expert_ffn.front();
  if (!uniform) o << " .. (per expert)";
  if (s.shared_ffn > 0) o << ", shared ffn " << s.shared_ffn;
  o << ", " << kernels::router_score_name(s.router.score) << " router";
  if (s.capacity.factor > 0)
    o << ", capacity factor " << s.capacity.factor << " (" << kernels::drop_policy_name(s.capacity.policy) << ")";
  else o << ", dropless";
  if (s.aux_coef > 0) o << ", aux loss " << s.aux_coef;
  if (c.dense_layers > 0) o << ", first " << c.dense_layers << " layers dense";
  if (c.layer_step > 1) o << ", every " << c.layer_step << "th layer";
  o << ")";
  return o.str();
}

std::string ep_obstacle(int64_t experts, int ep) {
  if (ep >= 1 && experts % ep == 0) return "";
  return std::to_string(experts) + " experts do not split over ep = " + std::to_string(ep) +
         " (model.moe.experts must be a multiple of parallel.ep)";
}

}  // namespace shardsim::sharding::plans

#include "models/executor_config.h"

#include <stdexcept>
#include <string>
#include <vector>

#include "models/lm_model.h"
#include "sharding/engine_config.h"
#include "sharding/plans/expert_parallel_config.h"

namespace shardsim::models {

namespace {
bool is_mlp(const ConfigNode& root) {
  return root.has("workload") && root.child("workload").is_map() &&
         sharding::spec_use_of(root.child("workload")) == sharding::SpecUse::mlp;
}
}  // namespace

void check_executor_root_keys(const ConfigNode& root, bool serve) {
  // The MLP-only workload (model.kind mlp) is the model with attention off, x + mlp(rmsnorm(x)) per layer: its
  // checkpoint: section is run's (train writes only with --checkpoint).
  const bool mlp = is_mlp(root);
  std::vector<std::string_view> keys(std::begin(sharding::kTrainRootKeys), std::end(sharding::kTrainRootKeys));
  keys.push_back("validate");  // run's validate: section (a block config trains with its validation setting)
  if (mlp) keys.push_back("checkpoint");
  if (serve) keys.push_back("serve");
  root.expect_keys(keys);
  if (mlp && root.has("checkpoint")) {
    const ConfigNode ck = root.child("checkpoint");
    ck.expect_keys({"path", "enabled"});
    (void)ck.get_bool("enabled", true);
    if (ck.has("path")) (void)ck.get_string("path");
  }
}

ExecutorConfig read_executor_config(const ConfigNode& root, int64_t chips, bool forward, bool serve) {
  if (!root.has("workload")) root.fail("model: missing (the language model's sizes: vocab, hidden, layers, ...)");
  ExecutorConfig e;
  e.mlp = is_mlp(root);
  const ConfigNode m = root.child("workload");
  // The model keys by the MLP's rules (model.kind mlp) or the language model's; the plan by the executor's (every
  // plan key, dp filling the chips left by the rest).
  e.spec = sharding::parse_model_spec(m, e.mlp ? sharding::SpecUse::mlp : sharding::SpecUse::train);
  if (serve) e.spec.batch = 0;  // serving's batches come from its scheduler: model.batch is unused
  // serve runs the executor's forward only (its serving mode): the plan checks of the forward mode (e.g. tp above
  // the KV heads, each chip holding its query heads' KV head) and the serving mode's refusals (the registry's).
  e.plan = sharding::parse_parallel_plan(root, e.spec, sharding::SpecUse::train, chips,
                                         sharding::train_section_recompute(root), forward, serve);
  if (e.spec.batch == 0) e.spec.batch = e.plan.dp;  // a block stack: one sequence per data-parallel replica
  e.train = sharding::parse_train_spec(root);
  e.has_train_section = root.has("train");
  sharding::ModelSpec& c = e.model;
  c = e.spec;
  const sharding::ParallelPlan& plan = e.plan;
  // A MoE model's reference routes each chip's micro-batch as its own token group (capacity and aux loss); with a
  // sequence split over chips (sp, cp, Ulysses) each chip drops over its own rows: the group's capacity pieces.
  try {
    if (c.moe) {
      kernels::CapacityOptions& cap = c.moe->spec.capacity;
      cap.groups = lm_moe_groups(c.batch, c.micro_batch, int64_t{plan.dp} * plan.ep);
      const int cp_axis = plan.ulysses > 1 ? plan.ulysses : plan.cp;
      sharding::plans::split_capacity_over_chips(cap, c.seq, c.batch / cap.groups, cp_axis,
                                                 plan.zigzag && plan.ulysses <= 1,
                                                 plan.sp && plan.etp <= 1 ? plan.tp : 1);  // etp: tp rows gathered
    }
    check_lm_config(c);
  } catch (const std::invalid_argument& ex) {
    m.fail(ex.what());
  }
  if (c.mlp == sharding::MlpKind::geglu && !forward)  // run computes its forward; the backward kernel is missing
    m.fail(std::string(e.mlp ? "activation: gelu (a GeGLU MLP)" : "mlp: geglu") +
           " trains not yet (its backward is not implemented; swiglu | gelu); `shardsim run` computes its forward");
  return e;
}

}  // namespace shardsim::models

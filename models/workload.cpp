#include "models/workload.h"

#include "collectives/algorithms.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <thread>

#include "collectives/algorithms.h"
#include "collectives/registry.h"
#include "common/error.h"
#include "runtime/chips.h"
#include "runtime/job_text.h"
#include "kernels/gemm.h"
#include "checkpoint/checkpoint.h"
#include "sharding/engine_config.h"
#include "sharding/model_spec.h"
#include "models/trace.h"
#include "topology/topology_yaml.h"

namespace shardsim::sharding {

using runtime::Tensor;

namespace {

RunConfig parse(const ConfigNode& root) {
  RunConfig c;
  c.file = root.file();
  c.text = root.text();
  root.expect_keys(kMlpRootKeys);
  c.name = root.get_string("name", "");
  c.topology = load_workload_topology(root);
  c.device = load_workload_device(root);
  c.shape_only = load_workload_shape_only(root);

  // The model and the plan through the one parser (sharding/model_spec.h).
  const auto w = root.child("workload");
  if (spec_use_of(w) != SpecUse::mlp) w.child("kind").fail(w.path() + ".kind: expected mlp");
  const ModelSpec spec = parse_model_spec(w, SpecUse::mlp);
  c.model = spec.label;
  c.mlp.hidden = spec.hidden;
  c.mlp.ffn = spec.ffn;
  c.mlp.tokens = spec.seq;
  c.mlp.activation = spec.glu_activation();
  c.mlp.dtype = spec.dtype;
  c.mlp.seed = spec.seed;
  const ParallelPlan plan = parse_parallel_plan(root, spec, SpecUse::mlp, c.topology.num_chips());
  c.tp = plan.tp;
  c.dp = plan.dp;
  c.all_reduce_algorithm = plan.algorithm_for(PlanCollective::tp_all_reduce);
  c.fused = plan.fused;
  c.mesh = mesh_from_config(root, plan, c.topology);

  try {
    check_mlp_fits(c.mlp, c.tp, c.device.usable_hbm_bytes() / sim::Memory::kGiB);
  } catch (const ConfigError& e) {
    root.child("workload").fail(std::string(e.what()) + hbm_capacity_note(c.device));
  }

  c.tolerance = c.mlp.dtype == runtime::DType::fp32 ? 1e-5 : 1.0 / 64.0;
  if (root.has("validate")) {
    const auto v = root.child("validate");
    v.expect_keys(kValidateKeys);
    c.validate = v.get_bool("enabled", true);
    if (v.has("tolerance")) c.tolerance = v.get_positive_double("tolerance");
  }
  c.checkpoint_path = (c.name.empty() ? std::string("shardsim_run") : c.name) + ".h5";
  if (root.has("checkpoint")) {
    const auto k = root.child("checkpoint");
    k.expect_keys(kCheckpointKeys);
    c.checkpoint = k.get_bool("enabled", true);
    c.checkpoint_path = k.get_string("path", c.checkpoint_path);
  }
  return c;
}

}  // namespace

BlockConfig mlp_block_config(const RunConfig& c) {
  BlockConfig b;
  b.file = c.file;
  b.name = c.name;
  b.model = c.model;
  b.text = c.text;
  b.topology = c.topology;
  b.device = c.device;
  b.shape = mlp_block_shape(c.mlp);
  b.plan.tp = c.tp;
  b.plan.dp = c.dp;
  b.plan.fused = c.fused;
  b.plan.tp_all_reduce = c.all_reduce_algorithm;
  b.mesh = c.mesh;
  b.validate = c.validate;
  b.tolerance = c.tolerance;
  b.shape_only = c.shape_only;
  return b;
}

RunConfig parse_run_config(const std::string& text, const std::string& file) {
  return parse(workload_config_from_text(text, file));
}

RunConfig parse_run_config(const ConfigNode& root) { return parse(root); }

RunConfig load_run_config(const std::string& file) {
  return parse(load_workload_config(file));
}

MlpTensorSpecs mlp_tensor_specs(const MlpShape& s) {
  MlpTensorSpecs t;
  t.x = {"activations/input", {s.tokens, s.hidden}, {}};
  t.w_gate = {"weights/w_gate", {s.hidden, s.ffn}, {{"tp", Shard{1}}}};
  t.w_up = {"weights/w_up", {s.hidden, s.ffn}, {{"tp", Shard{1}}}};
  t.w_down = {"weights/w_down", {s.ffn, s.hidden}, {{"tp", Shard{0}}}};
  t.y_partial = {"y (before the all_reduce)", {s.tokens, s.hidden}, {{"tp", Partial{collectives::ReduceOp::sum}}}};
  t.y = {"activations/output", {s.tokens, s.hidden}, {}};
  return t;
}

std::optional<std::string> checkpoint_target(const RunConfig& cfg, const RunOptions& opt) {
  if ((cfg.shape_only || opt.shape_only) && !opt.checkpoint_path) return std::nullopt;  // no data to write
  if (opt.no_checkpoint || (!cfg.checkpoint && !opt.checkpoint_path)) return std::nullopt;
  return opt.checkpoint_path.value_or(cfg.checkpoint_path);
}

std::string hbm_capacity_note(const sim::DeviceSpec& d) {
  char b[200];
  std::snprintf(b, sizeof b, " (device %s: %.4g GiB HBM less %.4g GiB kept in reserve, device.hbm_reserve_gib)",
                d.name.c_str(), d.hbm_gib, d.hbm_reserve_gib);
  return b;
}

void check_world_size(const RunConfig& cfg, int world_size) {
  const int chips = cfg.topology.num_chips();
  if (world_size != chips)
    throw ConfigError(cfg.file + ": the topology has " + std::to_string(chips) + " chips but the job has " +
                      runtime::job_size_text(world_size) + "; run it with " + runtime::resize_hint(chips, world_size));
}


}  // namespace shardsim::sharding

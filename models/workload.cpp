#include "models/workload.h"

#include "collectives/algorithms.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <thread>

#include "collectives/algorithms.h"
#include "collectives/registry.h"
#include "common/error.h"
#include "runtime/chips.h"
#include "kernels/gemm.h"
#include "checkpoint/checkpoint.h"
#include "sharding/engine_config.h"
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

  const auto w = root.child("workload");
  w.expect_keys(kMlpModelKeys);
  const std::string kind = w.get_string("kind");
  if (kind != "mlp") w.child("kind").fail(w.path() + ".kind: unknown workload '" + kind + "' (known: mlp)");
  c.model = w.get_string("model", "");
  c.mlp.hidden = w.get_positive_int("hidden");
  c.mlp.ffn = w.get_positive_int("ffn");
  c.mlp.tokens = w.get_positive_int("tokens");
  try {
    c.mlp.activation = kernels::parse_activation(w.get_string("activation", "silu"));
  } catch (const std::invalid_argument& e) {
    w.child("activation").fail(w.path() + ".activation: " + e.what());
  }
  try {
    c.mlp.dtype = runtime::parse_dtype(w.get_string("dtype", "fp32"));
  } catch (const std::invalid_argument& e) {
    w.child("dtype").fail(w.path() + ".dtype: " + e.what());
  }
  const int64_t seed = w.get_int("seed", 1234);
  if (seed < 0) w.child("seed").fail(w.path() + ".seed: must be >= 0");
  c.mlp.seed = static_cast<uint64_t>(seed);

  const int chips = c.topology.num_chips();
  if (root.has("parallel")) {
    const auto p = root.child("parallel");
    p.expect_keys(kMlpParallelKeys);
    c.dp = static_cast<int>(p.get_positive_int("dp", 1));
    if (chips % c.dp != 0)
      p.child("dp").fail("parallel.dp: " + std::to_string(c.dp) + " does not divide the topology's " +
                         std::to_string(chips) + " chips");
    c.tp = static_cast<int>(p.get_positive_int("tp", chips / c.dp));
    if (p.has("all_reduce")) {
      const std::string a = p.get_string("all_reduce");
      if (const auto why = collectives::algorithm_name_error(collectives::Collective::all_reduce, a); !why.empty())
        p.child("all_reduce").fail("parallel.all_reduce: " + why);
      c.all_reduce_algorithm = a;
    }
    c.fused = parse_fused_plan(p, c.tp, c.mlp.tokens, c.mlp.hidden);  // the output y [tokens, hidden]
  } else {
    c.tp = chips;
  }
  if (int64_t{c.tp} * c.dp != chips)
    root.child("parallel").fail("parallel.tp: tp " + std::to_string(c.tp) +
                                (c.dp > 1 ? " x dp " + std::to_string(c.dp) : std::string()) + " must equal the topology's chip count (" +
                                std::to_string(chips) +
                                "): the MLP is sharded by tensor parallelism over all chips of a data-parallel replica");
  c.mesh = mesh_from_config(root, {{"tp", c.tp}, {"dp", c.dp}}, c.topology);
  if (c.mlp.ffn < c.tp)
    root.child("workload").fail(w.path() + ".ffn: " + std::to_string(c.mlp.ffn) + " is smaller than tp=" +
                                std::to_string(c.tp) + ": some chips would hold no FFN column");

  try {
    check_mlp_fits(c.mlp, c.tp, c.device.hbm_gib);
  } catch (const ConfigError& e) {
    root.child("workload").fail(std::string(e.what()) + " (device " + c.device.name + ")");
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

// Generated from the placements: the style of each weight on the tp axis and the reduction of the partial output.
std::string mlp_plan_text(const MlpShape& s, const BlockPlan& p) {
  const MlpTensorSpecs t = mlp_tensor_specs(s);
  const Placement up = t.w_gate.on("tp"), down = t.w_down.on("tp"), y = t.y_partial.on("tp");
  std::ostringstream os;
  os << "tensor parallel tp=" << p.tp << " (Megatron MLP: gate/up " << parallel_style(up) << " " << to_string(up)
     << ", down " << parallel_style(down) << " " << to_string(down) << ", all_reduce("
     << collectives::reduce_op_name(std::get<Partial>(y).op) << ") of the output)";
  if (p.fused.enabled)
    os << "; fused: down projection + all_reduce as one gemm_all_reduce (" << p.fused.describe() << ")";
  if (p.dp > 1) os << " x dp=" << p.dp << " (data parallel replicas)";
  return os.str();
}

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
  b.plan.all_reduce = c.all_reduce_algorithm;
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

void check_world_size(const RunConfig& cfg, int world_size) {
  const int chips = cfg.topology.num_chips();
  if (world_size != chips)
    throw ConfigError(cfg.file + ": the topology has " + std::to_string(chips) + " chips but the job has " +
                      std::to_string(world_size) + " ranks; run it with mpirun -np " + std::to_string(chips));
}


}  // namespace shardsim::sharding

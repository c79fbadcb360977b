#include "models/runner.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <map>
#include <utility>
#include <vector>

#include "common/error.h"
#include "common/output_file.h"
#include "runtime/job_text.h"
#include "models/profile_plots.h"
#include "runtime/chips.h"
#include "runtime/host_memory.h"

namespace shardsim::sharding {

ModelConfig parse_model_config(const ConfigNode& root) {
  ModelConfig c;
  if (is_block_config(root)) {
    c.kind = ModelConfig::Kind::transformer_block;
    c.block = parse_block_config(root, root.file());
  } else {
    c.kind = ModelConfig::Kind::mlp;
    c.mlp = parse_run_config(root);
    c.block = mlp_block_config(c.mlp);
  }
  return c;
}

ModelConfig load_model_config(const std::string& file, const ConfigOverrides& overrides) {
  return parse_model_config(load_workload_config(file, overrides));
}

std::shared_ptr<const ModelConfig> load_model_config_shared(const std::string& file,
                                                            const ConfigOverrides& overrides) {
  if (!runtime::chip_mode()) return std::make_shared<const ModelConfig>(load_model_config(file, overrides));
  struct Entry {
    std::shared_ptr<const ModelConfig> config;
    std::exception_ptr error;
  };
  // Fibers of one thread: no locking. Keyed by what was asked, so a different request parses again.
  static std::map<std::string, Entry> memo;
  const std::string key = file + "\n" + overrides.describe() + (overrides.switched ? " --switch" : "") +
                          (overrides.fully_connected ? " --fully-connected" : "");
  auto it = memo.find(key);
  if (it == memo.end()) {
    Entry e;
    try {
      e.config = std::make_shared<const ModelConfig>(load_model_config(file, overrides));
    } catch (...) {
      e.error = std::current_exception();
    }
    it = memo.emplace(key, std::move(e)).first;
  }
  if (it->second.error) std::rethrow_exception(it->second.error);
  return it->second.config;
}

std::optional<std::string> model_checkpoint_target(const ModelConfig& c, const RunOptions& opt) {
  // Shape-only runs hold no data: no checkpoint unless one is asked for (which check_run refuses).
  if (c.shape_only() || opt.shape_only) {
    if (opt.checkpoint_path && !opt.no_checkpoint) return *opt.checkpoint_path;
    return std::nullopt;
  }
  if (c.kind == ModelConfig::Kind::mlp) return checkpoint_target(c.mlp, opt);
  // A block writes a checkpoint only when asked (--checkpoint): its weights come from the seed.
  if (opt.checkpoint_path && !opt.no_checkpoint) return *opt.checkpoint_path;
  return std::nullopt;
}

namespace {
// Shape-only runs store no tensor, but each chip keeps per-token bookkeeping: measured 16-20 bytes per token on
// each chip (peak RSS: configs/workloads/small_mlp.yaml at 4 and 16 chips of one rank up to 16,777,216 tokens, the
// llama2_7b_tp8 block at seq 1M), estimated at 24 bytes per token of the whole batch x seq on every chip of this
// host (cp and dp would divide it: not counted). Exit 3 beyond 90% of the host's available memory (the 2^24-token
// MLP on 128 chips of one rank would need ~40 GB; the kernel killed such runs with no line).
void check_shape_only_host_memory(const ModelConfig& c) {
  const double tokens = double(std::max<int64_t>(c.block.shape.batch, 1)) * double(c.block.shape.seq);
  const int chips = runtime::node_ranks() * runtime::chips_per_rank();
  const double need = 24.0 * tokens * chips, avail = runtime::mem_available_bytes();
  if (avail > 0 && need > 0.9 * avail) {
    char b[320];
    std::snprintf(b, sizeof b, ": needs about %.3g GiB of host memory for the shape-only run's bookkeeping (%.3g "
                  "tokens x 24 bytes x %d chips on this host), but only %.3g GiB is available; use fewer tokens "
                  "or chips per host", need / 1073741824.0, tokens, chips, avail / 1073741824.0);
    throw RuntimeFault(c.file() + b);
  }
}
}  // namespace

void check_run(const runtime::World& world, const ModelConfig& c, const RunOptions& opt,
               const std::string& json_path) {
  const int chips = c.topology().num_chips();
  if (chips != world.size())
    throw ConfigError(c.file() + ": the topology has " + std::to_string(chips) + " chips but the job has " +
                      runtime::job_size_text(world.size()) + "; run it with " +
                      runtime::resize_hint(chips, world.size()));
  if (opt.no_checkpoint && opt.checkpoint_path.has_value())
    throw UsageError("--checkpoint and --no-checkpoint contradict each other");
  const bool shape_only = c.shape_only() || opt.shape_only;
  if (shape_only) {
    const std::string why = opt.shape_only ? "--shape-only" : c.file() + ": mode: shape_only";
    if (opt.checkpoint_path)
      throw UsageError("--checkpoint: a shape-only run (" + why + ") holds no data to checkpoint; drop --checkpoint");
    if (!opt.resume_from.empty())
      throw UsageError("--resume: a shape-only run (" + why + ") loads no weights; drop --resume");
  }
  if (c.kind == ModelConfig::Kind::transformer_block && c.block.shape.layers > 1) {
    if (!opt.resume_from.empty() || opt.checkpoint_path)
      throw UsageError(c.file() + ": checkpoints of a transformer_block hold one layer; workload.layers is " +
                       std::to_string(c.block.shape.layers) + " (drop --checkpoint/--resume or set layers: 1)");
  }
  if (!opt.resume_from.empty() && ::access(opt.resume_from.c_str(), R_OK) != 0)
    throw UsageError("--resume " + opt.resume_from + ": cannot read: " + std::strerror(errno));
  if (!shape_only) check_host_memory(c.block);
  else check_shape_only_host_memory(c);
  // Every output: its directory must be writable, it must not be a directory, and no two outputs (nor an output
  // and the config) may be the same file, even before they exist (common/output_file.h). Resuming from the
  // checkpoint path itself is fine: it is replaced atomically only after the run.
  std::vector<std::pair<std::string, std::string>> outputs;  // {what, path}
  if (const auto ckpt = model_checkpoint_target(c, opt)) {
    (void)resolve_file_output(*ckpt, "checkpoint");  // HDF5 seeks: never /dev/stdout, a pipe or a device
    outputs.emplace_back("checkpoint", *ckpt);
  }
  if (!json_path.empty()) outputs.emplace_back("--json", json_path);
  if (!opt.trace_path.empty()) outputs.emplace_back("--trace", opt.trace_path);
  if (!opt.trace_path.empty()) (void)resolve_trace_filter(opt.trace, c.block.topology, &c.block.mesh);
  for (auto& o : check_plots_dir(opt.plots_dir)) outputs.push_back(std::move(o));
  check_outputs_distinct(outputs, {{"the config file", c.file()}});
}

RunReport run_model(const runtime::World& world, const ModelConfig& c, const RunOptions& opt) {
  // One runner for every model: the MLP is a layer stack without attention (models/workload.h's mlp_block_config).
  // --shape-only (opt.shape_only) overrides the config's mode.
  BlockRunOptions bo;
  bo.trace_path = opt.trace_path;
  bo.trace = opt.trace;
  bo.profile = opt.profile;
  bo.plots_dir = opt.plots_dir;
  bo.resume_from = opt.resume_from;
  bo.shape_only = opt.shape_only;
  if (const auto ckpt = model_checkpoint_target(c, opt)) bo.checkpoint_path = *ckpt;
  return run_block(world, c.block, bo);
}

}  // namespace shardsim::sharding

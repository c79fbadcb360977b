// The one runner of `shardsim run` and the sweep: a model config (a stack of layers: the MLP workload is one MLP
// layer, a transformer_block an attention sublayer then the MLP sublayer, both with sharding/plans/block.h's mlp_layer and block_forward)
// is loaded by one function, checked by one function and run by one function, which returns the one report
// type (models/report.h's RunReport: to_text, to_json).
//
// Compute or only charge cost: every layer charges its kernels to the chip's simulated timeline through
// sharding/plans/block_ops.h's plans::Chip (plans::gemm, plans::rmsnorm, mlp_layer, the plan units) and its
// collectives through runtime::Transport, computing the real data in the same calls. Shape-only mode (config
// mode: shape_only or run --shape-only) makes the weights and inputs shape-only tensors (runtime/tensor.h) and the
// Transport header-only: the same calls then only charge their cost (kernels/kernel_cost.h's rule), so every
// simulated figure equals the real-data run's (tests/e2e/shape_only_models.sh checks every config). No
// validation, no checkpoint (--checkpoint and --resume are refused, exit 2).
//
// Errors: ConfigError / UsageError (exit 2) from load/check, identical on every rank; run_model's own
// failures after the agreement point are RuntimeFault (exit 3).
#pragma once

#include <memory>
#include <string>

#include "common/config.h"
#include "models/report.h"
#include "models/transformer.h"
#include "models/workload.h"
#include "runtime/world.h"
#include "sharding/engine_config.h"

namespace shardsim::sharding {

// The model description run_model runs: BLOCK, a stack of layers (models/transformer.h's BlockConfig; the MLP
// workload is one layer without attention, shape.attention false). MLP keeps what only the MLP's config schema
// says (its checkpoint: section; the sweep's chip-count check).
struct ModelConfig {
  enum class Kind { mlp, transformer_block };
  Kind kind = Kind::mlp;
  RunConfig mlp;      // kind == mlp: the MLP config as parsed
  BlockConfig block;  // every kind: the layer stack that runs
  const std::string& file() const { return block.file; }
  const topology::Topology& topology() const { return block.topology; }
  bool shape_only() const { return block.shape_only; }
};

// ROOT as load_workload_config returns it (model:/workload: section, overrides applied); dispatches on
// model.kind (mlp | transformer_block) to the layer stack's parser. ConfigError naming FILE:LINE.
ModelConfig parse_model_config(const ConfigNode& root);
ModelConfig load_model_config(const std::string& file, const ConfigOverrides& overrides = {});
// The same, shared: with several chips per rank (runtime/chips.h) the rank's chips (fibers of one thread) all load
// the same FILE and OVERRIDES, and only the first parses it (YAML, topology, the parse-time HBM replay of every
// chip: O(chips) each, so O(chips^2) per rank otherwise); the others get the same immutable config, or the same
// error. With one chip per rank: load_model_config.
std::shared_ptr<const ModelConfig> load_model_config_shared(const std::string& file,
                                                            const ConfigOverrides& overrides = {});

// Everything `run` checks before anything runs (collective: call on every rank inside World::agree): the world
// size equals the chip count; one chip per rank where the model needs it; --resume readable; outputs (checkpoint,
// --json JSON_PATH, --trace) distinct, writable and not the config; host memory. Throws ConfigError/UsageError.
void check_run(const runtime::World& world, const ModelConfig& config, const RunOptions& options,
               const std::string& json_path);

// The checkpoint this run writes, or none: MLP as checkpoint_target (config's checkpoint: section or
// --checkpoint); a transformer block only with --checkpoint.
std::optional<std::string> model_checkpoint_target(const ModelConfig& config, const RunOptions& options);

// Runs the model on WORLD (collective); the report is complete on rank 0.
RunReport run_model(const runtime::World& world, const ModelConfig& config, const RunOptions& options);

}  // namespace shardsim::sharding

// The one loader's reading of a config for the executor (models/lm_tp.h): what `run`, `train` and `serve`
// (apps/train_setup.cpp's load) and every workload point of a sweep (experiments/sweep.cpp) read from the model:,
// parallel: and train: sections, with the same rules in the same order. The topology, the device and the
// command-line flags stay with the callers.
//
// Errors: ConfigError "FILE:LINE: key: ..." (exit 2) naming the key: an unknown root key, a missing model:
// section, every rule of the one parser (sharding/model_spec.h), a model the reference refuses (check_lm_config),
// a MoE model's capacity that does not split over the plan's chips, and a GeGLU MLP outside the forward mode.
#pragma once

#include <cstdint>

#include "common/config.h"
#include "sharding/model_spec.h"

namespace shardsim::models {

struct ExecutorConfig {
  sharding::ModelSpec spec;   // the model: section (a block stack without batch: one sequence per dp replica)
  // The executor's model: SPEC with, for a MoE model, the reference's token groups in moe->spec.capacity (each
  // chip's micro-batch routed as its own group; its pieces with sp, cp and Ulysses).
  sharding::ModelSpec model;
  sharding::ParallelPlan plan;
  sharding::TrainSpec train;
  bool mlp = false;                // model.kind mlp: the block with attention off
  bool has_train_section = false;  // the config has a train: section
};

// ROOT's keys: train's (sharding/engine_config.h kTrainRootKeys), validate:, checkpoint: with model.kind mlp
// (run's section, checked here), serve: when SERVE. ConfigError naming an unknown key.
void check_executor_root_keys(const ConfigNode& root, bool serve);

// ROOT (loaded by sharding/engine_config.h: the model: section as workload:) on CHIPS chips. FORWARD: the
// executor's forward mode (`run`); SERVE: serving (model.batch unused: the scheduler's batches).
ExecutorConfig read_executor_config(const ConfigNode& root, int64_t chips, bool forward, bool serve);

}  // namespace shardsim::models

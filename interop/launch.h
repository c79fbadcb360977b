// What the launch-argument importers and exporters share (megatron.h, torchtitan.h): the import's own options, the
// shardsim config an export reads, and the check that a written config loads with shardsim's one parser.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "interop/imported.h"
#include "sharding/model_spec.h"

namespace shardsim::interop {

// Options of `shardsim import megatron|torchtitan`.
struct LaunchOptions {
  int64_t world_size = 0;  // GPUs of the job (0: from the source: torchrun's --nnodes x --nproc_per_node)
  int64_t steps = 1;       // train.steps written (the source's iteration count is a run length, not a plan)
  int64_t vocab = 0;       // vocabulary size when the source names only a tokenizer file (0: from the source)
  std::string label;       // model.model; "" = from the source
};

// A shardsim training config as the exporters read it: the parsed model, plan and training loop on CHIPS chips.
struct PlanSource {
  sharding::ModelSpec spec;
  sharding::ParallelPlan plan;
  sharding::TrainSpec train;
  int64_t chips = 0;
  std::string where;  // the config's path
};
// Loads the training config FILE (`shardsim train`'s format) with the one parser. The chips: CHIPS when > 0, else
// the topology's chip count when the config has one, else the product of the plan's axes (dp 1 when not given: the
// config as `shardsim train` runs it on one chip per axis product). ConfigError (exit 2) naming the file's line.
// PLAN / SET: `--plan` and `--set` overrides as `train` takes them (sharding/engine_config.h), e.g. a sweep winner's plan.
PlanSource load_plan_source(const std::string& file, int64_t chips = 0, const std::string& plan = "",
                            const std::vector<std::string>& set = {});

// Parses YAML (a config an importer wrote, named WHERE in messages) with the one parser (model, plan on CHIPS chips,
// or the plan's own product when CHIPS is 0, train section): ConfigError naming WHERE's key if it does not load.
// Returns the parsed config.
PlanSource check_loads(const std::string& yaml, const std::string& where, int64_t chips);

// The parameters of MODEL as `shardsim train` counts them (models/lm_model.h lm_param_count).
int64_t param_count(const sharding::ModelSpec& model);

// Why two parsed configs differ ("" when their model, plan and training loop are equal): the first field that
// differs, as "model.hidden: 4096 vs 8192". For the round-trip tests (import(export(C)) = C).
std::string first_difference(const PlanSource& a, const PlanSource& b);

// One line of an export's "not expressible" list.
struct Unexpressed {
  std::string key;  // "parallel.mesh_dims"
  std::string why;
};

}  // namespace shardsim::interop

// torchtitan job TOML in and out (torchtitan/config/job_config.py defines the sections and defaults; docs/IMPORT.md
// has the table of every key read, ignored or refused).
//
// Import: [model] name "llama3" with flavor 8B, 70B or 405B (torchtitan's llama3 model args: dim, n_layers,
// n_heads, n_kv_heads, ffn_dim_multiplier, multiple_of, rope_theta; vocabulary 128,256 of the Llama 3 tokenizer),
// or a [shardsim_model] table of model: keys that an export writes for shapes that are no torchtitan flavor;
// [training] (batch_size or local_batch_size / global_batch_size, seq_len, max_norm, mixed_precision_param, seed,
// steps), [parallelism] (data_parallel_replicate_degree / data_parallel_shard_degree with -1 = the rest,
// tensor_parallel_degree, context_parallel_degree, pipeline_parallel_degree and _schedule, _microbatch_size,
// _layers_per_stage, _split_points, enable_async_tensor_parallel, fsdp_reshard_after_forward),
// [activation_checkpoint], [optimizer]; the older spellings of torchtitan's [experimental] section too.
//
// Errors (ConfigError, exit 2): "FILE:LINE: ..." for TOML that does not parse (a truncated file, a table defined
// twice), "FILE:LINE: [section] key: ..." for a value of the wrong type or out of bounds, degrees whose product is not
// the world size, an unknown model name or flavor; values echoed escaped.
#pragma once

#include <string>
#include <vector>

#include "interop/imported.h"
#include "interop/launch.h"

namespace shardsim::interop {

Imported import_torchtitan(const std::string& path, const LaunchOptions& opt = {});
Imported import_torchtitan_text(const std::string& text, const std::string& where, const LaunchOptions& opt = {});

// The job TOML of SRC's model and plan. What torchtitan cannot express is listed as comment lines at the top
// ("# not expressible ..."), also returned in UNEXPRESSED when given.
std::string export_torchtitan(const PlanSource& src, std::vector<Unexpressed>* unexpressed = nullptr);

}  // namespace shardsim::interop

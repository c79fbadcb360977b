// The MLP workload's config (a file `shardsim run` takes with model.kind: mlp) and its translation into the one
// runner's model description (mlp_block_config: a layer stack without attention, run by models/runner.h's run_model).
//
//   name: llama2-7b-mlp-tp8          # optional, for the report
//   topology: {...}                  # topology/topology_yaml.h
//   device: {...}                    # sim/device_spec.h
//   workload:
//     kind: mlp                      # the gated MLP of models/mlp.h
//     model: llama-2-7b              # optional label
//     hidden: 4096
//     ffn: 11008
//     tokens: 512
//     activation: silu               # silu (SwiGLU) | gelu (GeGLU)
//     dtype: fp32                    # fp32 | bf16
//     seed: 1234
//   parallel:
//     tp: 8                          # tensor-parallel size; tp x dp must equal the chip count (default chips / dp)
//     dp: 1                          # data-parallel replicas: replica d runs rows d·tokens.. of a seeded
//                                    # [dp·tokens, hidden] input with the same weights (no dp communication)
//     mesh_dims: [0]                 # optional: topology dimensions the mesh fills (sharding/device_mesh.h)
//     all_reduce: ring               # algorithm of the output all_reduce: ring (default), bidir_ring, torus,
//                                    # halving_doubling or auto (collectives/algorithms.h)
//     fused: false                   # true: the down projection runs fused with the all_reduce (gemm_all_reduce
//                                    # of sharding/fused.h), each piece's all_reduce with the algorithm above
//     chunks: auto                   # with fused: pieces, or auto (the modelled best of 1, 2, 4, ... 64)
//   validate:
//     enabled: true                  # compare against the single-device reference on rank 0
//     tolerance: 1e-5                # max |y - y_ref| / max |y_ref|; default 1e-5 fp32, 2^-6 bf16
//   checkpoint:
//     path: out.h5                   # where the checkpoint goes (relative to the working directory)
//     enabled: true
//
// Errors: ConfigError "FILE:LINE: ..." (exit 2) for every problem found in the file, including a chip
// count that differs from the MPI world size.
#pragma once

#include <optional>
#include <string>

#include "models/trace_filter.h"
#include "common/config.h"
#include "runtime/world.h"
#include "sharding/device_mesh.h"
#include "models/mlp.h"
#include "sharding/placement.h"
#include "models/report.h"
#include "sim/device_spec.h"
#include "topology/topology.h"

namespace shardsim::sharding {

struct RunConfig {
  std::string file;  // path it was loaded from
  std::string text;  // the YAML as written (stored in the checkpoint)
  std::string name;
  std::string model;
  topology::Topology topology;
  sim::DeviceSpec device;
  MlpShape mlp;
  int tp = 1;
  int dp = 1;       // data-parallel replicas of the tp plan
  DeviceMesh mesh;  // tp (innermost) x dp over every chip, placed on the topology (its placement() is the mesh's)
  std::string all_reduce_algorithm = "ring";
  FusedPlan fused;  // parallel.fused / parallel.chunks
  bool shape_only = false;  // mode: shape_only (models/transformer.h's BlockConfig::shape_only)
  bool validate = true;
  double tolerance = 0;
  bool checkpoint = true;
  std::string checkpoint_path;
};

// The keys the MLP's parser accepts per section (docs/CONFIG.md documents each; tests/unit/config_doc_test.cpp
// checks). The model: section is read as workload: (sharding/engine_config.h).
inline constexpr std::string_view kMlpRootKeys[] = {"name",     "topology", "device",     "workload",
                                                    "parallel", "validate", "checkpoint", "mode"};
inline constexpr std::string_view kCheckpointKeys[] = {"path", "enabled"};

RunConfig load_run_config(const std::string& file);
// Parses a config given as text (FILE is used in messages).
RunConfig parse_run_config(const std::string& text, const std::string& file);
// Parses a loaded config (sharding/engine_config.h's load_workload_config: new-style sections, overrides).
RunConfig parse_run_config(const ConfigNode& root);

// The placements of the MLP's tensors on the mesh (Megatron: W_gate/W_up column-parallel Shard(1), W_down
// row-parallel Shard(0), x replicated, y Partial(sum) before the all_reduce): the plan line and the checkpoint's
// placement attributes are generated from them.
struct MlpTensorSpecs {
  TensorSpec x, w_gate, w_up, w_down, y_partial, y;
};
MlpTensorSpecs mlp_tensor_specs(const MlpShape& s);

struct RunOptions {
  std::string resume_from;          // load weights (and input) from this checkpoint instead of the seed
  std::optional<std::string> checkpoint_path;  // overrides the config's
  bool no_checkpoint = false;
  std::string trace_path;           // write a Chrome trace of the simulated timelines here
  TraceOptions trace;               // its filters and size limit (models/trace_filter.h)
  bool profile = false;             // --profile: the critical path across chips in the report (models/profile.h)
  std::string plots_dir;            // --plots: roofline and utilisation plots here (models/profile_plots.h)
  bool shape_only = false;          // --shape-only: run the config in shape-only mode whatever its mode: says
};

// The checkpoint this run writes: --checkpoint, else the config's path; none with --no-checkpoint or when the
// config disables checkpoints and no --checkpoint is given.
std::optional<std::string> checkpoint_target(const RunConfig& config, const RunOptions& options);

// " (device NAME: X GiB HBM less Y GiB kept in reserve, device.hbm_reserve_gib)": what a simulated out-of-memory
// message adds, since a run may use hbm_gib less hbm_reserve_gib (DeviceSpec::usable_hbm_bytes, docs/CONFIG.md).
std::string hbm_capacity_note(const sim::DeviceSpec& d);

// Throws ConfigError naming the config file when WORLD_SIZE differs from the topology's chip count.
void check_world_size(const RunConfig& config, int world_size);


// The MLP as the one runner's model description: a layer stack without attention (models/transformer.h's
// BlockConfig with shape.attention false), run by run_block (models/runner.h's run_model) with the same schedule,
// simulated figures, report, validation and checkpoint format as before the runners were merged.
BlockConfig mlp_block_config(const RunConfig& config);

}  // namespace shardsim::sharding

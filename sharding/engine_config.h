// The workload config schema every `shardsim run` file follows, and the command-line overrides of `run`.
//
//   name: my-run                     # optional
//   topology: {kind: ring, ...}      # inline (topology/topology_yaml.h), or a path to a file: a shardsim file with
//                                    # a topology: section (configs/topologies/*.yaml) or an ASTRA-sim network.yml;
//                                    # a relative path is looked up next to the config, then in the working dir
//   device: trainium1                # a preset name (configs/devices.yaml; `shardsim help devices`), or
//                                    # inline keys {preset: ..., peak_tflops_fp32: ...}. Default: generic (the
//                                    # documented default device; every report prints the device line)
//   model:                           # the model (the older name of this section, workload:, is still read)
//     kind: mlp | transformer_block  # x + mlp(norm(x)) per layer, or a Llama block (sharding/model_spec.h)
//     ...                            # their shape keys
//   parallel:                        # the plan on the device mesh (sharding/device_mesh.h):
//     tp: 2                          # axes tp, cp (and ulysses: a cp axis whose attention is all_to_all)
//     mesh_dims: [0, 1]              # optional: the topology dimensions the mesh fills, innermost axis first
//     ...                            # plan keys of the workload (sp, cp_split, fused, chunks, all_reduce)
//   validate: {...}
//   checkpoint: {...}                # MLP only
//
// Errors: ConfigError "FILE:LINE: key: ..." (exit 2).
#pragma once

#include <string>
#include <vector>

#include "common/config.h"
#include "sharding/device_mesh.h"
#include "sharding/model_spec.h"
#include "sim/device_spec.h"
#include "topology/topology.h"

namespace shardsim::sharding {

// `--plan` and a sweep's plan entries take the keys of the plan registry and replace the plan's shape (its mesh
// axes and pipeline keys: sharding/plans/registry.h, mesh_plan_keys); the config's other parallel: keys stay.

// `run`'s overrides (the flags bench and validate use have the same names).
struct ConfigOverrides {
  std::string topology_file;  // --topology FILE
  int ring = 0;               // --ring N: a bidirectional ring of N chips
  std::string torus;          // --torus AxB[xC...]
  std::string mesh;           // --mesh AxB (no wrap-around)
  bool switched = false;      // --switch
  bool fully_connected = false;  // --fully-connected
  double bandwidth_gbps = 0;  // --bandwidth (0: the config's, else 100)
  double latency_ns = -1;     // --latency (<0: the config's, else 1000)
  std::string device;         // --device PRESET
  std::string plan;           // --plan tp=2,cp=4[,sp=true,...]: plan registry keys, each once; replaces the plan's shape
  std::vector<std::string> set;  // --set key.path=value (a YAML value)
  bool any() const {
    return !topology_file.empty() || ring > 0 || !torus.empty() || !mesh.empty() || switched || fully_connected ||
           bandwidth_gbps > 0 || latency_ns >= 0 || !device.empty() || !plan.empty() || !set.empty();
  }
  // " --plan tp=2,cp=4 --device h100" (for the report and the checkpoint).
  std::string describe() const;
};

// Loads FILE, reads the model: section as workload:, applies OVERRIDES. With overrides the returned node is the
// re-emitted YAML of what runs, under the name "FILE (with command-line overrides)", so messages and the
// stored config say what ran. ConfigError / UsageError (exit 2) for bad files and overrides.
ConfigNode load_workload_config(const std::string& file, const ConfigOverrides& overrides = {});
// The same for a config given as text (the sweep's generated points; OVERRIDES: a sweep's --what-if changes).
ConfigNode workload_config_from_text(const std::string& text, const std::string& file,
                                     const ConfigOverrides& overrides = {});

// The topology: section, inline or a path (see above).
topology::Topology load_workload_topology(const ConfigNode& root);
// The device: section, a preset name or a map; the default device when absent.
sim::DeviceSpec load_workload_device(const ConfigNode& root);
// The value of a --device flag as a config's device: node: a preset name (checked), or a copy of the device:
// section of the YAML file ARG names (checked; `calibrate --kernels --out` writes such files). UsageError for an
// unknown preset that is no file, or a file without a device: section; ConfigError naming the file's line.
YAML::Node device_flag_node(const std::string& arg);
inline constexpr const char* kDefaultDevice = "generic";
// The mode: key of a run config: "real" (default: real data, validated) or "shape_only" (true; shape-only
// tensors, cost-only kernels, header-only collectives: docs/ARCHITECTURE.md). ConfigError naming mode otherwise.
bool load_workload_shape_only(const ConfigNode& root);
// The fold: key of a run config: "auto" (default) or "on" (true: the run may fold, docs/performance/fold.md), or
// "off" (false). ConfigError naming fold otherwise. One reader for train and the sweep's up-front workload check.
bool load_workload_fold(const ConfigNode& root);
// The validate: section of every run config (docs/CONFIG.md).
inline constexpr std::string_view kValidateKeys[] = {"enabled", "tolerance"};
// The root keys of a training config (`shardsim train`; model: is read as workload:).
inline constexpr std::string_view kTrainRootKeys[] = {"name",  "topology", "device", "workload",
                                                      "train", "parallel", "mode", "fold"};

// PLAN's device mesh on TOPOLOGY (sharding/device_mesh.h's build_mesh, the one builder of run and train), its
// errors as ConfigError at ROOT's parallel.mesh_dims (or parallel:) line: the loader's pre-run check.
DeviceMesh checked_mesh(const ConfigNode& root, const ParallelPlan& plan, const topology::Topology& topology);

}  // namespace shardsim::sharding

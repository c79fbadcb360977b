#include "experiments/config_keys.h"

#include "experiments/sweep.h"
#include "sharding/engine_config.h"
#include "sharding/model_spec.h"
#include "sharding/plans/expert_parallel_config.h"
#include "serving/config_keys.h"
#include "sharding/plans/registry.h"
#include "sim/device_spec.h"
#include "topology/clos.h"
#include "topology/topology_yaml.h"

namespace shardsim::experiments {

namespace {
// `run` configs' root keys, as the one executor's loader (apps/train_setup.cpp's load) accepts them: train's root
// keys (train: is read by `train`, fold: by a shape-only `train`; `run` ignores both), validate:, and checkpoint:
// for model.kind mlp (run's default checkpoint target).
constexpr std::string_view kRunRootKeys[] = {"name",  "topology", "device", "workload", "parallel", "validate",
                                             "mode",  "train",    "fold",   "checkpoint"};
constexpr std::string_view kCheckpointKeys[] = {"path", "enabled"};
}  // namespace

const std::vector<ConfigKeySection>& config_key_sections() {
  static const std::vector<ConfigKeySection> sections = {
      {"run", "run configs", kRunRootKeys},
      {"train config", "train configs", sharding::kTrainRootKeys},
      {"model", "run and train configs (sharding/model_spec.h)", sharding::kModelKeys},
      {"model.moe", "train configs (sharding/plans/expert_parallel_config.h)", sharding::plans::kMoeKeys},
      {"parallel", "run and train configs (sharding/plans/registry.h)", sharding::parallel_keys()},
      {"train", "train configs", sharding::kTrainKeys},
      {"serve", "serve configs (apps/serve.cpp)", serving::kServeKeys},
      {"serve.slo", "serve configs", serving::kServeSloKeys},
      {"serve.disaggregation", "serve configs", serving::kServeDisaggKeys},
      {"serve.disaggregation.prefill", "serve configs (and .decode): a group's plan", serving::kServeDisaggGroupKeys},
      {"serve.trace", "serve configs, a trace file", serving::kServeTraceFileKeys},
      {"serve.trace", "serve configs, generated requests", serving::kServeTraceKeys},
      {"serve.trace.prompt", "serve configs: prompt and output lengths as a map", serving::kServeLengthKeys},
      {"validate", "run configs", sharding::kValidateKeys},
      {"checkpoint", "run configs, model.kind: mlp", kCheckpointKeys},
      {"device", "run configs, sweep device axis", sim::kDeviceKeys},
      {"topology", "kind: ring | fully_connected", topology::kTopologySimpleKeys},
      {"topology", "kind: switch", topology::kTopologySwitchKeys},
      {"topology", "kind: torus | mesh", topology::kTopologyGridKeys},
      {"topology", "kind: stacked", topology::kTopologyStackedKeys},
      {"topology", "kind: graph", topology::kTopologyGraphKeys},
      {"topology", "kind: clos", topology::kTopologyClosKeys},
      {"topology.dims[]", "kind: stacked", topology::kTopologyDimKeys},
      {"topology.links[]", "kind: graph", topology::kTopologyLinkKeys},
      {"topology.protocol", "every topology kind", topology::kTopologyProtocolKeys},
      {"ASTRA-sim network.yml", "topology files", topology::kAstraNetworkKeys},
      {"sweep", "sweep files", kSweepRootKeys},
      {"sweep.axes", "sweep files", kSweepAxisKeys},
      {"sweep.axes.workload[]", "sweep files", kSweepWorkloadKeys},
      {"sweep.axes.size", "sweep files (a range)", kSweepRangeKeys},
      {"sweep.axes.batching[]", "sweep files (serve workloads)", kSweepBatchingKeys},
      {"sweep.axes.plan[]", "sweep files", sharding::plans::sweep_plan_keys()},
  };
  return sections;
}

}  // namespace shardsim::experiments

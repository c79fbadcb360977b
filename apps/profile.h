// --what-if (docs/PROFILE.md): hardware or plan changes re-simulated in this process, each against the baseline.
//
// SPEC: changes separated by commas, each KEY=VALUE (several joined by '+' are simulated together). VALUE is a
// factor ("2x", "0.5x") of the config's current value or a new value. KEY:
//   link_bw (= bandwidth), latency      every dimension's topology.bandwidth_gbps / latency_ns (inline topology)
//   dimN.bandwidth, dimN.latency         dimension N only (a scalar becomes a per-dimension list)
//   peak                                 every peak_tflops_* the device sets (after its preset)
//   hbm_bw, hbm, launch                  device hbm_gbps, hbm_gib, launch_overhead_ns; or any device key by name
//   a config path (model.tokens, parallel.tp, ...)  a factor of the number there, or any YAML value as --set takes
// Each change becomes --set overrides (sharding/engine_config.h), so re-running with those --set flags gives the
// same time exactly. Errors: UsageError (exit 2) naming the change.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "common/config.h"
#include "reporting/report.h"
#include "runtime/world.h"
#include "sharding/engine_config.h"

namespace shardsim::apps {

struct WhatIfPlan {
  std::string change;             // as given
  std::vector<std::string> sets;  // the --set items it becomes
};

// ROOT: the config as loaded with the run's overrides (sharding::load_workload_config). No communication.
std::vector<WhatIfPlan> plan_what_if(const std::string& spec, const ConfigNode& root);

// Simulates every plan with SIMULATE (BASE's overrides plus the plan's sets; returns the simulated end time in ns,
// valid on rank 0) and returns the rows, largest speedup (BASELINE_NS / time) first. Collective when SIMULATE is.
std::vector<reporting::WhatIf> run_what_if(const std::vector<WhatIfPlan>& plans, double baseline_ns,
                                          const std::function<double(const sharding::ConfigOverrides&)>& simulate,
                                          const sharding::ConfigOverrides& base);

}  // namespace shardsim::apps

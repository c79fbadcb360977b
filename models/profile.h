// The profile section of a run's report (docs/PROFILE.md): the critical path across chips, the class of every op's
// time, the top bottlenecks and the waits, from sim/critical_path.h; and the what-if table.
#pragma once

#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <vector>

#include "runtime/world.h"
#include "sim/critical_path.h"
#include "sim/timeline.h"

namespace shardsim::sharding {

struct RunReport;

// One what-if change (`--what-if`): the change as given, the --set overrides it became, the re-simulated end
// time (ns, the critical chip's) and the speedup baseline / it.
struct WhatIf {
  std::string change;              // "link_bw=2x"
  std::vector<std::string> sets;   // "topology.bandwidth_gbps=200", ...
  double ns = 0;
  double speedup = 0;
};

// Collective (every rank calls it; nothing happens when both are off): with TRACE_PATH, writes the trace
// (models/trace.h) and with PROFILE sets REPORT.profile on rank 0, from every chip's events gathered once. TL must
// have recorded dependencies (sim::Timeline::set_record_dependencies) for the critical path and the arrows.
void profile_and_trace(const runtime::World& world, const sim::Timeline& tl, const std::string& trace_path,
                       bool profile, RunReport& report);

// The profile as text (the report's "profile" section) and JSON. TOP: rows of the bottleneck and wait tables.
std::string profile_text(const sim::Profile& p, size_t top = 10);
nlohmann::json profile_json(const sim::Profile& p);
// The what-if table: baseline, then one row per change, largest speedup first.
std::string what_if_text(double baseline_ns, const std::vector<WhatIf>& rows);
nlohmann::json what_if_json(double baseline_ns, const std::vector<WhatIf>& rows);

}  // namespace shardsim::sharding

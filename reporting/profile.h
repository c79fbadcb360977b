// The profile section of a run's report (docs/PROFILE.md): the critical path across chips, the class of every op's
// time, the top bottlenecks and the waits, from sim/critical_path.h; and the what-if table.
#pragma once

#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <vector>

#include "reporting/trace_filter.h"
#include "runtime/world.h"
#include "sim/critical_path.h"
#include "sim/timeline.h"

namespace shardsim::sharding {
class DeviceMesh;
}  // namespace shardsim::sharding

namespace shardsim::reporting {

struct RunReport;

// One what-if change (`--what-if`): the change as given, the --set overrides it became, the re-simulated end
// time (ns, the critical chip's) and the speedup baseline / it.
struct WhatIf {
  std::string change;              // "link_bw=2x"
  std::vector<std::string> sets;   // "topology.bandwidth_gbps=200", ...
  double ns = 0;
  double speedup = 0;
};


// What a run writes from its chips' recorded events (`--trace`, `--profile`, `--plots`).
struct ProfileOutputs {
  std::string trace_path;  // Chrome trace (reporting/trace.h); "" none
  bool profile = false;    // the profile section (RunReport::profile)
  std::string plots_dir;   // roofline and utilisation plots (reporting/profile_plots.h); "" none
  double peak_tflops = 0;  // the device's peak at the run's precision: the roofline's flat roof
  TraceOptions trace;      // the trace's filters and size limit (reporting/trace_filter.h)
  const sharding::DeviceMesh* mesh = nullptr;  // the run's mesh, for --trace-axis
  // Events must be recorded with dependencies (sim::Timeline::set_record_dependencies) when this is true.
  bool any() const { return !trace_path.empty() || profile || !plots_dir.empty(); }
};

// Collective (every rank calls it; nothing happens when OUT.any() is false): writes the trace (the chips and
// window OUT.trace keeps; its estimated size in REPORT.trace_note, and on stderr first when it is 64 MiB or more;
// past OUT.trace.max_mib it is not written: a warning line, REPORT.trace cleared), sets REPORT.profile and writes
// the plots (REPORT.plots; a plot gnuplot could not draw is REPORT.plots_warning) on rank 0, from every chip's
// events gathered once (they leave TL). TL must have recorded dependencies. A file that cannot be written is
// AgreedError (exit 3) on every rank; a bad filter UsageError (exit 2; runs check it before they start).
void profile_and_trace(const runtime::World& world, sim::Timeline& tl, const ProfileOutputs& out, RunReport& report);

// The profile as text (the report's "profile" section) and JSON. TOP: rows of the bottleneck and wait tables.
std::string profile_text(const sim::Profile& p, size_t top = 10);
nlohmann::json profile_json(const sim::Profile& p);
// The what-if table: baseline, then one row per change, largest speedup first.
std::string what_if_text(double baseline_ns, const std::vector<WhatIf>& rows);
nlohmann::json what_if_json(double baseline_ns, const std::vector<WhatIf>& rows);

}  // namespace shardsim::reporting

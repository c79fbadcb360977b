#include "reporting/profile.h"

#include <algorithm>
#include <cstdio>
#include <map>

#include "reporting/profile_plots.h"
#include "reporting/report.h"
#include "reporting/trace.h"
#include "common/text.h"

namespace shardsim::reporting {

namespace {

std::string fmt(const char* f, double a) {
  char b[64];
  std::snprintf(b, sizeof b, f, a);
  return b;
}

double pct(double part, double whole) { return whole > 0 ? 100.0 * part / whole : 0.0; }

const sim::ProfileEvent& event_of(const sim::Profile& p, const sim::PathStep& s) {
  for (const auto& ce : p.chips)
    if (ce.chip == s.chip) return ce.events[s.index];
  throw std::logic_error("profile: chip " + std::to_string(s.chip) + " of a path step not gathered");
}

// Bins of the utilisation plot over the run's [0, end].
constexpr int kUtilisationBins = 200;

// Steps of the critical path written out in the JSON at most (a long training step has many).
constexpr size_t kMaxPathSteps = 10000;

}  // namespace

void profile_and_trace(const runtime::World& world, sim::Timeline& tl, const ProfileOutputs& out, RunReport& report) {
  if (!out.any()) return;
  // The trace's size, stated before anything is gathered; past the limit it is not written.
  TraceFilter filter;
  bool trace = !out.trace_path.empty();
  if (trace) {
    filter = resolve_trace_filter(out.trace, tl.topology(), out.mesh);
    const TraceSize size = trace_size(world, tl, filter);
    char b[400];
    std::snprintf(b, sizeof b, "%.0f events of %d chip(s), about %s%s%s", size.events, size.chips,
                  trace_bytes_text(size.bytes).c_str(), filter.text.empty() ? "" : "; kept: ", filter.text.c_str());
    report.trace_note = b;
    const bool over = !trace_within_limit(out.trace_path, b, size.bytes, out.trace, world.rank() == 0,
                                          "keep fewer chips (--trace-chips, --trace-axis) or a time window (--trace-window)");
    if (over) {
      report.trace_note = "not written: " + report.trace_note + ", more than --trace-max-mib " +
                          fmt("%g", out.trace.max_mib);
      report.trace.clear();
      trace = false;
      if (!out.profile && out.plots_dir.empty()) return;
    }
  }
  auto all = gather_events(world, tl);
  std::shared_ptr<const sim::Profile> p;
  if (out.profile && world.rank() == 0) p = std::make_shared<const sim::Profile>(sim::profile(std::move(all)));
  const auto& chips = p ? p->chips : all;
  if (trace) write_trace_file(world, chips, tl.topology(), p.get(), out.trace_path, filter);
  if (!out.plots_dir.empty())
    world.agree([&] {
      if (world.rank() != 0) return;
      sim::TimeNs end = 0;
      for (const auto& ce : chips)
        for (const auto& e : ce.events) end = std::max(end, e.span.end);
      const auto roof = roofline(chips, Roof{out.peak_tflops, tl.device().hbm_gbps});
      report.plots_warning =
          write_profile_plots(out.plots_dir, report.name, roof, utilisation(chips, end, kUtilisationBins), &report.plots);
    });
  if (p) report.profile = std::move(p);
}

std::string profile_text(const sim::Profile& p, size_t top) {
  std::string s = "profile (critical path across chips, docs/PROFILE.md)\n";
  const double end = p.path.end;
  std::map<int, bool> chips;
  for (const auto& st : p.path.steps) chips[st.chip] = true;
  s += "  critical path:      " + fmt("%.3f", end / 1e3) + " us, " + std::to_string(p.path.steps.size()) +
       " steps on " + std::to_string(chips.size()) + " chip(s) (" + std::to_string(p.events) + " ops recorded)\n";
  s += "  path by class:     ";
  for (auto c : sim::kTimeClasses)
    s += std::string(" ") + sim::time_class_name(c) + " " + fmt("%.1f%%", pct(p.path_by_class[size_t(c)], end)) +
         (c == sim::TimeClass::waiting ? "\n" : ",");
  double all = 0;
  for (double v : p.all_by_class) all += v;
  s += "  all ops by class:  ";
  for (auto c : sim::kTimeClasses)
    if (c != sim::TimeClass::waiting)
      s += std::string(" ") + sim::time_class_name(c) + " " + fmt("%.1f%%", pct(p.all_by_class[size_t(c)], all)) +
           (c == sim::TimeClass::latency ? " (of every kernel, send and receive on every chip)\n" : ",");
  s += "  chips on the path:  ";
  for (size_t i = 0; i < p.chip_time.size() && i < top; ++i)
    s += (i ? ", " : "") + std::string("chip ") + std::to_string(p.chip_time[i].first) + " " +
         fmt("%.1f%%", pct(p.chip_time[i].second, end));
  if (p.chip_time.size() > top) s += ", ...";
  s += "\n  top bottlenecks (time on the critical path):\n";
  int w = 2;  // the op column: as wide as the longest name shown
  for (size_t i = 0; i < p.bottlenecks.size() && i < top; ++i)
    w = std::max(w, static_cast<int>(std::min<size_t>(p.bottlenecks[i].op.size(), 200)));
  char line[512];
  std::snprintf(line, sizeof line, "     #  %-*s  kind     class                   time (us)   share  steps  chips  first chip\n",
                w, "op");
  s += line;
  for (size_t i = 0; i < p.bottlenecks.size() && i < top; ++i) {
    const auto& b = p.bottlenecks[i];
    std::snprintf(line, sizeof line, "    %2zu  %-*.200s  %-7s  %-22s %10.3f  %5.1f%%  %5d  %5d  %10d\n", i + 1, w,
                  b.op.c_str(), b.category.c_str(), sim::time_class_name(b.cls), b.time / 1e3, pct(b.time, end),
                  b.steps, b.chips, b.first_chip);
    s += line;
  }
  if (p.waits.empty()) {
    s += "  waits: no engine idled for another chip's message\n";
  } else {
    s += "  waits (an engine idle until another chip's message arrived; largest first):\n";
    for (size_t i = 0; i < p.waits.size() && i < top; ++i) {
      const auto& w = p.waits[i];
      s += "    chip " + std::to_string(w.chip) + " '" + w.op + "' waited " + fmt("%.3f", w.time / 1e3) + " us (" +
           std::to_string(w.count) + (w.count == 1 ? " time" : " times") + ") on chip " + std::to_string(w.on_chip) +
           "'s '" + w.on_op + "'\n";
    }
  }
  return s;
}

nlohmann::json profile_json(const sim::Profile& p) {
  nlohmann::json j;
  j["end_ns"] = p.path.end;
  j["waiting_ns"] = p.path.waiting;
  j["ops_recorded"] = p.events;
  nlohmann::json pc = nlohmann::json::object(), ac = nlohmann::json::object();
  for (auto c : sim::kTimeClasses) {
    pc[sim::time_class_name(c)] = p.path_by_class[size_t(c)];
    if (c != sim::TimeClass::waiting) ac[sim::time_class_name(c)] = p.all_by_class[size_t(c)];
  }
  j["path_ns_by_class"] = pc;
  j["all_ops_ns_by_class"] = ac;
  j["chips_on_path"] = nlohmann::json::array();
  for (const auto& [chip, ns] : p.chip_time) j["chips_on_path"].push_back({{"chip", chip}, {"ns", ns}});
  j["bottlenecks"] = nlohmann::json::array();
  for (const auto& b : p.bottlenecks)
    j["bottlenecks"].push_back({{"op", b.op}, {"category", b.category}, {"class", sim::time_class_name(b.cls)},
                                {"ns", b.time}, {"steps", b.steps}, {"chips", b.chips}, {"first_chip", b.first_chip}});
  j["waits"] = nlohmann::json::array();
  for (const auto& w : p.waits)
    j["waits"].push_back({{"chip", w.chip}, {"op", w.op}, {"on_chip", w.on_chip}, {"on_op", w.on_op}, {"ns", w.time},
                          {"count", w.count}});
  j["path"] = nlohmann::json::array();
  for (size_t i = 0; i < p.path.steps.size() && i < kMaxPathSteps; ++i) {
    const auto& st = p.path.steps[i];
    const auto& e = event_of(p, st);
    j["path"].push_back({{"chip", st.chip}, {"op", std::string(e.name)}, {"category", std::string(e.category)},
                         {"class", sim::time_class_name(sim::time_class_of(e.bound))}, {"from_ns", st.from},
                         {"end_ns", e.span.end}, {"waiting_ns", st.waiting}});
  }
  j["path_truncated"] = p.path.steps.size() > kMaxPathSteps;
  return j;
}

std::string what_if_text(double baseline_ns, const std::vector<WhatIf>& rows) {
  std::string s = "what-if (each change re-simulated alone; speedup = baseline / changed time)\n";
  s += "  baseline                          " + fmt("%12.3f", baseline_ns / 1e3) + " us\n";
  for (const auto& w : rows) {
    char line[512];
    std::snprintf(line, sizeof line, "  %-32s  %12.3f us  %7.3fx", w.change.c_str(), w.ns / 1e3, w.speedup);
    s += line;
    std::string sets;
    for (const auto& x : w.sets) sets += (sets.empty() ? "" : " ") + std::string("--set ") + x;
    s += "  (" + sets + ")\n";
  }
  return s;
}

nlohmann::json what_if_json(double baseline_ns, const std::vector<WhatIf>& rows) {
  nlohmann::json j;
  j["baseline_ns"] = baseline_ns;
  j["changes"] = nlohmann::json::array();
  for (const auto& w : rows)
    j["changes"].push_back({{"change", w.change}, {"set", w.sets}, {"ns", w.ns}, {"speedup", w.speedup}});
  return j;
}

}  // namespace shardsim::reporting

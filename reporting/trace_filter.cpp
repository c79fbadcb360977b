#include "reporting/trace_filter.h"

#include <filesystem>
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <set>

#include "common/error.h"
#include "common/text.h"
#include "common/number.h"
#include "sharding/device_mesh.h"
#include "topology/topology.h"

namespace shardsim::reporting {

namespace {

// A whole number 0 <= n <= LIMIT written in decimal digits only, else -1.
long long decimal(const std::string& s, long long limit) {
  if (s.empty() || s[0] == '+' || s[0] == '-') return -1;
  const auto v = decimal_int(s);
  return v && *v <= limit ? *v : -1;
}

// "FROM:TO" in us -> ns; either may be empty.
bool parse_window(const std::string& w, double& from_ns, double& to_ns) {
  const size_t colon = w.find(':');
  if (colon == std::string::npos || w.find(':', colon + 1) != std::string::npos || w.size() == 1) return false;  // ":" keeps all
  auto number = [](const std::string& s, double& out) {
    if (s.empty()) return true;
    const auto v = decimal_double(s);
    if (!v || *v < 0 || *v > 9e9) return false;
    out = *v * 1e3;
    return true;
  };
  double a = 0, b = std::numeric_limits<double>::infinity();
  if (!number(w.substr(0, colon), a) || !number(w.substr(colon + 1), b) || !(a < b)) return false;
  from_ns = a;
  to_ns = b;
  return true;
}

std::vector<int> parse_chips(const std::string& text, int chips) {
  std::set<int> out;
  const std::string bad = "--trace-chips: '" + escape_control(text) + "': expected chip ids and ranges A-B of 0.." +
                          std::to_string(chips - 1) + ", separated by commas (e.g. 0-7,64)";
  size_t at = 0;
  while (at <= text.size()) {
    const size_t comma = std::min(text.find(',', at), text.size());
    const std::string item = text.substr(at, comma - at);
    const size_t dash = item.find('-');
    const long long a = decimal(item.substr(0, dash), chips - 1);
    const long long b = dash == std::string::npos ? a : decimal(item.substr(dash + 1), chips - 1);
    if (a < 0 || b < a) throw UsageError(bad);
    for (long long c = a; c <= b; ++c)
      if (!out.insert(static_cast<int>(c)).second)  // `0,0` and `0-3,2` were taken silently
        throw UsageError("--trace-chips: '" + escape_control(text) + "': chip " + std::to_string(c) + " given twice");
    at = comma + 1;
  }
  return {out.begin(), out.end()};
}

}  // namespace

bool TraceFilter::keeps_chip(int chip) const {
  return chips.empty() || std::binary_search(chips.begin(), chips.end(), chip);
}

std::string chip_ranges_text(const std::vector<int>& chips) {
  std::string s;
  for (size_t i = 0; i < chips.size();) {
    size_t j = i;
    while (j + 1 < chips.size() && chips[j + 1] == chips[j] + 1) ++j;
    s += (s.empty() ? "" : ",") + std::to_string(chips[i]) + (j > i ? "-" + std::to_string(chips[j]) : "");
    i = j + 1;
  }
  return s;
}

void check_trace_options(const TraceOptions& o) {
  if (!o.chips.empty() && !o.axis.empty())
    throw UsageError("--trace-chips and --trace-axis: give one of them (both choose the chips)");
  double a = 0, b = 0;
  if (!o.window.empty() && !parse_window(o.window, a, b))
    throw UsageError("--trace-window: '" + escape_control(o.window) +
                     "': expected FROM:TO in microseconds of simulated time, FROM < TO, either (not both) may be left out "
                     "(e.g. 1000:2500 or 1000:)");
  if (o.step < 0) throw UsageError("--trace-step: must be a step number >= 1 (got " + std::to_string(o.step) + ")");
  if (!std::isfinite(o.max_mib) || o.max_mib < 0 || o.max_mib > 1e9)
    throw UsageError("--trace-max-mib: must be between 0 (no limit) and 1e9 MiB");
}

TraceFilter resolve_trace_window(const TraceOptions& o) {
  check_trace_options(o);
  TraceFilter f;
  if (o.window.empty()) return f;
  parse_window(o.window, f.from_ns, f.to_ns);
  char b[96];
  if (std::isfinite(f.to_ns))
    std::snprintf(b, sizeof b, "%g .. %g us", f.from_ns / 1e3, f.to_ns / 1e3);
  else
    std::snprintf(b, sizeof b, "from %g us", f.from_ns / 1e3);
  f.text = b;
  return f;
}

std::string trace_bytes_text(double bytes) {
  const double mib = bytes / 1048576.0;
  char b[64];
  std::snprintf(b, sizeof b, "%.3g %s", mib < 1 ? bytes / 1024.0 : mib < 1024 ? mib : mib / 1024,
                mib < 1 ? "KiB" : mib < 1024 ? "MiB" : "GiB");
  return b;
}

bool trace_within_limit(const std::string& path, const std::string& note, double bytes, const TraceOptions& o,
                        bool print, const std::string& shrink) {
  const bool over = o.max_mib > 0 && bytes > o.max_mib * 1048576.0;
  if (print && (over || bytes >= kTraceNoteBytes)) {
    if (over) {
      // A file already at PATH is an earlier run's trace, not this one's: say so, so it is not read as this run's.
      std::error_code ec;
      const bool stale = std::filesystem::exists(path, ec);
      std::fprintf(stderr, "shardsim: warning: --trace %s not written: %s, more than --trace-max-mib %g; %s, or raise "
                   "--trace-max-mib%s\n", escape_control(path).c_str(), note.c_str(), o.max_mib, shrink.c_str(),
                   stale ? " (the file already there is an earlier run's, left as it was)" : "");
    } else {
      std::fprintf(stderr, "shardsim: note: --trace %s: %s\n", escape_control(path).c_str(), note.c_str());
    }
    std::fflush(stderr);
  }
  return !over;
}

TraceFilter resolve_trace_filter(const TraceOptions& o, const topology::Topology& topo, const sharding::DeviceMesh* mesh) {
  check_trace_options(o);
  TraceFilter f;
  std::vector<std::string> parts;
  if (!o.chips.empty()) {
    f.chips = parse_chips(o.chips, topo.num_chips());
    parts.push_back("chips " + chip_ranges_text(f.chips));
  }
  if (!o.axis.empty()) {
    const size_t colon = o.axis.find(':');
    const std::string name = o.axis.substr(0, colon);
    const int chip = colon == std::string::npos ? 0
                                                 : static_cast<int>(decimal(o.axis.substr(colon + 1), topo.num_chips() - 1));
    if (!mesh) throw UsageError("--trace-axis: this run has no device mesh; use --trace-chips");
    std::string names;
    const sharding::MeshAxis* axis = nullptr;
    for (const auto& a : mesh->axes()) {
      if (a.size > 1) names += (names.empty() ? "" : ", ") + a.name;
      if (a.name == name && a.size > 1) axis = &a;
    }
    if (!axis || chip < 0)
      throw UsageError("--trace-axis: '" + escape_control(o.axis) + "': expected AXIS or AXIS:CHIP, AXIS one of this "
                       "run's mesh axes (" + (names.empty() ? std::string("none") : names) + "), CHIP 0.." +
                       std::to_string(topo.num_chips() - 1));
    const auto& place = mesh->placement();
    const auto it = std::find(place.begin(), place.end(), chip);
    if (it == place.end())
      throw UsageError("--trace-axis: chip " + std::to_string(chip) + " is not in this run's mesh");
    const int r = static_cast<int>(it - place.begin());
    const int coord = (r / axis->stride) % axis->size;
    for (int k = 0; k < axis->size; ++k) f.chips.push_back(place.at(static_cast<size_t>(r + (k - coord) * axis->stride)));
    std::sort(f.chips.begin(), f.chips.end());
    parts.push_back(axis->name + " group of chip " + std::to_string(chip) + ": chips " + chip_ranges_text(f.chips));
  }
  const TraceFilter w = resolve_trace_window(o);
  f.from_ns = w.from_ns;
  f.to_ns = w.to_ns;
  if (!w.text.empty()) parts.push_back(w.text);
  for (const auto& p : parts) f.text += (f.text.empty() ? "" : "; ") + p;
  return f;
}

}  // namespace shardsim::reporting

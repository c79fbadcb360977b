// What a trace keeps (docs/PROFILE.md "Traces at full size"): the flags of --trace, resolved against the run's
// topology and device mesh before it runs, and the size limit.
//   --trace-chips 0-7,64     these chips only (ids of the topology, each 0 .. chips-1; ranges A-B)
//   --trace-axis pp[:CHIP]   the chips of CHIP's group along a mesh axis (default chip 0): e.g. `pp` = one
//                            pipeline's stages, `tp` = one tensor-parallel group
//   --trace-window FROM:TO   events that overlap [FROM, TO], microseconds of simulated time (the trace's unit);
//                            either end may be left out ("100:" = from 100 us to the end)
//   --trace-step N           train: the step traced (default the last)
//   --trace-max-mib M        the file's size limit, MiB (default 1024; 0 = none): past it the trace is not
//                            written (one warning line; the run's report and exit code are unchanged)
// Errors: UsageError (exit 2) naming the flag and what it accepts.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace shardsim::topology {
class Topology;
}

namespace shardsim::sharding {
class DeviceMesh;
}  // namespace shardsim::sharding

namespace shardsim::reporting {


struct TraceOptions {
  std::string chips;
  std::string axis;
  std::string window;
  std::int64_t step = 0;  // 0: the last step
  double max_mib = 1024;
  bool filtered() const { return !chips.empty() || !axis.empty() || !window.empty(); }
};

struct TraceFilter {
  std::vector<int> chips;  // sorted, distinct; empty: every chip
  double from_ns = 0;
  double to_ns = std::numeric_limits<double>::infinity();
  std::string text;        // "chips 0-7; 100 .. 250 us" ("" for everything)
  bool keeps_chip(int chip) const;
  // An event of a kept chip that overlaps the window.
  bool keeps_span(double start_ns, double end_ns) const { return end_ns >= from_ns && start_ns <= to_ns; }
};

// Checks the flags' syntax (the parts that need no topology): UsageError naming the flag.
void check_trace_options(const TraceOptions& o);
// OPTIONS against TOPOLOGY's chips and MESH's axes (MESH may be null: --trace-axis is then refused).
TraceFilter resolve_trace_filter(const TraceOptions& o, const topology::Topology& topology, const sharding::DeviceMesh* mesh);
// Only the window of O (chips untouched: every chip), for traces without chips (serve's): UsageError as above.
TraceFilter resolve_trace_window(const TraceOptions& o);
// A trace's size in words: "812 KiB", "3.1 MiB", "1.2 GiB".
std::string trace_bytes_text(double bytes);
// Traces of this size or more are announced on stderr before they are written.
constexpr double kTraceNoteBytes = 64.0 * 1048576.0;
// Whether a trace of BYTES may be written under O.max_mib (0: no limit). With PRINT (rank 0), one line on stderr
// before anything is written: past the limit a warning that PATH is not written, saying NOTE (its events and
// size) and SHRINK (the flags that would make it smaller, e.g. "keep a time window (--trace-window)"); from
// kTraceNoteBytes on a note with NOTE.
bool trace_within_limit(const std::string& path, const std::string& note, double bytes, const TraceOptions& o,
                        bool print, const std::string& shrink);
// "0-7,9" for a sorted list of chips.
std::string chip_ranges_text(const std::vector<int>& chips);

}  // namespace shardsim::reporting

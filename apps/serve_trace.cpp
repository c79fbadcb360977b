// `serve --trace`: its size before and after the run, the limit, and the writing (apps/serve_server.h).
#include <cstdio>

#include "apps/serve_server.h"
#include "common/error.h"
#include "common/output_file.h"
#include "common/text.h"
#include "serving/metrics.h"

namespace shardsim::apps::serve_detail {

namespace {

// --trace-window (us) as serving::TraceWindow (s): UsageError naming the flag.
serving::TraceWindow trace_window(const reporting::TraceOptions& o) {
  const reporting::TraceFilter f = reporting::resolve_trace_window(o);
  return {f.from_ns / 1e9, f.to_ns / 1e9};
}

std::string mib_text(double mib) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", mib);
  return b;
}

constexpr const char* kShrink = "keep a time window (--trace-window FROM:TO, us)";

}  // namespace

void check_trace_size(const std::string& path, const reporting::TraceOptions& o,
                      const std::vector<serving::Request>& requests, bool print) {
  const serving::TraceSize least = serving::trace_size_at_least(requests, trace_window(o));
  const std::string note = std::to_string(requests.size()) + " requests: at least " + std::to_string(least.events) +
                           " events, " + reporting::trace_bytes_text(least.bytes) + " (the exact size after the run)";
  if (o.max_mib > 0 && least.bytes > o.max_mib * 1048576.0)
    throw UsageError("--trace " + escape_control(path) + ": " + note + ", more than --trace-max-mib " +
                     mib_text(o.max_mib) + "; " + kShrink + " or raise --trace-max-mib (0: no limit)");
  if (print && least.bytes >= reporting::kTraceNoteBytes) {
    std::fprintf(stderr, "shardsim: note: --trace %s: %s\n", escape_control(path).c_str(), note.c_str());
    std::fflush(stderr);
  }
}

std::string serve_trace_note(const std::string& path, const reporting::TraceOptions& o, const serving::ServeRun& run,
                             bool& write) {
  const serving::TraceSize n = serving::write_trace(run, trace_window(o), {});
  const std::string kept = reporting::resolve_trace_window(o).text;
  const std::string note = std::to_string(n.events) + " events, " + reporting::trace_bytes_text(n.bytes) +
                           (kept.empty() ? "" : "; kept: " + kept);
  write = reporting::trace_within_limit(path, note, n.bytes, o, true, kShrink);
  return write ? note : "not written: " + note + ", more than --trace-max-mib " + mib_text(o.max_mib);
}

void write_serve_trace(const std::string& path, const reporting::TraceOptions& o, const serving::ServeRun& run) {
  OutputFile out(path);
  (void)serving::write_trace(run, trace_window(o), [&](std::string_view piece) { out.write(piece); });
  out.commit();
}

}  // namespace shardsim::apps::serve_detail

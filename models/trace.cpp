#include "models/trace.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <climits>
#include <cstring>
#include <vector>

#include "common/error.h"
#include "common/output_file.h"
#include "runtime/chips.h"

namespace shardsim::sharding {

namespace {

using Ps = std::int64_t;  // picoseconds of simulated time

// Nearest picosecond of a time in ns. Monotone, so spans that do not overlap in ns do not overlap in ps.
Ps to_ps(double ns, const sim::Event& e, int chip) {
  // 9e15 ps (2.5 h of simulated time) keeps every ps exact in the double the JSON number is read into.
  if (!std::isfinite(ns) || ns < 0 || ns > 9e12)
    throw RuntimeFault("trace: chip " + std::to_string(chip) + ", event '" + e.name + "': simulated time " +
                       std::to_string(ns) + " ns cannot be written (must be finite, >= 0 and below 9e12 ns)");
  return std::llround(ns * 1e3);
}

// Microseconds as a JSON number: an exact integer count of ps divided by 1e6 is the double nearest to the
// decimal value, which nlohmann prints in its shortest form (at most 6 decimals).
nlohmann::json us(Ps ps) { return static_cast<double>(ps) / 1e6; }

// Counts (bytes, FLOPs) as JSON integers when they are whole numbers, else as doubles.
nlohmann::json count(double v) {
  if (std::isfinite(v) && v == std::floor(v) && std::fabs(v) < 9e15) return static_cast<std::int64_t>(v);
  return v;
}

}  // namespace

nlohmann::json trace_events(const sim::Timeline& tl) {
  const int chip = tl.chip();
  const int pid = chip + 1;
  const auto& events = tl.events();

  struct Span {
    Ps start, end;
  };
  std::vector<Span> spans;
  spans.reserve(events.size());
  for (const auto& e : events) {
    Span s{to_ps(e.span.start, e, chip), to_ps(e.span.end, e, chip)};
    if (s.end < s.start)
      throw RuntimeFault("trace: chip " + std::to_string(chip) + ", event '" + e.name + "' ends before it starts");
    spans.push_back(s);
  }

  // Collective regions: greedy interval partitioning in start order (the fewest tracks without overlap). Pipeline
  // actions (category "pipeline": a stage's forward / backward of one micro-batch) have one track of their own.
  std::vector<size_t> regions;
  bool pipeline = false;
  for (size_t i = 0; i < events.size(); ++i) {
    if (events[i].engine >= 0) continue;
    if (events[i].category == "pipeline") pipeline = true;
    else regions.push_back(i);
  }
  std::stable_sort(regions.begin(), regions.end(), [&](size_t a, size_t b) {
    return spans[a].start != spans[b].start ? spans[a].start < spans[b].start : spans[a].end > spans[b].end;
  });
  std::vector<int> lane_of(events.size(), -1);
  std::vector<Ps> lane_free;  // end of the last region on each collectives track
  for (size_t i : regions) {
    size_t lane = 0;
    while (lane < lane_free.size() && lane_free[lane] > spans[i].start) ++lane;
    if (lane == lane_free.size()) lane_free.push_back(0);
    lane_free[lane] = spans[i].end;
    lane_of[i] = static_cast<int>(lane);
  }
  const int lanes = std::max<int>(1, static_cast<int>(lane_free.size()));
  const int tracks = tl.num_engines() + lanes + (pipeline ? 1 : 0);
  const int pipeline_track = tl.num_engines() + lanes;
  if (tracks >= kTraceTidStride)
    throw RuntimeFault("trace: chip " + std::to_string(chip) + " needs " + std::to_string(tracks) +
                       " tracks, more than " + std::to_string(kTraceTidStride - 1));
  auto tid = [&](int track) { return pid * kTraceTidStride + track; };  // track: engine, then the lanes

  nlohmann::json ev = nlohmann::json::array();
  ev.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", pid}, {"args", {{"name", "chip " + std::to_string(chip)}}}});
  ev.push_back({{"ph", "M"}, {"name", "process_sort_index"}, {"pid", pid}, {"args", {{"sort_index", chip}}}});
  for (int t = 0; t < tracks; ++t) {
    std::string name = t < tl.num_engines() ? tl.engine_name(t) : std::string("collectives");
    if (t > tl.num_engines()) name.append(" ").append(std::to_string(t - tl.num_engines() + 1));
    if (pipeline && t == pipeline_track) name = "pipeline stage (micro-batch F / B)";
    ev.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", pid}, {"tid", tid(t)}, {"args", {{"name", name}}}});
    ev.push_back({{"ph", "M"}, {"name", "thread_sort_index"}, {"pid", pid}, {"tid", tid(t)}, {"args", {{"sort_index", t}}}});
  }
  for (size_t i = 0; i < events.size(); ++i) {
    const auto& e = events[i];
    nlohmann::json args = nlohmann::json::object();
    if (e.category == "compute") args["flops"] = count(e.flops);
    args["bytes"] = count(e.bytes);
    if (e.peer >= 0) args["peer"] = e.peer;
    const int track = e.engine >= 0            ? e.engine
                      : e.category == "pipeline" ? pipeline_track
                                                 : tl.num_engines() + lane_of[i];
    ev.push_back({{"ph", "X"},
                  {"name", e.name},
                  {"cat", e.category},
                  {"pid", pid},
                  {"tid", tid(track)},
                  {"ts", us(spans[i].start)},
                  {"dur", us(spans[i].end - spans[i].start)},
                  {"args", std::move(args)}});
  }
  return ev;
}

void write_trace(const runtime::World& world, const sim::Timeline& tl, const std::string& path) {
  // Each rank sends the inside of its JSON array; rank 0 splices them into one traceEvents array (no reparse).
  // Invalid UTF-8 in a name (it may come from a config) becomes U+FFFD instead of an exception on one rank.
  std::string mine = trace_events(tl).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  mine = mine.size() > 2 ? mine.substr(1, mine.size() - 2) : std::string();
  if (!world.vcomm() && mine.size() > static_cast<size_t>(INT_MAX))
    throw RuntimeFault("trace: chip " + std::to_string(tl.chip()) + " has more than 2 GiB of events");
  // Chip c's events at all[displs[c]], lens[c] bytes (on rank 0).
  std::vector<size_t> lens(static_cast<size_t>(world.size())), displs(lens.size(), 0);
  std::string all;
  if (world.vcomm()) {
    // Several chips per rank: through the chip router to chip 0 (variable-length, no 2 GiB limit).
    const auto parts = runtime::chips::gather(*world.vcomm(), mine.data(), mine.size(), 0, "trace");
    if (world.rank() == 0) {
      size_t total = 0;
      for (size_t i = 0; i < parts.size(); ++i) {
        displs[i] = total;
        lens[i] = parts[i].size();
        total += lens[i];
      }
      all.resize(total);
      for (size_t i = 0; i < parts.size(); ++i)
        if (lens[i]) std::memcpy(all.data() + displs[i], parts[i].data(), lens[i]);
    }
  } else {
    int len = static_cast<int>(mine.size());
    std::vector<int> ilens(lens.size()), idispls(lens.size(), 0);
    runtime::check_mpi(MPI_Gather(&len, 1, MPI_INT, ilens.data(), 1, MPI_INT, 0, world.comm()), world.rank(), "trace");
    long long total = 0;
    if (world.rank() == 0) {
      for (size_t i = 0; i < ilens.size(); ++i) {
        idispls[i] = static_cast<int>(std::min<long long>(total, INT_MAX));
        total += ilens[i];
      }
    }
    // MPI counts and displacements are ints: one gather carries at most 2 GiB. Every rank learns whether it fits.
    runtime::check_mpi(MPI_Bcast(&total, 1, MPI_LONG_LONG, 0, world.comm()), world.rank(), "trace");
    if (total > INT_MAX)
      throw AgreedError("trace: " + std::to_string(total) + " bytes of events, more than one gather carries (2 GiB)",
                        kExitRuntimeFault);
    if (world.rank() == 0) all.resize(static_cast<size_t>(total));
    runtime::check_mpi(MPI_Gatherv(mine.data(), len, MPI_CHAR, all.data(), ilens.data(), idispls.data(), MPI_CHAR, 0,
                                   world.comm()),
                       world.rank(), "trace");
    for (size_t i = 0; i < lens.size(); ++i) {
      lens[i] = static_cast<size_t>(ilens[i]);
      displs[i] = static_cast<size_t>(idispls[i]);
    }
  }
  // Rank 0 writes the file atomically (common/output_file.h); every rank learns the outcome, so a failure (e.g. a
  // full disk) is exit 3 everywhere with one line from rank 0.
  world.agree([&] {
    if (world.rank() != 0) return;
    const nlohmann::json header = {
        {"displayTimeUnit", "ns"},
        {"otherData",
         {{"clock", "simulated"},
          {"time_unit", "ts/dur in us of simulated time, start and end rounded to 1 ps"},
          {"processes", "pid = chip + 1, named 'chip N'"},
          {"chips", world.size()}}}};
    std::string head = header.dump();
    head.pop_back();  // the closing brace: traceEvents follows
    OutputFile out(path);
    out.write(head);
    out.write(",\"traceEvents\":[");
    bool first = true;
    for (size_t i = 0; i < lens.size(); ++i) {
      if (lens[i] == 0) continue;
      if (!first) out.write(",\n");
      first = false;
      out.write(std::string_view(all.data() + displs[i], lens[i]));
    }
    out.write("]}\n");
    out.commit();
  });
}

}  // namespace shardsim::sharding

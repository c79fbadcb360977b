#include "models/trace.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <climits>
#include <cstring>
#include <cstdio>
#include <map>
#include <optional>
#include <string_view>
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
  sim::ChipEvents ce{tl.chip(), tl.events()};
  ce.events.insert(ce.events.end(), tl.receives().begin(), tl.receives().end());
  return trace_events(ce, tl.topology(), {}, {});
}

namespace {

std::string hex_id(std::uint64_t id) {
  char b[24];
  std::snprintf(b, sizeof b, "0x%llx", static_cast<unsigned long long>(id));
  return b;
}

// Greedy interval partitioning in start order (the fewest tracks without overlap) of the events of EVENTS on
// ENGINE; LANE_OF gets each one's lane. Returns the number of lanes.
template <class Spans>
int pack_lanes(const std::vector<sim::Event>& events, const Spans& spans, int engine, std::vector<int>& lane_of) {
  std::vector<size_t> idx;
  for (size_t i = 0; i < events.size(); ++i)
    if (events[i].engine == engine && events[i].category != "pipeline") idx.push_back(i);
  std::stable_sort(idx.begin(), idx.end(), [&](size_t a, size_t b) {
    return spans[a].start != spans[b].start ? spans[a].start < spans[b].start : spans[a].end > spans[b].end;
  });
  std::vector<Ps> lane_free;  // end of the last event on each track
  for (size_t i : idx) {
    size_t lane = 0;
    while (lane < lane_free.size() && lane_free[lane] > spans[i].start) ++lane;
    if (lane == lane_free.size()) lane_free.push_back(0);
    lane_free[lane] = spans[i].end;
    lane_of[i] = static_cast<int>(lane);
  }
  return static_cast<int>(lane_free.size());
}

}  // namespace

nlohmann::json trace_events(const sim::ChipEvents& ce, const topology::Topology& topo,
                            const std::vector<size_t>& critical, const std::unordered_set<std::uint64_t>& paired) {
  const int chip = ce.chip;
  const int pid = chip + 1;
  const auto& events = ce.events;

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

  // Collective regions (engine -1), then receives (engine -2), each on their own lanes. Pipeline actions (category
  // "pipeline": a stage's forward / backward of one micro-batch) have one track of their own, after the regions.
  std::vector<int> lane_of(events.size(), -1);
  bool pipeline = false;
  for (const auto& e : events) pipeline = pipeline || (e.engine == -1 && e.category == "pipeline");
  const int engines = 1 + static_cast<int>(topo.out_links(chip).size());
  const int lanes = std::max(1, pack_lanes(events, spans, -1, lane_of));
  const int pipeline_track = engines + lanes;
  const int recv_first = engines + lanes + (pipeline ? 1 : 0);
  const int recv_lanes = pack_lanes(events, spans, -2, lane_of);
  const int tracks = recv_first + recv_lanes;
  if (tracks >= kTraceTidStride)
    throw RuntimeFault("trace: chip " + std::to_string(chip) + " needs " + std::to_string(tracks) +
                       " tracks, more than " + std::to_string(kTraceTidStride - 1));
  auto tid = [&](int track) { return pid * kTraceTidStride + track; };  // track: engine, the lanes, receive lanes

  nlohmann::json ev = nlohmann::json::array();
  ev.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", pid}, {"args", {{"name", "chip " + std::to_string(chip)}}}});
  ev.push_back({{"ph", "M"}, {"name", "process_sort_index"}, {"pid", pid}, {"args", {{"sort_index", chip}}}});
  for (int t = 0; t < tracks; ++t) {
    std::string name;
    if (t < engines) {
      name = sim::Timeline::engine_name(topo, chip, t);
    } else if (t < engines + lanes) {
      name = "collectives";
      if (t > engines) name.append(" ").append(std::to_string(t - engines + 1));
    } else if (pipeline && t == pipeline_track) {
      name = "pipeline stage (micro-batch F / B)";
    } else {
      name = "receives";
      if (t > recv_first) name.append(" ").append(std::to_string(t - recv_first + 1));
    }
    ev.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", pid}, {"tid", tid(t)}, {"args", {{"name", name}}}});
    ev.push_back({{"ph", "M"}, {"name", "thread_sort_index"}, {"pid", pid}, {"tid", tid(t)}, {"args", {{"sort_index", t}}}});
  }
  std::vector<char> on_path(events.size(), 0);
  for (size_t i : critical) on_path.at(i) = 1;
  for (size_t i = 0; i < events.size(); ++i) {
    const auto& e = events[i];
    nlohmann::json args = nlohmann::json::object();
    if (e.category == "compute") args["flops"] = count(e.flops);
    args["bytes"] = count(e.bytes);
    if (e.peer >= 0) args["peer"] = e.peer;
    if (e.bound != sim::Bound::none) args["bound"] = sim::bound_name(e.bound);
    if (on_path[i]) args["critical_path"] = true;
    const int track = e.engine >= 0             ? e.engine
                      : e.category == "pipeline" ? pipeline_track
                      : e.engine == -1           ? engines + lane_of[i]
                                                 : recv_first + lane_of[i];
    nlohmann::json x = {{"ph", "X"},
                        {"name", e.name},
                        {"cat", e.category},
                        {"pid", pid},
                        {"tid", tid(track)},
                        {"ts", us(spans[i].start)},
                        {"dur", us(spans[i].end - spans[i].start)},
                        {"args", std::move(args)}};
    if (e.category == "send" && e.id && paired.count(e.id)) {
      x["bind_id"] = hex_id(e.id);
      x["flow_out"] = true;
    } else if (e.engine == -2 && e.producer && paired.count(e.producer)) {
      x["bind_id"] = hex_id(e.producer);
      x["flow_in"] = true;
    }
    ev.push_back(std::move(x));
  }
  return ev;
}

namespace {

// Serialized events of one chip (gather_events): per event the strings with their lengths, then the fields.
template <class T>
void put(std::string& out, const T& v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof v);
}
void put_string(std::string& out, const std::string& s) {
  put(out, static_cast<std::uint32_t>(s.size()));
  out += s;
}
struct Reader {
  std::string_view in;
  size_t at = 0;
  template <class T>
  T get() {
    if (at + sizeof(T) > in.size()) throw RuntimeFault("profile: truncated event data in a gather");
    T v;
    std::memcpy(&v, in.data() + at, sizeof v);
    at += sizeof v;
    return v;
  }
  std::string get_string() {
    const auto n = get<std::uint32_t>();
    if (at + n > in.size()) throw RuntimeFault("profile: truncated event data in a gather");
    std::string s(in.substr(at, n));
    at += n;
    return s;
  }
};

void put_event(std::string& out, const sim::Event& e) {
  put_string(out, e.name);
  put_string(out, e.category);
  put(out, static_cast<std::int32_t>(e.engine));
  put(out, e.span.start);
  put(out, e.span.end);
  put(out, e.flops);
  put(out, e.bytes);
  put(out, static_cast<std::int32_t>(e.peer));
  put(out, e.id);
  put(out, e.producer);
  put(out, static_cast<std::uint8_t>(e.bound));
}

sim::Event get_event(Reader& r) {
  sim::Event e;
  e.name = r.get_string();
  e.category = r.get_string();
  e.engine = r.get<std::int32_t>();
  e.span.start = r.get<double>();
  e.span.end = r.get<double>();
  e.flops = r.get<double>();
  e.bytes = r.get<double>();
  e.peer = r.get<std::int32_t>();
  e.id = r.get<std::uint64_t>();
  e.producer = r.get<std::uint64_t>();
  e.bound = static_cast<sim::Bound>(r.get<std::uint8_t>());
  return e;
}

// Collective: every chip's MINE on rank 0 (in chip order); empty elsewhere.
std::vector<std::string> gather_strings(const runtime::World& world, const std::string& mine, int chip,
                                        const char* what) {
  std::vector<std::string> parts;
  if (world.vcomm()) {
    // Several chips per rank: through the chip router to chip 0 (variable-length, no 2 GiB limit).
    auto got = runtime::chips::gather(*world.vcomm(), mine.data(), mine.size(), 0, what);
    if (world.rank() == 0)
      for (auto& g : got) parts.emplace_back(reinterpret_cast<const char*>(g.data()), g.size());
    return parts;
  }
  if (mine.size() > static_cast<size_t>(INT_MAX))
    throw RuntimeFault(std::string(what) + ": chip " + std::to_string(chip) + " has more than 2 GiB of events");
  int len = static_cast<int>(mine.size());
  std::vector<int> ilens(static_cast<size_t>(world.size())), idispls(ilens.size(), 0);
  runtime::check_mpi(MPI_Gather(&len, 1, MPI_INT, ilens.data(), 1, MPI_INT, 0, world.comm()), world.rank(), what);
  long long total = 0;
  if (world.rank() == 0) {
    for (size_t i = 0; i < ilens.size(); ++i) {
      idispls[i] = static_cast<int>(std::min<long long>(total, INT_MAX));
      total += ilens[i];
    }
  }
  // MPI counts and displacements are ints: one gather carries at most 2 GiB. Every rank learns whether it fits.
  runtime::check_mpi(MPI_Bcast(&total, 1, MPI_LONG_LONG, 0, world.comm()), world.rank(), what);
  if (total > INT_MAX)
    throw AgreedError(std::string(what) + ": " + std::to_string(total) +
                          " bytes of events, more than one gather carries (2 GiB)",
                      kExitRuntimeFault);
  std::string all;
  if (world.rank() == 0) all.resize(static_cast<size_t>(total));
  runtime::check_mpi(MPI_Gatherv(mine.data(), len, MPI_CHAR, all.data(), ilens.data(), idispls.data(), MPI_CHAR, 0,
                                 world.comm()),
                     world.rank(), what);
  if (world.rank() == 0)
    for (size_t i = 0; i < ilens.size(); ++i) parts.push_back(all.substr(static_cast<size_t>(idispls[i]), static_cast<size_t>(ilens[i])));
  return parts;
}

}  // namespace

namespace {

// The critical path as a process of its own (pid CHIPS + 1): one slice per step, "chip N: OP", and "waiting".
nlohmann::json critical_path_events(const sim::CriticalPath& p, const std::vector<sim::ChipEvents>& all, int chips) {
  const int pid = chips + 1;
  const long tid = static_cast<long>(pid) * kTraceTidStride;
  nlohmann::json ev = nlohmann::json::array();
  ev.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", pid}, {"args", {{"name", "critical path"}}}});
  ev.push_back({{"ph", "M"}, {"name", "process_sort_index"}, {"pid", pid}, {"args", {{"sort_index", -1}}}});
  ev.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", pid}, {"tid", tid}, {"args", {{"name", "critical path"}}}});
  std::map<int, size_t> pos;
  for (size_t c = 0; c < all.size(); ++c) pos[all[c].chip] = c;
  for (const auto& s : p.steps) {
    const sim::Event& e = all[pos.at(s.chip)].events[s.index];
    if (s.waiting > 0) {
      const Ps a = to_ps(s.from - s.waiting, e, s.chip), b = to_ps(s.from, e, s.chip);
      ev.push_back({{"ph", "X"}, {"name", "waiting"}, {"cat", "critical_path"}, {"pid", pid}, {"tid", tid},
                    {"ts", us(a)}, {"dur", us(b - a)}, {"args", {{"class", "waiting"}}}});
    }
    const Ps a = to_ps(s.from, e, s.chip), b = to_ps(e.span.end, e, s.chip);
    ev.push_back({{"ph", "X"},
                  {"name", "chip " + std::to_string(s.chip) + ": " + e.name},
                  {"cat", "critical_path"},
                  {"pid", pid},
                  {"tid", tid},
                  {"ts", us(a)},
                  {"dur", us(b - a)},
                  {"args", {{"chip", s.chip}, {"category", e.category},
                            {"class", sim::time_class_name(sim::time_class_of(e.bound))}}}});
  }
  return ev;
}

}  // namespace

std::vector<sim::ChipEvents> gather_events(const runtime::World& world, const sim::Timeline& tl) {
  std::string mine;
  put(mine, static_cast<std::int32_t>(tl.chip()));
  put(mine, static_cast<std::uint64_t>(tl.events().size() + tl.receives().size()));
  for (const auto& e : tl.events()) put_event(mine, e);
  for (const auto& e : tl.receives()) put_event(mine, e);
  const auto parts = gather_strings(world, mine, tl.chip(), "trace");
  std::vector<sim::ChipEvents> all;
  for (const auto& p : parts) {
    Reader r{p};
    sim::ChipEvents ce;
    ce.chip = r.get<std::int32_t>();
    const auto n = r.get<std::uint64_t>();
    ce.events.reserve(static_cast<size_t>(std::min<std::uint64_t>(n, p.size())));
    for (std::uint64_t i = 0; i < n; ++i) ce.events.push_back(get_event(r));
    all.push_back(std::move(ce));
  }
  std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.chip < b.chip; });
  return all;
}

void write_trace(const runtime::World& world, const sim::Timeline& tl, const std::string& path) {
  const auto all = gather_events(world, tl);
  write_trace_file(world, all, tl.topology(), nullptr, path);
}

void write_trace_file(const runtime::World& world, const std::vector<sim::ChipEvents>& all,
                      const topology::Topology& topo, const sim::Profile* profile, const std::string& path) {
  // Rank 0 writes the file atomically (common/output_file.h); every rank learns the outcome, so a failure (e.g. a
  // full disk) is exit 3 everywhere with one line from rank 0. Invalid UTF-8 in a name (it may come from a config)
  // becomes U+FFFD.
  world.agree([&] {
    if (world.rank() != 0) return;
    // With dependency recording: the critical path (unless given) and the sends whose receive was recorded.
    bool deps = false;
    for (const auto& ce : all)
      for (const auto& e : ce.events) deps = deps || e.id != 0;
    std::optional<sim::CriticalPath> own;
    const sim::CriticalPath* path_of = profile ? &profile->path : nullptr;
    if (deps && !path_of) path_of = &own.emplace(sim::critical_path(all));
    std::unordered_set<std::uint64_t> sends, paired;
    for (const auto& ce : all)
      for (const auto& e : ce.events)
        if (e.category == "send" && e.id) sends.insert(e.id);
    for (const auto& ce : all)
      for (const auto& e : ce.events)
        if (e.engine == -2 && e.producer && sends.count(e.producer)) paired.insert(e.producer);
    std::map<int, std::vector<size_t>> critical;  // chip -> its events on the path
    if (path_of)
      for (const auto& s : path_of->steps) critical[s.chip].push_back(s.index);
    const nlohmann::json header = {
        {"displayTimeUnit", "ns"},
        {"otherData",
         {{"clock", "simulated"},
          {"time_unit", "ts/dur in us of simulated time, start and end rounded to 1 ps"},
          {"processes", "pid = chip + 1, named 'chip N'" + std::string(path_of ? "; the last one: the critical path" : "")},
          {"chips", world.size()}}}};
    std::string head = header.dump();
    head.pop_back();  // the closing brace: traceEvents follows
    OutputFile out(path);
    out.write(head);
    out.write(",\"traceEvents\":[");
    bool first = true;
    auto put_array = [&](const nlohmann::json& a) {
      std::string s = a.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
      if (s.size() <= 2) return;
      if (!first) out.write(",\n");
      first = false;
      out.write(std::string_view(s).substr(1, s.size() - 2));
    };
    static const std::vector<size_t> none;
    for (const auto& ce : all) {
      const auto it = critical.find(ce.chip);
      put_array(trace_events(ce, topo, it == critical.end() ? none : it->second, paired));
    }
    if (path_of) put_array(critical_path_events(*path_of, all, topo.num_chips()));
    out.write("]}\n");
    out.commit();
  });
}

}  // namespace shardsim::sharding

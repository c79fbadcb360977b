#include "reporting/trace.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <climits>
#include <cstring>
#include <cstdio>
#include <map>
#include <optional>
#include <unordered_map>
#include <string_view>
#include <vector>

#include "common/error.h"
#include "common/output_file.h"
#include "runtime/chips.h"

namespace shardsim::reporting {

namespace {

using Ps = std::int64_t;  // picoseconds of simulated time

// Nearest picosecond of a time in ns. Monotone, so spans that do not overlap in ns do not overlap in ps.
Ps to_ps(double ns, const sim::ProfileEvent& e, int chip) {
  // 9e15 ps (2.5 h of simulated time) keeps every ps exact in the double the JSON number is read into.
  if (!std::isfinite(ns) || ns < 0 || ns > 9e12)
    throw RuntimeFault("trace: chip " + std::to_string(chip) + ", event '" + std::string(e.name) + "': simulated time " +
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
  return trace_events(ce, tl.topology(), {}, {}, TraceFilter{});
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
int pack_lanes(const std::vector<sim::ProfileEvent>& events, const Spans& spans, int engine, const std::vector<char>& kept,
               std::vector<int>& lane_of) {
  std::vector<size_t> idx;
  for (size_t i = 0; i < events.size(); ++i)
    if (kept[i] && events[i].engine == engine && events[i].category != "pipeline") idx.push_back(i);
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
                            const std::vector<size_t>& critical, const std::vector<std::uint64_t>& paired,
                            const TraceFilter& filter) {
  const int chip = ce.chip;
  const int pid = chip + 1;
  const auto& events = ce.events;

  struct Span {
    Ps start, end;
  };
  std::vector<Span> spans;
  std::vector<char> kept(events.size(), 0);
  spans.reserve(events.size());
  for (size_t i = 0; i < events.size(); ++i) {
    const auto& e = events[i];
    Span s{to_ps(e.span.start, e, chip), to_ps(e.span.end, e, chip)};
    if (s.end < s.start)
      throw RuntimeFault("trace: chip " + std::to_string(chip) + ", event '" + std::string(e.name) +
                         "' ends before it starts");
    spans.push_back(s);
    kept[i] = filter.keeps_span(e.span.start, e.span.end) ? 1 : 0;
  }

  // Collective regions (engine -1), then receives (engine -2), each on their own lanes. Pipeline actions (category
  // "pipeline": a stage's forward / backward of one micro-batch) have one track of their own, after the regions.
  std::vector<int> lane_of(events.size(), -1);
  bool pipeline = false;
  for (size_t i = 0; i < events.size(); ++i)
    pipeline = pipeline || (kept[i] && events[i].engine == -1 && events[i].category == "pipeline");
  const int engines = 1 + static_cast<int>(topo.out_links(chip).size());
  const int lanes = std::max(1, pack_lanes(events, spans, -1, kept, lane_of));
  const int pipeline_track = engines + lanes;
  // The host's kernel issue (eager launch; sim::Timeline::kHostEngine) has a track of its own when recorded.
  bool host = false;
  for (size_t i = 0; i < events.size() && !host; ++i) host = kept[i] && events[i].engine == sim::Timeline::kHostEngine;
  const int host_track = pipeline_track + (pipeline ? 1 : 0);
  const int recv_first = host_track + (host ? 1 : 0);
  const int recv_lanes = pack_lanes(events, spans, -2, kept, lane_of);
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
    } else if (host && t == host_track) {
      name = "host (kernel launches, eager)";
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
    if (!kept[i]) continue;
    const auto& e = events[i];
    nlohmann::json args = nlohmann::json::object();
    if (e.category == "compute") args["flops"] = count(e.flops);
    args["bytes"] = count(e.bytes);
    if (e.peer >= 0) args["peer"] = e.peer;
    if (e.bound != sim::Bound::none) args["bound"] = sim::bound_name(e.bound);
    if (on_path[i]) args["critical_path"] = true;
    const int track = e.engine >= 0             ? e.engine
                      : e.category == "pipeline" ? pipeline_track
                      : e.engine == sim::Timeline::kHostEngine ? host_track
                      : e.engine == -1           ? engines + lane_of[i]
                                                 : recv_first + lane_of[i];
    nlohmann::json x = {{"ph", "X"},
                        {"name", std::string(e.name)},
                        {"cat", std::string(e.category)},
                        {"pid", pid},
                        {"tid", tid(track)},
                        {"ts", us(spans[i].start)},
                        {"dur", us(spans[i].end - spans[i].start)},
                        {"args", std::move(args)}};
    if (e.category == "send" && e.id && std::binary_search(paired.begin(), paired.end(), e.id)) {
      x["bind_id"] = hex_id(e.id);
      x["flow_out"] = true;
    } else if (e.engine == -2 && e.producer && std::binary_search(paired.begin(), paired.end(), e.producer)) {
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

// One chip's events, compactly: the chip, its distinct names (each once), then per event the index of its name
// and category in that table and its fields (65 bytes an event; the names were most of an Event's size).
std::string serialize_chip(int chip, const std::vector<sim::Event>& events, const std::vector<sim::Event>& receives) {
  std::unordered_map<std::string_view, std::uint32_t> index;
  std::vector<std::string_view> names;
  auto name_of = [&](const std::string& n) {
    const auto [it, fresh] = index.try_emplace(n, static_cast<std::uint32_t>(names.size()));
    if (fresh) names.push_back(n);
    return it->second;
  };
  std::string body;
  body.reserve((events.size() + receives.size()) * 65);
  auto put_event = [&](const sim::Event& e) {
    put(body, name_of(e.name));
    put(body, name_of(e.category));
    put(body, static_cast<std::int32_t>(e.engine));
    put(body, e.span.start);
    put(body, e.span.end);
    put(body, e.flops);
    put(body, e.bytes);
    put(body, static_cast<std::int32_t>(e.peer));
    put(body, e.id);
    put(body, e.producer);
    put(body, static_cast<std::uint8_t>(e.bound));
  };
  for (const auto& e : events) put_event(e);
  for (const auto& e : receives) put_event(e);
  std::string out;
  put(out, static_cast<std::int32_t>(chip));
  put(out, static_cast<std::uint32_t>(names.size()));
  for (const auto n : names) put_string(out, std::string(n));
  put(out, static_cast<std::uint64_t>(events.size() + receives.size()));
  return out + body;
}

sim::ChipEvents deserialize_chip(std::string_view part) {
  Reader r{part};
  sim::ChipEvents ce;
  ce.chip = r.get<std::int32_t>();
  const auto n_names = r.get<std::uint32_t>();
  std::vector<std::string_view> names;
  for (std::uint32_t i = 0; i < n_names && r.at < part.size(); ++i) names.push_back(sim::intern_name(r.get_string()));
  if (names.size() != n_names) throw RuntimeFault("profile: truncated event data in a gather");
  const auto name = [&](std::uint32_t i) {
    if (i >= names.size()) throw RuntimeFault("profile: corrupt event data in a gather");
    return names[i];
  };
  const auto n = r.get<std::uint64_t>();
  ce.events.reserve(static_cast<size_t>(std::min<std::uint64_t>(n, part.size() / 65 + 1)));
  for (std::uint64_t i = 0; i < n; ++i) {
    sim::ProfileEvent e;
    e.name = name(r.get<std::uint32_t>());
    e.category = name(r.get<std::uint32_t>());
    e.engine = r.get<std::int32_t>();
    e.span.start = r.get<double>();
    e.span.end = r.get<double>();
    e.flops = r.get<double>();
    e.bytes = r.get<double>();
    e.peer = r.get<std::int32_t>();
    e.id = r.get<std::uint64_t>();
    e.producer = r.get<std::uint64_t>();
    e.bound = static_cast<sim::Bound>(r.get<std::uint8_t>());
    ce.events.push_back(e);
  }
  return ce;
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
nlohmann::json critical_path_events(const sim::CriticalPath& p, const std::vector<sim::ChipEvents>& all, int chips,
                                    const TraceFilter& filter) {
  const int pid = chips + 1;
  const long tid = static_cast<long>(pid) * kTraceTidStride;
  nlohmann::json ev = nlohmann::json::array();
  ev.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", pid}, {"args", {{"name", "critical path"}}}});
  ev.push_back({{"ph", "M"}, {"name", "process_sort_index"}, {"pid", pid}, {"args", {{"sort_index", -1}}}});
  ev.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", pid}, {"tid", tid}, {"args", {{"name", "critical path"}}}});
  std::map<int, size_t> pos;
  for (size_t c = 0; c < all.size(); ++c) pos[all[c].chip] = c;
  for (const auto& s : p.steps) {
    const sim::ProfileEvent& e = all[pos.at(s.chip)].events[s.index];
    if (!filter.keeps_chip(s.chip) || !filter.keeps_span(s.from - s.waiting, e.span.end)) continue;
    if (s.waiting > 0) {
      const Ps a = to_ps(s.from - s.waiting, e, s.chip), b = to_ps(s.from, e, s.chip);
      ev.push_back({{"ph", "X"}, {"name", "waiting"}, {"cat", "critical_path"}, {"pid", pid}, {"tid", tid},
                    {"ts", us(a)}, {"dur", us(b - a)}, {"args", {{"class", "waiting"}}}});
    }
    const Ps a = to_ps(s.from, e, s.chip), b = to_ps(e.span.end, e, s.chip);
    ev.push_back({{"ph", "X"},
                  {"name", "chip " + std::to_string(s.chip) + ": " + std::string(e.name)},
                  {"cat", "critical_path"},
                  {"pid", pid},
                  {"tid", tid},
                  {"ts", us(a)},
                  {"dur", us(b - a)},
                  {"args", {{"chip", s.chip}, {"category", std::string(e.category)},
                            {"class", sim::time_class_name(sim::time_class_of(e.bound))}}}});
  }
  return ev;
}

}  // namespace

std::vector<sim::ChipEvents> gather_events(const runtime::World& world, sim::Timeline& tl) {
  // The chip's events leave its timeline as they are serialized (nothing reads them after), and each chip's part
  // is freed as rank 0 decodes it: host memory holds each event about once at a time.
  std::string mine = serialize_chip(tl.chip(), tl.events(), tl.receives());
  tl.release_events();
  auto parts = gather_strings(world, mine, tl.chip(), "trace");
  std::string().swap(mine);
  std::vector<sim::ChipEvents> all;
  all.reserve(parts.size());
  for (auto& p : parts) {
    all.push_back(deserialize_chip(p));
    std::string().swap(p);
  }
  std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.chip < b.chip; });
  return all;
}

TraceSize trace_size(const runtime::World& world, const sim::Timeline& tl, const TraceFilter& filter) {
  // Per kept event about 160 bytes of JSON plus its name (measured: 175 bytes at 18-character names), per chip
  // its process and track names.
  double mine[2] = {0, 0};
  if (filter.keeps_chip(tl.chip())) {
    auto add = [&](const sim::Event& e) {
      if (!filter.keeps_span(e.span.start, e.span.end)) return;
      mine[0] += 1;
      mine[1] += 160 + double(e.name.size());
    };
    for (const auto& e : tl.events()) add(e);
    for (const auto& e : tl.receives()) add(e);
    mine[1] += 2000;
  }
  const auto all = world.allgather(mine, sizeof mine, "trace size");
  TraceSize t;
  for (size_t i = 0; i + sizeof mine <= all.size(); i += sizeof mine) {
    double v[2];
    std::memcpy(v, all.data() + i, sizeof v);
    t.events += v[0];
    t.bytes += v[1];
    if (v[1] > 0) ++t.chips;
  }
  return t;
}

void write_trace(const runtime::World& world, sim::Timeline& tl, const std::string& path) {
  const auto all = gather_events(world, tl);
  write_trace_file(world, all, tl.topology(), nullptr, path, TraceFilter{});
}

void write_trace_file(const runtime::World& world, const std::vector<sim::ChipEvents>& all,
                      const topology::Topology& topo, const sim::Profile* profile, const std::string& path,
                      const TraceFilter& filter) {
  // Rank 0 writes the file atomically (common/output_file.h); every rank learns the outcome, so a failure (e.g. a
  // full disk) is exit 3 everywhere with one line from rank 0. Invalid UTF-8 in a name (it may come from a config)
  // becomes U+FFFD.
  world.agree([&] {
    if (world.rank() != 0) return;
    // With dependency recording: the critical path (unless given) and the sends whose receive was recorded, both
    // ends kept by the filter (an arrow needs both of its slices in the file).
    bool deps = false;
    for (const auto& ce : all)
      for (const auto& e : ce.events) deps = deps || e.id != 0;
    const sim::EventIndex index(all);
    std::optional<sim::CriticalPath> own;
    const sim::CriticalPath* path_of = profile ? &profile->path : nullptr;
    if (deps && !path_of) path_of = &own.emplace(sim::critical_path(all, &index));
    std::vector<std::uint64_t> paired;
    for (const auto& ce : all) {
      if (!filter.keeps_chip(ce.chip)) continue;
      for (const auto& e : ce.events) {
        if (e.engine != -2 || !e.producer || !filter.keeps_span(e.span.start, e.span.end)) continue;
        int pos = 0;
        size_t i = 0;
        if (!index.locate(e.producer, pos, i)) continue;
        const sim::ProfileEvent& send = all[static_cast<size_t>(pos)].events[i];
        if (send.category == "send" && filter.keeps_chip(all[static_cast<size_t>(pos)].chip) &&
            filter.keeps_span(send.span.start, send.span.end))
          paired.push_back(e.producer);
      }
    }
    std::sort(paired.begin(), paired.end());
    std::map<int, std::vector<size_t>> critical;  // chip -> its events on the path
    if (path_of)
      for (const auto& s : path_of->steps) critical[s.chip].push_back(s.index);
    nlohmann::json other = {
        {"clock", "simulated"},
        {"time_unit", "ts/dur in us of simulated time, start and end rounded to 1 ps"},
        {"processes", "pid = chip + 1, named 'chip N'" + std::string(path_of ? "; the last one: the critical path" : "")},
        {"chips", world.size()}};
    if (!filter.text.empty()) other["filter"] = filter.text;
    const nlohmann::json header = {{"displayTimeUnit", "ns"}, {"otherData", other}};
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
      if (!filter.keeps_chip(ce.chip)) continue;
      const auto it = critical.find(ce.chip);
      put_array(trace_events(ce, topo, it == critical.end() ? none : it->second, paired, filter));
    }
    if (path_of) put_array(critical_path_events(*path_of, all, topo.num_chips(), filter));
    out.write("]}\n");
    out.commit();
  });
}

}  // namespace shardsim::reporting

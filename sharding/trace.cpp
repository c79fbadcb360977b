#include "sharding/trace.h"

#include <fstream>

#include "common/error.h"

namespace shardsim::sharding {

nlohmann::json trace_events(const sim::Timeline& tl) {
  nlohmann::json ev = nlohmann::json::array();
  const int pid = tl.chip();
  const int collectives_tid = tl.num_engines();
  ev.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", pid}, {"args", {{"name", "chip " + std::to_string(pid)}}}});
  ev.push_back({{"ph", "M"}, {"name", "process_sort_index"}, {"pid", pid}, {"args", {{"sort_index", pid}}}});
  for (int e = 0; e < tl.num_engines(); ++e)
    ev.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", pid}, {"tid", e}, {"args", {{"name", tl.engine_name(e)}}}});
  ev.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", pid}, {"tid", collectives_tid},
                {"args", {{"name", "collectives"}}}});
  for (const auto& e : tl.events()) {
    nlohmann::json args = {{"bytes", e.bytes}};
    if (e.flops > 0) args["flops"] = e.flops;
    if (e.peer >= 0) args["peer"] = e.peer;
    ev.push_back({{"ph", "X"},
                  {"name", e.name},
                  {"cat", e.category},
                  {"pid", pid},
                  {"tid", e.engine >= 0 ? e.engine : collectives_tid},
                  {"ts", e.span.start / 1e3},
                  {"dur", e.span.duration() / 1e3},
                  {"args", args}});
  }
  return ev;
}

void write_trace(const runtime::World& world, const sim::Timeline& tl, const std::string& path) {
  const std::string mine = trace_events(tl).dump();
  int len = static_cast<int>(mine.size());
  std::vector<int> lens(static_cast<size_t>(world.size()));
  runtime::check_mpi(MPI_Gather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, 0, world.comm()), world.rank(), "trace");
  std::vector<int> displs(lens.size(), 0);
  std::string all;
  if (world.rank() == 0) {
    long total = 0;
    for (size_t i = 0; i < lens.size(); ++i) {
      displs[i] = static_cast<int>(total);
      total += lens[i];
    }
    all.resize(static_cast<size_t>(total));
  }
  runtime::check_mpi(MPI_Gatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), displs.data(), MPI_CHAR, 0,
                                 world.comm()),
                     world.rank(), "trace");
  int failed = 0;
  if (world.rank() == 0) {
    nlohmann::json doc = {{"displayTimeUnit", "ns"},
                          {"otherData", {{"clock", "simulated"}, {"ts_unit", "us of simulated time"}}},
                          {"traceEvents", nlohmann::json::array()}};
    for (size_t i = 0; i < lens.size(); ++i) {
      auto part = nlohmann::json::parse(all.substr(static_cast<size_t>(displs[i]), static_cast<size_t>(lens[i])));
      for (auto& e : part) doc["traceEvents"].push_back(std::move(e));
    }
    std::ofstream out(path);
    out << doc.dump() << "\n";
    failed = out.good() ? 0 : 1;
  }
  MPI_Bcast(&failed, 1, MPI_INT, 0, world.comm());
  if (failed) throw RuntimeFault("cannot write trace to '" + path + "'");
}

}  // namespace shardsim::sharding

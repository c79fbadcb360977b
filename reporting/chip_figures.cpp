// The per-chip figures of a run's report (reporting/report.h): each chip's op rows, its step with the pipeline
// bubble apart, and the every-chip tables, gathered host-side over the world; the critical chip (the one that ends
// last) is the summary's, in every mode.
#include <algorithm>
#include <cstring>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

#include "reporting/report.h"
#include "runtime/chips.h"

namespace shardsim::reporting {

std::vector<OpStat> op_breakdown(const sim::Timeline& tl) {
  std::vector<OpStat> out;  // the timeline's totals, ordered by (kind, name)
  for (const auto& t : tl.op_totals()) out.push_back({t.name, t.kind, t.calls, t.time_ns, t.flops, t.bytes});
  std::stable_sort(out.begin(), out.end(), [](const OpStat& a, const OpStat& b) {
    if (a.kind != b.kind) return a.kind == "kernel";
    return a.time_ns > b.time_ns;
  });
  return out;
}

int critical_rank(const runtime::World& world, double my_total_ns) {
  const auto bytes = world.allgather(&my_total_ns, sizeof my_total_ns, "report: critical chip");
  std::vector<double> totals(bytes.size() / sizeof(double));
  std::memcpy(totals.data(), bytes.data(), totals.size() * sizeof(double));
  int best = 0;  // the largest total, the lowest rank among equals (MPI_MAXLOC's rule)
  for (int r = 1; r < static_cast<int>(totals.size()); ++r)
    if (totals[static_cast<size_t>(r)] > totals[static_cast<size_t>(best)]) best = r;
  return best;
}

double pipeline_bubble_ns(const sim::Timeline& tl) {
  double wait = 0;
  for (const auto& o : tl.op_totals())
    if (o.kind == "collective" && o.name.rfind("pp.recv", 0) == 0) wait += o.time_ns;
  return std::min(wait, tl.breakdown().exposed_comm);
}

sim::Breakdown without_bubble(sim::Breakdown b, double bubble) {
  b.communication = std::max(0.0, b.communication - bubble);
  b.exposed_comm = std::max(0.0, b.exposed_comm - bubble);
  return b;
}

CriticalStep critical_step(const runtime::World& world, const sim::Breakdown& mine, const sim::Timeline& tl) {
  const double v[7] = {mine.total, mine.compute, mine.communication, mine.exposed_comm, mine.flops, mine.bytes_sent,
                       std::min(pipeline_bubble_ns(tl), mine.exposed_comm)};
  const auto bytes = world.allgather(v, sizeof v, "report: critical chip's step");
  std::vector<double> all(bytes.size() / sizeof(double));
  std::memcpy(all.data(), bytes.data(), all.size() * sizeof(double));
  size_t best = 0;  // the largest total, the lowest rank among equals (critical_rank's rule)
  for (size_t r = 1; r < all.size() / 7; ++r)
    if (all[7 * r] > all[7 * best]) best = r;
  const double* b = &all[7 * best];
  return {without_bubble(sim::Breakdown{b[0], b[1], b[2], b[3], b[4], b[5]}, b[6]), b[6], static_cast<int>(best)};
}

std::vector<OpStat> ops_of_rank(const runtime::World& world, const std::vector<OpStat>& mine, int critical) {
  nlohmann::json j = nlohmann::json::array();
  if (world.rank() == critical)
    for (const auto& o : mine) j.push_back({o.name, o.kind, o.calls, o.time_ns, o.flops, o.bytes});
  const std::string text = world.broadcast(world.rank() == critical ? j.dump() : std::string(), critical);
  std::vector<OpStat> out;
  for (const auto& r : nlohmann::json::parse(text))
    out.push_back({r[0].get<std::string>(), r[1].get<std::string>(), r[2].get<int>(), r[3].get<double>(),
                   r[4].get<double>(), r[5].get<double>()});
  return out;
}

namespace {
// The plan's collectives the report lists, in its order (the plan units' Comm keys).
const char* const kReportComm[] = {"tp all_reduce", "sp all_gather", "sp reduce_scatter", "cp ring K/V",
                                   "ulysses all_to_all"};

// The critical chip's fused ops and layer ends, sent from its rank CRITICAL to every rank: their counts differ
// between chips (pipeline stages hold different layers and fused ops), so they cannot ride in the fixed-size
// every-chip gather (a chip with more of them than the gathering chip overran its buffer: heap corruption under
// fused x pp).
struct CriticalLists {
  std::vector<sharding::FusedOp> fused;
  std::vector<double> layer_end;
};
CriticalLists lists_of_rank(const runtime::World& world, const ChipFigures& mine, int critical) {
  nlohmann::json j = nlohmann::json::object();
  if (world.rank() == critical) {
    j["names"] = nlohmann::json::array();
    if (mine.fused)
      for (const auto& f : *mine.fused) j["names"].push_back(f.name);
    j["values"] = mine.fused ? sharding::pack(*mine.fused) : std::vector<double>{};
    j["layer_end"] = mine.layer_end;
  }
  const std::string text = world.broadcast(world.rank() == critical ? j.dump() : std::string(), critical);
  const nlohmann::json got = nlohmann::json::parse(text);
  CriticalLists out;
  std::vector<sharding::FusedOp> names;
  for (const auto& n : got.at("names")) names.push_back({n.get<std::string>(), {}});
  const auto values = got.at("values").get<std::vector<double>>();
  if (values.size() != names.size() * size_t(sharding::kFusedFields))
    throw std::logic_error("report: the critical chip's fused figures do not match their names");
  if (!names.empty()) out.fused = sharding::unpack(values.data(), names);
  out.layer_end = got.at("layer_end").get<std::vector<double>>();
  return out;
}
}  // namespace

void gather_chip_figures(const runtime::World& world, const sim::Timeline& tl, const ChipFigures& mine,
                         const std::vector<int>& placement, RunReport& r) {
  const sim::Breakdown bd = tl.breakdown();
  std::vector<double> stats = {bd.total, bd.compute, bd.communication, bd.exposed_comm, mine.attention_ns,
                               mine.peak_memory_bytes, bd.flops, bd.bytes_sent, pipeline_bubble_ns(tl)};
  constexpr size_t kComm0 = 9;  // the per-collective figures start here, 4 per key
  for (const char* key : kReportComm) {
    const sharding::CommStat* c = nullptr;
    if (mine.comm)
      if (const auto it = mine.comm->find(key); it != mine.comm->end()) c = &it->second;
    stats.push_back(c ? c->bytes : 0);
    stats.push_back(c ? c->expected : 0);
    stats.push_back(c ? c->calls : 0);
    stats.push_back(c ? c->ns : 0);
  }
  const size_t nf = stats.size();  // the same on every chip: the every-chip gather below takes nf from each
  // A folded run: the critical chip's op rows come from its mirror in the simulated replica (equal timelines).
  const int critical = runtime::chips::mirror_of(critical_rank(world, bd.total));
  r.ops = ops_of_rank(world, op_breakdown(tl), critical);
  const CriticalLists lists = lists_of_rank(world, mine, critical);
  // Last, so no chip holds the every-chip figures across a wait (chips x figures each: 0.5 GB over a fold's replica).
  const auto bytes = world.allgather(stats.data(), nf * sizeof(double), "report: chip figures");
  std::vector<double> all(bytes.size() / sizeof(double));
  std::memcpy(all.data(), bytes.data(), all.size() * sizeof(double));
  const int chips = static_cast<int>(all.size() / nf);
  r.per_chip.clear();
  r.total_flops = 0;
  for (int k = 0; k < chips; ++k) {
    const double* v = &all[nf * static_cast<size_t>(k)];
    r.total_flops += v[6];  // integer-valued FLOP counts: the sum is exact in any order
    ChipReport cr;
    cr.chip = placement.at(static_cast<size_t>(k));
    cr.breakdown = without_bubble(sim::Breakdown{v[0], v[1], v[2], v[3], v[6], v[7]}, v[8]);
    cr.peak_memory_bytes = v[5];
    r.per_chip.push_back(cr);
    if (k > 0 && v[0] <= r.critical.total) continue;
    r.critical = cr.breakdown;
    r.critical_chip = cr.chip;
    r.bubble_ns = v[8];
    r.attention_ns = v[4];
    r.comm.clear();
    for (size_t c = 0; c < std::size(kReportComm); ++c) {
      const double* x = v + kComm0 + 4 * c;
      if (x[2] > 0) r.comm[kReportComm[c]] = sharding::CommStat{x[0], x[1], static_cast<int>(x[2]), x[3], {}};
    }
    // The algorithm that ran: this chip's record of the same collective (every chip of a plan runs one rule).
    for (auto& [key, stat] : r.comm)
      if (mine.comm)
        if (const auto it = mine.comm->find(key); it != mine.comm->end()) stat.algorithm = it->second.algorithm;
  }
  // The critical chip's lists (critical_rank's rule is the loop's: the largest total, the lowest rank among equals).
  r.fused = lists.fused;
  r.layer_ns.clear();
  for (size_t l = 0; l < lists.layer_end.size(); ++l)
    r.layer_ns.push_back(lists.layer_end[l] - (l == 0 ? 0.0 : lists.layer_end[l - 1]));
  if (const auto it = r.comm.find("tp all_reduce"); it != r.comm.end()) {
    r.all_reduce_ns = it->second.ns;
    r.all_reduce_bytes_per_chip = it->second.bytes;
    r.all_reduce_expected_bytes = it->second.expected;
  }
}

}  // namespace shardsim::reporting

#include "collectives/algorithms.h"

#include "runtime/chips.h"
#include "runtime/fold_shift.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <stdexcept>

#include "collectives/multi_ring.h"
#include "collectives/rail_ring.h"
#include "collectives/registry.h"
#include "common/error.h"
#include "runtime/world.h"

namespace shardsim::collectives {

namespace {

struct Entry {
  Collective c;
  const char* name;
};

const std::vector<Entry>& catalogue() {
  static const std::vector<Entry> v = {
      {Collective::all_reduce, "all_reduce"}, {Collective::reduce_scatter, "reduce_scatter"},
      {Collective::all_gather, "all_gather"}, {Collective::all_gatherv, "all_gatherv"},
      {Collective::broadcast, "broadcast"},   {Collective::reduce, "reduce"},
      {Collective::all_to_all, "all_to_all"}, {Collective::all_to_allv, "all_to_allv"},
      {Collective::gather, "gather"},         {Collective::scatter, "scatter"},
      {Collective::send_recv, "send_recv"},   {Collective::barrier, "barrier"},
  };
  return v;
}

const Entry& entry(Collective c) { return catalogue().at(static_cast<size_t>(c)); }

std::string us(double ns) {
  char b[32];
  std::snprintf(b, sizeof b, "%.3f us", ns / 1e3);
  return b;
}

}  // namespace

std::string collective_name(Collective c) { return entry(c).name; }

Collective parse_collective(const std::string& name) {
  std::string known;
  for (const auto& e : catalogue()) {
    if (name == e.name) return e.c;
    known += (known.empty() ? "" : ", ") + std::string(e.name);
  }
  throw std::invalid_argument("unknown collective '" + name + "' (known: " + known + ")");
}

const std::vector<Collective>& all_collectives() {
  static const std::vector<Collective> v = [] {
    std::vector<Collective> out;
    for (const auto& e : catalogue()) out.push_back(e.c);
    return out;
  }();
  return v;
}

bool is_reduction(Collective c) {
  return c == Collective::all_reduce || c == Collective::reduce_scatter || c == Collective::reduce;
}
bool is_rooted(Collective c) {
  return c == Collective::broadcast || c == Collective::reduce || c == Collective::gather || c == Collective::scatter;
}

const std::vector<std::string>& algorithm_names(Collective c) {
  static const std::vector<std::vector<std::string>> by_collective = [] {
    std::vector<std::vector<std::string>> v(catalogue().size());
    for (const auto& a : registered_algorithms())
      for (Collective x : a.collectives) v.at(static_cast<size_t>(x)).push_back(a.name);
    return v;
  }();
  return by_collective.at(static_cast<size_t>(c));
}

std::string canonical_algorithm(Collective c, const std::string& name) {
  const AlgorithmDescriptor* a = find_algorithm(name);
  return a && a->implements(c) ? a->name : "";
}

std::string not_an_algorithm_of(Collective c, const std::string& name) {
  std::string takes;
  for (const auto& n : algorithm_names(c)) takes += n + ", ";
  takes += "auto";
  std::string other;
  for (Collective o : all_collectives())
    if (o != c && !canonical_algorithm(o, name).empty()) other += (other.empty() ? "" : ", ") + collective_name(o);
  if (other.empty()) return "unknown algorithm '" + name + "' (known: " + takes + ")";
  return "algorithm '" + name + "' is not applicable to " + collective_name(c) + " (it is an algorithm of " + other +
         "); " + collective_name(c) + " takes: " + takes;
}

std::string obstacle(Collective c, const std::string& algorithm, const runtime::Transport& tp) {
  const AlgorithmDescriptor* a = find_algorithm(algorithm);
  if (!a || !a->implements(c)) return "it is not an algorithm of " + collective_name(c);
  return a->obstacle ? a->obstacle(c, tp) : "";
}

std::string plan_algorithm(Collective c, const std::string& name, int group_size) {
  if (group_size < 2 || name.empty() || name == "auto") return "auto";
  const std::string a = canonical_algorithm(c, name);
  return a.empty() ? "auto" : a;
}

std::string plan_obstacle(Collective c, const std::string& algorithm, const runtime::Transport& tp) {
  const std::string a = plan_algorithm(c, algorithm, tp.size());
  if (a == "auto") return "";
  const std::string why = obstacle(c, a, tp);
  if (why.empty()) return "";
  return collective_name(c) + " over " + std::to_string(tp.size()) + " chips (" + tp.topology().describe() +
         "): " + why;
}

double estimate_ns(Collective c, const std::string& algorithm, const runtime::Transport& tp, double bytes,
                   size_t chunk_bytes) {
  if (tp.size() == 1) return 0;
  const AlgorithmDescriptor* a = find_algorithm(algorithm);
  if (!a || !a->implements(c) || !a->estimate_ns) return std::numeric_limits<double>::infinity();
  const double t = a->estimate_ns(c, tp, bytes, chunk_bytes);
  const double overhead = call_overhead_ns(c, tp);
  return overhead > 0 ? t + overhead : t;  // the replay starts at time 0; the run starts its first step at c
}

sim::TimeNs Choice::start(runtime::Transport& tp, sim::TimeNs ready, const std::string& name) const {
  if (!(call_overhead_ns > 0)) return ready;
  return tp.timeline().fixed_cost(name + ".launch", ready, call_overhead_ns);
}

double call_overhead_ns(Collective c, const runtime::Transport& tp) {
  if (tp.size() == 1 || c == Collective::send_recv || c == Collective::barrier) return 0;
  return tp.topology().protocol().call_overhead_ns;
}

runtime::CallSignature check_args(Collective c, runtime::Transport& tp, const CollectiveOptions& o, uint64_t count,
                                  DType dtype, int op) {
  runtime::CallSignature sig;
  sig.collective = static_cast<int32_t>(c);
  sig.dtype = static_cast<int32_t>(dtype);
  sig.op = op;
  sig.root = is_rooted(c) ? o.root : 0;
  sig.count = count;
  sig.algorithm = std::hash<std::string>{}(o.algorithm) & 0xffffffffffffull;
  sig.shape_only = tp.shape_only() ? 1 : 0;
  if (!o.check_args || tp.size() == 1) return sig;
  // Agreed once per (communicator, signature): a signature every rank agreed on before needs no new round; a
  // later mismatch is then caught by the receivers, which compare every message header's signature with their
  // own (runtime/transport.h). A new signature is agreed here, in one small non-blocking all-reduce that the
  // watchdog watches.
  // A rank that skips the round while another agrees on a new signature (the mixed case) is told by the
  // agreement messages themselves (runtime::Transport::agreed()).
  static constexpr const char* names[] = {"collective", "count", "dtype", "op", "root", "algorithm"};
  constexpr size_t k = std::size(names);
  int64_t mine[k] = {static_cast<int64_t>(c), static_cast<int64_t>(count), static_cast<int64_t>(dtype), op,
                           sig.root, static_cast<int64_t>(sig.algorithm)};
  // SHARDSIM_TEST_NEW_SIGNATURE (algorithms.h): this rank's call turns into a never-agreed signature.
  static const auto hook = [] {
    std::pair<std::vector<int>, int64_t> r{{}, -1};
    const char* v = std::getenv("SHARDSIM_TEST_NEW_SIGNATURE");
    if (!v) return r;
    const std::string s = v;
    const size_t at = s.find('@');
    if (at == std::string::npos) return r;
    for (size_t b = 0; b < at;) {
      const size_t e = std::min(s.find(',', b), at);
      r.first.push_back(std::atoi(s.substr(b, e - b).c_str()));
      b = e + 1;
    }
    r.second = std::atoll(s.c_str() + at + 1);
    return r;
  }();
  // The hook names MPI ranks, or chips (chip-level world ranks) when a rank hosts several chips.
  const bool forced = hook.second >= 0 && tp.calls() == hook.second &&
                      std::find(hook.first.begin(), hook.first.end(),
                                tp.chip_mode() ? runtime::chips::current() : tp.world_rank_of(tp.rank())) !=
                          hook.first.end();
  if (forced) {
    sig.count = count + 1;
    mine[1] = static_cast<int64_t>(sig.count);
  }
  const uint64_t h = sig.hash();
  // With several chips per rank every call is agreed (no skipping): the mixed case's detection reads MPI
  // messages, which chips do not see (they talk through the chip router). A chip-mode agreement is a fold on
  // member 0 of the communicator, 2(p-1) small messages beside the collective's own.
  if (!tp.chip_mode() && tp.agreed(h)) {
    tp.note_skipped(mine, names);
    return sig;
  }
  int64_t both[2 * k], out[2 * k];
  for (size_t i = 0; i < k; ++i) {
    both[i] = mine[i];
    both[k + i] = -mine[i];
  }
  const std::string what = collective_name(c) + ": argument check";
  std::copy(both, both + 2 * k, out);
  tp.agree_max(std::span<int64_t>(out, 2 * k), names, what);
  size_t bad = k;
  for (size_t i = 0; i < k && bad == k; ++i)
    if (out[i] != -out[k + i]) bad = i;
  if (bad == k) {
    if (!tp.chip_mode()) tp.mark_agreed(h);  // chip mode agrees every call and never reads the set
    return sig;
  }
  // Who has what: gather the disagreeing field from every rank (all ranks are here, so this cannot hang).
  const std::vector<int64_t> all = tp.allgather(both[bad], what);
  std::string msg = collective_name(c) + ": ranks disagree on " + names[bad] + ":";
  for (int r = 0; r < tp.size() && r < 16; ++r) {
    msg += " chip " + std::to_string(tp.chip_of(r)) + " ";
    const int64_t v = all[static_cast<size_t>(r)];
    if (std::string(names[bad]) == "dtype") msg += runtime::dtype_name(static_cast<DType>(v));
    else if (std::string(names[bad]) == "collective") msg += collective_name(static_cast<Collective>(v));
    else if (std::string(names[bad]) == "algorithm") msg += "(another name)";
    else msg += std::to_string(v);
    msg += r + 1 < tp.size() ? "," : "";
  }
  if (tp.size() > 16) msg += " ...";
  throw AgreedError(msg + " (every rank must call the collective with the same arguments)", kExitBadInput);
}

namespace {

Choice choose_algorithm(Collective c, const CollectiveOptions& options, const runtime::Transport& tp, double bytes);

}  // namespace

namespace {
// Whether ALGORITHM's program on TP's group is mapped onto itself by the replica shift: the one-way and the
// bidirectional ring always (the shift rotates the group's ranks); an algorithm of explicit ring orders (rail_ring,
// multi_ring) when the shift of the run's chips (runtime/fold_shift.h) maps each of its directed cycles onto itself
// (rail_ring: a shift by an even number of nodes, which the fold's period is rounded up to; apps/train_setup.cpp).
bool fold_symmetric(const std::string& algorithm, const runtime::Transport& tp) {
  if (algorithm == "ring" || algorithm == "bidir_ring") return true;
  if (algorithm != "rail_ring" && algorithm != "multi_ring") return false;
  const std::vector<int>& shift = runtime::fold_chip_shift();
  const auto& chips = tp.rank_to_chip();
  std::vector<int> rank_on(shift.size(), -1), image(chips.size());
  for (size_t r = 0; r < chips.size(); ++r) {
    if (static_cast<size_t>(chips[r]) >= shift.size()) return false;
    rank_on[static_cast<size_t>(chips[r])] = static_cast<int>(r);
  }
  for (size_t r = 0; r < chips.size(); ++r)
    if ((image[r] = rank_on[static_cast<size_t>(shift[static_cast<size_t>(chips[r])])]) < 0) return false;
  return ring::maps_onto_itself(algorithm == "rail_ring" ? rail_ring::cycles(tp) : multi_ring::cycles(tp.size()),
                                image);
}
}  // namespace

std::string fold_algorithm_reason(Collective c, const std::string& algorithm) {
  return collective_name(c) + ": " + algorithm + " over data-parallel replicas (symmetric under the replica shift: "
         "ring and bidir_ring, and rail_ring / multi_ring where the shift maps their rings onto themselves; "
         "parallel.algorithm: ring keeps the run folded)";
}

std::string fold_chunks_reason(const std::string& name, size_t count, int parts) {
  return name + ": chunks of different sizes over data-parallel replicas (" + std::to_string(count) +
         " elements over " + std::to_string(parts) + " ranks)";
}

Choice choose(Collective c, const CollectiveOptions& options, const runtime::Transport& tp, double bytes) {
  Choice ch = choose_algorithm(c, options, tp, bytes);
  // A folded run (docs/performance/fold.md) is exact only where a collective over a group of simulated and
  // mirrored chips runs the same program on every member up to a relabelling of the group's ranks by the shift:
  // the one-way and the bidirectional ring (neighbours r +- 1), and the cycle algorithms whose rings the shift maps
  // onto themselves (fold_symmetric; their chunks must be equal too: registry.cpp). Any other algorithm there (a
  // tree's root, XOR partners, grid orders) ends the folded attempt, even where the router's checks would not see
  // the difference. fold_obstacle decides the plan's own calls before the run.
  if (tp.spans_mirrored() && !fold_symmetric(ch.algorithm, tp))
    runtime::chips::fold_broken(fold_algorithm_reason(c, ch.algorithm));
  return ch;
}

std::string fold_obstacle(Collective c, const CollectiveOptions& options, const runtime::Transport& tp, size_t count,
                          DType dtype, const std::string& name) {
  if (tp.size() < 2 || !tp.spans_mirrored()) return "";
  const Choice ch = choose_algorithm(c, options, tp, static_cast<double>(count * runtime::dtype_size(dtype)));
  if (!fold_symmetric(ch.algorithm, tp)) return fold_algorithm_reason(c, ch.algorithm);
  if (count % static_cast<size_t>(tp.size()) != 0) return fold_chunks_reason(name, count, tp.size());
  return "";
}

namespace {

Choice choose_algorithm(Collective c, const CollectiveOptions& options, const runtime::Transport& tp, double bytes) {
  const std::string cname = collective_name(c);
  const auto& names = algorithm_names(c);
  if (tp.plan_algorithms() && plan_algorithm(c, options.algorithm, tp.size()) == "auto" &&
      options.algorithm != "auto") {
    CollectiveOptions as_auto = options;  // the plan rule: a collective without the plan's name runs auto
    as_auto.algorithm = "auto";
    return choose_algorithm(c, as_auto, tp, bytes);
  }
  if (options.algorithm != "auto") {
    const std::string a = canonical_algorithm(c, options.algorithm);
    if (a.empty()) throw UsageError(cname + ": " + not_an_algorithm_of(c, options.algorithm));
    if (const std::string why = obstacle(c, a, tp); !why.empty())
      throw UsageError(cname + ": algorithm '" + a + "' cannot run on " + std::to_string(tp.size()) + " chips of " +
                       tp.topology().describe() + ": " + why);
    return {a, find_algorithm(a), "", call_overhead_ns(c, tp)};
  }
  // The choice depends only on the group, its topology, the size and the chunk size: memoised per transport.
  const std::array<uint64_t, 4> key = {static_cast<uint64_t>(c), std::bit_cast<uint64_t>(bytes), options.chunk_bytes,
                                       std::hash<std::string>{}(options.algorithm)};
  auto& memo = tp.choice_memo();
  if (auto it = memo.find(key); it != memo.end())
    return {it->second.first, find_algorithm(it->second.first), it->second.second, call_overhead_ns(c, tp)};
  if (memo.size() >= 4096) memo.clear();
  Choice best;
  double best_ns = std::numeric_limits<double>::infinity();
  std::string why = "auto for " + std::to_string(static_cast<long long>(bytes)) + " B on " +
                    std::to_string(tp.size()) + " chips:";
  std::vector<std::pair<std::string, std::string>> parts;
  for (const auto& a : names) {
    if (const std::string ob = obstacle(c, a, tp); !ob.empty()) {
      parts.emplace_back(a, "n/a (" + ob + ")");
      continue;
    }
    const AlgorithmDescriptor* d = find_algorithm(a);
    if (d->in_auto(c) && d->auto_obstacle) {
      if (const std::string no = d->auto_obstacle(c, tp); !no.empty()) {
        parts.emplace_back(a, "not weighed (" + no + ")");
        continue;
      }
    }
    const double t = estimate_ns(c, a, tp, bytes, options.chunk_bytes);
    if (!d->in_auto(c)) {
      parts.emplace_back(a, us(t) + " (opt-in only)");
      continue;
    }
    parts.emplace_back(a, us(t));
    if (t < best_ns) {
      best_ns = t;
      best.algorithm = a;
    }
  }
  for (const auto& [a, text] : parts)
    why += " " + a + " " + text + (a == best.algorithm ? " (chosen)" : "") + ";";
  why.pop_back();
  best.explanation = why;
  best.descriptor = find_algorithm(best.algorithm);
  best.call_overhead_ns = call_overhead_ns(c, tp);
  memo.emplace(key, std::make_pair(best.algorithm, best.explanation));
  return best;
}

}  // namespace

}  // namespace shardsim::collectives

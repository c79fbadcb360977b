#include "sim/critical_path.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <set>
#include <stdexcept>
#include <tuple>
#include <unordered_map>
#include <utility>

namespace shardsim::sim {

namespace {

bool on_path_kind(const Event& e) { return e.engine >= 0 || e.engine == -2; }  // kernels, sends, receives

using Where = std::pair<int, size_t>;  // (position in CHIPS, event index)

std::unordered_map<std::uint64_t, Where> index_ids(const std::vector<ChipEvents>& chips) {
  std::unordered_map<std::uint64_t, Where> at;
  for (size_t c = 0; c < chips.size(); ++c)
    for (size_t i = 0; i < chips[c].events.size(); ++i)
      if (chips[c].events[i].id) at.emplace(chips[c].events[i].id, Where{static_cast<int>(c), i});
  return at;
}

}  // namespace

const char* time_class_name(TimeClass c) {
  switch (c) {
    case TimeClass::compute: return "compute-bound";
    case TimeClass::hbm: return "HBM-bound";
    case TimeClass::link: return "link-bandwidth-bound";
    case TimeClass::latency: return "latency-bound";
    case TimeClass::waiting: break;
  }
  return "waiting";
}

TimeClass time_class_of(Bound b) {
  switch (b) {
    case Bound::compute: return TimeClass::compute;
    case Bound::hbm: return TimeClass::hbm;
    case Bound::link: return TimeClass::link;
    case Bound::latency: return TimeClass::latency;
    case Bound::none: break;
  }
  return TimeClass::waiting;
}

std::string op_family(const std::string& name) {
  std::string s;
  for (size_t i = 0; i < name.size();) {
    if (std::isdigit(static_cast<unsigned char>(name[i]))) {
      s += 'N';
      while (i < name.size() && std::isdigit(static_cast<unsigned char>(name[i]))) ++i;
    } else {
      s += name[i++];
    }
  }
  return s;
}

CriticalPath critical_path(const std::vector<ChipEvents>& chips) {
  CriticalPath p;
  // The last-finishing event (ties: the lower chip, then the later-recorded event).
  int best_c = -1;
  size_t best_i = 0;
  for (size_t c = 0; c < chips.size(); ++c) {
    for (size_t i = 0; i < chips[c].events.size(); ++i) {
      const Event& e = chips[c].events[i];
      if (!on_path_kind(e)) continue;
      if (best_c < 0 || e.span.end > p.end ||
          (e.span.end == p.end && chips[c].chip == chips[static_cast<size_t>(best_c)].chip)) {
        best_c = static_cast<int>(c);
        best_i = i;
        p.end = e.span.end;
      }
    }
  }
  if (best_c < 0) return p;
  const auto at = index_ids(chips);
  std::vector<Where> chain{{best_c, best_i}};
  for (size_t guard = 0;; ++guard) {
    const Event& e = chips[static_cast<size_t>(chain.back().first)].events[chain.back().second];
    if (!e.producer) break;
    const auto it = at.find(e.producer);
    if (it == at.end()) break;  // recorded on no chip (e.g. evicted from a bounded table): waiting from here
    const Event& q = chips[static_cast<size_t>(it->second.first)].events[it->second.second];
    if (q.span.start > e.span.start || guard > at.size())
      throw std::invalid_argument("critical path: event '" + e.name + "' has producer '" + q.name +
                                  "' that starts after it (a dependency loop)");
    chain.push_back(it->second);
  }
  std::reverse(chain.begin(), chain.end());
  TimeNs t = 0;
  for (const auto& [c, i] : chain) {
    const Event& e = chips[static_cast<size_t>(c)].events[i];
    PathStep s{chips[static_cast<size_t>(c)].chip, i, std::max(t, e.span.start), std::max(0.0, e.span.start - t)};
    if (s.from > e.span.end) s.from = e.span.end;  // an event inside its producer's span (a port's overhead)
    p.waiting += s.waiting;
    p.steps.push_back(s);
    t = std::max(t, e.span.end);
  }
  return p;
}

Profile profile(std::vector<ChipEvents> chips) {
  Profile pr;
  pr.path = critical_path(chips);
  std::map<int, size_t> pos;  // chip -> position in CHIPS
  for (size_t c = 0; c < chips.size(); ++c) pos[chips[c].chip] = c;
  // The path: per class, per chip, per (op family, category, class).
  std::map<int, TimeNs> per_chip;
  std::map<std::tuple<std::string, std::string, int>, Bottleneck> rows;
  std::map<std::tuple<std::string, std::string, int>, std::set<int>> row_chips;
  for (const auto& s : pr.path.steps) {
    const Event& e = chips[pos.at(s.chip)].events[s.index];
    const TimeNs on = e.span.end - s.from;
    pr.path_by_class[static_cast<size_t>(TimeClass::waiting)] += s.waiting;
    pr.path_by_class[static_cast<size_t>(time_class_of(e.bound))] += on;
    per_chip[s.chip] += on + s.waiting;
    const auto key = std::make_tuple(op_family(e.name), e.category, static_cast<int>(time_class_of(e.bound)));
    Bottleneck& b = rows[key];
    if (b.steps == 0) {
      b.op = std::get<0>(key);
      b.category = e.category;
      b.cls = time_class_of(e.bound);
      b.first_chip = s.chip;
    }
    b.time += on;
    ++b.steps;
    row_chips[key].insert(s.chip);
  }
  if (pr.path.waiting > 0) {
    Bottleneck w;
    w.op = "(no recorded producer)";
    w.category = "wait";
    w.time = pr.path.waiting;
    for (const auto& s : pr.path.steps)
      if (s.waiting > 0) {
        if (w.steps == 0) w.first_chip = s.chip;
        ++w.steps;
      }
    w.chips = 1;
    pr.bottlenecks.push_back(w);
  }
  for (auto& [key, b] : rows) {
    b.chips = static_cast<int>(row_chips[key].size());
    pr.bottlenecks.push_back(b);
  }
  std::stable_sort(pr.bottlenecks.begin(), pr.bottlenecks.end(),
                   [](const Bottleneck& a, const Bottleneck& b) { return a.time > b.time; });
  pr.chip_time.assign(per_chip.begin(), per_chip.end());
  std::stable_sort(pr.chip_time.begin(), pr.chip_time.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });

  // Every op's class, and the waits of engines on other chips' messages.
  const auto at = index_ids(chips);
  std::map<std::tuple<int, std::string, int, std::string>, Wait> waits;
  for (const auto& ce : chips) {
    std::map<int, TimeNs> engine_end;  // engine -> latest end so far
    for (const Event& e : ce.events) {
      if (!on_path_kind(e)) continue;
      ++pr.events;
      pr.all_by_class[static_cast<size_t>(time_class_of(e.bound))] += e.span.duration();
      if (e.engine < 0) continue;
      auto [it, fresh] = engine_end.try_emplace(e.engine, 0.0);
      const TimeNs idle = e.span.start - it->second;
      it->second = std::max(it->second, e.span.end);
      if (!(idle > 0) || !e.producer) continue;
      const auto p = at.find(e.producer);
      if (p == at.end()) continue;
      const Event& r = chips[static_cast<size_t>(p->second.first)].events[p->second.second];
      if (r.category != "recv") continue;
      std::string on_op = "recv";
      if (const auto s = at.find(r.producer); s != at.end())
        on_op = op_family(chips[static_cast<size_t>(s->second.first)].events[s->second.second].name);
      const auto key = std::make_tuple(ce.chip, op_family(e.name), r.peer, on_op);
      Wait& w = waits[key];
      w.chip = ce.chip;
      w.op = std::get<1>(key);
      w.on_chip = r.peer;
      w.on_op = on_op;
      w.time += idle;
      ++w.count;
    }
  }
  for (auto& [key, w] : waits) pr.waits.push_back(std::move(w));
  std::stable_sort(pr.waits.begin(), pr.waits.end(), [](const Wait& a, const Wait& b) { return a.time > b.time; });
  pr.chips = std::move(chips);
  return pr;
}

}  // namespace shardsim::sim

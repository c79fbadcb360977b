#include "sim/critical_path.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cctype>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <tuple>
#include <unordered_set>
#include <utility>

namespace shardsim::sim {

namespace {

// Kernels, sends, receives and the host's kernel issue.
bool on_path_kind(const ProfileEvent& e) { return e.engine >= 0 || e.engine == -2 || e.engine == Timeline::kHostEngine; }

}  // namespace

std::string_view intern_name(std::string_view name) {
  static std::mutex mu;
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view v) const { return std::hash<std::string_view>{}(v); }
  };
  static std::unordered_set<std::string, Hash, std::equal_to<>> pool;
  const std::lock_guard<std::mutex> lock(mu);
  auto it = pool.find(name);
  if (it == pool.end()) it = pool.emplace(name).first;
  return *it;  // nodes never move
}

EventIndex::EventIndex(const std::vector<ChipEvents>& chips) : chips_(&chips) {
  size_t n = 0;
  for (const auto& ce : chips) n += ce.events.size();
  ids_.reserve(n);
  for (size_t c = 0; c < chips.size(); ++c) {
    if (chips[c].events.size() > UINT32_MAX) throw std::length_error("profile: more than 2^32 events on one chip");
    for (size_t i = 0; i < chips[c].events.size(); ++i)
      if (chips[c].events[i].id) ids_.push_back({chips[c].events[i].id, static_cast<std::uint32_t>(c), static_cast<std::uint32_t>(i)});
  }
  // Ids are unique; the first recorded wins if one repeats (as the hash map's emplace did).
  std::stable_sort(ids_.begin(), ids_.end(), [](const Entry& a, const Entry& b) { return a.id < b.id; });
}

bool EventIndex::locate(std::uint64_t id, int& chip_pos, size_t& index) const {
  const auto it = std::lower_bound(ids_.begin(), ids_.end(), id, [](const Entry& e, std::uint64_t v) { return e.id < v; });
  if (it == ids_.end() || it->id != id) return false;
  chip_pos = static_cast<int>(it->chip_pos);
  index = it->index;
  return true;
}

const ProfileEvent* EventIndex::find(std::uint64_t id) const {
  int c = 0;
  size_t i = 0;
  return locate(id, c, i) ? &(*chips_)[static_cast<size_t>(c)].events[i] : nullptr;
}

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

std::string op_family(std::string_view name) {
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

CriticalPath critical_path(const std::vector<ChipEvents>& chips, const EventIndex* index) {
  CriticalPath p;
  // The last-finishing event (ties: the lower chip, then the later-recorded event).
  int best_c = -1;
  size_t best_i = 0;
  for (size_t c = 0; c < chips.size(); ++c) {
    for (size_t i = 0; i < chips[c].events.size(); ++i) {
      const ProfileEvent& e = chips[c].events[i];
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
  std::optional<EventIndex> own;
  const EventIndex& at = index ? *index : own.emplace(chips);
  std::vector<std::pair<int, size_t>> chain{{best_c, best_i}};
  for (size_t guard = 0;; ++guard) {
    const ProfileEvent& e = chips[static_cast<size_t>(chain.back().first)].events[chain.back().second];
    if (!e.producer) break;
    int qc = 0;
    size_t qi = 0;
    if (!at.locate(e.producer, qc, qi)) break;  // recorded on no chip: waiting from here
    const ProfileEvent& q = chips[static_cast<size_t>(qc)].events[qi];
    if (q.span.start > e.span.start || guard > at.size())
      throw std::invalid_argument("critical path: event '" + std::string(e.name) + "' has producer '" +
                                  std::string(q.name) + "' that starts after it (a dependency loop)");
    chain.emplace_back(qc, qi);
  }
  std::reverse(chain.begin(), chain.end());
  TimeNs t = 0;
  for (const auto& [c, i] : chain) {
    const ProfileEvent& e = chips[static_cast<size_t>(c)].events[i];
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
  const EventIndex at(chips);
  pr.path = critical_path(chips, &at);
  std::map<int, size_t> pos;  // chip -> position in CHIPS
  for (size_t c = 0; c < chips.size(); ++c) pos[chips[c].chip] = c;
  // The path: per class, per chip, per (op family, category, class).
  std::map<int, TimeNs> per_chip;
  std::map<std::tuple<std::string, std::string, int>, Bottleneck> rows;
  std::map<std::tuple<std::string, std::string, int>, std::set<int>> row_chips;
  for (const auto& s : pr.path.steps) {
    const ProfileEvent& e = chips[pos.at(s.chip)].events[s.index];
    const TimeNs on = e.span.end - s.from;
    pr.path_by_class[static_cast<size_t>(TimeClass::waiting)] += s.waiting;
    pr.path_by_class[static_cast<size_t>(time_class_of(e.bound))] += on;
    per_chip[s.chip] += on + s.waiting;
    const auto key = std::make_tuple(op_family(e.name), std::string(e.category), static_cast<int>(time_class_of(e.bound)));
    Bottleneck& b = rows[key];
    if (b.steps == 0) {
      b.op = std::get<0>(key);
      b.category = std::string(e.category);
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
  std::map<std::tuple<int, std::string, int, std::string>, Wait> waits;
  for (const auto& ce : chips) {
    std::map<int, TimeNs> engine_end;  // engine -> latest end so far
    for (const ProfileEvent& e : ce.events) {
      // The host's issue is not device work: on the path, not in the device's op classes or count.
      if (!on_path_kind(e) || e.engine == Timeline::kHostEngine) continue;
      ++pr.events;
      pr.all_by_class[static_cast<size_t>(time_class_of(e.bound))] += e.span.duration();
      if (e.engine < 0) continue;
      auto [it, fresh] = engine_end.try_emplace(e.engine, 0.0);
      const TimeNs idle = e.span.start - it->second;
      it->second = std::max(it->second, e.span.end);
      if (!(idle > 0) || !e.producer) continue;
      const ProfileEvent* r = at.find(e.producer);
      if (!r || r->category != "recv") continue;
      std::string on_op = "recv";
      if (const ProfileEvent* s = at.find(r->producer)) on_op = op_family(s->name);
      const auto key = std::make_tuple(ce.chip, op_family(e.name), r->peer, on_op);
      Wait& w = waits[key];
      w.chip = ce.chip;
      w.op = std::get<1>(key);
      w.on_chip = r->peer;
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

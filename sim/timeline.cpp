#include "sim/timeline.h"

#include "sim/eager_kernels.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <mutex>
#include <shared_mutex>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

namespace shardsim::sim {

const char* bound_name(Bound b) {
  switch (b) {
    case Bound::compute: return "compute-bound";
    case Bound::hbm: return "HBM-bound";
    case Bound::link: return "link-bandwidth-bound";
    case Bound::latency: return "latency-bound";
    case Bound::none: break;
  }
  return "none";
}

Timeline::Timeline(int chip, const topology::Topology& topo, DeviceSpec device, bool record_events)
    : chip_(chip), topo_(&topo), device_(std::move(device)), record_(record_events) {
  if (chip < 0 || chip >= topo.num_chips())
    throw std::out_of_range("timeline: chip " + std::to_string(chip) + " not in topology");
  free_.assign(1 + topo.out_links(chip).size(), 0.0);
  last_on_engine_.assign(free_.size(), 0);
  // Test hook: every recording timeline records dependencies, so any test can check that recording them changes
  // no simulated time (tests/e2e/profile.sh runs the async collectives' tests this way).
  static const bool force_deps = std::getenv("SHARDSIM_RECORD_DEPENDENCIES") != nullptr;
  if (record_ && force_deps) set_record_dependencies(true);
}

void Timeline::set_record_dependencies(bool on) {
  deps_ = on;
  if (!on) return;
  if (next_id_ == 0) next_id_ = (static_cast<std::uint64_t>(chip_ + 1) << 40) | 1;
  if (producers_.empty()) producers_.assign(kProducerSlots, ProducerSlot{});
}

void Timeline::set_async_id_space(std::uint64_t seq) {
  next_id_ = (static_cast<std::uint64_t>(chip_ + 1) << 40) | (std::uint64_t{1} << 39) | ((seq & 0x7FFFF) << 20) | 1;
}

std::uint64_t Timeline::new_id() { return next_id_++; }

namespace {
size_t producer_hash(TimeNs t) {
  std::uint64_t b = 0;
  std::memcpy(&b, &t, sizeof b);
  b ^= b >> 29;
  b *= 0x9E3779B97F4A7C15ull;
  return static_cast<size_t>(b >> 32);
}
}  // namespace

void Timeline::note_end(TimeNs t, std::uint64_t id) {
  if (producers_.empty() || !(t >= 0)) return;
  if (2 * (producer_count_ + 1) > producers_.size()) {  // keep it at most half full: short probes
    std::vector<ProducerSlot> old(producers_.size() * 2);
    old.swap(producers_);
    producer_count_ = 0;
    for (const ProducerSlot& s : old)
      if (s.t >= 0) note_end(s.t, s.id);
  }
  const size_t mask = producers_.size() - 1;
  for (size_t i = producer_hash(t) & mask;; i = (i + 1) & mask) {
    ProducerSlot& s = producers_[i];
    if (s.t == t) {  // a newer event with the same time
      s.id = id;
      return;
    }
    if (s.t < 0) {
      s = {t, id};
      ++producer_count_;
      return;
    }
  }
}

std::uint64_t Timeline::producer_of(TimeNs t) const {
  if (producers_.empty() || !(t > 0)) return 0;
  const size_t mask = producers_.size() - 1;
  for (size_t i = producer_hash(t) & mask;; i = (i + 1) & mask) {
    const ProducerSlot& s = producers_[i];
    if (s.t == t) return s.id;
    if (s.t < 0) return 0;
  }
}

int Timeline::slot_of(int link) {
  const auto [it, added] = slot_.try_emplace(link, static_cast<int>(link_free_.size()));
  if (added) {
    link_free_.push_back(0.0);
    link_last_.push_back(0);
    in_busy_.emplace_back();
  }
  return it->second;
}

void Timeline::fill_route(Route& r, const std::vector<int>& links) {
  r.hops.reserve(links.size());
  double at = 0;
  for (int id : links) {
    r.hops.push_back(Hop{id, slot_of(id), at});
    at += topo_->link(id).latency_ns;
  }
  r.bottleneck_gbps = std::numeric_limits<double>::infinity();
  for (int id : links) r.bottleneck_gbps = std::min(r.bottleneck_gbps, topo_->link(id).bandwidth_gbps);
  r.latency_ns = at;
}

const Timeline::Route& Timeline::route_from(int src) {
  if (auto it = in_routes_.find(src); it != in_routes_.end()) return it->second;
  if (src < 0 || src >= topo_->num_nodes())  // a chip, or its own switch (in-switch collectives' down-link)
    throw std::out_of_range("timeline: chip " + std::to_string(src) + " not in topology");
  Route& r = in_routes_[src];
  fill_route(r, topo_->route(src, chip_));
  return r;
}

void Timeline::Intervals::drop_front() {
  ++head;
  if (head >= 64 && head * 2 >= v.size()) {
    v.erase(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(head));
    head = 0;
  }
}

void Timeline::book_interval(int slot, Span s) {
  Intervals& iv = in_busy_[static_cast<size_t>(slot)];
  auto& v = iv.v;
  const auto begin = v.begin() + static_cast<std::ptrdiff_t>(iv.head);
  // First interval ending at or after s.start: everything before it ends earlier.
  auto it = std::lower_bound(begin, v.end(), s.start, [](const Span& x, TimeNs t) { return x.end < t; });
  auto last = it;  // merge every interval that overlaps or touches s
  while (last != v.end() && last->start <= s.end) {
    s.start = std::min(s.start, last->start);
    s.end = std::max(s.end, last->end);
    ++last;
  }
  if (it != last) {  // replace the merged ones by S
    *it = s;
    v.erase(it + 1, last);
  } else {
    v.insert(it, s);
  }
  if (iv.size() > kMaxIntervals) {
    v[iv.head + 1].start = v[iv.head].start;
    iv.drop_front();
  }
}

int Timeline::peer_of_receive(int src, std::uint64_t send_id) const {
  return src >= topo_->num_chips() && send_id ? chip_of_event(send_id) : src;
}

TimeNs Timeline::receive(int src, double bytes, TimeNs start, TimeNs arrival, std::uint64_t send_id,
                         TimeNs send_end) {
  if (src == chip_) return arrival;
  if (!(bytes > 0)) {  // not booked; with dependencies still a receive (its time is the sender's latency)
    if (deps_ && record_) {
      receives_.push_back(Event{"recv", "recv", -2, {send_end >= 0 ? std::min(send_end, arrival) : start, arrival}, 0,
                                bytes, peer_of_receive(src, send_id), new_id(), send_id, Bound::latency});
      note_end(arrival, receives_.back().id);
    }
    return arrival;
  }
  const Route& r = route_from(src);
  const double lat = topo_->protocol().latency_factor_for(bytes);
  const double o = topo_->protocol().message_overhead_ns;  // the sender's: the data enters its route o after START
  const bool shared = step_ != nullptr;  // a flow of a step with crossing flows: charged as send() charged it
  const double occupancy = shared ? shared_occupancy(r, bytes)
                                  : bytes / (r.bottleneck_gbps * topo_->protocol().efficiency_for(bytes));  // as send()
  TimeNs t = start;
  // Earliest t >= START at which every link l_i is free over [t + offset_i, t + offset_i + occupancy).
  for (bool moved = true; moved;) {
    moved = false;
    for (const Hop& h : r.hops) {
      const Intervals& iv = in_busy_[static_cast<size_t>(h.slot)];
      const double off = o + h.offset * lat, a = t + off, b = a + occupancy;
      auto it = std::upper_bound(iv.v.begin() + static_cast<std::ptrdiff_t>(iv.head), iv.v.end(), a,
                                 [](TimeNs x, const Span& s) { return x < s.end; });
      if (it != iv.v.end() && it->start < b && it->end - off > t) {
        t = it->end - off;
        moved = true;
      }
    }
  }
  for (const Hop& h : r.hops) {
    const double a = t + (o + h.offset * lat);
    if (shared) {  // the step's other flows are in k_l already: book after the step
      step_booked_.push_back({h.slot, {a, a + occupancy}});
    } else {
      book_interval(h.slot, {a, a + occupancy});
    }
  }
  const TimeNs at = t == start ? arrival : arrival + (t - start);
  if (deps_ && record_) {
    const TimeNs from = send_end >= 0 ? std::min(send_end, at) : start;
    // Queued behind other senders' flows (t - start) longer than the flight after the port (arrival - from).
    const Bound b = t - start > arrival - from ? Bound::link : Bound::latency;
    receives_.push_back(Event{"recv", "recv", -2, {from, at}, 0, bytes, peer_of_receive(src, send_id), new_id(),
                              send_id, b});
    note_end(at, receives_.back().id);
  }
  return at;
}

StepShare StepShare::make(const topology::Topology& topo, const std::vector<std::pair<int, int>>& pairs) {
  StepShare s;
  const size_t n = topo.links().size();
  s.flows.assign(n, 0);
  std::vector<int> first(n, -1);  // first sender seen on each link
  for (const auto& [a, b] : pairs) {
    if (a == b) continue;
    for (int id : topo.route(a, b)) {
      const size_t l = static_cast<size_t>(id);
      ++s.flows[l];
      if (first[l] < 0) {
        first[l] = a;
      } else if (first[l] != a) {
        s.any_shared = true;
      }
    }
  }
  return s;
}

void Timeline::begin_step(const StepShare* share) {
  step_ = share && share->any_shared ? share : nullptr;
  step_free_.clear();
  step_booked_.clear();
}

void Timeline::end_step() {
  for (const auto& [at, t] : step_free_) {
    TimeNs& f = at >= 0 ? free_[static_cast<size_t>(at)] : link_free_[static_cast<size_t>(-1 - at)];
    f = std::max(f, t);
  }
  for (const auto& [slot, s] : step_booked_) book_interval(slot, s);
  step_free_.clear();
  step_booked_.clear();
  step_ = nullptr;
}

double Timeline::shared_occupancy(const Route& r, double bytes) const {
  const double eff = topo_->protocol().efficiency_for(bytes);
  double occ = 0;
  for (const Hop& h : r.hops) {
    const double k = static_cast<double>(std::max<uint32_t>(1, step_->flows[static_cast<size_t>(h.link)]));
    occ = std::max(occ, k * bytes / (topo_->link(h.link).bandwidth_gbps * eff));
  }
  return occ;
}

const Timeline::Route& Timeline::route_to(int dst) {
  if (auto it = routes_.find(dst); it != routes_.end()) return it->second;
  if (dst < 0 || dst >= topo_->num_nodes())  // a chip, or its own switch (in-switch collectives' up-link)
    throw std::out_of_range("timeline: chip " + std::to_string(dst) + " not in topology");
  Route& r = routes_[dst];
  fill_route(r, topo_->route(chip_, dst));
  const auto& outs = topo_->out_links(chip_);
  r.port = 1 + static_cast<int>(std::find(outs.begin(), outs.end(), r.hops.front().link) - outs.begin());
  return r;
}

std::string Timeline::engine_name(int engine) const { return engine_name(*topo_, chip_, engine); }

std::string Timeline::engine_name(const topology::Topology& topo, int chip, int engine) {
  if (engine == kComputeEngine) return "compute";
  const auto& l = topo.link(topo.out_links(chip).at(static_cast<size_t>(engine - 1)));
  std::string s = "link->";
  s += topo.is_switch(l.dst) ? "switch " + std::to_string(l.dst - topo.num_chips()) : std::to_string(l.dst);
  if (!topo.is_grid()) return s;
  s += " (dim" + std::to_string(l.dim);
  s += l.dir > 0 && !topo.is_switch(l.dst) ? "+" : l.dir < 0 ? "-" : "";
  return s + ")";
}

Span Timeline::compute(const std::string& name, double flops, double bytes, Precision p, TimeNs ready,
                       const KernelShape& shape) {
  const EagerDecomposition* eager =
      device_.eager_kernels && shape.cls == KernelClass::vector ? eager_decomposition(name) : nullptr;
  if (!eager) return compute_one(name, flops, bytes, p, ready, shape);
  const double e = p == Precision::fp64 ? 8 : p == Precision::fp32 ? 4 : p == Precision::fp8 || p == Precision::int8 ? 1 : 2;
  const double n = bytes / (eager->fused_e_bytes * e);  // elements of the fused kernel's main tensor
  std::vector<const EagerPart*> parts;
  for (const EagerPart& part : eager->parts)
    if (!(part.cast && e == 4)) parts.push_back(&part);
  Span all{0, 0};
  TimeNs t = ready;
  for (size_t i = 0; i < parts.size(); ++i) {
    const Span s = compute_one(name + "." + parts[i]->name, flops / double(parts.size()),
                               n * (parts[i]->e_bytes * e + parts[i]->f_bytes * 4), p, t, shape);
    if (i == 0) all.start = s.start;
    all.end = t = s.end;
  }
  return all;
}

Span Timeline::compute_one(const std::string& name, double flops, double bytes, Precision p, TimeNs ready,
                           const KernelShape& shape) {
  const TimeNs free = free_[kComputeEngine];
  const bool host = device_.host_launch_ns > 0 && !device_.cuda_graph;
  if (host) host_ += device_.host_launch_ns;
  const TimeNs start = std::max({ready, free, host_});
  if (host && host_ > std::max(ready, free)) ++host_gated_;
  const KernelTime kt = kernel_time(device_, flops, bytes, p, shape);
  const TimeNs end = start + kt.total_ns;
  free_[kComputeEngine] = end;
  if (record_) {
    // What bound the start: its data, else the engine, else (host-bound) the host's issue, recorded before the
    // kernel's own event is pushed.
    const std::uint64_t data = deps_ && start == ready ? producer_of(ready) : 0;
    const std::uint64_t host_producer =
        deps_ && host && !data && start != free && start == host_ ? note_host_issue(start) : 0;
    if (!keeps_events()) {  // summed, not kept: no Event built
      fold_summary(name, "compute", {start, end}, flops, bytes);
      return {start, end};
    }
    events_.push_back(Event{name, "compute", kComputeEngine, {start, end}, flops, bytes, -1});
    if (deps_) {
      Event& e = events_.back();
      e.id = new_id();
      e.producer = data ? data : start == free ? last_on_engine_[kComputeEngine] : host_producer;
      // The kernel model's terms (sim/kernel_model.h); the element-wise engines beside a tensor engine count as
      // compute.
      const double tf = std::max(kt.compute_ns, kt.engine_ns), tb = kt.memory_ns;
      e.bound = device_.kernel_gap_ns() > std::max(tf, tb) ? Bound::latency : tf >= tb ? Bound::compute : Bound::hbm;
      last_on_engine_[kComputeEngine] = e.id;
      note_end(end, e.id);
    }
    commit();
  }
  return {start, end};
}

void Timeline::note_send(const std::string& name, const Route& r, int dst, double bytes, TimeNs ready, TimeNs start,
                         Span span, double occupancy, double lat) {
  if (!keeps_events()) return fold_summary(name, "send", span, 0, bytes);  // summed, not kept: no Event built
  events_.push_back(Event{name, "send", r.port, span, 0, bytes, dst});
  if (!deps_) return commit();
  Event& e = events_.back();
  e.id = new_id();
  // What bound the start (called before the port and links are updated): the data, the port, or a link.
  const double o = topo_->protocol().message_overhead_ns;
  std::uint64_t p = start == ready ? producer_of(ready) : 0;
  if (!p && start == free_[static_cast<size_t>(r.port)]) p = last_on_engine_[static_cast<size_t>(r.port)];
  for (const Hop& h : r.hops)
    if (!p && start == link_free_[static_cast<size_t>(h.slot)] - h.offset * lat - o) p = link_last_[static_cast<size_t>(h.slot)];
  e.producer = p;
  e.bound = occupancy >= o + r.latency_ns * lat ? Bound::link : Bound::latency;
  last_on_engine_[static_cast<size_t>(r.port)] = e.id;
  for (const Hop& h : r.hops) link_last_[static_cast<size_t>(h.slot)] = e.id;
  last_send_id_ = e.id;
  last_send_end_ = span.end;
  note_end(span.end, e.id);
  commit();
}

Span Timeline::send(const std::string& name, int dst, double bytes, TimeNs ready) {
  if (dst == chip_) {
    last_send_id_ = 0;
    return {ready, ready};
  }
  const Route& r = route_to(dst);
  // The protocol (topology.h): with the default one, efficiency and latency factor are exactly 1 and the
  // per-message overhead o is 0. The port is busy for o before the data enters the route (once, not per hop).
  const double lat = topo_->protocol().latency_factor_for(bytes);
  const double o = topo_->protocol().message_overhead_ns;
  if (step_) {
    // A flow of a step with crossing flows: B_l / k_l on every link, starting when port and links were free
    // before the step (the step's other flows, its own included, are in k_l); the times it leaves busy apply at
    // end_step(), so no flow of the step queues behind another.
    const double occupancy = shared_occupancy(r, bytes);
    TimeNs start = std::max(ready, free_[static_cast<size_t>(r.port)]);
    for (const Hop& h : r.hops)
      start = std::max(start, link_free_[static_cast<size_t>(h.slot)] - h.offset * lat - o);
    if (record_) note_send(name, r, dst, bytes, ready, start, {start, start + o + occupancy}, occupancy, lat);
    step_free_.push_back({r.port, start + o + occupancy});
    for (const Hop& h : r.hops) step_free_.push_back({-1 - h.slot, start + o + h.offset * lat + occupancy});
    return {start, start + o + r.latency_ns * lat + occupancy};
  }
  const double occupancy = bytes / (r.bottleneck_gbps * topo_->protocol().efficiency_for(bytes));  // as transfer_cost
  TimeNs start = std::max(ready, free_[static_cast<size_t>(r.port)]);
  for (const Hop& h : r.hops)  // every link must be free when the head reaches it (o after the start)
    start = std::max(start, link_free_[static_cast<size_t>(h.slot)] - h.offset * lat - o);
  if (record_) note_send(name, r, dst, bytes, ready, start, {start, start + o + occupancy}, occupancy, lat);
  for (const Hop& h : r.hops) link_free_[static_cast<size_t>(h.slot)] = start + o + h.offset * lat + occupancy;
  free_[static_cast<size_t>(r.port)] = start + o + occupancy;
  return {start, start + o + r.latency_ns * lat + occupancy};
}

Span Timeline::replay_send(const Event& e) {
  if (e.peer == chip_) return e.span;
  const Route& r = route_to(e.peer);
  const double lat = topo_->protocol().latency_factor_for(e.bytes);
  const double start = e.span.start + topo_->protocol().message_overhead_ns;  // the data's start (send(): o first)
  // The occupancy exactly as send() computed it: the plain one, or k times it for a flow of a step (k flows on
  // its busiest link; the same expression as shared_occupancy on a route of equal bandwidths); else the span.
  const double eff = topo_->protocol().efficiency_for(e.bytes);
  double occupancy = e.bytes / (r.bottleneck_gbps * eff);
  if (start + occupancy != e.span.end) {
    const double k = std::round((e.span.end - start) / occupancy);
    const double shared = k * e.bytes / (r.bottleneck_gbps * eff);
    occupancy = k >= 1 && start + shared == e.span.end ? shared : e.span.end - start;
  }
  for (const Hop& h : r.hops) {
    TimeNs& f = link_free_[static_cast<size_t>(h.slot)];
    f = std::max(f, start + h.offset * lat + occupancy);
  }
  free_[static_cast<size_t>(r.port)] = std::max(free_[static_cast<size_t>(r.port)], start + occupancy);
  if (record_) {
    events_.push_back(Event{e.name, "send", r.port, e.span, 0, e.bytes, e.peer, e.id, e.producer, e.bound});
    if (deps_ && e.id) {
      last_on_engine_[static_cast<size_t>(r.port)] = e.id;
      for (const Hop& h : r.hops) link_last_[static_cast<size_t>(h.slot)] = e.id;
      last_send_id_ = e.id;
      last_send_end_ = e.span.end;
      note_end(e.span.end, e.id);
    }
    commit();
  }
  return e.span;
}

TimeNs Timeline::fixed_cost(const std::string& name, TimeNs ready, double ns) {
  const TimeNs end = ready + ns;
  if (!deps_ || !record_) return end;  // bookkeeping only: no simulated time depends on it
  events_.push_back(Event{name, "host", kHostEngine, {ready, end}, 0, 0, -1});
  Event& e = events_.back();
  e.id = new_id();
  e.producer = producer_of(ready);
  e.bound = Bound::latency;  // a fixed cost per call
  note_end(end, e.id);
  commit();
  return end;
}

void Timeline::host_sync(TimeNs t) {
  if (!(device_.host_launch_ns > 0 && !device_.cuda_graph) || !(t > host_)) return;
  host_ = t;
  host_epoch_ = t;
  host_epoch_producer_ = deps_ ? producer_of(t) : 0;
  host_last_id_ = 0;
}

std::uint64_t Timeline::note_host_issue(TimeNs issued) {
  const TimeNs from = host_last_id_ ? host_last_end_ : host_epoch_;
  events_.push_back(Event{"host_launch", "host", kHostEngine, {std::min(from, issued), issued}, 0, 0, -1});
  Event& h = events_.back();
  h.id = new_id();
  h.producer = host_last_id_ ? host_last_id_ : host_epoch_producer_;
  h.bound = Bound::latency;  // kernel launches: a fixed cost per kernel, as a launch-bound kernel's
  host_last_id_ = h.id;
  host_last_end_ = issued;
  commit();
  return host_last_id_;
}

void Timeline::reset() {
  std::fill(free_.begin(), free_.end(), 0.0);
  host_ = 0;
  host_epoch_ = 0;
  host_epoch_producer_ = 0;
  host_last_id_ = 0;
  host_last_end_ = 0;
  std::fill(link_free_.begin(), link_free_.end(), 0.0);
  for (auto& iv : in_busy_) {
    iv.v.clear();
    iv.head = 0;
  }
  events_.clear();
  sum_ = Summary{};
  receives_.clear();  // ids keep counting: never reused
  std::fill(last_on_engine_.begin(), last_on_engine_.end(), 0);
  std::fill(link_last_.begin(), link_last_.end(), 0);
  if (!producers_.empty()) {
    producers_.assign(kProducerSlots, ProducerSlot{});
    producers_.shrink_to_fit();
    producer_count_ = 0;
  }
  last_send_id_ = 0;
  step_ = nullptr;
  step_free_.clear();
  step_booked_.clear();
}

void Timeline::release_events() {
  std::vector<Event>().swap(events_);
  std::vector<Event>().swap(receives_);
}

void Timeline::record_region(const std::string& name, const std::string& category, Span span, double bytes) {
  if (!record_) return;
  if (!keeps_events()) return fold_summary(name, category, span, 0, bytes);  // summed, not kept: no Event built
  events_.push_back(Event{name, category, -1, span, 0, bytes, -1});
  if (deps_) {
    events_.back().id = new_id();
    events_.back().producer = producer_of(span.end);
  }
  commit();
}

void Timeline::replay_region(const Event& e) {
  if (!record_) return;
  events_.push_back(e);
  commit();
}

void Timeline::replay_receive(const Event& e) {
  if (!record_ || !deps_) return;
  receives_.push_back(e);
  note_end(e.span.end, e.id);
}

TimeNs Timeline::end_time() const { return sum_.end; }

namespace {

// Sorted, merged union of intervals.
std::vector<Span> merge(std::vector<Span> v) {
  std::sort(v.begin(), v.end(), [](const Span& a, const Span& b) { return a.start < b.start; });
  std::vector<Span> out;
  for (const auto& s : v) {
    if (s.end <= s.start) continue;
    if (!out.empty() && s.start <= out.back().end) {
      out.back().end = std::max(out.back().end, s.end);
    } else {
      out.push_back(s);
    }
  }
  return out;
}

TimeNs length(const std::vector<Span>& v) {
  TimeNs t = 0;
  for (const auto& s : v) t += s.duration();
  return t;
}

TimeNs intersection(const std::vector<Span>& a, const std::vector<Span>& b) {
  TimeNs t = 0;
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const TimeNs lo = std::max(a[i].start, b[j].start);
    const TimeNs hi = std::min(a[i].end, b[j].end);
    if (hi > lo) t += hi - lo;
    (a[i].end < b[j].end) ? ++i : ++j;
  }
  return t;
}

// Digit runs of NAME replaced by N: the op totals' row name ("all_gather.layer3" -> "all_gather.layerN").
std::string op_row_name(const std::string& name) {
  std::string out;
  for (size_t i = 0; i < name.size();) {
    if (std::isdigit(static_cast<unsigned char>(name[i]))) {
      out += 'N';
      while (i < name.size() && std::isdigit(static_cast<unsigned char>(name[i]))) ++i;
    } else {
      out += name[i++];
    }
  }
  return out;
}

// MERGED (sorted, disjoint, as merge() leaves it) becomes the merged union of itself and PENDING (emptied): the
// spans of MERGED that end before PENDING's earliest start are not touched, so folding a chip's spans in time
// order costs O(pending) per call, not O(all spans so far). The same list as merge(MERGED + PENDING).
void merge_into(std::vector<Span>& merged, std::vector<Span>& pending) {
  TimeNs first = 0;
  bool any = false;
  for (const auto& s : pending)
    if (s.end > s.start && (!any || s.start < first)) {
      first = s.start;
      any = true;
    }
  if (any) {
    const auto keep = std::lower_bound(merged.begin(), merged.end(), first,
                                       [](const Span& m, TimeNs t) { return m.end < t; });
    pending.insert(pending.end(), keep, merged.end());
    merged.erase(keep, merged.end());
    const auto tail = merge(std::move(pending));
    merged.insert(merged.end(), tail.begin(), tail.end());
  }
  pending.clear();
}

std::vector<Span> joined(const std::vector<Span>& merged, const std::vector<Span>& pending) {
  std::vector<Span> v;
  v.reserve(merged.size() + pending.size());
  v.insert(v.end(), merged.begin(), merged.end());
  v.insert(v.end(), pending.begin(), pending.end());
  return merge(std::move(v));
}

constexpr size_t kPendingSpans = 1024;  // spans folded before they are merged in (a bound on host memory only)

// Event names interned process-wide (every timeline of every chip, on every thread: the async engine's timelines
// fold on their own thread), so a timeline finds an event's op-total row by a small dense index. At most
// kMaxNameIds names (a bound on host memory; past it names get kNoNameId and are looked up by row name).
constexpr std::uint32_t kNoNameId = 0xffffffffu;
constexpr size_t kMaxNameIds = size_t{1} << 16;

std::uint32_t name_id(const std::string& name) {
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  static std::shared_mutex mutex;
  static std::unordered_map<std::string, std::uint32_t, Hash, std::equal_to<>> ids;
  {
    const std::shared_lock lock(mutex);
    if (auto it = ids.find(std::string_view(name)); it != ids.end()) return it->second;
  }
  const std::unique_lock lock(mutex);
  if (auto it = ids.find(std::string_view(name)); it != ids.end()) return it->second;
  if (ids.size() >= kMaxNameIds) return kNoNameId;
  const auto id = static_cast<std::uint32_t>(ids.size());
  ids.emplace(name, id);
  return id;
}

}  // namespace

void Timeline::commit() {
  fold(events_.back());
  if (!keeps_events()) events_.pop_back();
}

void Timeline::fold(const Event& e) { fold_summary(e.name, e.category, e.span, e.flops, e.bytes); }

void Timeline::fold_summary(const std::string& name, std::string_view category, Span span, double flops,
                            double bytes) {
  ++recorded_;
  sum_.end = std::max(sum_.end, span.end);
  int kind = -1;  // 0 kernel, 1 collective
  if (category == "compute") {
    sum_.compute_pending.push_back(span);
    sum_.flops += flops;
    if (sum_.compute_pending.size() >= kPendingSpans) merge_into(sum_.compute, sum_.compute_pending);
    kind = 0;
  } else if (category == "collective") {
    sum_.comm_pending.push_back(span);
    if (sum_.comm_pending.size() >= kPendingSpans) merge_into(sum_.comm, sum_.comm_pending);
    kind = 1;
  } else if (category == "send") {
    sum_.bytes_sent += bytes;
  }
  if (kind < 0) return;
  const std::uint32_t id = name_id(name);
  auto& by_id = sum_.row_of_id[kind];
  std::uint32_t row = id < by_id.size() ? by_id[id] : 0;
  if (row > 0) {
    --row;
  } else {
    std::string row_name = op_row_name(name);
    auto& by_row_name = sum_.row_of_row_name[kind];
    if (auto r = by_row_name.find(std::string_view(row_name)); r != by_row_name.end()) {
      row = r->second;
    } else {
      row = static_cast<std::uint32_t>(sum_.ops.size());
      OpTotal t;
      t.kind = kind == 0 ? "kernel" : "collective";
      t.name = row_name;
      sum_.ops.push_back(std::move(t));
      by_row_name.emplace(std::move(row_name), row);
    }
    if (id != kNoNameId) {
      if (id >= by_id.size()) by_id.resize(id + 1, 0);
      by_id[id] = row + 1;
    }
  }
  OpTotal& o = sum_.ops[row];
  ++o.calls;
  o.time_ns += span.duration();
  o.flops += flops;
  o.bytes += bytes;
}

std::vector<OpTotal> Timeline::op_totals() const {
  std::vector<OpTotal> v = sum_.ops;  // one row per (kind, name): the order is total
  std::sort(v.begin(), v.end(), [](const OpTotal& a, const OpTotal& b) {
    const int c = a.kind.compare(b.kind);
    return c < 0 || (c == 0 && a.name < b.name);
  });
  return v;
}

Breakdown Timeline::breakdown() const {
  Breakdown b;
  b.flops = sum_.flops;
  b.bytes_sent = sum_.bytes_sent;
  const auto c = joined(sum_.compute, sum_.compute_pending);
  const auto m = joined(sum_.comm, sum_.comm_pending);
  b.total = end_time();
  b.compute = length(c);
  b.communication = length(m);
  b.exposed_comm = b.communication - intersection(c, m);
  return b;
}

}  // namespace shardsim::sim

#include "sim/timeline.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace shardsim::sim {

Timeline::Timeline(int chip, const topology::Topology& topo, DeviceSpec device, bool record_events)
    : chip_(chip), topo_(&topo), device_(std::move(device)), record_(record_events) {
  if (chip < 0 || chip >= topo.num_chips())
    throw std::out_of_range("timeline: chip " + std::to_string(chip) + " not in topology");
  free_.assign(1 + topo.out_links(chip).size(), 0.0);
  link_free_.assign(topo.links().size(), 0.0);
  routes_.resize(static_cast<size_t>(topo.num_chips()));
  have_route_.assign(static_cast<size_t>(topo.num_chips()), false);
}

void Timeline::fill_route(Route& r, std::vector<int> links) const {
  r.links = std::move(links);
  double at = 0;
  for (int id : r.links) {
    r.offset.push_back(at);
    at += topo_->link(id).latency_ns;
  }
  r.bottleneck_gbps = std::numeric_limits<double>::infinity();
  for (int id : r.links) r.bottleneck_gbps = std::min(r.bottleneck_gbps, topo_->link(id).bandwidth_gbps);
  r.latency_ns = at;
}

const Timeline::Route& Timeline::route_from(int src) {
  if (in_routes_.empty()) {  // the receive side's state is made on first use (event-free replays may never need it)
    in_routes_.resize(static_cast<size_t>(topo_->num_chips()));
    have_in_route_.assign(static_cast<size_t>(topo_->num_chips()), false);
    in_busy_.resize(topo_->links().size());
  }
  Route& r = in_routes_.at(static_cast<size_t>(src));
  if (have_in_route_[static_cast<size_t>(src)]) return r;
  fill_route(r, topo_->route(src, chip_));
  have_in_route_[static_cast<size_t>(src)] = true;
  return r;
}

void Timeline::book_interval(int link, Span s) {
  auto& v = in_busy_[static_cast<size_t>(link)];
  // First interval ending at or after s.start: everything before it ends earlier.
  auto it = std::lower_bound(v.begin(), v.end(), s.start, [](const Span& x, TimeNs t) { return x.end < t; });
  auto last = it;  // merge every interval that overlaps or touches s
  while (last != v.end() && last->start <= s.end) {
    s.start = std::min(s.start, last->start);
    s.end = std::max(s.end, last->end);
    ++last;
  }
  it = v.erase(it, last);
  v.insert(it, s);
  if (v.size() > kMaxIntervals) {
    v[1].start = v[0].start;
    v.erase(v.begin());
  }
}

TimeNs Timeline::receive(int src, double bytes, TimeNs start, TimeNs arrival) {
  if (src == chip_ || !(bytes > 0)) return arrival;
  const Route& r = route_from(src);
  const double lat = topo_->protocol().latency_factor_for(bytes);
  const bool shared = step_ != nullptr;  // a flow of a step with crossing flows: charged as send() charged it
  const double occupancy = shared ? shared_occupancy(r, bytes)
                                  : bytes / (r.bottleneck_gbps * topo_->protocol().efficiency_for(bytes));  // as send()
  TimeNs t = start;
  // Earliest t >= START at which every link l_i is free over [t + offset_i, t + offset_i + occupancy).
  for (bool moved = true; moved;) {
    moved = false;
    for (size_t i = 0; i < r.links.size(); ++i) {
      const auto& v = in_busy_[static_cast<size_t>(r.links[i])];
      const double off = r.offset[i] * lat, a = t + off, b = a + occupancy;
      auto it = std::upper_bound(v.begin(), v.end(), a, [](TimeNs x, const Span& s) { return x < s.end; });
      if (it != v.end() && it->start < b && it->end - off > t) {
        t = it->end - off;
        moved = true;
      }
    }
  }
  for (size_t i = 0; i < r.links.size(); ++i) {
    const double a = t + r.offset[i] * lat;
    if (shared) {  // the step's other flows are in k_l already: book after the step
      step_booked_.push_back({r.links[i], {a, a + occupancy}});
    } else {
      book_interval(r.links[i], {a, a + occupancy});
    }
  }
  return t == start ? arrival : arrival + (t - start);
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
  for (const auto& [link, s] : step_booked_) book_interval(link, s);
  step_free_.clear();
  step_booked_.clear();
  step_ = nullptr;
}

double Timeline::shared_occupancy(const Route& r, double bytes) const {
  const double eff = topo_->protocol().efficiency_for(bytes);
  double occ = 0;
  for (int id : r.links) {
    const double k = static_cast<double>(std::max<uint32_t>(1, step_->flows[static_cast<size_t>(id)]));
    occ = std::max(occ, k * bytes / (topo_->link(id).bandwidth_gbps * eff));
  }
  return occ;
}

const Timeline::Route& Timeline::route_to(int dst) {
  Route& r = routes_.at(static_cast<size_t>(dst));
  if (have_route_[static_cast<size_t>(dst)]) return r;
  fill_route(r, topo_->route(chip_, dst));
  const auto& outs = topo_->out_links(chip_);
  r.port = 1 + static_cast<int>(std::find(outs.begin(), outs.end(), r.links.front()) - outs.begin());
  have_route_[static_cast<size_t>(dst)] = true;
  return r;
}

std::string Timeline::engine_name(int engine) const {
  if (engine == kComputeEngine) return "compute";
  const auto& l = topo_->link(topo_->out_links(chip_).at(static_cast<size_t>(engine - 1)));
  std::string s = "link->";
  s += topo_->is_switch(l.dst) ? "switch " + std::to_string(l.dst - topo_->num_chips()) : std::to_string(l.dst);
  if (!topo_->is_grid()) return s;
  s += " (dim" + std::to_string(l.dim);
  s += l.dir > 0 && !topo_->is_switch(l.dst) ? "+" : l.dir < 0 ? "-" : "";
  return s + ")";
}

Span Timeline::compute(const std::string& name, double flops, double bytes, Precision p, TimeNs ready) {
  const TimeNs start = std::max(ready, free_[kComputeEngine]);
  const TimeNs end = start + compute_time_ns(device_, flops, bytes, p);
  free_[kComputeEngine] = end;
  if (record_) events_.push_back(Event{name, "compute", kComputeEngine, {start, end}, flops, bytes, -1});
  return {start, end};
}

Span Timeline::send(const std::string& name, int dst, double bytes, TimeNs ready) {
  if (dst == chip_) return {ready, ready};
  const Route& r = route_to(dst);
  // The protocol (topology.h): with the default one, efficiency and latency factor are exactly 1.
  const double lat = topo_->protocol().latency_factor_for(bytes);
  if (step_) {
    // A flow of a step with crossing flows: B_l / k_l on every link, starting when port and links were free
    // before the step (the step's other flows, its own included, are in k_l); the times it leaves busy apply at
    // end_step(), so no flow of the step queues behind another.
    const double occupancy = shared_occupancy(r, bytes);
    TimeNs start = std::max(ready, free_[static_cast<size_t>(r.port)]);
    for (size_t i = 0; i < r.links.size(); ++i)
      start = std::max(start, link_free_[static_cast<size_t>(r.links[i])] - r.offset[i] * lat);
    step_free_.push_back({r.port, start + occupancy});
    for (size_t i = 0; i < r.links.size(); ++i)
      step_free_.push_back({-1 - r.links[i], start + r.offset[i] * lat + occupancy});
    if (record_) events_.push_back(Event{name, "send", r.port, {start, start + occupancy}, 0, bytes, dst});
    return {start, start + r.latency_ns * lat + occupancy};
  }
  const double occupancy = bytes / (r.bottleneck_gbps * topo_->protocol().efficiency_for(bytes));  // as transfer_cost
  TimeNs start = std::max(ready, free_[static_cast<size_t>(r.port)]);
  for (size_t i = 0; i < r.links.size(); ++i)  // every link must be free when the head reaches it
    start = std::max(start, link_free_[static_cast<size_t>(r.links[i])] - r.offset[i] * lat);
  for (size_t i = 0; i < r.links.size(); ++i)
    link_free_[static_cast<size_t>(r.links[i])] = start + r.offset[i] * lat + occupancy;
  free_[static_cast<size_t>(r.port)] = start + occupancy;
  if (record_) events_.push_back(Event{name, "send", r.port, {start, start + occupancy}, 0, bytes, dst});
  return {start, start + r.latency_ns * lat + occupancy};
}

Span Timeline::replay_send(const Event& e) {
  if (e.peer == chip_) return e.span;
  const Route& r = route_to(e.peer);
  const double lat = topo_->protocol().latency_factor_for(e.bytes);
  const double start = e.span.start;
  // The occupancy exactly as send() computed it: the plain one, or k times it for a flow of a step (k flows on
  // its busiest link; the same expression as shared_occupancy on a route of equal bandwidths); else the span.
  const double eff = topo_->protocol().efficiency_for(e.bytes);
  double occupancy = e.bytes / (r.bottleneck_gbps * eff);
  if (start + occupancy != e.span.end) {
    const double k = std::round((e.span.end - start) / occupancy);
    const double shared = k * e.bytes / (r.bottleneck_gbps * eff);
    occupancy = k >= 1 && start + shared == e.span.end ? shared : e.span.end - start;
  }
  for (size_t i = 0; i < r.links.size(); ++i) {
    TimeNs& f = link_free_[static_cast<size_t>(r.links[i])];
    f = std::max(f, start + r.offset[i] * lat + occupancy);
  }
  free_[static_cast<size_t>(r.port)] = std::max(free_[static_cast<size_t>(r.port)], start + occupancy);
  if (record_) events_.push_back(Event{e.name, "send", r.port, e.span, 0, e.bytes, e.peer});
  return e.span;
}

void Timeline::reset() {
  std::fill(free_.begin(), free_.end(), 0.0);
  std::fill(link_free_.begin(), link_free_.end(), 0.0);
  for (auto& v : in_busy_) v.clear();
  events_.clear();
  step_ = nullptr;
  step_free_.clear();
  step_booked_.clear();
}

void Timeline::record_region(const std::string& name, const std::string& category, Span span, double bytes) {
  if (record_) events_.push_back(Event{name, category, -1, span, 0, bytes, -1});
}

TimeNs Timeline::end_time() const {
  TimeNs t = 0;
  for (const auto& e : events_) t = std::max(t, e.span.end);
  return t;
}

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

}  // namespace

Breakdown Timeline::breakdown() const {
  Breakdown b;
  std::vector<Span> compute, comm;
  for (const auto& e : events_) {
    if (e.category == "compute") {
      compute.push_back(e.span);
      b.flops += e.flops;
    } else if (e.category == "collective") {
      comm.push_back(e.span);
    } else if (e.category == "send") {
      b.bytes_sent += e.bytes;
    }
  }
  const auto c = merge(compute);
  const auto m = merge(comm);
  b.total = end_time();
  b.compute = length(c);
  b.communication = length(m);
  b.exposed_comm = b.communication - intersection(c, m);
  return b;
}

}  // namespace shardsim::sim

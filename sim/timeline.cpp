#include "sim/timeline.h"

#include <algorithm>
#include <stdexcept>

namespace shardsim::sim {

Timeline::Timeline(int chip, const topology::Topology& topo, DeviceSpec device)
    : chip_(chip), topo_(&topo), device_(std::move(device)) {
  if (chip < 0 || chip >= topo.num_chips())
    throw std::out_of_range("timeline: chip " + std::to_string(chip) + " not in topology");
  free_.assign(1 + topo.out_links(chip).size(), 0.0);
}

std::string Timeline::engine_name(int engine) const {
  if (engine == kComputeEngine) return "compute";
  const auto& l = topo_->link(topo_->out_links(chip_).at(engine - 1));
  return "link->" + std::to_string(l.dst) + " (dim" + std::to_string(l.dim) + (l.dir > 0 ? "+" : "-") + ")";
}

Span Timeline::compute(const std::string& name, double flops, double bytes, Precision p, TimeNs ready) {
  const TimeNs start = std::max(ready, free_[kComputeEngine]);
  const TimeNs end = start + compute_time_ns(device_, flops, bytes, p);
  free_[kComputeEngine] = end;
  events_.push_back(Event{name, "compute", kComputeEngine, {start, end}, flops, bytes, -1});
  return {start, end};
}

Span Timeline::send(const std::string& name, int dst, double bytes, TimeNs ready) {
  if (dst == chip_) return {ready, ready};
  const auto route = topo_->route(chip_, dst);
  const auto& outs = topo_->out_links(chip_);
  const int port = 1 + static_cast<int>(std::find(outs.begin(), outs.end(), route.front()) - outs.begin());
  const TransferCost c = transfer_cost(*topo_, route, bytes);
  const TimeNs start = std::max(ready, free_[port]);
  free_[port] = start + c.occupancy_ns;
  events_.push_back(Event{name, "send", port, {start, start + c.occupancy_ns}, 0, bytes, dst});
  return {start, start + c.total_ns()};
}

void Timeline::reset() {
  std::fill(free_.begin(), free_.end(), 0.0);
  events_.clear();
}

void Timeline::record_region(const std::string& name, const std::string& category, Span span, double bytes) {
  events_.push_back(Event{name, category, -1, span, 0, bytes, -1});
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

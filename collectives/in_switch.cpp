#include "collectives/in_switch.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace shardsim::collectives::in_switch {

namespace {

constexpr double kDefaultPieceBytes = 1 << 20;  // chunk_bytes 0: pieces of 1 MiB
constexpr int kMaxPieces = 64;

// The reduction switch dimension whose one line is TP's group, or -1 with WHY set.
int find_dimension(const runtime::Transport& tp, std::string* why) {
  const auto& topo = tp.topology();
  if (!topo.is_grid()) {
    *why = "the topology is a " + topo.kind_name() + " (an edge list: no switch with in-switch reduction)";
    return -1;
  }
  const auto& dims = topo.dim_specs();
  bool any = false;
  for (size_t d = 0; d < dims.size(); ++d) {
    if (dims[d].kind != topology::DimKind::switch_ || !dims[d].reduction.enabled || dims[d].size < 2) continue;
    any = true;
    if (tp.size() != dims[d].size) continue;
    // Every rank on a distinct chip of the line through rank 0's chip along D.
    const auto base = topo.coords(tp.chip_of(0));
    std::vector<int> seen(static_cast<size_t>(dims[d].size), 0);
    bool line = true;
    for (int r = 0; r < tp.size() && line; ++r) {
      auto xyz = topo.coords(tp.chip_of(r));
      int& s = seen[static_cast<size_t>(xyz[d])];
      line = s == 0;
      s = 1;
      xyz[d] = base[d];
      line = line && xyz == base;
    }
    if (line) return static_cast<int>(d);
  }
  *why = any ? "the group's chips are not the chips of one reduction switch (one rank on each chip of its line)"
             : "the topology has no switch with in-switch reduction (a switch with 'reduction: true')";
  return -1;
}

const topology::Link& up_link(const runtime::Transport& tp, int dim, int r) {
  const auto& topo = tp.topology();
  const int chip = tp.chip_of(r);
  return topo.link(*topo.link_between(chip, topo.switch_node(dim, chip)));
}
const topology::Link& down_link(const runtime::Transport& tp, int dim, int r) {
  const auto& topo = tp.topology();
  const int chip = tp.chip_of(r);
  return topo.link(*topo.link_between(topo.switch_node(dim, chip), chip));
}
double occupancy(const runtime::Transport& tp, const topology::Link& l, double bytes) {
  return bytes > 0 ? bytes / (l.bandwidth_gbps * tp.topology().protocol().efficiency_for(bytes)) : 0.0;
}

}  // namespace

std::string obstacle(const runtime::Transport& tp) {
  std::string why;
  find_dimension(tp, &why);
  return why;
}

double Schedule::piece(double total, int i) const {
  return std::floor((i + 1) * total / pieces) - std::floor(i * total / pieces);
}

Schedule schedule(const runtime::Transport& tp, bool rs, bool ag, const std::vector<double>& chunk,
                  size_t chunk_bytes) {
  Schedule s;
  std::string why;
  s.dim = find_dimension(tp, &why);
  const auto& red = tp.topology().dim_specs().at(static_cast<size_t>(s.dim)).reduction;
  s.rate_gbps = red.rate.bandwidth_gbps;
  s.latency_ns = red.rate.latency_ns;
  double total = 0;
  for (double c : chunk) total += c;
  for (double c : chunk) {
    s.up.push_back(rs ? total : c);
    s.down.push_back(ag ? total - (rs ? 0.0 : c) : c);
  }
  const double largest = std::max(*std::max_element(s.up.begin(), s.up.end()),
                                  *std::max_element(s.down.begin(), s.down.end()));
  const double piece = chunk_bytes ? static_cast<double>(chunk_bytes) : kDefaultPieceBytes;
  s.pieces = static_cast<int>(std::clamp(std::ceil(largest / piece), 1.0, static_cast<double>(kMaxPieces)));
  s.reduced = rs ? total : 0.0;
  return s;
}

std::vector<double> up_arrivals(const runtime::Transport& tp, const Schedule& s, int r, double start) {
  const auto& l = up_link(tp, s.dim, r);
  const auto& pr = tp.topology().protocol();
  std::vector<double> out;
  for (int i = 0; i < s.pieces; ++i) {  // Timeline::send: o, the route's latency, the occupancy; the port free after
    const double b = s.piece(s.up[static_cast<size_t>(r)], i), occ = occupancy(tp, l, b);
    out.push_back(start + pr.message_overhead_ns + l.latency_ns * pr.latency_factor_for(b) + occ);
    start += pr.message_overhead_ns + occ;
  }
  return out;
}

std::vector<double> emit_times(const Schedule& s, const std::vector<std::vector<double>>& arrivals) {
  std::vector<double> emit(static_cast<size_t>(s.pieces));
  double engine = -1e300;
  for (int i = 0; i < s.pieces; ++i) {
    double all_in = -1e300;
    for (size_t r = 0; r < arrivals.size(); ++r)
      if (s.up[r] > 0) all_in = std::max(all_in, arrivals[r][static_cast<size_t>(i)]);
    engine = std::max(engine, all_in) + s.piece(s.reduced, i) / s.rate_gbps;  // the switch reduces one at a time
    emit[static_cast<size_t>(i)] = engine + s.latency_ns;
  }
  return emit;
}

double down_flight(const runtime::Transport& tp, const Schedule& s, int r, int i) {
  const auto& l = down_link(tp, s.dim, r);
  const auto& pr = tp.topology().protocol();
  const double b = s.piece(s.down[static_cast<size_t>(r)], i);
  return pr.message_overhead_ns + l.latency_ns * pr.latency_factor_for(b) + occupancy(tp, l, b);
}

std::vector<double> down_arrivals(const runtime::Transport& tp, const Schedule& s, int r,
                                  const std::vector<double>& emit) {
  const auto& l = down_link(tp, s.dim, r);
  std::vector<double> out;
  double link_free = -1e300;  // Timeline::receive: a piece waits until the previous one has left the link
  for (int i = 0; i < s.pieces; ++i) {
    const double b = s.piece(s.down[static_cast<size_t>(r)], i), occ = occupancy(tp, l, b);
    const double t = b > 0 ? std::max(emit[static_cast<size_t>(i)], link_free) : emit[static_cast<size_t>(i)];
    if (b > 0) link_free = t + occ;
    out.push_back(t + down_flight(tp, s, r, i));
  }
  return out;
}

namespace {

// When rank R's piece I (its first entered the up-link at START) has left R's port (Timeline::send's span end):
// the pieces go back to back, each o + piece / (B eff) on the port.
double up_port_free(const runtime::Transport& tp, const Schedule& s, int r, double start, int i) {
  const auto& l = up_link(tp, s.dim, r);
  const auto& pr = tp.topology().protocol();
  for (int j = 0; j <= i; ++j) start += pr.message_overhead_ns + occupancy(tp, l, s.piece(s.up[static_cast<size_t>(r)], j));
  return start;
}

// Dependency recording only (else zeros, no messages): every rank's FIRST_UP (the id of its first up-send; its
// pieces' sends take the next ids, as one timeline numbers its events). The ids travel in untimed empty messages'
// times: the low 40 bits of an id (its count; the top bits are the chip + 1, sim/timeline.h) are exact in a
// double, and the chip is the sender's.
std::vector<std::uint64_t> exchange_up_ids(runtime::Transport& tp, std::uint64_t first_up, const std::string& name) {
  const int p = tp.size(), me = tp.rank();
  std::vector<std::uint64_t> ids(static_cast<size_t>(p), 0);
  if (!tp.timeline().records_dependencies()) return ids;
  constexpr std::uint64_t kLow = (std::uint64_t{1} << 40) - 1;
  const auto chip_bits = [&](int r) { return std::uint64_t(tp.chip_of(r) + 1) << 40; };
  ids[static_cast<size_t>(me)] = first_up && (first_up & ~kLow) == chip_bits(me) ? first_up : 0;
  std::vector<runtime::SendOp> sends;
  std::vector<runtime::RecvOp> recvs;
  for (int k = 1; k < p; ++k) {
    sends.push_back({nullptr, 0, (me + k) % p, static_cast<double>(ids[static_cast<size_t>(me)] & kLow), false});
    recvs.push_back({nullptr, 0, (me - k + p) % p, 0, false});
  }
  tp.exchange(sends, recvs, name + ".ids");
  for (const auto& rv : recvs)
    if (rv.arrival > 0) ids[static_cast<size_t>(rv.src)] = chip_bits(rv.src) | static_cast<std::uint64_t>(rv.arrival);
  return ids;
}

// The whole algorithm over LAYOUT on BASE (in place): RS and / or AG halves (see the header).
sim::TimeNs run(runtime::Transport& tp, void* base_v, const Layout& layout, DType t, ReduceOp op, bool rs, bool ag,
                size_t chunk_bytes, sim::TimeNs ready, const std::string& name) {
  const int p = tp.size(), me = tp.rank();
  if (p == 1) return ready;
  auto* base = static_cast<unsigned char*>(base_v);
  const size_t es = runtime::dtype_size(t);
  std::vector<double> chunk;
  for (size_t r = 0; r < layout.parts(); ++r) chunk.push_back(static_cast<double>(layout.size[r] * es));
  if (layout.total() == 0) return ready;
  const Schedule s = schedule(tp, rs, ag, chunk, chunk_bytes);
  const int sw = tp.topology().switch_node(s.dim, tp.chip());
  const size_t m = static_cast<size_t>(me);
  // Up: every piece into the up-link, back to back; START = when the first one entered it.
  double start = ready, end = ready;
  std::uint64_t first_up = 0;  // dependency recording: the id of this chip's first up-send (the others follow it)
  for (int i = 0; i < s.pieces && s.up[m] > 0; ++i) {
    const sim::Span span = tp.send_to_switch(sw, s.piece(s.up[m], i), ready, name + ".up");
    if (i == 0) start = span.start;
    if (i == 0) first_up = tp.timeline().last_send_id();
    end = span.end;  // a chip with nothing coming down is done when its data is up
  }
  const std::vector<std::uint64_t> up_ids = exchange_up_ids(tp, first_up, name);
  // The data, in untimed messages that carry START.
  std::vector<double> starts(static_cast<size_t>(p), 0.0);
  starts[m] = start;
  const bool data = !tp.shape_only();
  std::vector<runtime::SendOp> sends;
  std::vector<runtime::RecvOp> recvs;
  if (rs) {
    const size_t mine = layout.size[m] * es;
    unsigned char* in = tp.scratch(0, mine * static_cast<size_t>(p));
    for (int k = 1; k < p; ++k) {
      const int dst = (me + k) % p, src = (me - k + p) % p;
      sends.push_back({base + layout.offset[static_cast<size_t>(dst)] * es, layout.size[static_cast<size_t>(dst)] * es,
                       dst, start, false});
      recvs.push_back({in ? in + static_cast<size_t>(k) * mine : nullptr, mine, src, 0, false});
    }
    tp.exchange(sends, recvs, name + ".reduce");
    for (const auto& rv : recvs) {
      starts[static_cast<size_t>(rv.src)] = rv.arrival;
      if (data && mine) reduce_into(base + layout.offset[m] * es, rv.buf, layout.size[m], t, op);
    }
  }
  if (ag) {
    sends.clear();
    recvs.clear();
    for (int k = 1; k < p; ++k) {
      const int dst = (me + k) % p, src = (me - k + p) % p;
      sends.push_back({base + layout.offset[m] * es, layout.size[m] * es, dst, start, false});
      recvs.push_back({base + layout.offset[static_cast<size_t>(src)] * es, layout.size[static_cast<size_t>(src)] * es,
                       src, 0, false});
    }
    tp.exchange(sends, recvs, name + ".multicast");
    if (!rs)
      for (const auto& rv : recvs) starts[static_cast<size_t>(rv.src)] = rv.arrival;
  }
  // Down: the switch sends piece i at emit[i]; the down-link delivers it, queued behind the previous one.
  std::vector<std::vector<double>> arrivals;
  for (int r = 0; r < p; ++r) arrivals.push_back(up_arrivals(tp, s, r, starts[static_cast<size_t>(r)]));
  const auto emit = emit_times(s, arrivals);
  for (int i = 0; i < s.pieces && s.down[m] > 0; ++i) {  // Timeline::receive queues it behind earlier flows
    const double e = emit[static_cast<size_t>(i)];
    // Its producer (dependency recording): the up-send of the chip whose piece i reached the switch last, from the
    // moment that chip's port was free again, so the profiler's path crosses the switch to that chip's send.
    int last = -1;
    for (int r = 0; r < p; ++r)
      if (s.up[static_cast<size_t>(r)] > 0 &&
          (last < 0 || arrivals[static_cast<size_t>(r)][static_cast<size_t>(i)] >
                           arrivals[static_cast<size_t>(last)][static_cast<size_t>(i)]))
        last = r;
    const std::uint64_t id = last >= 0 && up_ids[static_cast<size_t>(last)] ? up_ids[static_cast<size_t>(last)] + i : 0;
    const double sent = id ? up_port_free(tp, s, last, starts[static_cast<size_t>(last)], i) : -1;
    end = std::max(end, tp.timeline().receive(sw, s.piece(s.down[m], i), e, e + down_flight(tp, s, me, i), id, sent));
  }
  return end;
}

}  // namespace

sim::TimeNs all_reduce(runtime::Transport& tp, const void* sendbuf, void* recvbuf, size_t count, DType t, ReduceOp op,
                       size_t chunk_bytes, sim::TimeNs ready, const std::string& name) {
  const size_t bytes = count * runtime::dtype_size(t);
  if (sendbuf != recvbuf && bytes && !tp.shape_only()) std::memcpy(recvbuf, sendbuf, bytes);
  const Layout layout = Layout::from(Partition{count, static_cast<size_t>(tp.size())});
  return run(tp, recvbuf, layout, t, op, true, true, chunk_bytes, ready, name);
}
sim::TimeNs reduce_scatter(runtime::Transport& tp, void* base, const Layout& layout, DType t, ReduceOp op,
                           size_t chunk_bytes, sim::TimeNs ready, const std::string& name) {
  return run(tp, base, layout, t, op, true, false, chunk_bytes, ready, name);
}
sim::TimeNs all_gather(runtime::Transport& tp, void* base, const Layout& layout, DType t, size_t chunk_bytes,
                       sim::TimeNs ready, const std::string& name) {
  return run(tp, base, layout, t, ReduceOp::sum, false, true, chunk_bytes, ready, name);
}

}  // namespace shardsim::collectives::in_switch

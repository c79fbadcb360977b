#include "collectives/ring.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cstdio>
#include <span>
#include <stdexcept>
#include <string>

namespace shardsim::collectives::ring {

std::vector<Lane> make_lanes(const Layout& layout, size_t elem_size, bool bidirectional, size_t chunk_bytes,
                             sim::TimeNs ready) {
  return make_lanes(layout, elem_size, bidirectional ? std::vector<int>{1, -1} : std::vector<int>{1}, chunk_bytes,
                    ready);
}

bool maps_onto_itself(const std::vector<Cycle>& cycles, const std::vector<int>& image) {
  const int p = static_cast<int>(image.size());
  for (const Cycle& c : cycles)
    for (int r = 0; r < p; ++r)
      if (c.at(image[static_cast<size_t>(r)], 1, p) != image[static_cast<size_t>(c.at(r, 1, p))]) return false;
  return true;
}

Cycle Cycle::from_order(std::vector<int> order) {
  std::vector<int> pos(order.size(), -1);
  for (size_t q = 0; q < order.size(); ++q) {
    const int r = order[q];
    if (r < 0 || static_cast<size_t>(r) >= order.size() || pos[static_cast<size_t>(r)] >= 0)
      throw std::logic_error("ring::Cycle::from_order: not a permutation of 0.." + std::to_string(order.size() - 1));
    pos[static_cast<size_t>(r)] = static_cast<int>(q);
  }
  Cycle c;
  c.order = std::make_shared<const std::vector<int>>(std::move(order));
  c.pos = std::make_shared<const std::vector<int>>(std::move(pos));
  return c;
}

std::vector<Cycle> stride_cycles(const std::vector<int>& dirs) {
  std::vector<Cycle> out(dirs.size());
  for (size_t i = 0; i < dirs.size(); ++i) out[i].stride = dirs[i];
  return out;
}

std::vector<Lane> make_lanes(const Layout& layout, size_t elem_size, const std::vector<int>& directions,
                             size_t chunk_bytes, sim::TimeNs ready) {
  return make_lanes(layout, elem_size, stride_cycles(directions), chunk_bytes, ready);
}

std::vector<Lane> make_lanes(const Layout& layout, size_t elem_size, const std::vector<Cycle>& directions,
                             size_t chunk_bytes, sim::TimeNs ready) {
  const size_t dirs = directions.size();
  const size_t per_dir_bytes = (layout.max_size() * elem_size + dirs - 1) / dirs;
  // At most kMaxPieces per direction: a tiny chunk size on a huge buffer would otherwise mean millions of
  // messages per step (the piece then grows beyond chunk_bytes).
  constexpr size_t kMaxPieces = 64;
  const size_t pieces =
      chunk_bytes == 0 ? 1 : std::clamp<size_t>((per_dir_bytes + chunk_bytes - 1) / chunk_bytes, 1, kMaxPieces);
  std::vector<Lane> lanes;
  lanes.reserve(dirs * pieces);
  for (size_t d = 0; d < dirs; ++d) {
    for (size_t j = 0; j < pieces; ++j) {
      Lane lane;
      lane.ring = directions[d];
      lane.t = ready;
      lane.layout.offset.reserve(layout.parts());
      lane.layout.size.reserve(layout.parts());
      for (size_t r = 0; r < layout.parts(); ++r) {
        const Partition sub{layout.size[r], dirs * pieces};
        lane.layout.offset.push_back(layout.offset[r] + sub.offset(d * pieces + j));
        lane.layout.size.push_back(sub.size(d * pieces + j));
      }
      if (lane.layout.max_size() > 0) lanes.push_back(std::move(lane));
    }
  }
  return lanes;
}

namespace {

// One ring pass (reduce-scatter when REDUCE, else all-gather) over all lanes at once.
sim::TimeNs run(runtime::Transport& tp, void* basep, std::vector<Lane>& lanes, DType t, const ReduceOp* reduce,
                const std::string& label, const void* srcp = nullptr) {
  const long p = tp.size(), r = tp.rank();
  sim::TimeNs end = 0;
  for (const auto& l : lanes) end = std::max(end, l.t);
  if (p == 1 || lanes.empty()) return end;
  const size_t es = runtime::dtype_size(t);
  auto* base = static_cast<unsigned char*>(basep);
  const auto* src = srcp ? static_cast<const unsigned char*>(srcp) : base;
  // Per-pass arrays on the stack for up to kInline lanes (no allocation on the common path; a fiber may switch
  // inside exchange(), so thread-local reuse would not be safe in chip mode).
  constexpr size_t kInline = 8;
  const size_t nl = lanes.size();
  std::array<unsigned char*, kInline> scratch_inline{};
  std::array<runtime::SendOp, kInline> sends_inline{};
  std::array<runtime::RecvOp, kInline> recvs_inline{};
  std::vector<unsigned char*> scratch_heap;
  std::vector<runtime::SendOp> sends_heap;
  std::vector<runtime::RecvOp> recvs_heap;
  if (nl > kInline) {
    scratch_heap.resize(nl);
    sends_heap.resize(nl);
    recvs_heap.resize(nl);
  }
  const std::span<unsigned char*> scratch(nl > kInline ? scratch_heap.data() : scratch_inline.data(), nl);
  const std::span<runtime::SendOp> sends(nl > kInline ? sends_heap.data() : sends_inline.data(), nl);
  const std::span<runtime::RecvOp> recvs(nl > kInline ? recvs_heap.data() : recvs_inline.data(), nl);
  // Receive space for every lane, carved out of the transport's reusable scratch (slot 0).
  if (reduce) {
    size_t total = 0;
    for (const auto& l : lanes) total += l.layout.max_size() * es;
    unsigned char* block = tp.scratch(0, total);
    for (size_t i = 0; i < lanes.size(); ++i) {
      scratch[i] = block;
      block += lanes[i].layout.max_size() * es;
    }
  }
  // "LABEL.stepS", built in one buffer (the names are longer than the short-string buffer).
  std::string step_label = label;
  step_label += ".step";
  const size_t stem = step_label.size();
  char digits[24];
  // The step's global pattern: every rank sends its lanes to r + 1 (and r - 1): the same shift on every rank.
  // Strides other than +-1 (multi_ring.h): no pattern, each flow has a link of its own.
  int fwd = 0, bwd = 0;
  bool unit = true;
  for (const auto& l : lanes) {
    (l.ring.stride > 0 ? fwd : bwd) += 1;
    unit = unit && l.ring.unit();
  }
  const runtime::FlowPattern pattern =
      fwd == bwd || bwd == 0 ? runtime::FlowPattern::shift(1, bwd ? -1 : 0, fwd)
                             : runtime::FlowPattern::shift(fwd ? 1 : -1, 0, fwd ? fwd : bwd);
  const runtime::FlowPattern* step_pattern = unit ? &pattern : nullptr;
  for (long s = 0; s < p - 1; ++s) {
    for (size_t i = 0; i < lanes.size(); ++i) {
      const Lane& l = lanes[i];
      const int me = static_cast<int>(r), np = static_cast<int>(p);
      const auto sc = static_cast<size_t>(l.ring.at(me, reduce ? -(s + 1) : -s, np));
      const auto rc = static_cast<size_t>(l.ring.at(me, reduce ? -(s + 2) : -(s + 1), np));
      const unsigned char* from = s == 0 ? src : base;  // later steps forward what was reduced into BASE
      sends[i] = {from + l.layout.offset[sc] * es, l.layout.size[sc] * es, l.ring.at(me, 1, np), l.t};
      void* into = reduce ? static_cast<void*>(scratch[i]) : base + l.layout.offset[rc] * es;
      recvs[i] = {into, l.layout.size[rc] * es, l.ring.at(me, -1, np), 0};
    }
    step_label.resize(stem);
    step_label.append(digits, static_cast<size_t>(std::to_chars(digits, digits + sizeof digits, s).ptr - digits));
    tp.exchange(sends, recvs, step_label, step_pattern);
    for (size_t i = 0; i < lanes.size(); ++i) {
      Lane& l = lanes[i];
      if (reduce) {
        const auto rc = static_cast<size_t>(l.ring.at(static_cast<int>(r), -(s + 2), static_cast<int>(p)));
        const size_t at = l.layout.offset[rc] * es;
        if (!tp.shape_only()) reduce_to(base + at, src + at, scratch[i], l.layout.size[rc], t, *reduce);
      }
      l.t = std::max(l.t, recvs[i].arrival);
      end = std::max(end, l.t);
    }
  }
  return end;
}

}  // namespace

sim::TimeNs reduce_scatter(runtime::Transport& tp, void* base, std::vector<Lane>& lanes, DType t, ReduceOp op,
                           const std::string& name, const void* src) {
  return run(tp, base, lanes, t, &op, name + ".reduce_scatter", src);
}

sim::TimeNs all_gather(runtime::Transport& tp, void* base, std::vector<Lane>& lanes, DType t,
                       const std::string& name) {
  return run(tp, base, lanes, t, nullptr, name + ".all_gather");
}

std::string bidirectional_obstacle(const runtime::Transport& tp) {
  const int p = tp.size();
  if (p <= 2) return "";  // with 2 ranks both directions are the same neighbour: still correct, no gain
  const auto& topo = tp.topology();
  for (int r = 0; r < p; ++r) {
    const int c = tp.chip_of(r), next = tp.chip_of((r + 1) % p), prev = tp.chip_of((r + p - 1) % p);
    const auto a = topo.route(c, next), b = topo.route(c, prev);
    if (!a.empty() && !b.empty() && a.front() == b.front()) {
      const auto& l = topo.link(a.front());
      const int via = l.dst;
      const auto* dim = topo.is_grid() ? &topo.dim_specs().at(static_cast<size_t>(l.dim)) : nullptr;
      const std::string hop = std::to_string(c) + " -> " + std::to_string(via);
      std::string link;
      if (topo.is_switch(via))
        link = "the same link, its one uplink to switch " + std::to_string(via - topo.num_chips());
      else if (dim && dim->kind == topology::DimKind::ring && !dim->bidirectional)
        link = "the same link " + hop + " (the ring is one-way)";
      else if (dim && dim->kind == topology::DimKind::line && topo.hop_count(c, next) + topo.hop_count(c, prev) > 2)
        link = "the same link " + hop + " (the end of a line: no wrap-around link)";
      else
        link = "the same link " + hop + " (the rank order does not follow the topology's rings: with this placement "
               "the routes to ring neighbours are multi-hop and start the same way)";
      return "chip " + std::to_string(c) + " reaches chips " + std::to_string(next) + " and " + std::to_string(prev) +
             " through " + link + ", so the two directions would share it";
    }
  }
  return "";
}

}  // namespace shardsim::collectives::ring

#include "collectives/torus.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "collectives/ring.h"

namespace shardsim::collectives::torus {

std::string obstacle(const runtime::Transport& tp) {
  const auto& topo = tp.topology();
  if (!topo.is_grid())
    return "the topology is a " + topo.kind_name() +
           " (an edge list without dimensions); the torus / hierarchical algorithm needs a grid topology (ring, "
           "torus, mesh, switch, fully_connected or stacked)";
  if (tp.size() != topo.num_chips())
    return "the group has " + std::to_string(tp.size()) + " of the topology's " + std::to_string(topo.num_chips()) +
           " chips (a sub-group is not a torus)";
  std::vector<int> rank_on(static_cast<size_t>(topo.num_chips()), -1);
  for (int r = 0; r < tp.size(); ++r) {
    int& other = rank_on.at(static_cast<size_t>(tp.chip_of(r)));
    if (other >= 0)
      return "ranks " + std::to_string(other) + " and " + std::to_string(r) + " are both on chip " +
             std::to_string(tp.chip_of(r)) + " (the torus algorithm needs one rank on every chip)";
    other = r;
  }
  return "";
}

std::vector<DimRing> dim_order(const topology::Topology& topo) {
  std::vector<DimRing> out;
  const auto& dims = topo.dims();
  for (size_t i = dims.size(); i-- > 0;) {  // innermost first: the tie-break of the stable sort below
    const int k = dims[i];
    if (k < 2) continue;
    DimRing r;
    r.dim = static_cast<int>(i);
    r.k = k;
    std::vector<int> xyz(dims.size(), 0);
    for (int x = 0; x < k; ++x) {
      xyz[i] = x;
      r.line.push_back(topo.chip_at(xyz));
    }
    auto bottleneck = [&](const std::vector<int>& route) {
      double b = std::numeric_limits<double>::infinity();
      for (int id : route) b = std::min(b, topo.link(id).bandwidth_gbps);
      return b;
    };
    const auto fwd = topo.route(r.line[0], r.line[1]);
    const auto bwd = topo.route(r.line[0], r.line[static_cast<size_t>(k - 1)]);
    r.bidirectional = k > 2 && bwd.front() != fwd.front();
    r.bandwidth_gbps = r.bidirectional ? 2 * std::min(bottleneck(fwd), bottleneck(bwd)) : bottleneck(fwd);
    out.push_back(std::move(r));
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const DimRing& a, const DimRing& b) { return a.bandwidth_gbps > b.bandwidth_gbps; });
  return out;
}

size_t position(const topology::Topology& topo, const std::vector<DimRing>& order, int chip) {
  const auto xyz = topo.coords(chip);
  size_t q = 0;
  for (const auto& d : order) q = q * static_cast<size_t>(d.k) + static_cast<size_t>(xyz[static_cast<size_t>(d.dim)]);
  return q;
}

Plan plan(runtime::Transport& tp, const std::vector<DimRing>& order) {
  const auto& topo = tp.topology();
  const auto xyz = topo.coords(tp.chip());
  Plan pl;
  size_t lo = 0, span = static_cast<size_t>(tp.size());
  for (const auto& d : order) {
    const size_t k = static_cast<size_t>(d.k), x = static_cast<size_t>(xyz[static_cast<size_t>(d.dim)]);
    const size_t stride = span / k;
    auto base = xyz;
    base[static_cast<size_t>(d.dim)] = 0;
    runtime::Transport& g = tp.subgroup("torus.dim" + std::to_string(d.dim), topo.chip_at(base), static_cast<int>(x));
    const bool bidir = k > 2 && ring::bidirectional_obstacle(g).empty();
    pl.steps.push_back({&g, d.dim, lo, stride, k, bidir});
    lo += x * stride;
    span = stride;
  }
  pl.rank_at.assign(static_cast<size_t>(tp.size()), 0);
  for (int r = 0; r < tp.size(); ++r) pl.rank_at[position(topo, order, tp.chip_of(r))] = static_cast<size_t>(r);
  return pl;
}

Layout by_position(const Layout& layout, const Plan& pl) {
  Layout out;
  for (size_t r : pl.rank_at) {
    out.offset.push_back(layout.offset[r]);
    out.size.push_back(layout.size[r]);
  }
  return out;
}

namespace {

bool packed(const Layout& l) {
  for (size_t q = 0; q + 1 < l.parts(); ++q)
    if (l.offset[q + 1] != l.offset[q] + l.size[q]) return false;
  return true;
}

// The layout of one dimension's ring: block c = the positions [lo + c*stride, lo + (c+1)*stride) of the
// position-ordered layout POS (packed, so each block is one contiguous range).
Layout block_layout(const Layout& pos, const DimStep& s) {
  Layout out;
  for (size_t c = 0; c < s.k; ++c) {
    const size_t first = s.lo + c * s.stride, last = first + s.stride - 1;
    out.offset.push_back(pos.offset[first]);
    out.size.push_back(pos.offset[last] + pos.size[last] - pos.offset[first]);
  }
  return out;
}

}  // namespace

sim::TimeNs rs_pass(const DimStep& s, void* base, const Layout& pos, DType t, ReduceOp op, sim::TimeNs ready,
                    size_t chunk_bytes, const std::string& name) {
  auto lanes = ring::make_lanes(block_layout(pos, s), runtime::dtype_size(t), s.bidirectional, chunk_bytes, ready);
  return std::max(ready, ring::reduce_scatter(*s.group, base, lanes, t, op, name + ".dim" + std::to_string(s.dim)));
}

sim::TimeNs ag_pass(const DimStep& s, void* base, const Layout& pos, DType t, sim::TimeNs ready, size_t chunk_bytes,
                    const std::string& name) {
  auto lanes = ring::make_lanes(block_layout(pos, s), runtime::dtype_size(t), s.bidirectional, chunk_bytes, ready);
  return std::max(ready, ring::all_gather(*s.group, base, lanes, t, name + ".dim" + std::to_string(s.dim)));
}

namespace {

sim::TimeNs rs_passes(const Plan& pl, void* base, const Layout& pos, DType t, ReduceOp op, sim::TimeNs ready,
                      size_t chunk_bytes, const std::string& name) {
  sim::TimeNs now = ready;
  for (const auto& s : pl.steps) now = rs_pass(s, base, pos, t, op, now, chunk_bytes, name);
  return now;
}

sim::TimeNs ag_passes(const Plan& pl, void* base, const Layout& pos, DType t, sim::TimeNs ready, size_t chunk_bytes,
                      const std::string& name) {
  sim::TimeNs now = ready;
  for (size_t i = pl.steps.size(); i-- > 0;) now = ag_pass(pl.steps[i], base, pos, t, now, chunk_bytes, name);
  return now;
}

// POS packed from 0 in position order (the scratch copy's layout).
Layout packed_from_zero(const Layout& pos) {
  Layout out;
  size_t at = 0;
  for (size_t n : pos.size) {
    out.offset.push_back(at);
    out.size.push_back(n);
    at += n;
  }
  return out;
}

}  // namespace

Layout layout(const runtime::Transport& tp, const Partition& part) {
  return layout(tp, part, dim_order(tp.topology()));
}

Layout layout(const runtime::Transport& tp, const Partition& part, const std::vector<DimRing>& order) {
  const auto& topo = tp.topology();
  Layout out;
  for (int r = 0; r < tp.size(); ++r) {
    const size_t q = position(topo, order, tp.chip_of(r));
    out.offset.push_back(part.offset(q));
    out.size.push_back(part.size(q));
  }
  return out;
}

sim::TimeNs reduce_scatter(runtime::Transport& tp, void* base, const Layout& layout, DType t, ReduceOp op,
                           sim::TimeNs ready, size_t chunk_bytes, const std::string& name) {
  const Plan pl = plan(tp, dim_order(tp.topology()));
  const Layout pos = by_position(layout, pl);
  if (packed(pos)) return rs_passes(pl, base, pos, t, op, ready, chunk_bytes, name);
  // Pack the chunks in position order, run there, and bring this rank's reduced chunk back.
  const size_t es = runtime::dtype_size(t);
  const Layout work_layout = packed_from_zero(pos);
  unsigned char* work = tp.scratch(4, layout.total() * es);
  auto* b = static_cast<unsigned char*>(base);
  for (size_t q = 0; q < pos.parts(); ++q)
    if (pos.size[q] && !tp.shape_only()) std::memcpy(work + work_layout.offset[q] * es, b + pos.offset[q] * es, pos.size[q] * es);
  const sim::TimeNs end = rs_passes(pl, work, work_layout, t, op, ready, chunk_bytes, name);
  const size_t me = static_cast<size_t>(tp.rank());
  size_t q = 0;
  while (pl.rank_at[q] != me) ++q;
  if (layout.size[me] && !tp.shape_only()) std::memcpy(b + layout.offset[me] * es, work + work_layout.offset[q] * es, layout.size[me] * es);
  return end;
}

sim::TimeNs all_gather(runtime::Transport& tp, void* base, const Layout& layout, DType t, sim::TimeNs ready,
                       size_t chunk_bytes, const std::string& name) {
  const Plan pl = plan(tp, dim_order(tp.topology()));
  const Layout pos = by_position(layout, pl);
  if (packed(pos)) return ag_passes(pl, base, pos, t, ready, chunk_bytes, name);
  // Put this rank's chunk at its position in a packed copy, gather there, and copy every chunk back.
  const size_t es = runtime::dtype_size(t);
  const Layout work_layout = packed_from_zero(pos);
  unsigned char* work = tp.scratch(4, layout.total() * es);
  auto* b = static_cast<unsigned char*>(base);
  const size_t me = static_cast<size_t>(tp.rank());
  size_t mine = 0;
  while (pl.rank_at[mine] != me) ++mine;
  if (pos.size[mine] && !tp.shape_only()) std::memcpy(work + work_layout.offset[mine] * es, b + pos.offset[mine] * es, pos.size[mine] * es);
  const sim::TimeNs end = ag_passes(pl, work, work_layout, t, ready, chunk_bytes, name);
  for (size_t q = 0; q < pos.parts(); ++q)
    if (pos.size[q] && !tp.shape_only()) std::memcpy(b + pos.offset[q] * es, work + work_layout.offset[q] * es, pos.size[q] * es);
  return end;
}

}  // namespace shardsim::collectives::torus

#include "collectives/torus.h"

#include <algorithm>

#include "collectives/ring.h"

namespace shardsim::collectives::torus {

std::string obstacle(const runtime::Transport& tp) {
  const auto& topo = tp.topology();
  if (!topo.is_grid()) return "the topology is a " + topo.kind_name() + " without dimensions (not a torus or stack)";
  if (tp.size() != topo.num_chips())
    return "the group has " + std::to_string(tp.size()) + " of the topology's " + std::to_string(topo.num_chips()) +
           " chips (a sub-group is not a torus)";
  for (int r = 0; r < tp.size(); ++r)
    if (tp.chip_of(r) != r) return "rank " + std::to_string(r) + " is on chip " + std::to_string(tp.chip_of(r)) +
                                   " (the torus algorithm needs rank r on chip r)";
  return "";
}

namespace {

struct DimStep {
  runtime::Transport* group;  // the ring along this dimension through this chip
  size_t lo, stride, k;       // rank range [lo, lo + k*stride) split into k blocks of STRIDE ranks
  bool bidirectional;
};

// The per-dimension rings this chip takes part in, outermost dimension first, with the rank blocks they split.
std::vector<DimStep> plan(runtime::Transport& tp) {
  const auto& topo = tp.topology();
  const auto& dims = topo.dims();
  const auto xyz = topo.coords(tp.chip());
  std::vector<DimStep> steps;
  size_t lo = 0, span = static_cast<size_t>(tp.size());
  for (size_t d = 0; d < dims.size(); ++d) {
    const size_t k = static_cast<size_t>(dims[d]);
    const size_t stride = span / k;
    if (k > 1) {
      auto base = xyz;
      base[d] = 0;
      runtime::Transport& g = tp.subgroup("torus.dim" + std::to_string(d), topo.chip_at(base), xyz[d]);
      const bool bidir = k > 2 && ring::bidirectional_obstacle(g).empty();
      steps.push_back({&g, lo, stride, k, bidir});
    }
    lo += static_cast<size_t>(xyz[d]) * stride;
    span = stride;
  }
  return steps;
}

// The layout of one dimension's ring: block c = the ranks [lo + c*stride, lo + (c+1)*stride).
Layout block_layout(const Layout& layout, const DimStep& s) {
  Layout out;
  for (size_t c = 0; c < s.k; ++c) {
    const size_t first = s.lo + c * s.stride, last = first + s.stride - 1;
    out.offset.push_back(layout.offset[first]);
    out.size.push_back(layout.offset[last] + layout.size[last] - layout.offset[first]);
  }
  return out;
}

}  // namespace

sim::TimeNs reduce_scatter(runtime::Transport& tp, void* base, const Layout& layout, DType t, ReduceOp op,
                           sim::TimeNs ready, size_t chunk_bytes, const std::string& name) {
  sim::TimeNs now = ready;
  const auto steps = plan(tp);
  for (size_t i = 0; i < steps.size(); ++i) {
    auto lanes = ring::make_lanes(block_layout(layout, steps[i]), runtime::dtype_size(t), steps[i].bidirectional,
                                  chunk_bytes, now);
    now = std::max(now, ring::reduce_scatter(*steps[i].group, base, lanes, t, op, name + ".dim" + std::to_string(i)));
  }
  return now;
}

sim::TimeNs all_gather(runtime::Transport& tp, void* base, const Layout& layout, DType t, sim::TimeNs ready,
                       size_t chunk_bytes, const std::string& name) {
  sim::TimeNs now = ready;
  const auto steps = plan(tp);
  for (size_t i = steps.size(); i-- > 0;) {
    auto lanes = ring::make_lanes(block_layout(layout, steps[i]), runtime::dtype_size(t), steps[i].bidirectional,
                                  chunk_bytes, now);
    now = std::max(now, ring::all_gather(*steps[i].group, base, lanes, t, name + ".dim" + std::to_string(i)));
  }
  return now;
}

}  // namespace shardsim::collectives::torus

#include "collectives/torus_concurrent.h"

#include <algorithm>
#include <cstring>

#include "collectives/torus.h"

namespace shardsim::collectives::torus_concurrent {

std::string obstacle(const runtime::Transport& tp) {
  if (std::string why = torus::obstacle(tp); !why.empty()) return why;
  if (torus::dim_order(tp.topology()).size() < 2)
    return "the topology has one dimension of size > 1 (the concurrent-dimension algorithm splits the data over "
           "two or more; torus and ring run one)";
  return "";
}

namespace {

// One part: its reduce-scatter order's plan and its elements in position order (packed).
struct Part {
  std::vector<torus::DimRing> order;
  torus::Plan plan;
  Layout pos;
  sim::TimeNs now;
};

// The parts' plans: order o_0 = dim_order(), o_j = o_0 rotated left by j.
std::vector<Part> make_parts(runtime::Transport& tp, sim::TimeNs ready) {
  const auto order = torus::dim_order(tp.topology());
  std::vector<Part> parts;
  for (size_t j = 0; j < order.size(); ++j) {
    auto o = order;
    std::rotate(o.begin(), o.begin() + static_cast<std::ptrdiff_t>(j), o.end());
    torus::Plan pl = torus::plan(tp, o);
    parts.push_back({std::move(o), std::move(pl), {}, ready});
  }
  return parts;
}

// Every part's reduce-scatter phases (RS) and / or all-gather phases (AG), phase by phase: in phase i, part j
// runs its order's i-th dimension, so the parts of one phase use distinct dimensions.
sim::TimeNs run(std::vector<Part>& parts, void* base, DType t, ReduceOp op, bool rs, bool ag, size_t chunk_bytes,
                const std::string& name) {
  const size_t phases = parts.front().plan.steps.size();
  if (rs)
    for (size_t i = 0; i < phases; ++i)
      for (auto& p : parts) p.now = torus::rs_pass(p.plan.steps[i], base, p.pos, t, op, p.now, chunk_bytes, name);
  if (ag)
    for (size_t i = phases; i-- > 0;)
      for (auto& p : parts) p.now = torus::ag_pass(p.plan.steps[i], base, p.pos, t, p.now, chunk_bytes, name);
  sim::TimeNs end = 0;
  for (const auto& p : parts) end = std::max(end, p.now);
  return end;
}

// reduce_scatter / all_gather over LAYOUT (indexed by rank): part j carries sub-piece j of every rank's chunk,
// packed in its position order into scratch; GATHER_IN: every chunk is copied in (reduce-scatter) or only this
// rank's (all-gather); the reverse copies bring back this rank's chunk or every chunk.
sim::TimeNs run_layout(runtime::Transport& tp, void* base, const Layout& layout, DType t, ReduceOp op, bool rs,
                       size_t chunk_bytes, sim::TimeNs ready, const std::string& name) {
  auto parts = make_parts(tp, ready);
  const size_t d = parts.size(), es = runtime::dtype_size(t), me = static_cast<size_t>(tp.rank());
  unsigned char* work = tp.scratch(4, layout.total() * es);
  auto* b = static_cast<unsigned char*>(base);
  struct Copy {
    size_t work, buf, n;  // elements
    size_t rank;
  };
  std::vector<Copy> copies;
  size_t at = 0;
  for (size_t j = 0; j < d; ++j) {
    auto& p = parts[j];
    for (size_t r : p.plan.rank_at) {
      const Partition sub{layout.size[r], d};
      p.pos.offset.push_back(at);
      p.pos.size.push_back(sub.size(j));
      copies.push_back({at, layout.offset[r] + sub.offset(j), sub.size(j), r});
      at += sub.size(j);
    }
  }
  const bool data = !tp.shape_only();
  auto copy = [&](bool in, bool all) {
    for (const auto& c : copies)
      if (data && c.n && (all || c.rank == me)) {
        if (in) std::memcpy(work + c.work * es, b + c.buf * es, c.n * es);
        else std::memcpy(b + c.buf * es, work + c.work * es, c.n * es);
      }
  };
  copy(/*in=*/true, /*all=*/rs);
  const sim::TimeNs end = run(parts, work, t, op, rs, !rs, chunk_bytes, name);
  copy(/*in=*/false, /*all=*/!rs);
  return end;
}

}  // namespace

sim::TimeNs all_reduce(runtime::Transport& tp, const void* sendbuf, void* recvbuf, size_t count, DType t, ReduceOp op,
                       size_t chunk_bytes, sim::TimeNs ready, const std::string& name) {
  const size_t es = runtime::dtype_size(t);
  if (sendbuf != recvbuf && count && !tp.shape_only()) std::memcpy(recvbuf, sendbuf, count * es);
  auto parts = make_parts(tp, ready);
  const Partition split{count, parts.size()};
  for (size_t j = 0; j < parts.size(); ++j) {
    // Part j's elements in its position order, shifted to its range of the buffer (packed, so in place).
    const Partition mine{split.size(j), static_cast<size_t>(tp.size())};
    Layout l = torus::by_position(torus::layout(tp, mine, parts[j].order), parts[j].plan);
    for (auto& off : l.offset) off += split.offset(j);
    parts[j].pos = std::move(l);
  }
  return run(parts, recvbuf, t, op, true, true, chunk_bytes, name);
}

sim::TimeNs reduce_scatter(runtime::Transport& tp, void* base, const Layout& layout, DType t, ReduceOp op,
                           size_t chunk_bytes, sim::TimeNs ready, const std::string& name) {
  return run_layout(tp, base, layout, t, op, true, chunk_bytes, ready, name);
}

sim::TimeNs all_gather(runtime::Transport& tp, void* base, const Layout& layout, DType t, size_t chunk_bytes,
                       sim::TimeNs ready, const std::string& name) {
  return run_layout(tp, base, layout, t, ReduceOp::sum, false, chunk_bytes, ready, name);
}

}  // namespace shardsim::collectives::torus_concurrent

#include "collectives/flat.h"

#include <stdexcept>

#include "collectives/halving_doubling.h"
#include "collectives/ring.h"
#include "collectives/torus.h"

namespace shardsim::collectives::flat {

sim::TimeNs reduce_scatter(runtime::Transport& tp, const std::string& algorithm, void* base, const Layout& layout,
                           DType t, ReduceOp op, size_t chunk_bytes, sim::TimeNs ready, const std::string& name) {
  if (algorithm == "ring" || algorithm == "bidir_ring") {
    auto lanes = ring::make_lanes(layout, runtime::dtype_size(t), algorithm == "bidir_ring", chunk_bytes, ready);
    return std::max(ready, ring::reduce_scatter(tp, base, lanes, t, op, name));
  }
  if (algorithm == "torus") return torus::reduce_scatter(tp, base, layout, t, op, ready, chunk_bytes, name);
  if (algorithm == "halving_doubling") return halving_doubling::reduce_scatter(tp, base, layout, t, op, ready, name);
  throw std::logic_error("flat::reduce_scatter: algorithm " + algorithm);
}

sim::TimeNs all_gather(runtime::Transport& tp, const std::string& algorithm, void* base, const Layout& layout,
                       DType t, size_t chunk_bytes, sim::TimeNs ready, const std::string& name) {
  if (algorithm == "ring" || algorithm == "bidir_ring") {
    auto lanes = ring::make_lanes(layout, runtime::dtype_size(t), algorithm == "bidir_ring", chunk_bytes, ready);
    return std::max(ready, ring::all_gather(tp, base, lanes, t, name));
  }
  if (algorithm == "torus") return torus::all_gather(tp, base, layout, t, ready, chunk_bytes, name);
  if (algorithm == "halving_doubling") return halving_doubling::all_gather(tp, base, layout, t, ready, name);
  throw std::logic_error("flat::all_gather: algorithm " + algorithm);
}

CollectiveResult finish(runtime::Transport& tp, const std::string& name, const std::string& algorithm,
                        const std::string& explanation, sim::Span span, double bytes, double sent_before) {
  tp.timeline().record_region(name, "collective", span, bytes);
  return {span, tp.bytes_sent() - sent_before, algorithm, explanation};
}

}  // namespace shardsim::collectives::flat

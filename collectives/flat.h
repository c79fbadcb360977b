// Internal: the reduce-scatter and all-gather phases of the "flat" algorithms (ring, bidir_ring, torus,
// halving_doubling) over any packed layout, shared by all_reduce, reduce_scatter, all_gather and all_gatherv.
#pragma once

#include <string>

#include "collectives/types.h"
#include "runtime/transport.h"

namespace shardsim::collectives::flat {

// In place on BASE: afterwards chunk r of LAYOUT on rank r holds the reduction over all ranks.
sim::TimeNs reduce_scatter(runtime::Transport& tp, const std::string& algorithm, void* base, const Layout& layout,
                           DType t, ReduceOp op, size_t chunk_bytes, sim::TimeNs ready, const std::string& name);
// In place on BASE: chunk r of LAYOUT on rank r is the input; afterwards every rank holds every chunk.
sim::TimeNs all_gather(runtime::Transport& tp, const std::string& algorithm, void* base, const Layout& layout,
                       DType t, size_t chunk_bytes, sim::TimeNs ready, const std::string& name);

// Records the op-level region on the timeline and fills a result.
CollectiveResult finish(runtime::Transport& tp, const std::string& name, const std::string& algorithm,
                        const std::string& explanation, sim::Span span, double bytes, double sent_before);

}  // namespace shardsim::collectives::flat

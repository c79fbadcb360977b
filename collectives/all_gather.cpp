#include "collectives/all_gather.h"

#include <cstring>

#include "collectives/algorithms.h"
#include "collectives/flat.h"
#include "collectives/registry.h"
#include "common/error.h"

namespace shardsim::collectives {

namespace {

CollectiveResult gather_layout(runtime::Transport& tp, Collective c, const void* sendbuf, void* recvbuf,
                               const Layout& layout, DType dtype, sim::TimeNs ready, const CollectiveOptions& o) {
  const size_t es = runtime::dtype_size(dtype);
  const double bytes = static_cast<double>(layout.total() * es);
  uint64_t sig = layout.total();
  for (size_t n : layout.size) sig = sig * 1000003u + n;  // the v-variant's counts must agree too
  const runtime::SignatureScope signature_scope(check_args(c, tp, o, sig & 0x7fffffffffffffffull, dtype, 0));
  const Choice choice = choose(c, o, tp, bytes);
  const std::string name = o.name.empty() ? collective_name(c) : o.name;
  const double sent_before = tp.bytes_sent();
  const size_t me = static_cast<size_t>(tp.rank());
  auto* mine = static_cast<unsigned char*>(recvbuf) + layout.offset[me] * es;
  if (sendbuf != mine && layout.size[me] && !tp.shape_only()) std::memmove(mine, sendbuf, layout.size[me] * es);
  const sim::TimeNs t = choice.descriptor->all_gather(tp, recvbuf, layout, dtype, o.chunk_bytes, choice.start(tp, ready, name), name);
  return flat::finish(tp, name, choice.algorithm, choice.explanation, {ready, t}, bytes, sent_before);
}

}  // namespace

CollectiveResult all_gather(runtime::Transport& tp, const void* sendbuf, void* recvbuf, size_t count, DType dtype,
                            sim::TimeNs ready, const CollectiveOptions& options) {
  return gather_layout(tp, Collective::all_gather, sendbuf, recvbuf,
                       Layout::from(Partition{count, static_cast<size_t>(tp.size())}), dtype, ready, options);
}

CollectiveResult all_gatherv(runtime::Transport& tp, const void* sendbuf, void* recvbuf,
                             const std::vector<size_t>& counts, DType dtype, sim::TimeNs ready,
                             const CollectiveOptions& options) {
  if (counts.size() != static_cast<size_t>(tp.size()))
    throw UsageError("all_gatherv: " + std::to_string(counts.size()) + " counts for " + std::to_string(tp.size()) +
                     " ranks");
  return gather_layout(tp, Collective::all_gatherv, sendbuf, recvbuf, Layout::from_counts(counts), dtype, ready,
                       options);
}

}  // namespace shardsim::collectives

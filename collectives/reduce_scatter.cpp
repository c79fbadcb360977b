#include "collectives/reduce_scatter.h"

#include <cstring>
#include <stdexcept>
#include <vector>

#include "collectives/ring.h"

namespace shardsim::collectives {

CollectiveResult reduce_scatter(runtime::Transport& tp, const void* sendbuf, void* recvbuf, size_t count,
                                DType dtype, ReduceOp op, sim::TimeNs ready, const ReduceScatterOptions& options) {
  if (options.algorithm != "ring")
    throw std::invalid_argument("reduce_scatter: unknown algorithm '" + options.algorithm + "' (known: ring)");
  const double sent_before = tp.bytes_sent();
  const size_t es = runtime::dtype_size(dtype);
  const Partition part{count, static_cast<size_t>(tp.size())};
  const size_t r = static_cast<size_t>(tp.rank());
  // Work on a copy: the input must stay intact out of place, and in place only our chunk may change.
  std::vector<unsigned char> work(count * es);
  if (count) std::memcpy(work.data(), sendbuf, count * es);
  const sim::TimeNs t = ring::reduce_scatter_inplace(tp, work.data(), count, dtype, op, ready, options.name);
  if (part.size(r)) {
    std::memmove(recvbuf, work.data() + part.offset(r) * es, part.size(r) * es);
    if (op == ReduceOp::avg) finish_avg(recvbuf, part.size(r), dtype, part.parts);
  }
  tp.timeline().record_region(options.name, "collective", {ready, t}, static_cast<double>(count * es));
  return {{ready, t}, tp.bytes_sent() - sent_before, "ring"};
}

}  // namespace shardsim::collectives

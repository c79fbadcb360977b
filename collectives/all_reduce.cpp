#include "collectives/all_reduce.h"

#include <cstring>
#include <stdexcept>

#include "collectives/ring.h"

namespace shardsim::collectives {

CollectiveResult all_reduce(runtime::Transport& tp, const void* sendbuf, void* recvbuf, size_t count, DType dtype,
                            ReduceOp op, sim::TimeNs ready, const AllReduceOptions& options) {
  if (options.algorithm != "ring")
    throw std::invalid_argument("all_reduce: unknown algorithm '" + options.algorithm + "' (known: ring)");
  const double sent_before = tp.bytes_sent();
  const size_t bytes = count * runtime::dtype_size(dtype);
  if (sendbuf != recvbuf && bytes) std::memmove(recvbuf, sendbuf, bytes);
  sim::TimeNs t = ring::reduce_scatter_inplace(tp, recvbuf, count, dtype, op, ready, options.name);
  t = ring::all_gather_inplace(tp, recvbuf, count, dtype, t, options.name);
  if (op == ReduceOp::avg) finish_avg(recvbuf, count, dtype, static_cast<size_t>(tp.size()));
  tp.timeline().record_region(options.name, "collective", {ready, t}, static_cast<double>(bytes));
  return {{ready, t}, tp.bytes_sent() - sent_before, "ring"};
}

}  // namespace shardsim::collectives

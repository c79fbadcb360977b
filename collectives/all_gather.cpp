#include "collectives/all_gather.h"

#include <cstring>
#include <stdexcept>

#include "collectives/ring.h"

namespace shardsim::collectives {

CollectiveResult all_gather(runtime::Transport& tp, const void* sendbuf, void* recvbuf, size_t count, DType dtype,
                            sim::TimeNs ready, const AllGatherOptions& options) {
  if (options.algorithm != "ring")
    throw std::invalid_argument("all_gather: unknown algorithm '" + options.algorithm + "' (known: ring)");
  const double sent_before = tp.bytes_sent();
  const size_t es = runtime::dtype_size(dtype);
  const Partition part{count, static_cast<size_t>(tp.size())};
  const size_t r = static_cast<size_t>(tp.rank());
  auto* own = static_cast<unsigned char*>(recvbuf) + part.offset(r) * es;
  if (own != sendbuf && part.size(r)) std::memmove(own, sendbuf, part.size(r) * es);
  const sim::TimeNs t = ring::all_gather_inplace(tp, recvbuf, count, dtype, ready, options.name);
  tp.timeline().record_region(options.name, "collective", {ready, t}, static_cast<double>(count * es));
  return {{ready, t}, tp.bytes_sent() - sent_before, "ring"};
}

}  // namespace shardsim::collectives

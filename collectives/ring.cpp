#include "collectives/ring.h"

#include <algorithm>
#include <vector>

namespace shardsim::collectives::ring {

namespace {
inline size_t mod(long a, long p) { return static_cast<size_t>(((a % p) + p) % p); }
}  // namespace

sim::TimeNs reduce_scatter_inplace(runtime::Transport& tp, void* work, size_t count, DType t, ReduceOp op,
                                   sim::TimeNs ready, const std::string& name) {
  const long p = tp.size(), r = tp.rank();
  if (p == 1 || count == 0) return ready;
  const size_t es = runtime::dtype_size(t);
  const Partition part{count, static_cast<size_t>(p)};
  std::vector<unsigned char> incoming(part.max_size() * es);
  auto* base = static_cast<unsigned char*>(work);
  const int next = static_cast<int>(mod(r + 1, p)), prev = static_cast<int>(mod(r - 1, p));
  sim::TimeNs t_now = ready;
  for (long s = 0; s < p - 1; ++s) {
    const size_t send_chunk = mod(r - s - 1, p), recv_chunk = mod(r - s - 2, p);
    const size_t sn = part.size(send_chunk), rn = part.size(recv_chunk);
    const sim::TimeNs arrived =
        tp.sendrecv(base + part.offset(send_chunk) * es, sn * es, next, incoming.data(), rn * es, prev, t_now,
                    name + ".reduce_scatter.step" + std::to_string(s));
    reduce_into(base + part.offset(recv_chunk) * es, incoming.data(), rn, t, op);
    t_now = std::max(t_now, arrived);
  }
  return t_now;
}

sim::TimeNs all_gather_inplace(runtime::Transport& tp, void* work, size_t count, DType t, sim::TimeNs ready,
                               const std::string& name) {
  const long p = tp.size(), r = tp.rank();
  if (p == 1 || count == 0) return ready;
  const size_t es = runtime::dtype_size(t);
  const Partition part{count, static_cast<size_t>(p)};
  auto* base = static_cast<unsigned char*>(work);
  const int next = static_cast<int>(mod(r + 1, p)), prev = static_cast<int>(mod(r - 1, p));
  sim::TimeNs t_now = ready;
  for (long s = 0; s < p - 1; ++s) {
    const size_t send_chunk = mod(r - s, p), recv_chunk = mod(r - s - 1, p);
    const sim::TimeNs arrived =
        tp.sendrecv(base + part.offset(send_chunk) * es, part.size(send_chunk) * es, next,
                    base + part.offset(recv_chunk) * es, part.size(recv_chunk) * es, prev, t_now,
                    name + ".all_gather.step" + std::to_string(s));
    t_now = std::max(t_now, arrived);
  }
  return t_now;
}

}  // namespace shardsim::collectives::ring

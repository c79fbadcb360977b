#include "collectives/send_recv.h"

#include <algorithm>

#include "collectives/flat.h"
#include "common/error.h"

namespace shardsim::collectives {

namespace {
void check_peer(const runtime::Transport& tp, int peer, const char* op) {
  if (peer < 0 || peer >= tp.size())
    throw UsageError(std::string(op) + ": peer " + std::to_string(peer) + " is outside the group of " +
                     std::to_string(tp.size()) + " ranks");
}
}  // namespace

CollectiveResult send(runtime::Transport& tp, const void* buf, size_t count, DType dtype, int peer,
                      sim::TimeNs ready, const CollectiveOptions& o) {
  check_peer(tp, peer, "send");
  const std::string name = o.name.empty() ? "send" : o.name;
  const double before = tp.bytes_sent(), bytes = static_cast<double>(count * runtime::dtype_size(dtype));
  tp.send(buf, count * runtime::dtype_size(dtype), peer, ready, name);
  return flat::finish(tp, name, "direct", "", {ready, ready}, bytes, before);
}

CollectiveResult recv(runtime::Transport& tp, void* buf, size_t count, DType dtype, int peer, sim::TimeNs ready,
                      const CollectiveOptions& o) {
  check_peer(tp, peer, "recv");
  const std::string name = o.name.empty() ? "recv" : o.name;
  const double before = tp.bytes_sent(), bytes = static_cast<double>(count * runtime::dtype_size(dtype));
  const sim::TimeNs t = std::max(ready, tp.recv(buf, count * runtime::dtype_size(dtype), peer, name));
  return flat::finish(tp, name, "direct", "", {ready, t}, bytes, before);
}

CollectiveResult barrier(runtime::Transport& tp, sim::TimeNs ready, const CollectiveOptions& o) {
  const std::string name = o.name.empty() ? "barrier" : o.name;
  const double before = tp.bytes_sent();
  const int p = tp.size(), r = tp.rank();
  sim::TimeNs t = ready;
  char dummy = 0;
  for (int dist = 1, k = 0; dist < p; dist *= 2, ++k)
    t = std::max(t, tp.sendrecv(&dummy, 0, (r + dist) % p, &dummy, 0, (r - dist + p) % p, t,
                                name + ".round" + std::to_string(k)));
  return flat::finish(tp, name, "dissemination", "", {ready, t}, 0, before);
}

}  // namespace shardsim::collectives

#include "collectives/gather.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "collectives/algorithms.h"
#include "collectives/broadcast.h"
#include "collectives/flat.h"

namespace shardsim::collectives {

namespace {

CollectiveResult rooted_direct(runtime::Transport& tp, Collective c, const void* sendbuf, void* recvbuf, size_t count,
                               DType dtype, sim::TimeNs ready, const CollectiveOptions& o) {
  const std::string cname = collective_name(c);
  const size_t es = runtime::dtype_size(dtype), block = count * es, p = static_cast<size_t>(tp.size());
  const runtime::SignatureScope signature_scope(check_args(c, tp, o, count, dtype, 0));
  check_root(tp, o.root, cname);
  const Choice choice = choose(c, o, tp, static_cast<double>(block * p));
  const std::string name = o.name.empty() ? cname : o.name;
  const double sent_before = tp.bytes_sent();
  const bool is_gather = c == Collective::gather;
  const sim::TimeNs start = choice.start(tp, ready, name);  // after the call's fixed cost (algorithms.h)
  sim::TimeNs end = start;
  if (tp.rank() == o.root) {
    auto* all = static_cast<unsigned char*>(is_gather ? recvbuf : const_cast<void*>(sendbuf));
    unsigned char* mine = all + static_cast<size_t>(o.root) * block;
    void* local = is_gather ? const_cast<void*>(sendbuf) : recvbuf;
    if (block && local != mine && !tp.shape_only()) {
      if (is_gather) std::memmove(mine, local, block);
      else std::memmove(local, mine, block);
    }
    std::vector<runtime::SendOp> sends;
    std::vector<runtime::RecvOp> recvs;
    for (size_t j = 1; j < p; ++j) {  // peers in ring order from the root, so the schedule is symmetric
      const int peer = static_cast<int>((static_cast<size_t>(o.root) + j) % p);
      unsigned char* at = all + static_cast<size_t>(peer) * block;
      if (is_gather) recvs.push_back({at, block, peer, 0});
      else sends.push_back({at, block, peer, start});
    }
    tp.exchange(sends, recvs, name);
    for (const auto& r : recvs) end = std::max(end, r.arrival);
  } else if (is_gather) {
    tp.send(sendbuf, block, o.root, start, name);
  } else {
    end = std::max(end, tp.recv(recvbuf, block, o.root, name));
  }
  return flat::finish(tp, name, choice.algorithm, choice.explanation, {ready, end}, static_cast<double>(block * p),
                      sent_before);
}

}  // namespace

CollectiveResult gather(runtime::Transport& tp, const void* sendbuf, void* recvbuf, size_t count, DType dtype,
                        sim::TimeNs ready, const CollectiveOptions& options) {
  return rooted_direct(tp, Collective::gather, sendbuf, recvbuf, count, dtype, ready, options);
}

CollectiveResult scatter(runtime::Transport& tp, const void* sendbuf, void* recvbuf, size_t count, DType dtype,
                         sim::TimeNs ready, const CollectiveOptions& options) {
  return rooted_direct(tp, Collective::scatter, sendbuf, recvbuf, count, dtype, ready, options);
}

}  // namespace shardsim::collectives

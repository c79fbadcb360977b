#include "collectives/all_to_all.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "collectives/algorithms.h"
#include "collectives/flat.h"
#include "common/error.h"

namespace shardsim::collectives {

namespace {

CollectiveResult pairwise(runtime::Transport& tp, Collective c, const unsigned char* send,
                          const std::vector<size_t>& sendcounts, const std::vector<size_t>& sdispls,
                          unsigned char* recv, const std::vector<size_t>& recvcounts,
                          const std::vector<size_t>& rdispls, DType dtype, sim::TimeNs ready,
                          const CollectiveOptions& o) {
  const int p = tp.size(), r = tp.rank();
  const size_t es = runtime::dtype_size(dtype);
  for (const auto* v : {&sendcounts, &sdispls, &recvcounts, &rdispls})
    if (v->size() != static_cast<size_t>(p))
      throw UsageError(collective_name(c) + ": " + std::to_string(v->size()) + " counts/displacements for " +
                       std::to_string(p) + " ranks");
  double bytes = 0;
  for (size_t n : sendcounts) bytes += static_cast<double>(n * es);
  // all_to_allv counts legitimately differ per rank (the header check catches sender/receiver mismatches).
  const runtime::SignatureScope signature_scope(
      check_args(c, tp, o, c == Collective::all_to_all ? static_cast<uint64_t>(sendcounts[0]) : 0, dtype, 0));
  const Choice choice = choose(c, o, tp, bytes);
  const std::string name = o.name.empty() ? collective_name(c) : o.name;
  const double sent_before = tp.bytes_sent();
  if (recvcounts[r] != sendcounts[r])
    throw UsageError(collective_name(c) + ": chip " + std::to_string(tp.chip()) + " sends itself " +
                     std::to_string(sendcounts[r]) + " elements but expects " + std::to_string(recvcounts[r]));
  if (sendcounts[r] && !tp.shape_only()) std::memmove(recv + rdispls[r] * es, send + sdispls[r] * es, sendcounts[r] * es);
  // One step of every pair (direct): rank r sends to r + 1, r + 2, ... (in that order on its ports) and
  // receives from r - 1, r - 2, ...; the global pattern (every rank to every other) lets flows of different
  // senders that cross on a link share it (crossing-flow contention, docs/MODEL.md).
  const sim::TimeNs start = choice.start(tp, ready, name);  // after the call's fixed cost (algorithms.h)
  sim::TimeNs end = start;
  std::vector<runtime::SendOp> sends;
  std::vector<runtime::RecvOp> recvs;
  sends.reserve(static_cast<size_t>(p));
  recvs.reserve(static_cast<size_t>(p));
  for (int s = 1; s < p; ++s) {
    const int dst = (r + s) % p, src = (r - s + p) % p;
    sends.push_back({send + sdispls[dst] * es, sendcounts[dst] * es, dst, start});
    recvs.push_back({recv + rdispls[src] * es, recvcounts[src] * es, src, 0});
  }
  const runtime::FlowPattern pattern = runtime::FlowPattern::all_pairs();
  tp.exchange(sends, recvs, name, &pattern);
  for (const auto& ro : recvs) end = std::max(end, ro.arrival);
  return flat::finish(tp, name, choice.algorithm, choice.explanation, {ready, end}, bytes, sent_before);
}

}  // namespace

CollectiveResult all_to_all(runtime::Transport& tp, const void* sendbuf, void* recvbuf, size_t count, DType dtype,
                            sim::TimeNs ready, const CollectiveOptions& options) {
  const size_t p = static_cast<size_t>(tp.size());
  if (count % p != 0)
    throw UsageError("all_to_all: count " + std::to_string(count) + " is not a multiple of the " + std::to_string(p) +
                     " ranks (use all_to_allv for uneven blocks)");
  const size_t block = count / p, es = runtime::dtype_size(dtype);
  std::vector<size_t> counts(p, block), displs(p);
  for (size_t j = 0; j < p; ++j) displs[j] = j * block;
  // In place: send from a copy so incoming blocks cannot overwrite blocks not yet sent.
  const void* src = sendbuf;
  if (sendbuf == recvbuf && count && !tp.shape_only()) {
    unsigned char* copy = tp.scratch(3, count * es);
    std::memcpy(copy, sendbuf, count * es);
    src = copy;
  }
  return pairwise(tp, Collective::all_to_all, static_cast<const unsigned char*>(src), counts, displs,
                  static_cast<unsigned char*>(recvbuf), counts, displs, dtype, ready, options);
}

CollectiveResult all_to_allv(runtime::Transport& tp, const void* sendbuf, const std::vector<size_t>& sendcounts,
                             const std::vector<size_t>& sdispls, void* recvbuf,
                             const std::vector<size_t>& recvcounts, const std::vector<size_t>& rdispls, DType dtype,
                             sim::TimeNs ready, const CollectiveOptions& options) {
  return pairwise(tp, Collective::all_to_allv, static_cast<const unsigned char*>(sendbuf), sendcounts, sdispls,
                  static_cast<unsigned char*>(recvbuf), recvcounts, rdispls, dtype, ready, options);
}

}  // namespace shardsim::collectives

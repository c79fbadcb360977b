#include "collectives/all_reduce.h"

#include <cstring>

#include "collectives/algorithms.h"
#include "collectives/flat.h"
#include "collectives/halving_doubling.h"
#include "collectives/ring.h"
#include "collectives/torus.h"

namespace shardsim::collectives {

CollectiveResult all_reduce(runtime::Transport& tp, const void* sendbuf, void* recvbuf, size_t count, DType dtype,
                            ReduceOp op, sim::TimeNs ready, const CollectiveOptions& options) {
  const size_t bytes = count * runtime::dtype_size(dtype);
  const runtime::SignatureScope signature_scope(
      check_args(Collective::all_reduce, tp, options, count, dtype, static_cast<int>(op)));
  const Choice choice = choose(Collective::all_reduce, options, tp, static_cast<double>(bytes));
  const std::string name = options.name.empty() ? "all_reduce" : options.name;
  const double sent_before = tp.bytes_sent();
  sim::TimeNs t = ready;
  const int p = tp.size();
  if ((choice.algorithm == "ring" || choice.algorithm == "bidir_ring") && p > 1 && sendbuf != recvbuf) {
    // Out of place on a ring: read SENDBUF directly in the reduce-scatter pass (no initial copy of S bytes).
    const Layout layout = Layout::from(Partition{count, static_cast<size_t>(p)});
    auto lanes = ring::make_lanes(layout, runtime::dtype_size(dtype), choice.algorithm == "bidir_ring",
                                  options.chunk_bytes, ready);
    t = std::max(ready, ring::reduce_scatter(tp, recvbuf, lanes, dtype, op, name, sendbuf));
    t = flat::all_gather(tp, choice.algorithm, recvbuf, layout, dtype, options.chunk_bytes, t, name);
    if (op == ReduceOp::avg) finish_avg(recvbuf, count, dtype, static_cast<size_t>(p));
    return flat::finish(tp, name, choice.algorithm, choice.explanation, {ready, t}, static_cast<double>(bytes),
                        sent_before);
  }
  if (sendbuf != recvbuf && bytes) std::memcpy(recvbuf, sendbuf, bytes);
  if (choice.algorithm == "halving_doubling") {
    t = halving_doubling::all_reduce(tp, recvbuf, count, dtype, op, ready, name);
  } else {
    // torus: chunks in the algorithm's position order, so its passes run in place (torus.h).
    const Partition part{count, static_cast<size_t>(tp.size())};
    const Layout layout = choice.algorithm == "torus" ? torus::layout(tp, part) : Layout::from(part);
    t = flat::reduce_scatter(tp, choice.algorithm, recvbuf, layout, dtype, op, options.chunk_bytes, t, name);
    t = flat::all_gather(tp, choice.algorithm, recvbuf, layout, dtype, options.chunk_bytes, t, name);
  }
  if (op == ReduceOp::avg) finish_avg(recvbuf, count, dtype, static_cast<size_t>(tp.size()));
  return flat::finish(tp, name, choice.algorithm, choice.explanation, {ready, t}, static_cast<double>(bytes),
                      sent_before);
}

}  // namespace shardsim::collectives

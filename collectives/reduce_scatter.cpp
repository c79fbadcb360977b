#include "collectives/reduce_scatter.h"

#include <cstring>

#include "collectives/algorithms.h"
#include "collectives/flat.h"
#include "collectives/registry.h"

namespace shardsim::collectives {

CollectiveResult reduce_scatter(runtime::Transport& tp, const void* sendbuf, void* recvbuf, size_t count,
                                DType dtype, ReduceOp op, sim::TimeNs ready, const CollectiveOptions& options) {
  const size_t es = runtime::dtype_size(dtype);
  const runtime::SignatureScope signature_scope(
      check_args(Collective::reduce_scatter, tp, options, count, dtype, static_cast<int>(op)));
  const Choice choice = choose(Collective::reduce_scatter, options, tp, static_cast<double>(count * es));
  const std::string name = options.name.empty() ? "reduce_scatter" : options.name;
  const double sent_before = tp.bytes_sent();
  const Partition part{count, static_cast<size_t>(tp.size())};
  const size_t me = static_cast<size_t>(tp.rank());
  // The algorithms work in place on a full-size buffer; SENDBUF stays untouched.
  unsigned char* work = tp.scratch(1, count * es);  // slot 1: the algorithms use slot 0 for receives
  const bool data = !tp.shape_only();  // shape-only: no copies, no arithmetic (runtime/transport.h)
  if (count && data) std::memcpy(work, sendbuf, count * es);
  const sim::TimeNs t = choice.descriptor->reduce_scatter(tp, work, Layout::from(part), dtype, op,
                                                       options.chunk_bytes, choice.start(tp, ready, name), name);
  if (op == ReduceOp::avg && data) finish_avg(work + part.offset(me) * es, part.size(me), dtype, part.parts);
  if (part.size(me) && data) std::memmove(recvbuf, work + part.offset(me) * es, part.size(me) * es);
  return flat::finish(tp, name, choice.algorithm, choice.explanation, {ready, t}, static_cast<double>(count * es),
                      sent_before);
}

}  // namespace shardsim::collectives

#include "collectives/all_reduce.h"

#include "collectives/algorithms.h"
#include "collectives/flat.h"
#include "collectives/registry.h"

namespace shardsim::collectives {

CollectiveResult all_reduce(runtime::Transport& tp, const void* sendbuf, void* recvbuf, size_t count, DType dtype,
                            ReduceOp op, sim::TimeNs ready, const CollectiveOptions& options) {
  const size_t bytes = count * runtime::dtype_size(dtype);
  const runtime::SignatureScope signature_scope(
      check_args(Collective::all_reduce, tp, options, count, dtype, static_cast<int>(op)));
  const Choice choice = choose(Collective::all_reduce, options, tp, static_cast<double>(bytes));
  const std::string name = options.name.empty() ? "all_reduce" : options.name;
  const double sent_before = tp.bytes_sent();
  const sim::TimeNs t =
      choice.descriptor->all_reduce(tp, sendbuf, recvbuf, count, dtype, op, options.chunk_bytes, choice.start(tp, ready, name), name);
  if (op == ReduceOp::avg && !tp.shape_only()) finish_avg(recvbuf, count, dtype, static_cast<size_t>(tp.size()));
  return flat::finish(tp, name, choice.algorithm, choice.explanation, {ready, t}, static_cast<double>(bytes),
                      sent_before);
}

}  // namespace shardsim::collectives

#include "collectives/reduce.h"

#include <cstring>

#include "collectives/algorithms.h"
#include "collectives/broadcast.h"
#include "collectives/flat.h"
#include "collectives/registry.h"

namespace shardsim::collectives {

CollectiveResult reduce(runtime::Transport& tp, const void* sendbuf, void* recvbuf, size_t count, DType dtype,
                        ReduceOp op, sim::TimeNs ready, const CollectiveOptions& options) {
  const size_t bytes = count * runtime::dtype_size(dtype);
  const runtime::SignatureScope signature_scope(
      check_args(Collective::reduce, tp, options, count, dtype, static_cast<int>(op)));
  check_root(tp, options.root, "reduce");
  const Choice choice = choose(Collective::reduce, options, tp, static_cast<double>(bytes));
  const std::string name = options.name.empty() ? "reduce" : options.name;
  const double sent_before = tp.bytes_sent();
  unsigned char* acc = tp.scratch(1, bytes);  // slot 1: the tree uses slot 2 for what children send
  const bool data = !tp.shape_only();  // shape-only: no copies, no arithmetic (runtime/transport.h)
  if (bytes && data) std::memcpy(acc, sendbuf, bytes);
  const sim::TimeNs t =
      choice.descriptor->reduce(tp, acc, count, dtype, op, options.root, options.chunk_bytes, choice.start(tp, ready, name), name);
  if (tp.rank() == options.root && data) {
    if (op == ReduceOp::avg) finish_avg(acc, count, dtype, static_cast<size_t>(tp.size()));
    if (bytes) std::memcpy(recvbuf, acc, bytes);
  }
  return flat::finish(tp, name, choice.algorithm, choice.explanation, {ready, t}, static_cast<double>(bytes),
                      sent_before);
}

}  // namespace shardsim::collectives

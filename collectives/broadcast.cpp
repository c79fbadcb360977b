#include "collectives/broadcast.h"

#include <cstring>

#include "collectives/algorithms.h"
#include "collectives/flat.h"
#include "collectives/registry.h"
#include "common/error.h"

namespace shardsim::collectives {

void check_root(const runtime::Transport& tp, int root, const std::string& op) {
  if (root < 0 || root >= tp.size())
    throw UsageError(op + ": root " + std::to_string(root) + " is outside the group of " + std::to_string(tp.size()) +
                     " ranks");
}

CollectiveResult broadcast(runtime::Transport& tp, const void* sendbuf, void* recvbuf, size_t count, DType dtype,
                           sim::TimeNs ready, const CollectiveOptions& options) {
  const size_t bytes = count * runtime::dtype_size(dtype);
  const runtime::SignatureScope signature_scope(check_args(Collective::broadcast, tp, options, count, dtype, 0));
  check_root(tp, options.root, "broadcast");
  const Choice choice = choose(Collective::broadcast, options, tp, static_cast<double>(bytes));
  const std::string name = options.name.empty() ? "broadcast" : options.name;
  const double sent_before = tp.bytes_sent();
  if (tp.rank() == options.root && sendbuf != recvbuf && bytes && !tp.shape_only()) std::memcpy(recvbuf, sendbuf, bytes);
  const sim::TimeNs t =
      choice.descriptor->broadcast(tp, recvbuf, count, dtype, options.root, options.chunk_bytes, choice.start(tp, ready, name),
                                   name);
  return flat::finish(tp, name, choice.algorithm, choice.explanation, {ready, t}, static_cast<double>(bytes),
                      sent_before);
}

}  // namespace shardsim::collectives

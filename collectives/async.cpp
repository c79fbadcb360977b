#include "collectives/async.h"

#include "collectives/all_reduce.h"

namespace shardsim::collectives {

AsyncHandle all_reduce_async(runtime::Transport& tp, const void* sendbuf, void* recvbuf, size_t count, DType dtype,
                             ReduceOp op, sim::TimeNs ready, const CollectiveOptions& options) {
  auto result = std::make_shared<CollectiveResult>();
  const std::string name = options.name.empty() ? "all_reduce" : options.name;
  runtime::AsyncOp job = tp.engine().submit(name, [=](runtime::Transport& etp) {
    *result = all_reduce(etp, sendbuf, recvbuf, count, dtype, op, ready, options);
  });
  return AsyncHandle(std::move(job), std::move(result));
}

}  // namespace shardsim::collectives

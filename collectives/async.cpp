#include "collectives/async.h"

#include "collectives/all_gather.h"
#include "collectives/all_reduce.h"
#include "collectives/all_to_all.h"
#include "collectives/broadcast.h"
#include "collectives/reduce.h"
#include "collectives/reduce_scatter.h"

namespace shardsim::collectives {

namespace {
// Submits RUN (the synchronous collective, called with the engine's transport) as one engine job named after
// OPTIONS.name or DEFAULT_NAME.
template <class Run>
AsyncHandle submit(runtime::Transport& tp, const CollectiveOptions& options, const char* default_name, Run run) {
  auto result = std::make_shared<CollectiveResult>();
  const std::string name = options.name.empty() ? default_name : options.name;
  runtime::AsyncOp job = tp.engine().submit(name, [=](runtime::Transport& etp) { *result = run(etp); });
  return AsyncHandle(std::move(job), std::move(result));
}
}  // namespace

AsyncHandle all_reduce_async(runtime::Transport& tp, const void* sendbuf, void* recvbuf, size_t count, DType dtype,
                             ReduceOp op, sim::TimeNs ready, const CollectiveOptions& options) {
  return submit(tp, options, "all_reduce", [=](runtime::Transport& etp) {
    return all_reduce(etp, sendbuf, recvbuf, count, dtype, op, ready, options);
  });
}

AsyncHandle reduce_scatter_async(runtime::Transport& tp, const void* sendbuf, void* recvbuf, size_t count,
                                 DType dtype, ReduceOp op, sim::TimeNs ready, const CollectiveOptions& options) {
  return submit(tp, options, "reduce_scatter", [=](runtime::Transport& etp) {
    return reduce_scatter(etp, sendbuf, recvbuf, count, dtype, op, ready, options);
  });
}

AsyncHandle all_gather_async(runtime::Transport& tp, const void* sendbuf, void* recvbuf, size_t count, DType dtype,
                             sim::TimeNs ready, const CollectiveOptions& options) {
  return submit(tp, options, "all_gather", [=](runtime::Transport& etp) {
    return all_gather(etp, sendbuf, recvbuf, count, dtype, ready, options);
  });
}

AsyncHandle broadcast_async(runtime::Transport& tp, const void* sendbuf, void* recvbuf, size_t count, DType dtype,
                            sim::TimeNs ready, const CollectiveOptions& options) {
  return submit(tp, options, "broadcast", [=](runtime::Transport& etp) {
    return broadcast(etp, sendbuf, recvbuf, count, dtype, ready, options);
  });
}

AsyncHandle reduce_async(runtime::Transport& tp, const void* sendbuf, void* recvbuf, size_t count, DType dtype,
                         ReduceOp op, sim::TimeNs ready, const CollectiveOptions& options) {
  return submit(tp, options, "reduce", [=](runtime::Transport& etp) {
    return reduce(etp, sendbuf, recvbuf, count, dtype, op, ready, options);
  });
}

AsyncHandle all_to_all_async(runtime::Transport& tp, const void* sendbuf, void* recvbuf, size_t count, DType dtype,
                             sim::TimeNs ready, const CollectiveOptions& options) {
  return submit(tp, options, "all_to_all", [=](runtime::Transport& etp) {
    return all_to_all(etp, sendbuf, recvbuf, count, dtype, ready, options);
  });
}

}  // namespace shardsim::collectives

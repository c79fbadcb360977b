#include "verification/reference.h"

#include <cstring>
#include <stdexcept>

namespace shardsim::verification::reference {

using namespace collectives;  // the collectives this room calibrates / verifies

Buffer all_reduce(const std::vector<Buffer>& inputs, size_t count, DType dtype, ReduceOp op) {
  if (inputs.empty()) throw std::invalid_argument("reference::all_reduce: no inputs");
  const size_t bytes = count * runtime::dtype_size(dtype);
  Buffer acc(inputs[0].begin(), inputs[0].begin() + static_cast<long>(bytes));
  for (size_t r = 1; r < inputs.size(); ++r) reduce_into(acc.data(), inputs[r].data(), count, dtype, op);
  if (op == ReduceOp::avg) finish_avg(acc.data(), count, dtype, inputs.size());
  return acc;
}

Buffer reduce_scatter(const std::vector<Buffer>& inputs, size_t count, DType dtype, ReduceOp op, size_t rank) {
  const Buffer full = all_reduce(inputs, count, dtype, op);
  const Partition part{count, inputs.size()};
  const size_t es = runtime::dtype_size(dtype);
  return Buffer(full.begin() + static_cast<long>(part.offset(rank) * es),
                full.begin() + static_cast<long>((part.offset(rank) + part.size(rank)) * es));
}

Buffer all_gather(const std::vector<Buffer>& chunks, size_t count, DType dtype) {
  const Partition part{count, chunks.size()};
  const size_t es = runtime::dtype_size(dtype);
  Buffer out(count * es);
  for (size_t r = 0; r < chunks.size(); ++r) {
    if (chunks[r].size() != part.size(r) * es) throw std::invalid_argument("reference::all_gather: chunk size");
    if (!chunks[r].empty()) std::memcpy(out.data() + part.offset(r) * es, chunks[r].data(), chunks[r].size());
  }
  return out;
}

}  // namespace shardsim::verification::reference

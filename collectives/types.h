// Shared vocabulary of the collectives: reduction ops, results, the partition of a buffer over ranks.
#pragma once

#include <cstddef>
#include <string>

#include "runtime/dtype.h"
#include "sim/timeline.h"

namespace shardsim::collectives {

using runtime::DType;

// Reduction ops as NCCL names them. avg = sum / number of ranks (applied once, at the end).
enum class ReduceOp { sum, prod, min, max, avg };
std::string reduce_op_name(ReduceOp op);
ReduceOp parse_reduce_op(const std::string& name);  // std::invalid_argument on unknown names

// What one collective call did on this chip.
struct CollectiveResult {
  sim::Span span;          // simulated: from the time the inputs were ready to the time the output is
  double bytes_sent = 0;   // bytes this chip injected into links
  std::string algorithm;   // e.g. "ring"
};

// Contiguous split of COUNT elements over PARTS ranks: the first COUNT % PARTS ranks get one extra element.
// Handles COUNT < PARTS (some ranks get 0). This is the layout of reduce_scatter output / all_gather input.
struct Partition {
  size_t count;
  size_t parts;
  size_t size(size_t i) const { return count / parts + (i < count % parts ? 1 : 0); }
  size_t offset(size_t i) const { return i * (count / parts) + (i < count % parts ? i : count % parts); }
  size_t max_size() const { return count / parts + (count % parts ? 1 : 0); }
};

// ACC[i] = ACC[i] op IN[i] for i < N, computed in fp32 for bf16 (rounded once per call; NCCL does the same
// per reduction step) and in the element type for fp32. avg reduces as sum; finish_avg divides afterwards.
void reduce_into(void* acc, const void* in, size_t n, DType t, ReduceOp op);
void finish_avg(void* buf, size_t n, DType t, size_t ranks);

}  // namespace shardsim::collectives

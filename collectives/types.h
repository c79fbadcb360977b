// Shared vocabulary of the collectives: reduction ops, options, results, how a buffer is split over ranks.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "runtime/dtype.h"
#include "sim/timeline.h"

namespace shardsim::collectives {

using runtime::DType;

// Reduction ops as NCCL names them (ncclRedOp_t). avg = sum, then divided by the number of ranks once at the
// end (integers: truncating division of the wrapped sum; floats: one rounding).
enum class ReduceOp { sum, prod, min, max, avg };
std::string reduce_op_name(ReduceOp op);
ReduceOp parse_reduce_op(const std::string& name);  // std::invalid_argument on unknown names
const std::vector<ReduceOp>& all_reduce_ops();

// Options every collective takes (Gloo style: a struct with defaults next to a free function).
struct CollectiveOptions {
  // Algorithm name; "auto" picks the lowest estimated simulated time (see algorithms.h). Each collective's
  // header lists the names it accepts; an unknown or inapplicable one is a UsageError (exit 2) saying why.
  std::string algorithm = "auto";
  // Pipelining: each ring step's chunk is cut into pieces of at most this many bytes that travel (and are
  // reduced) independently, so a piece can move on while the next one is still in flight. 0 = no pipelining.
  size_t chunk_bytes = 0;
  int root = 0;       // broadcast, reduce, gather, scatter: the root's rank in this transport
  // Before moving data, all ranks compare their arguments (collective, count, dtype, op, root, algorithm) in one
  // small all-reduce the first time this signature is used on the communicator (host time only, never
  // simulated); a mismatch, which would otherwise hang or corrupt data as it does in NCCL, becomes an AgreedError
  // (exit 2) on every rank naming the chips that disagree. Later calls with an agreed signature skip the round:
  // message headers carry the signature and a receiver seeing another one raises UsageError (exit 2).
  bool check_args = true;
  std::string name;   // event-name prefix on the timeline; empty = the collective's name
};

// What one collective call did on this chip.
struct CollectiveResult {
  sim::Span span;          // simulated: from the time the inputs were ready to the time the output is here
  double bytes_sent = 0;   // bytes this chip injected into links
  std::string algorithm;   // the algorithm that ran, e.g. "ring" (what "auto" resolved to)
  std::string explanation; // why "auto" chose it (every candidate's estimate); empty when forced
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

// Where each rank's chunk lives in a buffer (element offsets and sizes); chunks need not be equal or adjacent.
struct Layout {
  std::vector<size_t> offset;
  std::vector<size_t> size;
  static Layout from(const Partition& p);
  static Layout from_counts(const std::vector<size_t>& counts);  // packed one after another
  size_t parts() const { return size.size(); }
  size_t max_size() const;
  size_t total() const;  // sum of sizes
};

// ACC[i] = ACC[i] op IN[i] for i < N. Integers wrap modulo 2^bits (sum, prod); fp32/fp64 compute in their own
// type; fp16, bf16 and fp8 compute in fp32 and round once per call (NCCL does the same per reduction step).
// avg reduces as sum; finish_avg divides afterwards.
// Special values (floating types) propagate the same through every algorithm, because each op below is
// commutative (bit for bit, except that NaN results may differ in payload and sign): sum/prod follow IEEE 754 (NaN in, NaN out; Inf + -Inf = NaN; 0 * Inf = NaN);
// min/max are IEEE 754-2019 minimum/maximum: NaN if either operand is NaN, and -0 < +0. fp8 results that
// overflow saturate to the largest finite value (runtime/dtype.h), fp16/bf16 overflow to infinity.
void reduce_into(void* acc, const void* in, size_t n, DType t, ReduceOp op);
// OUT[i] = A[i] op B[i] with the same arithmetic (OUT may be A).
void reduce_to(void* out, const void* a, const void* b, size_t n, DType t, ReduceOp op);
void finish_avg(void* buf, size_t n, DType t, size_t ranks);

}  // namespace shardsim::collectives

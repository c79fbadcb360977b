// Single-device references for the collectives: what one chip holding every rank's buffer would compute.
//
// INPUTS[r] is rank r's buffer (COUNT elements of DTYPE, raw bytes). The reduction runs rank 0, 1, ..., p-1
// in order with the same per-element arithmetic as the distributed version (fp32, or fp32 then rounded for bf16).
// With "verifiable" inputs (integers small enough that every partial sum is exact in the dtype) the
// distributed result must equal this bit for bit, whatever order the algorithm reduced in.
#pragma once

#include <vector>

#include "collectives/types.h"

namespace shardsim::verification::reference {

using collectives::ReduceOp;
using runtime::DType;

using Buffer = std::vector<unsigned char>;

Buffer all_reduce(const std::vector<Buffer>& inputs, size_t count, DType dtype, ReduceOp op);
// Chunk RANK of the all_reduce result under Partition{COUNT, p}.
Buffer reduce_scatter(const std::vector<Buffer>& inputs, size_t count, DType dtype, ReduceOp op, size_t rank);
// CHUNKS[r] holds Partition{COUNT, p}.size(r) elements; the result is their concatenation.
Buffer all_gather(const std::vector<Buffer>& chunks, size_t count, DType dtype);

}  // namespace shardsim::verification::reference

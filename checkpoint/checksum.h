// Internal to checkpoint/: the per-tensor checksum (its definition is in checkpoint.h) over raw memory.
#pragma once

#include <cstdint>

#include "runtime/tensor.h"

namespace shardsim::checkpoint::detail {

// The text stored in the root attribute checksum_algorithm.
extern const char* const kChecksumDefinition;

// checksum_block over raw memory: BLOCK_SHAPE elements of DT at DATA, the block's first element at OFF of a
// tensor of shape G.
uint64_t checksum_raw(const void* data, runtime::DType dt, const runtime::Shape& block_shape,
                      const runtime::Shape& off, const runtime::Shape& g);

}  // namespace shardsim::checkpoint::detail

// Gathering a sharded activation's rows on rank 0 for validation against the single-device model (run's block and
// MLP stacks, models/transformer.h).
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/tensor.h"
#include "runtime/world.h"

namespace shardsim::sharding {

// Rank 0's copy of every owner chip's rows: ROWS (global row ids, as doubles) in chip order and their values VALS
// [total, hidden] fp32; other ranks get nothing. TOTAL = rows gathered.
struct GatheredRows {
  int total = 0;
  std::vector<double> rows;
  std::vector<float> vals;
};
// Collective over WORLD: each chip passes OWNER (whether its rows count: replicas pass false), its global row ids
// ROWS and OUT [rows, HIDDEN]. One chip per rank: MPI_Gather(v) to rank 0; several chips per rank (every chip the
// same row count): one fixed-size allgather through the chip router carrying [owner flag, row ids, values].
GatheredRows gather_owner_rows(const runtime::World& world, bool owner, const std::vector<int64_t>& rows,
                               const runtime::Tensor& out, int64_t hidden);

}  // namespace shardsim::sharding

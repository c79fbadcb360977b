#include "models/init.h"

#include <Random123/philox.h>

#include <stdexcept>

namespace shardsim::models {

void fill_uniform_block(runtime::Tensor& out, const InitSpec& spec, int64_t global_cols, int64_t row0, int64_t col0) {
  if (out.rank() != 2) throw std::invalid_argument("fill_uniform_block: tensor must be 2-D");
  const int64_t rows = out.dim(0), cols = out.dim(1);
  if (col0 + cols > global_cols) throw std::invalid_argument("fill_uniform_block: block outside the global tensor");
  r123::Philox4x32 gen;
  const r123::Philox4x32::key_type key = {{static_cast<uint32_t>(spec.seed), static_cast<uint32_t>(spec.seed >> 32)}};
  r123::Philox4x32::ctr_type ctr = {{0, 0, spec.tensor_id, 0}};
  r123::Philox4x32::ctr_type block{};
  uint64_t cached = ~uint64_t{0};
  const float scale = (spec.hi - spec.lo) * (1.0f / 16777216.0f);
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      const auto k = static_cast<uint64_t>((row0 + i) * global_cols + col0 + j);
      const uint64_t b = k >> 2;
      if (b != cached) {
        ctr[0] = static_cast<uint32_t>(b);
        ctr[1] = static_cast<uint32_t>(b >> 32);
        block = gen(ctr, key);
        cached = b;
      }
      const uint32_t u = block[k & 3];
      out.set(i * cols + j, spec.lo + scale * static_cast<float>(u >> 8));
    }
  }
}

}  // namespace shardsim::models

#include "models/lm_data.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "models/init.h"

namespace shardsim::models {

int64_t lm_pattern_next(int64_t token, int64_t vocab) { return (5 * token + 3) % vocab; }

LmBatch lm_synthetic_batch(const LmConfig& c, uint64_t data_seed, int64_t step) {
  check_lm_config(c);
  if (step < 0) throw std::invalid_argument("lm data: step must be >= 0, got " + std::to_string(step));
  // First tokens of this step's sequences: rows [step·batch, step·batch + batch) of a [*, 1] uniform tensor.
  runtime::Tensor first(runtime::DType::fp32, {c.batch, 1});
  sharding::fill_uniform_block(first, {data_seed, kLmDataTensorId, 0.0f, static_cast<float>(c.vocab)}, 1,
                               step * c.batch, 0);
  LmBatch b;
  for (int64_t s = 0; s < c.batch; ++s) {
    int64_t t = std::clamp<int64_t>(static_cast<int64_t>(std::floor(first.f32()[s])), 0, c.vocab - 1);
    for (int64_t i = 0; i < c.seq; ++i) {
      b.inputs.push_back(t);
      t = lm_pattern_next(t, c.vocab);
      b.targets.push_back(t);
    }
  }
  return b;
}

}  // namespace shardsim::models

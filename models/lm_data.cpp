#include "models/lm_data.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "models/init.h"

namespace shardsim::models {

int64_t lm_pattern_next(int64_t token, int64_t vocab) { return (5 * token + 3) % vocab; }

void lm_synthetic_activations(const ModelSpec& c, uint64_t data_seed, int64_t step, int64_t row0,
                              runtime::Tensor& input, runtime::Tensor& target) {
  if (step < 0 || row0 < 0 || input.rank() != 2 || input.dim(1) != c.hidden || input.shape() != target.shape() ||
      row0 + input.dim(0) > c.batch * c.seq || input.dtype() != runtime::DType::fp32 ||
      target.dtype() != runtime::DType::fp32)
    throw std::invalid_argument("lm data: rows " + std::to_string(row0) + ".. of step " + std::to_string(step) +
                                " into " + runtime::shape_str(input.shape()) + " (fp32 [rows, hidden] needed)");
  const int64_t first = step * c.batch * c.seq + row0;  // the data position of the first row
  models::fill_uniform_block(input, {data_seed, kLmInputTensorId, -1.0f, 1.0f}, c.hidden, first, 0);
  models::fill_uniform_block(target, {data_seed, kLmTargetTensorId, -1.0f, 1.0f}, c.hidden, first, 0);
}

LmBatch lm_synthetic_batch(const ModelSpec& c, uint64_t data_seed, int64_t step) {
  check_lm_config(c);
  if (step < 0) throw std::invalid_argument("lm data: step must be >= 0, got " + std::to_string(step));
  if (c.vocab == 0) {  // a block stack: activations in, a regression target out
    LmBatch b;
    b.input = runtime::Tensor(runtime::DType::fp32, {c.batch * c.seq, c.hidden});
    b.target = runtime::Tensor(runtime::DType::fp32, {c.batch * c.seq, c.hidden});
    lm_synthetic_activations(c, data_seed, step, 0, b.input, b.target);
    return b;
  }
  // First tokens of this step's sequences: rows [step·batch, step·batch + batch) of a [*, 1] uniform tensor.
  runtime::Tensor first(runtime::DType::fp32, {c.batch, 1});
  models::fill_uniform_block(first, {data_seed, kLmDataTensorId, 0.0f, static_cast<float>(c.vocab)}, 1,
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

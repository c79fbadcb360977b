// Synthetic training data for the reference language model: token sequences with a learnable pattern, from the
// seeded Philox generator (models/init.h), so any step's batch can be made without making the ones before it.
//
// Sequence number s (= step · batch + b: the data position) starts with one token drawn uniformly from
// [0, vocab) (Philox element (s, 0) of tensor id kLmDataTensorId under the data seed); every later token is
//     t_i = (5 · t_{i−1} + 3) mod vocab
// an affine map, a permutation of the vocabulary whenever vocab is not divisible by 5. The first target of each
// sequence is predictable and so is every one after it; a model that has learned the map reaches a loss near 0,
// against log(vocab) for uniform guessing.
#pragma once

#include <cstdint>

#include "models/lm_model.h"

namespace shardsim::models {

constexpr uint32_t kLmDataTensorId = 0x10da7a;

// The batch of training step STEP (0-based) of the config's shape.
LmBatch lm_synthetic_batch(const LmConfig& c, uint64_t data_seed, int64_t step);

// The pattern's next token (exposed for the test that checks the generator).
int64_t lm_pattern_next(int64_t token, int64_t vocab);

}  // namespace shardsim::models

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
constexpr uint32_t kLmInputTensorId = 0x10da7b, kLmTargetTensorId = 0x10da7c;

// The batch of training step STEP (0-based) of the config's shape. Without a vocabulary (vocab 0, a block stack):
// the input and target activations instead, see lm_synthetic_activations.
LmBatch lm_synthetic_batch(const ModelSpec& c, uint64_t data_seed, int64_t step);

// Vocab 0: rows [ROW0, ROW0 + rows) of step STEP's input and target activations (fp32 [rows, hidden], filled):
// uniform in [-1, 1), Philox elements (data position, column) of tensor ids kLmInputTensorId / kLmTargetTensorId
// under the data seed, where the data position of row r is step · batch · seq + r; so a chip makes only its rows
// and every plan sees the same data. std::invalid_argument for rows outside the step's batch or a wrong shape.
void lm_synthetic_activations(const ModelSpec& c, uint64_t data_seed, int64_t step, int64_t row0,
                              runtime::Tensor& input, runtime::Tensor& target);

// The pattern's next token (exposed for the test that checks the generator).
int64_t lm_pattern_next(int64_t token, int64_t vocab);

}  // namespace shardsim::models

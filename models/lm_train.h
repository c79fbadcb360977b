// The single-device training loop of the reference language model: forward, backward, global-norm clipping and
// AdamW with fp32 master weights (kernels/optimizer.h). With ModelSpec::dtype = bf16 the forward and backward run
// on a bf16 compute copy of the weights with bf16 activations and gradients, and AdamW updates the fp32 masters
// and refreshes the copy (mixed precision, Micikevicius et al. 2018): 4 + 4 + 4 bytes of master and moments plus
// 2 + 2 of copy and gradient = 16 per parameter, as in ZeRO's accounting; fp32 holds 4 + 4 + 4 + 4 = 16 as well.
// Deterministic: two runs of the same config give bit-identical losses and weights.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "kernels/optimizer.h"
#include "models/lm_model.h"
#include "sharding/model_spec.h"

namespace shardsim::models {

// The train: section's settings (steps, AdamW, clipping, data seed): sharding/model_spec.h's TrainSpec.
using LmTrainConfig = sharding::TrainSpec;

struct LmStepResult {
  int64_t step = 0;          // 1-based
  double loss = 0;           // mean loss of the step's batch, before the update
  double grad_norm = 0;      // global gradient norm before clipping
  double clip = 1;           // the coefficient applied
  double flops = 0;          // sum of the kernels' FLOPs (forward + backward + optimizer)
  std::vector<kernels::KernelCost> costs;  // every kernel the step ran, in order
};

struct LmTrainState {
  LmWeights weights;     // fp32 master weights
  LmWeights m, v;        // AdamW moments, fp32
  int64_t step = 0;      // updates done
  LmWeights compute;     // bf16 compute copy (refreshed by every AdamW step); empty for fp32, which computes on
                         // the masters
  const LmWeights& compute_weights() const { return compute.layers.empty() && compute.embed.numel() == 0 ? weights : compute; }
};

LmTrainState lm_train_init(const ModelSpec& c);

// Runs CONFIG.steps steps from STATE, calling ON_STEP (if set) after each. Returns each step's result.
// std::runtime_error when a gradient norm is not finite (the step is not applied).
std::vector<LmStepResult> lm_train(const ModelSpec& c, const LmTrainConfig& t, LmTrainState& state,
                                   const std::function<void(const LmStepResult&)>& on_step = {});

}  // namespace shardsim::models

#include "models/lm_train.h"

#include <cmath>
#include <sstream>
#include <stdexcept>

#include "models/lm_data.h"

namespace shardsim::models {

LmTrainState lm_train_init(const ModelSpec& c) {
  LmTrainState st{lm_init(c), lm_zeros(c, runtime::DType::fp32), lm_zeros(c, runtime::DType::fp32), 0, {}};
  if (c.dtype != runtime::DType::fp32) st.compute = lm_compute_copy(c, st.weights);
  return st;
}

std::vector<LmStepResult> lm_train(const ModelSpec& c, const LmTrainConfig& t, LmTrainState& st,
                                   const std::function<void(const LmStepResult&)>& on_step) {
  std::vector<LmStepResult> results;
  LmWeights grads = lm_zeros(c, c.dtype);
  const bool copy = c.dtype != runtime::DType::fp32;
  for (int64_t i = 0; i < t.steps; ++i) {
    LmStepResult r;
    r.step = st.step + 1;
    const LmBatch batch = lm_synthetic_batch(c, t.data_seed, st.step);
    LmCache cache;
    r.loss = lm_forward(c, st.compute_weights(), batch, &cache, &r.costs);
    lm_backward(c, st.compute_weights(), batch, cache, grads, &r.costs);
    // One chip holds every weight whole: no axis replicates anything, so every term is counted.
    std::vector<kernels::GradNormTerm> terms;
    for (auto& [name, g] : grads.named_weights()) terms.push_back({g, {}});
    r.grad_norm = std::sqrt(kernels::grad_sq_norm_local(terms));
    if (!std::isfinite(r.grad_norm)) {
      std::ostringstream msg;
      msg << "lm training: gradient norm is " << r.grad_norm << " at step " << r.step << " (loss " << r.loss
          << "); the step was not applied";
      throw std::runtime_error(msg.str());
    }
    r.clip = t.max_grad_norm > 0 ? kernels::clip_coefficient(r.grad_norm, t.max_grad_norm) : 1.0;
    auto ws = st.weights.named_weights();
    auto ms = st.m.named_weights();
    auto vs = st.v.named_weights();
    auto gs = grads.named_weights();
    auto cs = st.compute.named_weights();
    for (size_t k = 0; k < ws.size(); ++k)
      r.costs.push_back(kernels::adamw_step(*ws[k].second, *ms[k].second, *vs[k].second, *gs[k].second, r.step,
                                            t.adamw, static_cast<float>(r.clip), copy ? cs[k].second : nullptr));
    // Auxiliary-loss-free balancing: each MoE layer's selection bias from the step's tokens per expert.
    if (c.moe && c.moe->bias_update > 0)
      for (int64_t l = 0; l < c.layers; ++l) {
        if (!c.moe_layer(l)) continue;
        const std::vector<int64_t>& load = cache.layers[size_t(l)].moe_ref.routing.counts;
        kernels::update_expert_bias(st.weights.layers[size_t(l)].moe.bias, load, c.moe->bias_update);
        if (copy) st.compute.layers[size_t(l)].moe.bias = st.weights.layers[size_t(l)].moe.bias;
      }
    st.step = r.step;
    for (const auto& k : r.costs) r.flops += k.flops;
    if (on_step) on_step(r);
    results.push_back(std::move(r));
  }
  return results;
}

}  // namespace shardsim::models

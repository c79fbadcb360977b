#include "models/lm_activations.h"

#include <stdexcept>

namespace shardsim::models {

const char* recompute_name(Recompute r) {
  switch (r) {
    case Recompute::none: return "none";
    case Recompute::selective: return "selective";
    case Recompute::full: return "full";
  }
  return "?";
}

std::vector<ActivationTerm> lm_layer_activation_terms(const ModelSpec& c, int64_t micro_batch,
                                                      const ActivationScheme& s) {
  if (s.tp < 1 || micro_batch < 1 || s.element_bytes <= 0)
    throw std::invalid_argument("lm_layer_activation_terms: tp, micro_batch and element_bytes must be positive");
  const double t = s.tp, e = s.element_bytes, sb = double(c.seq) * double(micro_batch), h = double(c.hidden);
  const double a = double(c.heads), qd = a * double(c.head_dim), kvd = double(c.kv_heads) * double(c.head_dim);
  const double seq_split = s.sp ? t : 1.0;  // what sequence parallelism shards
  std::vector<ActivationTerm> out;
  auto add = [&out](const char* name, double bytes) { out.push_back({name, bytes}); };
  add("layer input (norm 1 input)", e * sb * h / seq_split);
  if (s.recompute == Recompute::full) return out;
  add("norm 1 output (QKV input)", e * sb * h / seq_split);
  add("q", e * sb * qd / t);
  add("k", e * sb * kvd / t);
  add("v", e * sb * kvd / t);
  if (!s.megatron_core) {
    add("attention log-sum-exp (fp32)", 4.0 * a * sb / t);
  } else if (s.recompute == Recompute::none) {
    const double s2 = a * double(c.seq) * sb / t;  // a·s²·b / t elements
    add("softmax output", e * s2);
    add("softmax dropout mask", s2);
    add("softmax dropout output", e * s2);
  }
  add("projection input", e * sb * qd / t);
  if (s.megatron_core) add("attention dropout mask", sb * h / seq_split);
  add("norm 2 input", e * sb * h / seq_split);
  add("norm 2 output (MLP input)", e * sb * h / seq_split);
  const double f = e * sb * double(c.ffn) / t;
  if (c.gated()) {
    add("MLP gate", f);
    add("MLP up", f);
    add("MLP activation output", f);
  } else {
    add("GELU input", f);
    add("GELU output", f);
  }
  if (s.megatron_core) add("MLP dropout mask", sb * h / seq_split);
  return out;
}

double lm_layer_activation_bytes(const ModelSpec& c, int64_t micro_batch, const ActivationScheme& s) {
  double b = 0;
  for (const auto& term : lm_layer_activation_terms(c, micro_batch, s)) b += term.bytes;
  return b;
}

}  // namespace shardsim::models

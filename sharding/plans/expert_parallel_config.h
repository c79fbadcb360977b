// The model.moe section: a mixture-of-experts MLP in every layer after the first dense_layers (docs/CONFIG.md,
// "model.moe"; docs/MOE.md). Parsed here so the one model parser (sharding/model_spec.cpp) and the plan registry's
// ep unit take it with one call each.
//
//   model:
//     mlp: swiglu                 # the experts' MLP kind (swiglu | geglu | gelu), as the dense MLP's
//     moe:
//       experts: 8                # E routed experts
//       top_k: 2
//       expert_ffn: 14336         # every expert's inner size, or a list of E sizes (fine-grained experts)
//       shared_experts: 0         # shared experts always applied, each of inner size expert_ffn[0] ...
//       shared_ffn: 0             # ... or their total inner size given directly (wins when > 0)
//       router: softmax           # softmax | sigmoid
//       normalize: true           # normalise the k weights to sum 1
//       scale: 1.0                # routed scaling factor (DeepSeek-V3: 2.5)
//       bias_update: 0            # aux-loss-free balancing step gamma (DeepSeek-V3: 0.001); 0 = no selection bias
//       capacity_factor: 0        # 0 = dropless; > 0: capacity per expert and ep rank's tokens
//       drop_policy: probs        # probs | position
//       aux_loss_coef: 0          # Switch's alpha (1e-2 there; Megatron-Core's default 0)
//       dense_layers: 0           # the first n layers keep the dense MLP (model.ffn; DeepSeek first_k_dense_replace)
//       layer_step: 1             # layer i (0-based) is MoE when (i + 1) % layer_step == 0 (Qwen2-MoE's
//                                 # decoder_sparse_step, Llama 4's interleave_moe_layer_step), after dense_layers
//       routing: uniform          # shape-only runs: uniform | zipf | histogram (the declared distribution)
//       skew: 1.0                 # zipf exponent
//       routing_seed: 1           # which experts zipf makes popular
//       routing_file: experts.csv # routing: histogram: a CSV "layer,expert,tokens" (layer: index or all), e.g.
//                                 # tokens per expert measured in a real run (relative: to the config's folder)
//       expert_groups: 1          # node-limited routing (DeepSeek-V3 n_group): experts in this many groups of
//       group_limit: 0            # consecutive ids; each token's top_k among its group_limit best groups (0: off)
//       group_top: 0              # group score = sum of its group_top best keys (0: top_k / group_limit)
//       placement: contiguous     # contiguous | balanced (experts placed over ep by the declared load)
// Errors: ConfigError "FILE:LINE: model.moe.KEY: ..." (exit 2) for an unknown key, a value out of its bound, a
// list of expert_ffn whose length is not experts, top_k above experts, dense_layers above the model's layers.
#pragma once

#include <string_view>

#include "common/config.h"
#include "kernels/moe_mlp.h"
#include "sharding/model_spec.h"
#include "sharding/plans/registry.h"

namespace shardsim::sharding::plans {

inline constexpr std::string_view kMoeKeys[] = {
    "experts",      "top_k",           "expert_ffn",  "shared_experts", "shared_ffn",    "router",
    "normalize",    "scale",           "bias_update", "capacity_factor", "drop_policy",  "aux_loss_coef",
    "dense_layers", "layer_step",      "routing",     "skew",            "routing_seed",  "expert_groups",
    "group_limit",  "group_top",       "placement",   "routing_file"};

// Bounds (docs/CONFIG.md).
struct MoeBounds {
  static constexpr int64_t experts = 1 << 16;
  static constexpr int64_t ffn = 1 << 24;
};

// The layer config (kernels::MoeConfig, kernels/moe_mlp.h, so that ModelSpec can hold one without including
// this header). MOE: the model's moe: node; MODEL: the rest of the model (hidden, layers, mlp, dtype) already parsed.
kernels::MoeConfig parse_moe_config(const ConfigNode& moe, const ModelSpec& model);

// "moe 8 experts top-2 (expert ffn 14336, swiglu, softmax router, dropless)" for the report's model line.
std::string moe_text(const kernels::MoeConfig& c);

// The ep plan's divisibility rule: "" when EXPERTS split over EP, else the message (for parallel.ep).
std::string ep_obstacle(int64_t experts, int ep);

// The single-device reference's capacity pieces (kernels::CapacityOptions::split and order) for a plan that splits
// each sequence over chips: every chip drops over its own rows (Megatron-Core computes the capacity from a rank's
// local tokens), so each reference group of SEQS sequences of SEQ tokens is cut into the rows of its CP x SP_TP
// chips in their own order: cp rank c holds token_layout(SEQ, SEQS, CP, c, ZIGZAG)'s rows (sharding/plans/block.h;
// Ulysses: ZIGZAG false), and with sp (SP_TP > 1) tp rank r the r-th of SP_TP equal slices of them. Dropless, or
// CP = SP_TP = 1: C is left as it is. Throws std::invalid_argument when the rows do not split evenly.
void split_capacity_over_chips(kernels::CapacityOptions& c, int64_t seq, int64_t seqs, int cp, bool zigzag, int sp_tp);

// The plan registry's descriptors of the ep unit (parallel.ep: the mesh's ep axis) and the etp unit
// (parallel.etp: 1 or tp), registered by registry.cpp. Rules: ep and etp need model.moe; ep divides the experts;
// etp is 1 or tp and divides every expert's (and the shared experts') inner size.
PlanDescriptor ep_plan_descriptor();
PlanDescriptor etp_plan_descriptor();

}  // namespace shardsim::sharding::plans

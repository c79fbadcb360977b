// The mixture-of-experts MLP on one chip, forward and backward: the single-device reference, and the pieces an
// expert-parallel plan (sharding/plans/expert_parallel.h) composes around its token exchange.
//
//   logits = x · W_router                      [T, E]      (gemm, the model's dtype)
//   routing = route + capacity (kernels/moe.h)             (top-k experts and weights per token, dropped slots)
//   aux = aux_loss(routing)                                (reported; its gradient enters the router's)
//   xp = permute(x)                            [N, h]      (the kept assignments, expert-major)
//   yp[rows of e] = expert_e(xp[rows of e])                (grouped GEMMs: gate/up, GLU or GELU, down)
//   y = unpermute(yp, weights) + shared(x)     [T, h]      (shared experts: one dense MLP always applied)
// expert_e(z) = (act(z·W_gate_e) ⊙ z·W_up_e)·W_down_e (swiglu / geglu) or gelu(z·W_up_e)·W_down_e (gelu), with
// W_gate_e, W_up_e [h, f_e], W_down_e [f_e, h]: every expert has its own inner size f_e (fine-grained experts).
// The shared experts are one MLP of inner size shared_ffn (DeepSeek-V3's n_shared_experts x moe_intermediate_size,
// Qwen's shared_expert_intermediate_size), the same activation.
//
// Every kernel is charged through CHARGE in execution order (a grouped GEMM as one kernel, one launch, every
// expert's GEMM at its own token count in the kernel model: MoeCharge::grouped). Dtypes: fp32 or bf16 tensors, the routing in fp32. Shape-only x (kernels/kernel_cost.h):
// the routing comes from a declared distribution (declared_routing) and every kernel only charges.
// Errors: std::invalid_argument naming the shape or the option.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kernels/elementwise.h"
#include "kernels/moe.h"

namespace shardsim::kernels {

struct MoeSpec {
  int64_t hidden = 0;
  RouterOptions router;              // experts, top_k, score, normalize, scale, bias
  std::vector<int64_t> expert_ffn;   // f_e per expert [E]
  int64_t shared_ffn = 0;            // 0: no shared experts
  bool gated = true;                 // swiglu / geglu (false: gelu MLP, no W_gate)
  Activation activation = Activation::silu;
  CapacityOptions capacity;          // factor <= 0: dropless; groups: tokens routed together
  double aux_coef = 0;               // aux loss coefficient alpha (Switch: 1e-2); 0: none
  runtime::DType dtype = runtime::DType::fp32;
  int64_t experts() const { return router.experts; }
  void check() const;  // invalid_argument on a bad field
};

struct ExpertWeights {
  runtime::Tensor w_gate, w_up, w_down;  // w_gate default-constructed (rank 0) when not gated
};

// The layer's weights on one chip: the router, experts [first_expert, first_expert + experts.size()), and the
// shared MLP (shared.w_up default-constructed, rank 0, when none). BIAS: the layer's per-expert selection bias
// [E] (DeepSeek-V3's auxiliary-loss-free balancing; state, not a parameter: no gradient, no optimizer, updated by
// update_expert_bias after each training step); when set it replaces MoeSpec::router.bias for this layer.
struct MoeWeights {
  runtime::Tensor router;  // [h, E]
  int64_t first_expert = 0;
  std::vector<ExpertWeights> experts;
  ExpertWeights shared;
  std::vector<float> bias;  // [E] or empty (MoeSpec::router.bias)
};
// Parameters of one MoE layer (elements): TOTAL = router + every expert + the shared MLP; ACTIVE = what one token
// uses: router + shared + k experts of the mean expert size (exact when every expert has one size). An MFU counted
// on active parameters takes 6 · ACTIVE FLOPs per token for the layer's GEMMs in training (forward 2, backward 4).
struct MoeParams {
  double total = 0, active = 0;
};
MoeParams moe_params(const MoeSpec& s);

// Seeded weights (Philox, models/init.h's scheme is not used here: a fixed-seed uniform(-a, a) with a = 1/sqrt(fan_in),
// from std::mt19937_64 per tensor so any expert subset draws the same values as the full set).
MoeWeights make_moe_weights(const MoeSpec& s, uint64_t seed, int64_t first_expert, int64_t count, bool storage = true);
// Zero-filled gradients shaped like W.
MoeWeights zero_like(const MoeWeights& w);

// Charges kernels in execution order.
struct MoeCharge {
  std::function<void(const KernelCost&)> fn;
  void operator()(const KernelCost& c) const {
    if (fn) fn(c);
  }
  void grouped(const GroupedCost& g) const;  // one charge: G.total() (one launch), unless no group has rows
};

// What the experts' forward keeps for the backward, one entry per local expert.
struct ExpertActs {
  std::vector<runtime::Tensor> gate, up, act;
};

// Local experts W over rows XP [N, h] grouped by OFFSETS (one group per expert of W). Returns YP [N, h].
runtime::Tensor experts_forward(const MoeSpec& s, const std::vector<ExpertWeights>& w, const runtime::Tensor& xp,
                                const std::vector<int64_t>& offsets, ExpertActs* keep, const MoeCharge& charge);
// Backward: DYP [N, h] -> DXP [N, h]; GRADS (same count as W) receive the weight gradients (overwritten).
runtime::Tensor experts_backward(const MoeSpec& s, const std::vector<ExpertWeights>& w, const runtime::Tensor& xp,
                                 const std::vector<int64_t>& offsets, const ExpertActs& keep,
                                 const runtime::Tensor& dyp, std::vector<ExpertWeights>& grads,
                                 const MoeCharge& charge);

// The dense MLP of the shared experts (W.w_up non-empty): Y = mlp(X); KEEP receives gate/up/act (one entry).
runtime::Tensor shared_forward(const MoeSpec& s, const ExpertWeights& w, const runtime::Tensor& x, ExpertActs* keep,
                               const MoeCharge& charge);
runtime::Tensor shared_backward(const MoeSpec& s, const ExpertWeights& w, const runtime::Tensor& x,
                                const ExpertActs& keep, const runtime::Tensor& dy, ExpertWeights& grads,
                                const MoeCharge& charge);

// The router of W (W.router, the selection bias W.bias or S.router.bias) on X [T, h] (logits gemm, route, capacity
// with S.capacity.groups, aux loss). DECLARED: shape-only x takes it as the routing (Routing::from_counts). LOGITS
// (optional) keeps the logits. AUX receives the mean aux loss (0 when aux_coef is 0).
Routing router_forward(const MoeSpec& s, const MoeWeights& w, const runtime::Tensor& x,
                       const Routing* declared, runtime::Tensor* logits, double* aux, const MoeCharge& charge);
// Backward: DX [T, h] += through the router (added in fp32; DX has the shape of X), DROUTER [h, E] = x^T·dlogits.
void router_backward_pass(const MoeSpec& s, const runtime::Tensor& router_w, const runtime::Tensor& x,
                          const Routing& r, const std::vector<float>& dweight, double aux_grad,
                          runtime::Tensor& dx, runtime::Tensor& drouter, const MoeCharge& charge);

// What the reference forward keeps.
struct MoeActivations {
  Routing routing;
  runtime::Tensor xp, yp;
  ExpertActs experts, shared;
  double aux = 0;
};

// The MoE MLP on one chip holding every expert (W.experts.size() == E): Y [T, h] from X [T, h].
runtime::Tensor moe_forward(const MoeSpec& s, const MoeWeights& w, const runtime::Tensor& x, MoeActivations& keep,
                            const MoeCharge& charge, const Routing* declared = nullptr);
// Backward from DY [T, h] and AUX_GRAD (dL/d aux_g for every group): returns DX; GRADS (zero_like(W)) receive
// the router, expert and shared gradients.
runtime::Tensor moe_backward(const MoeSpec& s, const MoeWeights& w, const runtime::Tensor& x,
                             const MoeActivations& keep, const runtime::Tensor& dy, double aux_grad,
                             MoeWeights& grads, const MoeCharge& charge);

// ---- Declared routing (shape-only runs) ----
// Expert loads of a routing distribution: uniform, or Zipf with exponent SKEW (expert of popularity rank r gets a
// share proportional to 1/(r+1)^skew; which expert has which rank is a permutation drawn from SEED and STREAM, e.g.
// the chip and the layer). T·k assignments are split by largest remainder, each expert at most T (a token picks
// an expert once; the excess goes to the next-ranked experts), then capacity C (S.capacity per group of T tokens)
// clips each. Deterministic. A HISTOGRAM row (model.moe.routing: histogram, e.g. measured tokens per expert of a
// real run) replaces the Zipf shares for its layer: expert e's share is row[e] / sum(row), and the popularity rank
// (ties, excess) is the row's order, largest first, lower id first on ties.
struct RoutingDistribution {
  double skew = 0;   // 0: uniform
  uint64_t seed = 1;
  // Per global layer index: the E experts' weights (>= 0, sum > 0), or an empty row (a dense layer, or skew rules).
  std::vector<std::vector<double>> histogram;
  // LAYER's row, or nullptr when it has none.
  const std::vector<double>* row(int64_t layer) const {
    return layer >= 0 && size_t(layer) < histogram.size() && !histogram[size_t(layer)].empty()
               ? &histogram[size_t(layer)] : nullptr;
  }
};
// LAYER: the global layer index (its histogram row, if any); -1: none.
Routing declared_routing(const MoeSpec& s, int64_t tokens, const RoutingDistribution& d, uint64_t stream,
                         int64_t layer = -1);

// A model's MoE layers as the model.moe section describes them (sharding/plans/expert_parallel_config.h parses it).
struct MoeConfig {
  MoeSpec spec;                  // hidden, dtype and the MLP kind from the model
  int64_t dense_layers = 0;      // the first n layers keep the dense MLP
  int64_t layer_step = 1;        // after them, layer i is MoE when (i + 1) % layer_step == 0
  double bias_update = 0;        // aux-loss-free balancing step gamma (update_expert_bias); 0: no bias
  RoutingDistribution routing;   // shape-only runs
  // Expert placement over the ep chips (sharding/plans/expert_parallel.h, placement_by_load): false = expert e on
  // ep rank e / (E/ep); true = the experts of each layer placed so the ep chips' expected loads (the declared
  // routing's, shape-only runs and serving) even out: DeepSeek's EPLB idea without replicas.
  bool balance_placement = false;
  bool is_moe_layer(int64_t layer) const { return layer >= dense_layers && (layer + 1) % layer_step == 0; }
};

}  // namespace shardsim::kernels

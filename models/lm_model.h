// A single-device reference of a decoder-only language model (Llama-style), forward and full backward, built from
// the kernels of kernels/. It is the reference the sharded training step will be compared against (issue 18).
//
//   x_0     = embed[tokens] (+ pos_embed[position in sequence] with learned positions)  [N, h]   N = batch · seq
//   for each of the L blocks:
//     a     = norm(x, attn_norm)                    rmsnorm, or layernorm with its bias attn_norm_b
//     q, k, v = a·wq [N, Hq, d], a·wk [N, Hkv, d], a·wv [N, Hkv, d];  q, k = rope(q), rope(k) (position in sequence;
//             rope only)
//     o     = causal attention(q, k, v) per sequence (GQA: Hq a multiple of Hkv)          [N, Hq·d]
//     x     = x + o·wo
//     m     = norm(x, mlp_norm)
//     x     = x + (silu(m·w_gate) · (m·w_up))·w_down                                      (SwiGLU MLP)
//       or  x + gelu(m·w_up)·w_down                                                      (GELU MLP, mlp: gelu)
//   logits  = norm(x, final_norm) · head                                                 [N, V]
//             (tied_embeddings: head = embed^T, one weight; its gradient is the sum of both uses)
//   loss    = mean over the N tokens of the softmax cross-entropy against the next token
// The GPT variant (Radford et al. 2019; Brown et al. 2020; Megatron's GPT) is layernorm + gelu + learned + tied.
// Linear layers have no biases (LayerNorm has its bias): a choice, their FLOPs and bytes are O(N·h) per layer.
// GELU is the exact erf form (kernels/elementwise.h), not the tanh approximation.
//
// Weights are stored [in, out] (y = x·W), fp32. Initialisation from the seeded Philox generator
// (models/init.h, one tensor id per weight in the order of named_weights()): embed U(−1, 1), every projection
// U(−1/sqrt(fan_in), 1/sqrt(fan_in)), norm weights 1. Everything is deterministic: the same config and seed give
// bit-identical losses and weights (tested).
//
// Errors: std::invalid_argument naming the field for a config that does not fit (sizes < 1, Hq not a multiple of
// Hkv, odd head_dim) or a batch of the wrong shape or with a token outside [0, vocab).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kernels/kernel_cost.h"
#include "runtime/tensor.h"
#include "sharding/model_spec.h"
#include "sharding/plans/block.h"

namespace shardsim::models {

// The one model description (sharding/model_spec.h): every function below takes it. A chip's local model is a
// ModelSpec of its shard (ModelSpec::shard says where it sits in the whole model).
using sharding::ModelSpec;

// The token groups of a MoE model's reference for a plan whose REPLICAS (dp x ep) chips each route their own
// micro-batches of MICRO_BATCH sequences (0: one of batch / replicas): batch / micro_batch, or REPLICAS.
int64_t lm_moe_groups(int64_t batch, int64_t micro_batch, int64_t replicas);

// The reference's own checks of a model C (sizes >= 1, heads a multiple of kv_heads, even head_dim under RoPE,
// fp32 or bf16): std::invalid_argument "lm config: ..." naming the field. The parser (sharding/model_spec.h) refuses
// all of these first with the key's FILE:LINE; this guards the programmatic callers (tests, the executor's local
// models).
void check_lm_config(const ModelSpec& c);

// Whether NAME is a layernorm bias ("..._b").
bool lm_is_norm_bias(const std::string& name);

// Number of weights, all of them (embedding, norms, projections, head; every expert of a MoE layer).
int64_t lm_param_count(const ModelSpec& c);
// The weights that multiply activations in GEMMs: every projection of every block and the LM head; not the
// embedding table (a lookup) nor the norm weights. A MoE layer counts its active parameters (kernels::moe_params:
// router, shared experts and top_k experts of the mean size): MFU on active parameters. The N of the 6·N·tokens rule (docs/model/training.md, "Model FLOPs and MFU").
int64_t lm_matmul_param_count(const ModelSpec& c);
// Model FLOPs per token of one training step (forward + backward), PaLM's MFU numerator (Chowdhery et al. 2022,
// app. B): 6·N + 12·layers·heads·head_dim·seq, N = lm_matmul_param_count. The attention term counts the full
// seq x seq score matrix as published MFU figures do, although causal kernels compute about half of it.
double lm_model_flops_per_token(const ModelSpec& c);

// A weight a variant does not have (attn_norm_b without layernorm, w_gate with mlp: gelu, pos_embed without learned
// positions, head when tied) is an empty tensor (rank 0) and is left out of named_weights().
// A MoE layer (ModelSpec::moe_layer) has no w_gate, w_up, w_down; MOE holds its router, experts and shared experts,
// named "layers.L.moe.router", "layers.L.moe.expert.E.w_up" (E the global expert index), "layers.L.moe.shared.w_up".
struct LmLayer {
  runtime::Tensor attn_norm, attn_norm_b, wq, wk, wv, wo, mlp_norm, mlp_norm_b, w_gate, w_up, w_down;
  kernels::MoeWeights moe;
  // Every slot in the fixed order (present or not).
  std::vector<std::pair<const char*, runtime::Tensor*>> slots();
};

struct LmWeights {
  runtime::Tensor embed;  // [V, h]
  runtime::Tensor pos_embed;  // [seq, h] (learned positions)
  std::vector<LmLayer> layers;
  runtime::Tensor final_norm, final_norm_b;  // [h]
  runtime::Tensor head;        // [h, V] (untied)

  // Every weight present, with a stable name ("embed", "pos_embed", "layers.0.attn_norm", "layers.0.attn_norm_b",
  // "layers.0.wq", ..., "final_norm", "final_norm_b", "head"), in that fixed order.
  std::vector<std::pair<std::string, runtime::Tensor*>> named_weights();
  std::vector<std::pair<std::string, const runtime::Tensor*>> named_weights() const;
};

// The head's weight [h, V/T] as the GEMMs read it: W.head, or with tied embeddings the embedding table (shard)
// transposed into SCRATCH (kernels::transposed: a BLAS op T, not charged).
const runtime::Tensor& lm_head_weight(const ModelSpec& c, const LmWeights& w, runtime::Tensor& scratch);

// Zero-filled weights of the config's shapes in DTYPE (gradients: the compute dtype; optimizer moments: fp32);
// STORAGE false: shape-only tensors of those shapes (runtime/tensor.h), nothing allocated.
LmWeights lm_zeros(const ModelSpec& c, runtime::DType dtype, bool storage = true);
// The seeded initialisation described above: fp32 (the master weights).
LmWeights lm_init(const ModelSpec& c);
// MASTER rounded once to the config's compute dtype (a copy when that is fp32).
LmWeights lm_compute_copy(const ModelSpec& c, const LmWeights& master);

// One step's data: batch sequences of seq + 1 tokens; inputs are tokens [0, seq) of each, targets [1, seq + 1).
// Without a vocabulary (vocab 0: a stack of blocks, model.kind transformer_block) the step's data are activations
// instead: INPUT, the residual stream entering the first block, and TARGET, what the last block's output is
// regressed onto (kernels/mse_loss.h), both fp32 [batch · seq, hidden] (sequence-major rows); the token lists are
// then empty.
struct LmBatch {
  std::vector<int64_t> inputs;   // batch · seq, sequence-major
  std::vector<int64_t> targets;  // batch · seq
  runtime::Tensor input, target;  // vocab 0 only
};

// What the backward needs from the forward (kept whole: this is the small reference model).
struct LmCache {
  // What a block's forward keeps (sharding/plans/block.h): lse per sequence fp32 [Hq, seq]; o_heads only under
  // Ulysses (models/lm_tp.h).
  using Layer = sharding::plans::BlockActivations;
  std::vector<Layer> layers;
  runtime::Tensor x_final, xf, logits, row_max, sumexp;
};

// Vocab 0 (a stack of blocks): x_0 = the batch's input rounded to the compute dtype; no embedding, final norm,
// head or cross-entropy; the loss is kernels/mse_loss.h's mean squared error of x_L against the batch's target over
// the N·h elements (units 0 and layers + 1 hold no weight).
// Forward: W in the config's compute dtype (std::invalid_argument naming a weight otherwise). Returns the mean
// loss (per-token fp32 losses summed in fp64). CACHE (optional) receives what
// lm_backward needs; COSTS (optional) receives every kernel's cost in call order.
// Units (the granularity at which data parallelism gathers parameters and reduces gradients): unit 0 = embed,
// unit 1 + l = block l, unit layers + 1 = final_norm and head. UNIT_MARKS (optional, with COSTS) receives
// layers + 3 indices into COSTS: entry u is where unit u's forward kernels begin (u = 0 .. layers + 1), and the
// last one is COSTS' size at the end.
double lm_forward(const ModelSpec& c, const LmWeights& w, const LmBatch& batch, LmCache* cache = nullptr,
                  std::vector<kernels::KernelCost>* costs = nullptr, std::vector<size_t>* unit_marks = nullptr);

// Activation recomputation per block (Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost";
// Megatron's full recompute): lm_drop_block_activations keeps only each block's input x_in in CACHE;
// lm_recompute_block re-runs block LAYER's forward from it and refills its saved tensors (bit-identical to the
// first forward: the kernels are deterministic). COSTS receives the recomputed kernels.
void lm_drop_block_activations(LmCache& cache);
// Bytes of the activations a forward keeps for the backward, from CACHE as the forward filled it: every saved
// tensor; with RECOMPUTE, every block's input, the largest block's other saved tensors (one block is rebuilt at a
// time) and the head's tensors.
double lm_cache_bytes(const LmCache& cache, bool recompute);
// Of lm_cache_bytes(cache, true): the largest block's saved tensors other than its input, the working set of the
// one block a recomputing backward rebuilds at a time. A chip holding several (chunk, micro-batch) forwards (a
// pipeline's in-flight micro-batches) holds their inputs each but this working set once (Korthikanti et al. 2022,
// arXiv 2205.05198, section 5: full recomputation keeps the layer inputs, one layer is rebuilt at a time).
double lm_recompute_working_bytes(const LmCache& cache);
// The unit a weight belongs to (see lm_forward): 0 = "embed", 1 + l = "layers.<l>.*", layers + 1 = final_norm, head.
int lm_unit_of(const std::string& name, int64_t layers);
void lm_recompute_block(const ModelSpec& c, const LmWeights& w, int64_t layer, LmCache& cache,
                        std::vector<kernels::KernelCost>* costs = nullptr);

// Backward of the mean loss: writes every weight's gradient into GRADS (lm_zeros(c, c.dtype), overwritten).
// UNIT_MARKS (optional, with COSTS): layers + 2 indices into COSTS, in backward order: entry k is the size of
// COSTS once the gradients of unit layers + 1 − k are complete (head and final_norm first, then blocks
// layers − 1 .. 0, then the embedding).
void lm_backward(const ModelSpec& c, const LmWeights& w, const LmBatch& batch, const LmCache& cache, LmWeights& grads,
                 std::vector<kernels::KernelCost>* costs = nullptr, std::vector<size_t>* unit_marks = nullptr);

}  // namespace shardsim::models

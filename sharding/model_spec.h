// The one description of a workload's model and of its parallel plan, below the plan units that read them.
//
// ModelSpec describes a decoder-only language model (Llama-style; Touvron et al. 2023, Llama Team 2024
// arXiv:2407.21783):
//
//   tokens [batch, seq]  ─► embedding [vocab, hidden] (vocab > 0 only)
//                        ─► layers x block: x + attention(norm(x)) (attention on only), x + mlp(norm(x))
//                        ─► final norm, head [hidden, vocab], softmax cross-entropy (vocab > 0 only)
//
// The MLP-only and block-only workloads of `run` are this model with pieces off: vocab 0 drops the embedding, the
// final norm, the head and the loss (the input is a seeded [batch·seq, hidden] activation instead of tokens);
// attention false (or heads 0) makes every layer the MLP alone. The executor (models/lm_tp.h), the single-device
// reference (models/lm_model.h), the checkpoints and the decode path all take this type: a chip's local model is a
// ModelSpec too (its sizes divided by the plan, and its place in the whole model in ModelSpec::shard).
//
// Units and shapes (all sizes are element counts; "per step" = one optimizer step in training, one forward in run):
//   vocab        tokens in the vocabulary V; 0 = no embedding, final norm, head or loss
//   hidden       model dimension h; activations are [tokens, h]
//   layers       blocks L, each with its own weights
//   heads        query heads Hq; 0 = MLP-only layers (as attention false)
//   kv_heads     key/value heads Hkv (grouped-query attention when Hkv < Hq); Hq must be a multiple of Hkv
//   head_dim     d; q is [tokens, Hq·d], k and v [tokens, Hkv·d]. `run`'s block configs leave it out: d = h / Hq
//   ffn          the MLP's inner size (columns of W_gate and W_up, rows of W_down)
//   seq          tokens per sequence (the MLP workload's `tokens`: rows of one replica's input)
//   batch        sequences per step, global (over every data-parallel replica); 0 = one per dp replica (`run`)
//   micro_batch  sequences per micro-batch on each data-parallel replica (gradient accumulation over the
//                batch / dp / micro_batch micro-batches of a step); 0 = none (one micro-batch of batch / dp)
//   causal       causal attention mask (decoder); false = full attention
//   position     rope (rotary embedding, theta rope_theta; needs an even head_dim) | learned | none
//   norm         rmsnorm (epsilon norm_eps) | layernorm
//   mlp          swiglu (silu(x·W_gate) ⊙ x·W_up)·W_down | geglu (gelu in place of silu) | gelu (two matrices,
//                gelu(x·W_up)·W_down)
//   tied_embeddings  the head is the embedding's transpose (one weight)
//   dtype        compute dtype of weights, activations and gradients: fp32 | bf16 (training keeps fp32 masters)
//   seed         seeds the Philox initialisation of every weight and input (models/init.h)
//
// What each executor implements today (the parser refuses the rest with exit 2 naming the key, "not implemented
// yet"; the fidelity and pipeline work fills them in):
//   run, MLP-only (attention off, vocab 0): mlp swiglu or geglu; layers 1; batch = dp (one input per replica);
//        plan tp x dp (fused, all_reduce / algorithm for the tp all_reduce)
//   run, block (attention on, vocab 0): rmsnorm (eps 1e-5), swiglu or geglu, rope (theta 10000) or none,
//        head_dim = hidden / heads, any layers; batch = dp; Ulysses with replicated KV heads not yet
//   train (vocab > 0, attention on): rmsnorm or layernorm, swiglu or gelu, rope (any theta), learned or none,
//        tied or untied head (tied: not with pp > 1), causal, any micro_batch; tp above the KV heads not yet; fused
//        only with sp; one algorithm for all collectives (see algorithm)
//   Nowhere yet: geglu in train; layernorm, mlp gelu, position learned, tied_embeddings in run; in run:
//   micro_batch, parallel.pp > 1; in train: parallel.fused with schedule zb_h1 (the fused ops compute the weight
//   gradients that zb_h1 defers).
//
// A field not listed above as implemented is refused at parse, never ignored.
//
// ParallelPlan is the plan on the device mesh (sharding/device_mesh.h: axes tp innermost, then cp, then dp;
// Ulysses uses the cp axis): see each field. Which mode reads which field is said next to it.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/config.h"
#include "kernels/elementwise.h"
#include "kernels/fp8.h"
#include "kernels/moe_mlp.h"
#include "kernels/optimizer.h"
#include "runtime/dtype.h"
#include "sharding/fused.h"

namespace shardsim::sharding {

enum class PositionKind { rope, learned, none };
enum class NormKind { rmsnorm, layernorm };
enum class MlpKind { swiglu, geglu, gelu };
// The attention core's implementation (kernels/attention.h flash-style; kernels/attention_unfused.h Megatron's
// materialised scores).
enum class AttentionImpl { flash, unfused };

// Where a chip's local model (a ModelSpec whose sizes are the chip's shard: heads / tp, ffn / tp, seq / cp, the
// layers of its pipeline stage, its experts) sits in the whole model. A parsed spec, and every single-device
// reference model, leaves the defaults: the whole model. Only the executor fills it, on the local copy each chip
// builds (models/lm_tp.h, LmTpTrainer::local_config). It lives in ModelSpec rather than beside it because every
// function that takes a local model (zeros, init, forward and backward, checkpoints, decode) needs it to know
// which weights exist (which layer is a MoE layer, which experts, how many position rows).
struct LocalShard {
  // Rows of the learned position table; 0 = seq. A context-parallel chip holds seq / cp tokens of each sequence
  // but the whole table.
  int64_t positions = 0;
  // The routed experts this chip holds (expert parallelism): [expert_first, expert_first + expert_count); -1 = all.
  int64_t expert_first = 0, expert_count = -1;
  // The model index of each of the local layers (pipeline parallelism); empty = 0 .. layers - 1.
  std::vector<int64_t> global_layers;
};

struct ModelSpec {
  std::string label;  // model.model: a free-form name for reports ("llama-3-8b"); "" none
  int64_t vocab = 0;
  int64_t hidden = 0;
  int64_t layers = 1;
  int64_t heads = 0;
  int64_t kv_heads = 0;  // 0 in a parsed spec only when heads is 0
  int64_t head_dim = 0;  // 0 in a parsed spec only when heads is 0
  int64_t ffn = 0;
  int64_t seq = 0;
  int64_t batch = 0;
  int64_t micro_batch = 0;
  bool causal = true;
  PositionKind position = PositionKind::rope;
  double rope_theta = 10000.0;  // as parsed; the kernels take it (and norm_eps) as float, rounded once at each call
  NormKind norm = NormKind::rmsnorm;
  double norm_eps = 1e-5;  // (kernels/norm.h): the reference and the plan units compute with the same float
  MlpKind mlp = MlpKind::swiglu;
  bool tied_embeddings = false;
  bool attention = true;  // false: MLP-only layers (then heads, kv_heads and head_dim are 0)
  // Train only. attention_impl: the core's kernels (flash | unfused). dropout: Megatron's hidden and attention
  // dropout probability, and linear_bias: biases on the block's linear layers; both charged as the elementwise work
  // (kernels, masks) they add, their values not computed (kernels/bias_dropout.h).
  AttentionImpl attention_impl = AttentionImpl::flash;
  double dropout = 0;
  bool linear_bias = false;
  // Train only: FP8 GEMMs (kernels/fp8.h): none | tensor (per-tensor current scaling) | block (DeepSeek-V3's 1 x 128
  // / 128 x 128 scaling), E4M3 for every operand; the block's linear layers only (the attention core, the LM head,
  // the embedding, norms and the loss stay in model.dtype, as Transformer Engine's and Megatron-LM's FP8 runs keep them).
  kernels::Fp8Scaling fp8 = kernels::Fp8Scaling::none;
  runtime::DType dtype = runtime::DType::fp32;
  uint64_t seed = 1;
  // model.moe (train only): the mixture-of-experts MLP of the layers it names (kernels/moe_mlp.h, MoeConfig;
  // parsed by sharding/plans/expert_parallel_config.h; docs/MOE.md). Absent: every MLP dense.
  // A chip's local model holds its experts' etp shard inner sizes in moe->spec.
  std::optional<kernels::MoeConfig> moe;
  LocalShard shard;  // a chip's local model only: where its shard sits in the whole model (LocalShard above)

  bool has_attention() const { return attention && heads > 0; }
  bool layernorm() const { return norm == NormKind::layernorm; }
  bool gated() const { return mlp != MlpKind::gelu; }
  bool unfused_attention() const { return attention_impl == AttentionImpl::unfused; }
  int64_t position_rows() const { return shard.positions > 0 ? shard.positions : seq; }
  // Whether local layer L is a MoE layer (model.moe names its global index; LocalShard::global_layers).
  bool moe_layer(int64_t l) const {
    return moe && moe->is_moe_layer(shard.global_layers.empty() ? l : shard.global_layers[size_t(l)]);
  }
  bool has_embedding() const { return vocab > 0; }
  bool has_rope() const { return position == PositionKind::rope; }
  // The GLU activation of a gated MLP (swiglu: silu, geglu: gelu); gelu (ungated) has none.
  kernels::Activation glu_activation() const {
    return mlp == MlpKind::geglu ? kernels::Activation::gelu : kernels::Activation::silu;
  }
};

const char* position_name(PositionKind k);  // "rope" | "learned" | "none"
const char* norm_name(NormKind k);          // "rmsnorm" | "layernorm"
const char* mlp_name(MlpKind k);            // "swiglu" | "geglu" | "gelu"
const char* attention_impl_name(AttentionImpl k);  // "flash" | "unfused"

// The collectives a plan issues, for the one algorithm rule (ParallelPlan::algorithm_for).
enum class PlanCollective {
  tp_all_reduce,       // row-parallel output reduction (forward) / column-parallel input-gradient reduction
  sp_all_gather,       // sequence parallel: gather before a column-parallel GEMM
  sp_reduce_scatter,   // sequence parallel: reduce-scatter after a row-parallel GEMM
  ulysses_all_to_all,  // Ulysses: sequence <-> heads
  dp_gradients,        // data parallel: gradient all_reduce / reduce_scatter and ZeRO's parameter all_gather
  loss,                // vocab-parallel cross-entropy statistics (max, sum-exp, target logit) over tp
};

struct ParallelPlan {
  // Mesh axis sizes; dp·tp·cp·ulysses·pp = the chips. Read by both modes.
  int dp = 1;       // data parallel replicas (outermost axis)
  int tp = 1;       // tensor parallel (Megatron column/row-parallel GEMMs; innermost axis)
  int cp = 1;       // context parallel, ring attention (the cp axis)
  int ulysses = 1;  // DeepSpeed-Ulysses all_to_all attention (also on the cp axis; not together with cp > 1)
  int pp = 1;       // pipeline stages (outermost axis; train only, > 1 refused by run)
  // Expert parallelism (sharding/plans/expert_parallel.h; model.moe only): ep shards the routed experts over the
  // mesh's ep axis (between cp and dp; for attention one more data-parallel axis); etp (1 or tp) splits every
  // expert's inner size over the tp group (no mesh axis of its own: Megatron's expert tensor parallelism on the
  // tp chips).
  int ep = 1;
  int etp = 1;
  // Pipeline schedule (sharding/plans/pipeline_schedule.h; train with pp > 1): parallel.schedule gpipe | 1f1b |
  // interleaved | zb_h1 (default 1f1b; zb_h1 not with fused), virtual_stages v
  // (interleaved: model chunks per chip), pp_layers (layers of each of the pp·v model stages; empty = even).
  std::string schedule = "1f1b";
  int virtual_stages = 1;
  std::vector<int64_t> pp_layers;
  bool sp = false;  // sequence parallelism on the tp axis (needs tp > 1, not with ulysses)
  bool zigzag = true;  // parallel.cp_split: zigzag (chip c holds chunks c and 2cp-1-c) | contiguous
  FusedPlan fused;     // parallel.fused / parallel.chunks (sharding/fused.h); needs tp > 1
  // Training only (refused by run, which has no gradients or optimizer state):
  int zero = 0;                                // ZeRO stage 0-3 over the dp (x cp) replicas
  // Gradient buckets (parallel.bucket_bytes): -1 = auto, Megatron-LM's rule (sharding/plans/data_parallel.h
  // "Buckets": max(40M, 1M x dp x cp) elements on the first stage's first model chunk, one bucket per chunk
  // elsewhere or without overlap_grad_reduce); > 0 = PyTorch DDP's rule with that many bytes (its default 25 MiB:
  // 26214400); 0 = one reduction after the backward.
  int64_t bucket_bytes = -1;
  bool recompute = false;                      // full activation recomputation per block (recompute: full | true)
  // Selective recomputation (Korthikanti et al. 2022: the attention core recomputed in the backward, the rest
  // kept; recompute: selective). With model.attention_impl unfused the forward keeps no softmax output and the
  // backward runs the core again; the flash-style core always recomputes, so there it runs what none runs.
  bool selective_recompute = false;
  // Overlap of the data-parallel communication (Megatron's --overlap-grad-reduce / --overlap-param-gather):
  // overlap_grad_reduce: each gradient bucket reduced as soon as its units' gradients are ready (false: every bucket
  // after the backward); default true without sp, false with sp (the norm weights' tp all_reduce after backward).
  // overlap_param_gather (ZeRO 1-2): the updated parameters' all_gather overlaps the next step's forward, each
  // bucket awaited before the first unit that uses it.
  bool overlap_grad_reduce = true;
  bool overlap_param_gather = false;
  // The collective algorithm rule: "" = the default rule of algorithm_for; a registry name (collectives/registry.h)
  // or "auto" = that algorithm for every collective of the plan that implements it (else the default rule's).
  // Read from parallel.algorithm; parallel.all_reduce (older `run` key) sets the tp all_reduce's alone.
  std::string algorithm;
  std::string tp_all_reduce;  // parallel.all_reduce; "" = follow algorithm / the default rule
  std::vector<int> mesh_dims;  // topology dimensions the mesh fills, innermost axis first; empty = automatic

  // The product of every unit's size (dp·tp·cp·ulysses·pp): the plan registry's units with a size.
  int chips() const;
  // The algorithm a collective of kind WHAT runs under this plan, in `run` and `train` alike. The one default rule
  // (no parallel.algorithm, or "auto"): auto for every collective, the cost model's choice among the algorithms NCCL
  // would run for it (collectives/registry.h, AlgorithmDescriptor::auto_for; docs/COLLECTIVES.md "auto"). A named
  // parallel.algorithm runs every collective of the plan that implements it (the others auto);
  // parallel.all_reduce names the tp all_reduce's alone.
  std::string algorithm_for(PlanCollective what) const;
};

// The training loop's settings (the train: section; models/lm_train.h's LmTrainConfig is this type).
struct TrainSpec {
  int64_t steps = 30;  // the step to stop at (a resumed run continues to it)
  kernels::AdamWConfig adamw{.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.01f};
  double max_grad_norm = 1.0;  // global-norm clipping; <= 0 turns it off
  uint64_t data_seed = 7;
};

// ---- The one parser and validator of the model:, parallel: and train: sections ----
//
// Every command reads these sections through the functions below: `run` (model.kind mlp and transformer_block),
// `train`, the sweeps' generated points and `--plan` / `--set` (which rewrite the YAML before it is parsed:
// sharding/engine_config.h). The model: section arrives as workload: (its older name, still read) after
// load_workload_config. Errors: ConfigError "FILE:LINE: key: ..." (exit 2) naming the key, for an unknown key, a
// value out of its documented bound (docs/CONFIG.md, "Bounds"), a product of sizes out of bounds (computed with
// common/checked.h, never wrapped), a plan that does not fit the model or the chips, and a variant the executor
// of USE does not implement yet ("not implemented yet").

// Which executor reads the spec: run's MLP (model.kind: mlp), run's transformer block stack (kind:
// transformer_block), or train's language model (no kind, or kind: lm).
enum class SpecUse { mlp, block, train };
const char* spec_use_name(SpecUse use);  // "model.kind mlp" | "model.kind transformer_block" | "train"
// The use a model: section asks for (its kind: key; no kind = train). ConfigError naming kind otherwise.
SpecUse spec_use_of(const ConfigNode& model);

// The keys of each section, for every use (docs/CONFIG.md has a row per key; tests/unit/config_doc_test.cpp).
inline constexpr std::string_view kModelKeys[] = {
    "kind",     "model",      "vocab",     "hidden",   "layers",     "heads", "kv_heads", "head_dim",
    "ffn",      "seq",        "tokens",    "batch",    "micro_batch", "causal", "position", "rope",
    "rope_theta", "norm",     "norm_eps",  "mlp",      "activation", "tied_embeddings", "attention", "dtype",
    "seed",     "attention_impl", "dropout", "linear_bias", "moe", "fp8"};
// The parallel: section's keys: every key of every plan unit of the plan registry (sharding/plans/registry.h).
std::span<const std::string_view> parallel_keys();
inline constexpr std::string_view kTrainKeys[] = {"steps", "lr",            "beta1",     "beta2",    "eps",
                                                  "weight_decay", "max_grad_norm", "data_seed", "recompute"};

// Upper bounds of the sizes (inclusive; docs/CONFIG.md lists them with their reasons).
struct SpecBounds {
  static constexpr int64_t vocab = int64_t{1} << 24;        // 16,777,216 tokens
  static constexpr int64_t hidden = int64_t{1} << 20;       // 1,048,576
  static constexpr int64_t layers = 4096;
  static constexpr int64_t heads = 4096;                    // query and KV heads
  static constexpr int64_t head_dim = 4096;
  static constexpr int64_t ffn = int64_t{1} << 22;          // 4,194,304
  static constexpr int64_t seq = int64_t{1} << 24;          // 16,777,216 tokens per sequence
  static constexpr int64_t batch = int64_t{1} << 24;        // sequences per step
  static constexpr int64_t tokens = int64_t{1} << 32;       // batch x seq per step
  static constexpr int64_t weight = int64_t{1} << 40;       // elements of one weight matrix
  static constexpr int64_t params = int64_t{1} << 50;       // parameters of the whole model
  static constexpr int64_t axis = int64_t{1} << 20;         // a mesh axis size (the chip limit)
  static constexpr int64_t bucket_bytes = int64_t{1} << 50; // 1 PiB
  static constexpr int64_t steps = 1000000;                 // every step runs on the host
};

// Parses the model section MODEL for USE: the keys, their bounds and products, the shape rules (heads a multiple
// of kv_heads, head_dim even under RoPE, ...) and what USE implements.
ModelSpec parse_model_spec(const ConfigNode& model, SpecUse use);
// Parses ROOT's parallel: section (absent: the defaults below) for MODEL on CHIPS chips: every axis and option,
// the product of the axes = CHIPS, the divisibility rules of each plan unit, and what USE implements. Defaults:
// MLP: tp = CHIPS / dp; block and train: dp = CHIPS / (tp·cp·ulysses·pp). TRAIN_RECOMPUTE: the older
// train.recompute key when given (the plan's recompute). FORWARD_MODE: the executor's forward mode (`run`), which
// also runs what only its forward implements (tp above the KV heads: replicated KV heads); SERVE_MODE: its serving
// mode (a forward too). The units and keys refused in the mode (sharding/plans/registry.h, PlanModes) fail here.
ParallelPlan parse_parallel_plan(const ConfigNode& root, const ModelSpec& model, SpecUse use, int64_t chips,
                                 bool train_recompute = false, bool forward_mode = false, bool serve_mode = false);
// Parses the train: section (absent: the defaults).
TrainSpec parse_train_spec(const ConfigNode& root);
// The train: section's recompute: (older spelling of parallel.recompute); false when absent.
bool train_section_recompute(const ConfigNode& root);

}  // namespace shardsim::sharding

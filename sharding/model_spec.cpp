#include "sharding/model_spec.h"
#include "sharding/plans/registry.h"

#include <algorithm>
#include <cfloat>
#include <cstdint>
#include <stdexcept>

#include "collectives/algorithms.h"
#include "collectives/registry.h"
#include "common/byte_size.h"
#include "common/checked.h"
#include "sharding/plans/expert_parallel_config.h"

namespace shardsim::sharding {

const char* position_name(PositionKind k) {
  switch (k) {
    case PositionKind::rope: return "rope";
    case PositionKind::learned: return "learned";
    case PositionKind::none: return "none";
  }
  return "?";
}

const char* norm_name(NormKind k) { return k == NormKind::rmsnorm ? "rmsnorm" : "layernorm"; }

const char* attention_impl_name(AttentionImpl k) { return k == AttentionImpl::unfused ? "unfused" : "flash"; }

const char* mlp_name(MlpKind k) {
  switch (k) {
    case MlpKind::swiglu: return "swiglu";
    case MlpKind::geglu: return "geglu";
    case MlpKind::gelu: return "gelu";
  }
  return "?";
}

std::string ParallelPlan::algorithm_for(PlanCollective what) const {
  using collectives::Collective;
  Collective c = Collective::all_reduce;
  switch (what) {
    case PlanCollective::tp_all_reduce:
      if (!tp_all_reduce.empty()) return tp_all_reduce;
      break;
    case PlanCollective::sp_all_gather: c = Collective::all_gather; break;
    case PlanCollective::sp_reduce_scatter: c = Collective::reduce_scatter; break;
    case PlanCollective::ulysses_all_to_all: c = Collective::all_to_all; break;
    case PlanCollective::dp_gradients:
    case PlanCollective::loss: break;
  }
  // The one rule (collectives::plan_algorithm; groups of one chip are the collectives' own concern).
  return collectives::plan_algorithm(c, algorithm, 2) == "auto" ? "auto" : algorithm;
}

}  // namespace shardsim::sharding

// ------------------------------------------------------------------------------------------------ parser

namespace shardsim::sharding {

namespace {

std::string str(int64_t v) { return std::to_string(v); }

// "FILE:LINE: model.KEY: ... not implemented yet" for a variant USE's executor does not run.
[[noreturn]] void not_implemented(const ConfigNode& at, const std::string& what, SpecUse use) {
  at.fail(what + ": not implemented yet in " + spec_use_name(use));
}

// The node to blame for KEY of SECTION: the key when given, else the section.
ConfigNode at_key(const ConfigNode& section, std::string_view key) {
  return section.has(key) ? section.child(key) : section;
}

// A product of sizes within LIMIT, else "FILE:LINE: WHAT = A x B ... is above LIMIT" at NODE.
int64_t bounded_product(const ConfigNode& node, const std::string& what, const std::vector<int64_t>& factors,
                        int64_t limit) {
  std::optional<int64_t> p = 1;
  for (int64_t f : factors) p = p ? checked_mul(*p, f) : std::nullopt;
  if (!p || *p > limit) {
    std::string terms;
    for (int64_t f : factors) terms += (terms.empty() ? "" : " x ") + str(f);
    node.fail(what + " = " + terms + (p ? " = " + str(*p) : std::string(" (beyond 2^63)")) + " is above the limit " +
              str(limit) + " (docs/CONFIG.md, Bounds)");
  }
  return *p;
}

runtime::DType parse_spec_dtype(const ConfigNode& m, SpecUse use) {
  const std::string name = m.get_string("dtype", "fp32");
  runtime::DType t{};
  try {
    t = runtime::parse_dtype(name);
  } catch (const std::invalid_argument& e) {
    m.child("dtype").fail(m.path() + ".dtype: " + e.what());
  }
  if (use != SpecUse::mlp && t != runtime::DType::fp32 && t != runtime::DType::bf16)
    m.child("dtype").fail(m.path() + ".dtype: '" + name + "' (" + spec_use_name(use) + " computes in fp32 or bf16" +
                          (use == SpecUse::train ? "; bf16: mixed precision with fp32 master weights)" : ")"));
  return t;
}

void parse_position(const ConfigNode& m, ModelSpec& s) {
  if (m.has("rope") && m.has("position"))
    m.child("rope").fail(m.path() + ".rope: and position: say the same thing (rope: false is position: none); keep "
                         "position");
  if (m.has("rope")) s.position = m.get_bool("rope", true) ? PositionKind::rope : PositionKind::none;
  const std::string p = m.get_string("position", position_name(s.position));
  if (p == "rope") s.position = PositionKind::rope;
  else if (p == "learned") s.position = PositionKind::learned;
  else if (p == "none") s.position = PositionKind::none;
  else m.child("position").fail(m.path() + ".position: '" + p + "' (rope | learned | none)");
  if (m.has("rope_theta")) {
    s.rope_theta = m.get_positive_double("rope_theta");
    if (s.rope_theta > 1e12) m.child("rope_theta").fail(m.path() + ".rope_theta: must be at most 1e12");
  }
}

void parse_mlp_kind(const ConfigNode& m, ModelSpec& s) {
  if (m.has("activation") && m.has("mlp"))
    m.child("activation").fail(m.path() + ".activation: and mlp: say the same thing (activation silu is mlp swiglu, "
                               "gelu is geglu); keep mlp");
  if (m.has("activation")) {
    const std::string a = m.get_string("activation");
    if (a == "silu") s.mlp = MlpKind::swiglu;
    else if (a == "gelu") s.mlp = MlpKind::geglu;
    else m.child("activation").fail(m.path() + ".activation: '" + a + "' (silu | gelu: the gated MLP's activation)");
  }
  const std::string k = m.get_string("mlp", mlp_name(s.mlp));
  if (k == "swiglu") s.mlp = MlpKind::swiglu;
  else if (k == "geglu") s.mlp = MlpKind::geglu;
  else if (k == "gelu") s.mlp = MlpKind::gelu;
  else m.child("mlp").fail(m.path() + ".mlp: '" + k + "' (swiglu | geglu | gelu)");
}

// attention_impl, dropout, linear_bias (training only).
void parse_megatron_keys(const ConfigNode& m, ModelSpec& s, SpecUse use) {
  const std::string w = m.path() + ".";
  const std::string a = m.get_string("attention_impl", "flash");
  if (a == "flash") s.attention_impl = AttentionImpl::flash;
  else if (a == "unfused") s.attention_impl = AttentionImpl::unfused;
  else m.child("attention_impl").fail(w + "attention_impl: '" + a + "' (flash | unfused)");
  if (m.has("dropout")) {
    s.dropout = m.get_nonnegative_double("dropout", 0);
    if (s.dropout >= 1) m.child("dropout").fail(w + "dropout: a probability in [0, 1)");
  }
  s.linear_bias = m.get_bool("linear_bias", false);
  if (m.has("fp8")) {
    try {
      s.fp8 = kernels::parse_fp8_scaling(m.get_string("fp8"));
    } catch (const std::invalid_argument& e) {
      m.child("fp8").fail(w + "fp8: " + e.what());
    }
  }
  if (use != SpecUse::train)
    for (const char* k : {"attention_impl", "dropout", "linear_bias", "fp8"})
      if (m.has(k)) not_implemented(m.child(k), w + k, use);
}

// What USE's executor runs today (model_spec.h's table); everything else is refused naming its key.
void check_implemented(const ConfigNode& m, const ModelSpec& s, SpecUse use) {
  const std::string w = m.path() + ".";
  if (use == SpecUse::train) {  // every norm, position and tied embeddings; swiglu and gelu MLPs
    if (s.mlp == MlpKind::geglu) not_implemented(at_key(m, "mlp"), w + "mlp: geglu", use);
    return;
  }
  if (s.norm == NormKind::layernorm) not_implemented(m.child("norm"), w + "norm: layernorm", use);
  if (s.mlp == MlpKind::gelu) not_implemented(m.child("mlp"), w + "mlp: gelu (an ungated MLP)", use);
  if (s.position == PositionKind::learned) not_implemented(m.child("position"), w + "position: learned", use);
  if (s.tied_embeddings) not_implemented(m.child("tied_embeddings"), w + "tied_embeddings: true", use);
  if (s.micro_batch != 0)
    not_implemented(m.child("micro_batch"), w + "micro_batch (gradient accumulation: training only)", use);
  if (s.vocab != 0)
    not_implemented(m.child("vocab"), w + "vocab (the embedding, head and loss; `shardsim train` runs them)", use);
  if (s.has_attention()) {
    if (s.rope_theta != 10000.0) not_implemented(m.child("rope_theta"), w + "rope_theta other than 10000", use);
    if (s.norm_eps != 1e-5) not_implemented(m.child("norm_eps"), w + "norm_eps other than 1e-5", use);
  }
}

}  // namespace

const char* spec_use_name(SpecUse use) {
  switch (use) {
    case SpecUse::mlp: return "run (model.kind mlp)";
    case SpecUse::block: return "run (model.kind transformer_block)";
    case SpecUse::train: return "train";
  }
  return "?";
}

SpecUse spec_use_of(const ConfigNode& m) {
  if (!m.is_map()) m.fail(m.path() + ": expected a map of model keys");
  if (!m.has("kind")) return SpecUse::train;
  const std::string k = m.get_string("kind");
  if (k == "mlp") return SpecUse::mlp;
  if (k == "transformer_block") return SpecUse::block;
  if (k == "lm") return SpecUse::train;
  m.child("kind").fail(m.path() + ".kind: unknown model kind '" + k + "' (known: mlp, transformer_block, lm)");
}

ModelSpec parse_model_spec(const ConfigNode& m, SpecUse use) {
  m.expect_keys(kModelKeys);
  const std::string w = m.path() + ".";
  ModelSpec s;
  s.label = m.get_string("model", "");
  const bool mlp = use == SpecUse::mlp;
  // Attention: the MLP workload has none; the block and the language model have it.
  s.attention = m.get_bool("attention", !mlp);
  if (mlp && s.attention) m.child("attention").fail(w + "attention: model.kind mlp has no attention");
  if (!mlp && !s.attention)
    not_implemented(m.child("attention"), w + "attention: false (use model.kind: mlp for MLP-only layers)", use);
  if (mlp)
    for (const char* k : {"heads", "kv_heads", "head_dim", "causal", "position", "rope", "rope_theta", "norm",
                          "norm_eps"})
      if (m.has(k)) m.child(k).fail(w + k + ": model.kind mlp has no attention (its block: x + mlp(rmsnorm(x)))");
  // The language model needs its vocabulary and global batch; a stack of blocks (model.kind transformer_block, run
  // or trained) has neither embedding nor head (vocab 0) and one sequence per data-parallel replica by default.
  const bool lm = use == SpecUse::train && !(m.has("kind") && m.get_string("kind") == "transformer_block");
  if (!lm && use == SpecUse::train && m.has("vocab"))
    m.child("vocab").fail(w + "vocab: model.kind transformer_block has no embedding or head (a block stack trains on "
                              "a regression loss; drop kind for a language model)");
  s.vocab = m.get_int_in("vocab", lm ? 1 : 0, SpecBounds::vocab, lm ? -1 : 0);
  if (s.vocab < 0) m.fail("missing required key '" + w + "vocab'");
  s.hidden = m.get_int_in("hidden", 1, SpecBounds::hidden);
  s.layers = m.get_int_in("layers", 1, SpecBounds::layers, 1);
  if (mlp && s.layers != 1) not_implemented(m.child("layers"), w + "layers > 1 for model.kind mlp", use);
  s.ffn = m.get_int_in("ffn", 1, SpecBounds::ffn);
  // seq: the MLP's older name is tokens (rows of one replica's input).
  if (m.has("tokens") && m.has("seq")) m.child("tokens").fail(w + "tokens: and seq: are the same key; keep seq");
  if (m.has("tokens") && !mlp) m.child("tokens").fail(w + "tokens: model.kind mlp's name for seq; use seq");
  s.seq = m.get_int_in(m.has("tokens") ? "tokens" : "seq", 1, SpecBounds::seq);
  s.batch = m.get_int_in("batch", lm ? 1 : 0, SpecBounds::batch, lm ? -1 : 0);
  if (s.batch < 0) m.fail("missing required key '" + w + "batch'");
  s.micro_batch = m.get_int_in("micro_batch", 0, SpecBounds::batch, 0);
  if (s.micro_batch > 0 && s.batch > 0 && s.batch % s.micro_batch != 0)
    m.child("micro_batch").fail(w + "micro_batch: " + str(s.micro_batch) + " does not divide batch " + str(s.batch));
  if (s.attention) {
    s.heads = m.get_int_in("heads", 1, SpecBounds::heads);
    s.kv_heads = m.get_int_in("kv_heads", 1, s.heads, s.heads);
    if (s.heads % s.kv_heads != 0)
      m.child("kv_heads").fail(w + "kv_heads: " + str(s.heads) + " query heads are not a multiple of " +
                               str(s.kv_heads) + " KV heads");
    // head_dim: run's block derives it (hidden / heads); the language model takes it (default the same).
    const bool even = s.hidden % s.heads == 0;
    if (use == SpecUse::block && !even)
      m.child("heads").fail(w + "heads: hidden " + str(s.hidden) + " is not a multiple of " + str(s.heads) + " heads");
    s.head_dim = m.get_int_in("head_dim", 1, SpecBounds::head_dim, even ? s.hidden / s.heads : -1);
    if (s.head_dim < 0) m.fail("missing required key '" + w + "head_dim' (hidden is not a multiple of heads)");
    if (use == SpecUse::block && s.head_dim != s.hidden / s.heads)
      not_implemented(m.child("head_dim"), w + "head_dim other than hidden / heads", use);
    s.causal = m.get_bool("causal", true);
    parse_position(m, s);
    if (s.position == PositionKind::rope && s.head_dim % 2 != 0)
      at_key(m, m.has("head_dim") ? "head_dim" : "heads")
          .fail(w + "head_dim: " + str(s.head_dim) + " must be even for RoPE (it rotates pairs)");
    const std::string norm = m.get_string("norm", "rmsnorm");
    if (norm == "rmsnorm") s.norm = NormKind::rmsnorm;
    else if (norm == "layernorm") s.norm = NormKind::layernorm;
    else m.child("norm").fail(w + "norm: '" + norm + "' (rmsnorm | layernorm)");
    if (m.has("norm_eps")) {
      s.norm_eps = m.get_positive_double("norm_eps");
      if (s.norm_eps >= 1) m.child("norm_eps").fail(w + "norm_eps: must be below 1");
    }
  }
  parse_mlp_kind(m, s);
  s.tied_embeddings = m.get_bool("tied_embeddings", false);
  parse_megatron_keys(m, s, use);
  s.dtype = parse_spec_dtype(m, use);
  s.seed = static_cast<uint64_t>(m.get_int_in("seed", 0, INT64_MAX, mlp ? 1234 : 1));
  if (m.has("moe")) {  // after hidden, layers, mlp, dtype and seed, which the experts take
    if (use != SpecUse::train) not_implemented(m.child("moe"), w + "moe (mixture-of-experts layers)", use);
    s.moe = plans::parse_moe_config(m.child("moe"), s);
    int64_t f = 0;
    for (int64_t e : s.moe->spec.expert_ffn) f = std::max(f, e);
    bounded_product(at_key(m, "moe"), w + "moe: experts x hidden x expert_ffn (elements of the experts' W_up)",
                    {s.moe->spec.experts(), s.hidden, f}, SpecBounds::params);
  }
  // Products of sizes (overflow-safe): every weight matrix, the parameters, the tokens of a step.
  bounded_product(at_key(m, "ffn"), w + "hidden x ffn (elements of W_gate)", {s.hidden, s.ffn}, SpecBounds::weight);
  if (s.attention)
    bounded_product(at_key(m, "heads"), w + "hidden x heads x head_dim (elements of Wq)",
                    {s.hidden, s.heads, s.head_dim}, SpecBounds::weight);
  if (s.vocab > 0)
    bounded_product(at_key(m, "vocab"), w + "vocab x hidden (elements of the embedding)", {s.vocab, s.hidden},
                    SpecBounds::weight);
  const int64_t per_layer = 3 * s.hidden * s.ffn + 2 * s.hidden * (s.heads + s.kv_heads) * s.head_dim + 2 * s.hidden;
  bounded_product(at_key(m, "layers"), w + "layers x parameters per layer", {s.layers, per_layer}, SpecBounds::params);
  bounded_product(at_key(m, "seq"), w + "batch x seq (tokens per step)", {std::max<int64_t>(s.batch, 1), s.seq},
                  SpecBounds::tokens);
  check_implemented(m, s, use);
  return s;
}

}  // namespace shardsim::sharding

namespace shardsim::sharding {

namespace {

// The mesh's sizes: every plan unit's size key (the registry's units with a size), the axis that fills the chips
// when not given (MLP: tp = chips / dp; else dp = chips / the others), and their product = the chips.
void read_sizes(const plans::PlanParse& c, ParallelPlan& p) {
  const ConfigNode& par = c.par;
  const std::string w = "parallel.";
  std::vector<int64_t> inner_sizes;
  std::string inner_names;
  for (const auto& d : plans::registered_plans()) {
    if (!d.size || d.name == "dp") continue;
    p.*d.size = static_cast<int>(par.get_int_in(d.name, 1, SpecBounds::axis, 1));
    inner_sizes.push_back(p.*d.size);
    inner_names += (inner_names.empty() ? "" : " x ") + d.name;
  }
  const int64_t inner = bounded_product(par, "parallel: " + inner_names, inner_sizes, SpecBounds::axis);
  const int64_t chips = c.chips;
  if (c.use == SpecUse::mlp) {
    p.dp = static_cast<int>(par.get_int_in("dp", 1, SpecBounds::axis, 1));
    if (chips % p.dp != 0)
      par.child("dp").fail(w + "dp: " + str(p.dp) + " does not divide the topology's " + str(chips) + " chips");
    if (!par.has("tp")) p.tp = static_cast<int>(chips / p.dp);
  } else {
    p.dp = static_cast<int>(par.get_int_in("dp", 1, SpecBounds::axis, chips % inner == 0 ? chips / inner : 1));
  }
  std::vector<int64_t> sizes;
  std::string names;
  for (const auto& d : plans::registered_plans())
    if (d.size) {
      sizes.push_back(p.*d.size);
      names += (names.empty() ? "" : " x ") + d.name;
    }
  const int64_t all = bounded_product(par, "parallel: " + names, sizes, SpecBounds::axis);
  if (all == chips) return;
  par.fail("parallel: " + plans::size_product_text(p) + " = " + str(all) + " does not match the " +
           (c.use == SpecUse::train ? "job's " + str(chips) + (chips == 1 ? " chip" : " chips") + " (a job of " +
                                          str(all) + " chips runs it: --chips " + str(all) + ", or mpirun -np " +
                                          str(all) + ")"
                                    : "topology's " + str(chips) + " chips") +
           (c.use != SpecUse::mlp && !par.has("dp") && chips % inner != 0
                ? " (dp, not given, fills the chips left by " + inner_names + " = " + str(inner) +
                      " only when that divides them)"
                : std::string()) +
           " (the device mesh must cover every chip once)");
}

// The units' declared relations (needs / excludes), after their reads gave the specific messages.
void check_relations(const plans::PlanParse& c, const ParallelPlan& p) {
  for (const auto& d : plans::registered_plans()) {
    if (!d.unit || !d.is_active(p)) continue;
    for (const auto& n : d.needs)
      if (!plans::find_plan(n)->is_active(p)) c.fail(d.keys.front().name, "needs " + n);
    for (const auto& n : d.excludes)
      if (plans::find_plan(n)->is_active(p)) c.fail(d.keys.front().name, "not with " + n);
  }
}

}  // namespace

ParallelPlan parse_parallel_plan(const ConfigNode& root, const ModelSpec& s, SpecUse use, int64_t chips,
                                 bool train_recompute, bool forward_mode, bool serve_mode) {
  ParallelPlan p;
  p.recompute = train_recompute;
  const bool has = root.has("parallel");
  const ConfigNode par = has ? root.child("parallel") : root;
  const plans::PlanParse c{root, par, has, s, use, chips, forward_mode || serve_mode, serve_mode};
  if (!has) {
    if (use == SpecUse::block && chips != 1)
      root.fail("parallel: missing (a " + str(chips) + "-chip topology needs a plan: tp, cp or ulysses)");
    if (use == SpecUse::mlp) p.tp = static_cast<int>(chips);
    else p.dp = static_cast<int>(chips);
  } else {
    par.expect_keys(parallel_keys());
    if (use != SpecUse::train)  // a block or MLP config outside the executor: its forward only
      for (const auto& d : plans::registered_plans())
        for (const auto& k : d.keys)
          if (d.modes_of(k).forward == plans::ModeUse::no_effect && par.has(k.name))
            c.fail(k.name, "training only (" + d.modes_of(k).why + ")");
    read_sizes(c, p);
  }
  // Each unit's keys, then the rules between units, then each unit's rules against the model (registry order).
  for (const auto& d : plans::registered_plans())
    if (d.read) d.read(c, p);
  check_relations(c, p);
  plans::check_plan_modes(c, p);
  for (const auto& d : plans::registered_plans())
    if (d.check) d.check(c, p);
  return p;
}

bool train_section_recompute(const ConfigNode& root) {
  return root.has("train") && root.child("train").is_map() && root.child("train").get_bool("recompute", false);
}

TrainSpec parse_train_spec(const ConfigNode& root) {
  TrainSpec t;
  if (!root.has("train")) return t;
  const ConfigNode tr = root.child("train");
  tr.expect_keys(kTrainKeys);
  t.steps = tr.get_int_in("steps", 1, SpecBounds::steps, t.steps);
  const auto real = [&](const char* k, float fallback) {
    // Its own range, 0..FLT_MAX (not ConfigNode::kMaxFigure: a diverging run's lr of 1e30 is a legal input).
    const double v = tr.has(k) ? tr.get_double(k) : fallback;
    if (v < 0) tr.child(k).fail(std::string("train.") + k + ": must be >= 0 (got " + tr.child(k).printable_text() + ")");
    // AdamW runs in fp32: a finite double beyond FLT_MAX (lr: 1e300) would become inf there.
    if (v > FLT_MAX)
      tr.child(k).fail(std::string("train.") + k + ": must be at most 3.4e38 (AdamW works in fp32), got " +
                       tr.child(k).printable_text());
    return static_cast<float>(v);
  };
  t.adamw.lr = real("lr", t.adamw.lr);
  t.adamw.beta1 = real("beta1", t.adamw.beta1);
  t.adamw.beta2 = real("beta2", t.adamw.beta2);
  t.adamw.eps = real("eps", t.adamw.eps);
  t.adamw.weight_decay = real("weight_decay", t.adamw.weight_decay);
  t.max_grad_norm = tr.get_nonnegative_double("max_grad_norm", t.max_grad_norm);
  t.data_seed = static_cast<uint64_t>(tr.get_int_in("data_seed", 0, INT64_MAX, static_cast<int64_t>(t.data_seed)));
  if (t.adamw.beta1 >= 1) tr.child("beta1").fail("train.beta1: must be below 1");
  if (t.adamw.beta2 >= 1) tr.child("beta2").fail("train.beta2: must be below 1");
  if (!(t.adamw.eps > 0)) at_key(tr, "eps").fail("train.eps: must be > 0");
  return t;
}

}  // namespace shardsim::sharding

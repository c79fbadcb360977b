#include "interop/hf_config.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <vector>

#include "common/error.h"
#include "common/input_file.h"
#include "common/json_keys.h"
#include "common/text.h"
#include "sharding/model_spec.h"

namespace shardsim::interop {

namespace {

using json = nlohmann::json;
using sharding::SpecBounds;

// The fields of one JSON object with what the importer did with each: read() marks a field used; the fields never
// marked end as "not read" lines, so nothing is dropped silently.
class Fields {
 public:
  Fields(const json& obj, std::string where, std::string prefix = "")
      : obj_(obj), where_(std::move(where)), prefix_(std::move(prefix)) {}

  bool has(const std::string& k) const { return obj_.contains(k) && !obj_.at(k).is_null(); }
  const json& at(const std::string& k) const { return obj_.at(k); }
  void use(const std::string& k) { used_.insert(k); }
  bool used(const std::string& k) const { return used_.count(k) > 0; }
  // "name value" for the header, the value as JSON text, escaped and cut to 80 characters.
  std::string show(const std::string& k) const {
    std::string v = obj_.contains(k) ? obj_.at(k).dump() : "(absent)";
    if (v.size() > 80) v = v.substr(0, 77) + "...";
    return prefix_ + k + " " + v;
  }
  [[noreturn]] void fail(const std::string& k, const std::string& what) const {
    throw ConfigError(where_ + ": " + escape_control(prefix_ + k) + ": " + what);
  }
  // An integer field in [LO, HI]; absent or null -> nullopt.
  std::optional<int64_t> integer(const std::string& k, int64_t lo, int64_t hi) {
    use(k);
    if (!has(k)) return std::nullopt;
    const json& v = obj_.at(k);
    if (!v.is_number_integer())
      fail(k, "must be an integer (got " + escape_control(v.dump().substr(0, 40)) + ")");
    if (v.is_number_unsigned() ? v.get<uint64_t>() > static_cast<uint64_t>(hi) : v.get<int64_t>() > hi)
      fail(k, "must be at most " + std::to_string(hi) + " (got " + v.dump() + "; docs/CONFIG.md, \"Bounds\")");
    if (!v.is_number_unsigned() && v.get<int64_t>() < lo)
      fail(k, "must be at least " + std::to_string(lo) + " (got " + v.dump() + ")");
    return v.get<int64_t>();
  }
  int64_t need(const std::string& k, int64_t lo, int64_t hi) {
    const auto v = integer(k, lo, hi);
    if (!v) fail(k, "missing (every config.json of this architecture has it)");
    return *v;
  }
  std::optional<double> real(const std::string& k, double lo, double hi) {
    use(k);
    if (!has(k)) return std::nullopt;
    const json& v = obj_.at(k);
    if (!v.is_number()) fail(k, "must be a number (got " + escape_control(v.dump().substr(0, 40)) + ")");
    const double d = v.get<double>();
    if (!(d >= lo && d <= hi)) fail(k, "must be between " + number_text(lo) + " and " + number_text(hi) + " (got " + v.dump() + ")");
    return d;
  }
  std::optional<std::string> text(const std::string& k) {
    use(k);
    if (!has(k)) return std::nullopt;
    if (!obj_.at(k).is_string()) fail(k, "must be a string (got " + escape_control(obj_.at(k).dump().substr(0, 40)) + ")");
    return obj_.at(k).get<std::string>();
  }
  std::optional<bool> flag(const std::string& k) {
    use(k);
    if (!has(k)) return std::nullopt;
    if (!obj_.at(k).is_boolean()) fail(k, "must be true or false (got " + escape_control(obj_.at(k).dump().substr(0, 40)) + ")");
    return obj_.at(k).get<bool>();
  }
  // The fields present and never used, in the file's (sorted) order.
  std::vector<std::string> unused() const {
    std::vector<std::string> out;
    for (auto it = obj_.begin(); it != obj_.end(); ++it)
      if (!used_.count(it.key())) out.push_back(it.key());
    return out;
  }
  const std::string& where() const { return where_; }

 private:
  const json& obj_;
  std::string where_, prefix_;
  std::set<std::string> used_;
};

// Fields with no simulated cost in any family: token ids, initialisation, caching and output switches.
const std::set<std::string> kNoCost = {
    "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id", "transformers_version",
    "initializer_range", "init_std", "use_cache", "model_type", "_name_or_path", "output_attentions",
    "output_hidden_states", "return_dict", "is_decoder", "torchscript", "tokenizer_class", "quantization_config",
    "auto_map", "bos_token", "eos_token", "image_token_index", "boi_token_index",
    "eoi_token_index", "cache_implementation", "summary_activation", "summary_first_dropout", "summary_proj_to_labels",
    "summary_type", "summary_use_proj", "task_specific_params", "for_llm_compressor"};

json parse_json(const std::string& text, const std::string& where) {
  std::string dup;
  json j;
  try {
    j = parse_json_unique_keys(text, &dup);
  } catch (const json::parse_error& e) {
    const size_t byte = std::min<size_t>(e.byte, text.size());
    const size_t line = 1 + static_cast<size_t>(std::count(text.begin(), text.begin() + static_cast<long>(byte ? byte - 1 : 0), '\n'));
    std::string what = e.what();
    const size_t colon = what.find(": ");
    if (colon != std::string::npos && what.find("parse error") != std::string::npos) what = what.substr(colon + 2);
    throw ConfigError(where + ":" + std::to_string(line) + ": not valid JSON (" + escape_control(what) + ")");
  }
  if (!dup.empty())
    throw ConfigError(where + ": duplicate key '" + escape_control(dup) + "' (JSON readers disagree on which wins; keep one)");
  if (!j.is_object()) throw ConfigError(where + ": expected a JSON object (a Hugging Face config.json)");
  return j;
}

enum class Family { llama, llama4, mistral, mixtral, qwen2, qwen2_moe, qwen3, qwen3_moe, deepseek_v3, gpt2, gpt_neox,
                    gemma, gemma2 };

const std::map<std::string, Family>& architectures() {
  static const std::map<std::string, Family> m = {
      {"LlamaForCausalLM", Family::llama},         {"Llama4ForCausalLM", Family::llama4},
      {"Llama4ForConditionalGeneration", Family::llama4}, {"MistralForCausalLM", Family::mistral},
      {"MixtralForCausalLM", Family::mixtral},     {"Qwen2ForCausalLM", Family::qwen2},
      {"Qwen2MoeForCausalLM", Family::qwen2_moe},  {"Qwen3ForCausalLM", Family::qwen3},
      {"Qwen3MoeForCausalLM", Family::qwen3_moe},  {"DeepseekV3ForCausalLM", Family::deepseek_v3},
      {"GPT2LMHeadModel", Family::gpt2},           {"GPTNeoXForCausalLM", Family::gpt_neox},
      {"GemmaForCausalLM", Family::gemma},         {"Gemma2ForCausalLM", Family::gemma2}};
  return m;
}

std::string arch_list() {
  std::string s;
  for (const auto& [name, f] : architectures()) s += (s.empty() ? "" : ", ") + name;
  return s;
}

Family family_of(Fields& top, std::string& arch) {
  top.use("architectures");
  if (!top.has("architectures"))
    top.fail("architectures", "missing: the importer reads the model class from it (one of " + arch_list() + ")");
  const json& a = top.at("architectures");
  if (!a.is_array() || a.empty() || !a[0].is_string())
    top.fail("architectures", "must be a list of class names (got " + escape_control(a.dump().substr(0, 60)) + ")");
  arch = a[0].get<std::string>();
  const auto it = architectures().find(arch);
  if (it == architectures().end())
    top.fail("architectures", "'" + escape_control(arch) + "' is not an architecture shardsim imports (" + arch_list() +
                                  "; docs/IMPORT.md)");
  return it->second;
}

bool is_gelu(const std::string& act) { return act.rfind("gelu", 0) == 0; }

struct Ctx {
  Imported& imp;
  Fields& f;
  Family fam;
  const HfOptions& opt;
};

// The activation and MLP kind of every family.
void map_mlp(Ctx& c) {
  std::string key = c.f.has("hidden_activation") ? "hidden_activation"
                    : c.f.has("activation_function") ? "activation_function" : "hidden_act";
  const std::string act = c.f.text(key).value_or(c.fam == Family::gpt2 ? "gelu_new" : "silu");
  if (key == "hidden_activation") c.f.use("hidden_act");
  const bool gated = c.fam != Family::gpt2 && c.fam != Family::gpt_neox;
  if (!gated) {
    if (!is_gelu(act)) c.f.fail(key, "'" + escape_control(act) + "': the ungated MLP is written as mlp gelu only");
    c.imp.set("model", "mlp", "gelu", c.f.show(key));
    if (act != "gelu")
      c.imp.drop(c.f.show(key), "written as mlp gelu (exact erf); the tanh approximation has the same GEMMs and one "
                                "elementwise kernel of the same size");
  } else if (act == "silu" || act == "swish") {
    c.imp.set("model", "mlp", "swiglu", c.f.show(key));
  } else if (is_gelu(act)) {
    c.imp.set("model", "mlp", "swiglu", c.f.show(key));
    c.imp.drop(c.f.show(key), "GeGLU written as mlp swiglu: train has no geglu yet; the same GEMMs and parameters, only "
                              "the gate's elementwise activation differs (gelu vs silu)");
  } else {
    c.f.fail(key, "'" + escape_control(act) + "' is not an activation shardsim models (silu, gelu*)");
  }
}

void map_shapes(Ctx& c) {
  const bool gpt2 = c.fam == Family::gpt2;
  const int64_t hidden = c.f.need(gpt2 ? "n_embd" : "hidden_size", 1, SpecBounds::hidden);
  c.imp.set("model", "hidden", std::to_string(hidden), c.f.show(gpt2 ? "n_embd" : "hidden_size"));
  const std::string lk = gpt2 ? "n_layer" : "num_hidden_layers";
  c.imp.set("model", "layers", std::to_string(c.f.need(lk, 1, SpecBounds::layers)), c.f.show(lk));
  const std::string hk = gpt2 ? "n_head" : "num_attention_heads";
  const int64_t heads = c.f.need(hk, 1, SpecBounds::heads);
  c.imp.set("model", "heads", std::to_string(heads), c.f.show(hk));
  if (const auto kv = c.f.integer("num_key_value_heads", 1, SpecBounds::heads))
    c.imp.set("model", "kv_heads", std::to_string(*kv), c.f.show("num_key_value_heads"));
  else
    c.imp.set("model", "kv_heads", std::to_string(heads), "(no num_key_value_heads: multi-head attention)");
  if (c.fam == Family::deepseek_v3) {
    const int64_t v = c.f.need("v_head_dim", 1, SpecBounds::head_dim);
    c.imp.set("model", "head_dim", std::to_string(v), c.f.show("v_head_dim"));
    std::string mla;
    for (const char* k : {"q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim"}) {
      c.f.use(k);
      mla += (mla.empty() ? "" : ", ") + c.f.show(k);
    }
    c.imp.drop(mla, "multi-head latent attention is not expressible: written as multi-head attention with head_dim = "
                    "v_head_dim (the low-rank projections' parameters and FLOPs, and the wider q/k heads "
                    "(qk_nope_head_dim + qk_rope_head_dim), are not modelled)");
  } else if (const auto d = c.f.integer("head_dim", 1, SpecBounds::head_dim)) {
    c.imp.set("model", "head_dim", std::to_string(*d), c.f.show("head_dim"));
  } else {
    if (hidden % heads != 0) c.f.fail(hk, "does not divide the hidden size " + std::to_string(hidden) + " and no head_dim is given");
    c.imp.set("model", "head_dim", std::to_string(hidden / heads), "(no head_dim: hidden / heads)");
  }
  if (gpt2) {
    const auto inner = c.f.integer("n_inner", 1, SpecBounds::ffn);
    c.imp.set("model", "ffn", std::to_string(inner.value_or(4 * hidden)),
              inner ? c.f.show("n_inner") : "n_inner null: 4 x n_embd");
  } else {
    c.imp.set("model", "ffn", std::to_string(c.f.need("intermediate_size", 1, SpecBounds::ffn)), c.f.show("intermediate_size"));
  }
  c.imp.set("model", "vocab", std::to_string(c.f.need("vocab_size", 1, SpecBounds::vocab)), c.f.show("vocab_size"));
}

// Positions, norms, biases, tying, dropout: the per-family defaults of transformers' config classes.
void map_block(Ctx& c) {
  const bool gpt = c.fam == Family::gpt2 || c.fam == Family::gpt_neox;
  if (c.fam == Family::gpt2) {
    c.imp.set("model", "position", "learned", "GPT2LMHeadModel: learned positions (wpe)");
  } else {
    c.imp.set("model", "position", "rope", "rotary position embedding (architecture)");
    const std::string tk = c.fam == Family::gpt_neox && c.f.has("rotary_emb_base") ? "rotary_emb_base" : "rope_theta";
    if (const auto t = c.f.real(tk, 1, 1e12)) c.imp.set("model", "rope_theta", number_text(*t), c.f.show(tk));
    else c.imp.set("model", "rope_theta", "10000", "(no rope_theta: transformers' default 10000)");
    if (c.f.has("rope_scaling")) {
      c.f.use("rope_scaling");
      c.imp.drop(c.f.show("rope_scaling"), "RoPE frequency scaling changes no FLOP or byte (the same rotation kernels)");
    }
  }
  c.f.use("rope_scaling");
  const std::string ek = c.f.has("rms_norm_eps") ? "rms_norm_eps" : c.f.has("layer_norm_eps") ? "layer_norm_eps" : "layer_norm_epsilon";
  c.imp.set("model", "norm", gpt ? "layernorm" : "rmsnorm", gpt ? "LayerNorm with bias (architecture)" : "RMSNorm (architecture)");
  if (const auto e = c.f.real(ek, 1e-30, 1)) c.imp.set("model", "norm_eps", number_text(*e), c.f.show(ek));
  // Tied embeddings: transformers' PretrainedConfig defaults to true; Llama, Mistral, Mixtral, Qwen, DeepSeek and
  // GPT-NeoX configs default to false.
  const bool tie_default = c.fam == Family::gpt2 || c.fam == Family::gemma || c.fam == Family::gemma2;
  const auto tie = c.f.flag("tie_word_embeddings");
  c.imp.set("model", "tied_embeddings", tie.value_or(tie_default) ? "true" : "false",
            tie ? c.f.show("tie_word_embeddings") : std::string("(no tie_word_embeddings: the class default)"));
  if (gpt) {
    c.imp.set("model", "linear_bias", "true", "biases on every linear layer (architecture)");
    if (c.fam == Family::gpt_neox) c.f.use("attention_bias");
  } else {
    const bool attn_bias = c.f.flag("attention_bias").value_or(c.fam == Family::qwen2 || c.fam == Family::qwen2_moe);
    const bool mlp_bias = c.f.flag("mlp_bias").value_or(false);
    const std::string from = (c.f.has("attention_bias") ? c.f.show("attention_bias") : std::string("(no attention_bias)")) +
                             (c.f.has("mlp_bias") ? ", " + c.f.show("mlp_bias") : std::string());
    if (attn_bias && mlp_bias) c.imp.set("model", "linear_bias", "true", from);
    else if (!attn_bias) c.imp.set("model", "linear_bias", "false", from);
    else if (attn_bias)
      c.imp.drop(c.fam == Family::qwen2 || c.fam == Family::qwen2_moe ? "q/k/v biases (Qwen2 architecture)" : c.f.show("attention_bias"),
                 "attention-only biases are not expressible (model.linear_bias puts them on every linear layer); "
                 "their parameters (under 0.01 %) and bias adds are not modelled");
  }
  // Dropout: one probability for hidden and attention dropout.
  double p = 0;
  std::string from, zeros;
  for (const char* k : {"resid_pdrop", "hidden_dropout", "attention_dropout", "attn_pdrop", "embd_pdrop"}) {
    if (const auto v = c.f.real(k, 0, 0.999999)) {
      if (*v == 0) zeros += (zeros.empty() ? "" : ", ") + c.f.show(k);
      if (*v > p) {
        if (p > 0) c.imp.drop(from, "one dropout probability per model: the largest, " + number_text(*v) + ", is written");
        p = *v;
        from = c.f.show(k);
      } else if (*v > 0 && *v < p) {
        c.imp.drop(c.f.show(k), "one dropout probability per model: the largest, " + number_text(p) + ", is written");
      }
    }
  }
  if (p > 0) c.imp.set("model", "dropout", number_text(p), from);
  else if (!zeros.empty()) c.imp.set("model", "dropout", "0", zeros);
}

void map_moe(Ctx& c) {
  MoeFields& m = c.imp.moe;
  auto rec = [&](const char* k, int64_t* into) {
    if (!c.f.has(k)) return;
    c.f.use(k);
    m.sources.push_back(c.f.show(k));
    if (into && c.f.at(k).is_number_integer()) *into = c.f.at(k).get<int64_t>();
  };
  rec("num_local_experts", &m.experts);
  rec("num_experts", &m.experts);
  rec("n_routed_experts", &m.experts);
  rec("num_experts_per_tok", &m.top_k);
  rec("moe_intermediate_size", &m.moe_ffn);
  rec("intermediate_size_mlp", nullptr);
  rec("n_shared_experts", &m.shared_experts);
  rec("shared_expert_intermediate_size", &m.shared_ffn);
  rec("first_k_dense_replace", &m.first_dense);
  rec("decoder_sparse_step", &m.layer_step);
  rec("interleave_moe_layer_step", &m.layer_step);
  rec("moe_layer_freq", &m.layer_step);
  rec("ep_size", &m.expert_parallel);
  for (const char* k : {"mlp_only_layers", "norm_topk_prob", "router_aux_loss_coef", "output_router_logits",
                        "router_jitter_noise", "n_group", "topk_group", "topk_method", "routed_scaling_factor",
                        "scoring_func", "aux_loss_alpha", "seq_aux", "moe_layers"})
    rec(k, nullptr);
  for (const char* k : {"router_aux_loss_coef", "aux_loss_alpha"})
    if (c.f.has(k) && c.f.at(k).is_number()) m.aux_coef = c.f.at(k).get<double>();
  if (c.f.has("scoring_func") && c.f.at("scoring_func").is_string()) m.score = c.f.at("scoring_func").get<std::string>();
  if (c.f.has("norm_topk_prob") && c.f.at("norm_topk_prob").is_boolean()) m.normalize = c.f.at("norm_topk_prob").get<bool>();
  if (c.f.has("routed_scaling_factor") && c.f.at("routed_scaling_factor").is_number())
    m.scale = c.f.at("routed_scaling_factor").get<double>();
  if (m.experts > 0 && m.shared_ffn > 0 && m.shared_experts == 0) m.shared_experts = 1;
  // Mixtral and Llama 4 give each expert's inner size as intermediate_size; Llama 4 routes by sigmoid, top-1.
  if (m.experts > 0 && m.moe_ffn == 0 && c.f.has("intermediate_size") && c.f.at("intermediate_size").is_number_integer())
    m.moe_ffn = c.f.at("intermediate_size").get<int64_t>();
  if (c.fam == Family::llama4 && m.experts > 0) {
    m.score = "sigmoid";
    m.normalize = false;
  }
  if (c.fam == Family::mixtral) m.normalize = true;
  if (c.fam == Family::llama4 && m.experts > 0) m.shared_experts = 1;  // one shared expert of expert_ffn
}

// Family-specific fields that do not map, each with its reason.
void drop_family_fields(Ctx& c) {
  auto d = [&](const char* k, const std::string& why) {
    const bool skip = !c.f.has(k) || c.f.used(k);
    c.f.use(k);
    if (skip) return;
    c.imp.drop(c.f.show(k), why);
  };
  const std::string window = "sliding-window attention is not modelled: every layer attends over the whole causal "
                             "sequence (the same cost while seq <= the window)";
  if (c.f.has("use_sliding_window") && c.f.flag("use_sliding_window") == false) {
    c.imp.drop(c.f.show("use_sliding_window") + ", " + c.f.show("sliding_window") + ", " + c.f.show("max_window_layers"),
               "sliding-window attention switched off: nothing to model");
    c.f.use("sliding_window");
    c.f.use("max_window_layers");
  }
  d("sliding_window", window);
  d("use_sliding_window", window);
  d("max_window_layers", window);
  d("pretraining_tp", "Meta's tensor-parallel reference for the linear layers: no effect on the model's cost");
  d("rotary_pct", "partial rotary embedding: shardsim rotates the whole head (the rotation's elementwise kernel is "
                  "larger than the model's)");
  d("use_parallel_residual", "attention and MLP in parallel from one norm: shardsim runs them in sequence (the same "
                             "GEMMs; one more norm per layer)");
  d("qk_layernorm", "per-head q/k norms are not modelled (2 x head_dim parameters per layer)");
  d("attn_logit_softcapping", "logit soft-capping (one tanh per score) is not modelled");
  d("final_logit_softcapping", "logit soft-capping (one tanh per logit) is not modelled");
  d("query_pre_attn_scalar", "the attention's scale factor changes no cost");
  d("no_rope_layers", "layers without RoPE are not expressible: every layer is written with RoPE");
  d("attention_chunk_size", "chunked local attention is not modelled: every layer attends over the whole sequence");
  d("use_qk_norm", "per-head q/k norms are not modelled");
  d("attn_temperature_tuning", "attention temperature tuning changes no cost");
  d("floor_scale", "attention temperature tuning changes no cost");
  d("attn_scale", "attention temperature tuning changes no cost");
  d("num_nextn_predict_layers", "multi-token prediction layers are not modelled");
  d("scale_attn_weights", "the attention's scale factor changes no cost");
  d("scale_attn_by_inverse_layer_idx", "the attention's scale factor changes no cost");
  d("reorder_and_upcast_attn", "an fp32 upcast inside attention is not modelled");
  d("attention_multiplier", "a scale factor changes no cost");
  if (c.fam == Family::qwen3 || c.fam == Family::qwen3_moe)
    c.imp.drop("q_norm / k_norm (Qwen3 architecture)", "per-head q/k RMSNorms are not modelled: 2 x head_dim "
                                                       "parameters per layer and their small kernels");
  if (c.fam == Family::gemma || c.fam == Family::gemma2)
    c.imp.drop("embedding scaled by sqrt(hidden), norm weights as 1 + w (Gemma architecture)", "no cost difference");
  if (c.fam == Family::gemma2)
    c.imp.drop("post-attention and post-MLP RMSNorms (Gemma 2 architecture)",
               "two more norms per layer are not modelled (2 x hidden parameters per layer)");
  for (const char* k : {"n_positions", "n_ctx", "max_position_embeddings"}) c.f.use(k);
}

void map_dtype_and_run(Ctx& c, int64_t max_pos) {
  std::string dtype = c.opt.dtype;
  if (dtype.empty()) {
    const auto t = c.f.text("torch_dtype");
    if (t && (*t == "bfloat16" || *t == "float16")) dtype = "bf16";
    else if (t && *t == "float32") dtype = "fp32";
    else if (t) c.f.fail("torch_dtype", "'" + escape_control(*t) + "' (bfloat16, float16 or float32)");
    else dtype = "bf16";
    c.imp.set("model", "dtype", dtype, t ? c.f.show("torch_dtype") : "(no torch_dtype: bf16)");
    if (t && *t == "float16") c.imp.drop(c.f.show("torch_dtype"), "fp16 is written as bf16: the same bytes and peak on every modelled device");
  } else {
    c.f.use("torch_dtype");
    c.imp.set("model", "dtype", dtype, "import --dtype " + dtype);
  }
  const int64_t seq = c.opt.seq > 0 ? c.opt.seq : max_pos > 0 ? std::min<int64_t>(max_pos, 4096) : 4096;
  c.imp.set("model", "seq", std::to_string(seq),
            c.opt.seq > 0 ? "import --seq" : "min(max_position_embeddings, 4096) (import --seq to change)");
  if (c.fam == Family::gpt2 && max_pos > 0 && seq != max_pos)
    c.imp.notes.push_back("learned position table: seq rows (" + std::to_string(seq) + "), the checkpoint's n_positions is " +
                          std::to_string(max_pos) + " (parameters differ by the difference x hidden)");
  if (seq > max_pos && max_pos > 0)
    c.imp.notes.push_back("seq " + std::to_string(seq) + " is above max_position_embeddings " + std::to_string(max_pos));
  c.imp.set("model", "batch", std::to_string(c.opt.batch), "import --batch (global batch in sequences)");
  if (c.opt.micro_batch > 0) c.imp.set("model", "micro_batch", std::to_string(c.opt.micro_batch), "import --micro-batch");
  c.imp.set("train", "steps", "1", "import: one simulated step");
}

}  // namespace

Imported import_hf_text(const std::string& text, const std::string& where, const HfOptions& opt) {
  const json top_json = parse_json(text, where);
  Fields top(top_json, where);
  Imported imp;
  imp.origin = "Hugging Face config.json " + where;
  std::string arch;
  const Family fam = family_of(top, arch);
  // Llama 4's decoder lives in text_config; the rest of the file (vision tower, multimodal ids) is not read.
  const bool nested = fam == Family::llama4 && top.has("text_config");
  if (nested && !top.at("text_config").is_object()) top.fail("text_config", "must be an object");
  Fields inner(nested ? top.at("text_config") : top_json, where, nested ? "text_config." : "");
  Fields& f = nested ? inner : top;
  if (nested) {
    top.use("text_config");
    inner.use("architectures");
  }
  Ctx c{imp, f, fam, opt};
  imp.set("model", "model", yaml_string(opt.label.empty() ? std::filesystem::path(where).stem().string() : opt.label),
          "architectures [\"" + arch + "\"]");
  map_shapes(c);
  map_mlp(c);
  map_block(c);
  map_moe(c);
  drop_family_fields(c);
  const int64_t max_pos = f.integer(fam == Family::gpt2 ? "n_positions" : "max_position_embeddings", 1, SpecBounds::seq)
                              .value_or(0);
  map_dtype_and_run(c, max_pos);
  // Everything else, named: no-cost fields in one line, the rest as not read.
  for (Fields* fs : {&top, &inner}) {
    if (fs == &inner && !nested) continue;
    if (fs == &top) top.use("torch_dtype");
    std::string quiet;
    for (const std::string& k : fs->unused()) {
      if (kNoCost.count(k)) quiet += (quiet.empty() ? "" : ", ") + (fs == &inner ? "text_config." + k : k);
      else if (fs == &top && nested)
        imp.drop(top.show(k), "outside text_config (vision tower or multimodal field): the text decoder only");
      else
        imp.drop(fs->show(k), "not read: no mapping for this field (docs/IMPORT.md lists the fields read per family)");
    }
    if (!quiet.empty()) imp.drop(quiet, "token ids, initialisation, cache and output switches: no simulated cost");
  }
  return imp;
}

Imported import_hf(const std::string& path, const HfOptions& opt) {
  return import_hf_text(read_input_file(path, 4u << 20, "a Hugging Face config.json"), path, opt);
}

}  // namespace shardsim::interop

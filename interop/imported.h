// What an import produces: the keys of a shardsim config (model:, parallel:, train: and root keys), each with the
// source field or flag it came from, and every source field or flag it could not express with the reason. The
// importers (hf_config.h, megatron.h, torchtitan.h) fill an Imported; to_yaml writes it as a config whose header
// comment is the mapping table, so nothing is dropped silently (docs/IMPORT.md).
//
// Errors of every importer: ConfigError (exit 2), one line naming the input file (and line, for JSON and TOML) or
// the flag, with every echoed value escaped (common/text.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace shardsim::interop {

// One key written to the config. VALUE is the YAML scalar text (a number, true/false, or a string quoted by
// yaml_string); FROM names the source ("hidden_size 4096", "--hidden-size 4096", "[training] seq_len 8192", or
// "import --seq" for a value the import's own flags chose).
struct Mapped {
  std::string section;  // "model" | "parallel" | "train" | "" (root)
  std::string key;
  std::string value;
  std::string from;
};

// A source field or flag the config does not carry, and why (no cost in the simulation, not modelled yet, ...).
struct Dropped {
  std::string source;
  std::string why;
};

// The mixture-of-experts fields of a source (docs/MOE.md), listed in the header; moe_keys() below is the one place
// that turns them into model.moe keys (kernels/moe_mlp.h's MoeConfig through parse_moe_config).
struct MoeFields {
  int64_t experts = 0;          // routed experts per MoE layer (num_local_experts / num_experts / n_routed_experts)
  int64_t top_k = 0;            // experts per token (num_experts_per_tok / --moe-router-topk)
  int64_t moe_ffn = 0;          // one routed expert's inner size (moe_intermediate_size / --moe-ffn-hidden-size)
  int64_t shared_experts = 0;   // always-on shared experts (n_shared_experts; Qwen2-MoE: 1)
  int64_t shared_ffn = 0;       // the shared expert's inner size (shared_expert_intermediate_size)
  int64_t first_dense = 0;      // leading dense layers (DeepSeek first_k_dense_replace)
  int64_t layer_step = 1;       // every layer_step-th layer is MoE (decoder_sparse_step, interleave_moe_layer_step)
  int64_t expert_parallel = 1;  // --expert-model-parallel-size / expert_parallel_degree
  std::string score;            // router scores: "softmax" | "sigmoid" ("" = the family's default, softmax)
  double aux_coef = 0;          // load-balancing loss coefficient (router_aux_loss_coef / aux_loss_alpha)
  std::optional<bool> normalize;  // the top-k weights normalised to sum 1 (norm_topk_prob); nullopt = default
  double scale = 1;             // routed scaling factor (DeepSeek-V3's routed_scaling_factor)
  std::vector<std::string> sources;  // the source fields, as "name value", for the header
  bool any() const { return experts > 0; }
};
// The model.moe keys of MOE (sharding/plans/expert_parallel_config.h: experts, top_k, expert_ffn, shared_experts,
// shared_ffn, router, normalize, scale, aux_loss_coef, dense_layers, layer_step), section "moe". to_yaml writes
// them as a live model.moe section once the model parser reads one (sharding::kModelKeys holds "moe"), and until
// then as a commented block under model: (the dense skeleton runs; the header names the MoE fields).
std::vector<Mapped> moe_keys(const MoeFields& moe);
// Whether the one model parser reads model.moe (sharding::kModelKeys).
bool moe_section_read();

struct Imported {
  std::string origin;  // "Hugging Face config.json tests/data/hf/llama3_8b.json", "Megatron-LM arguments FILE", ...
  std::string command; // the command line that made it, for the header ("shardsim import hf FILE --seq 4096")
  std::vector<Mapped> keys;
  std::vector<Dropped> dropped;
  std::vector<std::string> notes;  // other lines for the header (defaults chosen, values derived)
  MoeFields moe;
  int64_t chips = 0;  // the world size the source implies (0: not known; then dp is left to the chip count)

  void set(const std::string& section, const std::string& key, const std::string& value, const std::string& from);
  void drop(const std::string& source, const std::string& why) { dropped.push_back({source, why}); }
  // The value written for SECTION.KEY, if any (the last set wins: set() replaces an earlier entry).
  std::optional<std::string> get(const std::string& section, const std::string& key) const;
};

// Root-level keys to carry from an existing config (`import --base CONFIG`): device, topology, mode, name, fold,
// each as YAML text. TOPOLOGY given as a relative path is rewritten to stay valid next to OUT_DIR.
struct BaseConfig {
  std::vector<std::pair<std::string, std::string>> root;  // key, YAML text of its value (block style)
};
// Reads the root keys other than model/workload/parallel/train of FILE (a shardsim config). ConfigError for a bad
// file. OUT_DIR: the folder the written config will live in ("" = the working directory).
BaseConfig read_base(const std::string& file, const std::string& out_dir);

// The config as YAML: the header comment (origin, command, every mapped key with its source, every dropped field
// with its reason, the MoE fields, the notes), then the root keys of BASE (or mode: shape_only when BASE has no
// mode), then model:, parallel:, train: in the order the keys were set. Every echoed source text is escaped and
// kept on one comment line.
std::string to_yaml(const Imported& imp, const BaseConfig& base = {});

// S as a YAML scalar that reads back as the string S (double-quoted, escaped) when it is not a plain safe word.
std::string yaml_string(const std::string& s);
// S double-quoted with \\ and \" escaped and control characters as \uXXXX: a YAML double-quoted scalar and a TOML
// basic string alike (yaml_string's quoted form; export torchtitan's strings).
std::string quoted_string(const std::string& s);
// A double as the shortest text that reads back as the same value ("1e-05", "500000").
std::string number_text(double v);
// The same for a float (AdamW's hyper-parameters are fp32): "0.01", not the double expansion of 0.01f.
std::string float_text(float v);

}  // namespace shardsim::interop

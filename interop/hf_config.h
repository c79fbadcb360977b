// Model shapes from a Hugging Face `config.json` (the file every model on the hub ships; transformers'
// PretrainedConfig subclasses define its fields: LlamaConfig, MistralConfig, MixtralConfig, Qwen2Config,
// Qwen2MoeConfig, Qwen3Config, Qwen3MoeConfig, DeepseekV3Config, GPT2Config, GPTNeoXConfig, GemmaConfig,
// Gemma2Config, Llama4Config).
//
// Every field of the file ends in exactly one of three places, listed in the written config's header: a model:
// key (sharding/model_spec.h's ModelSpec), a "not expressed" line with the reason, or the MoE record
// (imported.h's MoeFields). docs/IMPORT.md has the table per family.
//
// Architectures (the `architectures` list's first entry): LlamaForCausalLM (Llama 2, 3, 3.1-3.3), Llama4ForCausalLM
// and Llama4ForConditionalGeneration (its text_config), MistralForCausalLM, MixtralForCausalLM, Qwen2ForCausalLM,
// Qwen2MoeForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM, DeepseekV3ForCausalLM, GPT2LMHeadModel,
// GPTNeoXForCausalLM, GemmaForCausalLM, Gemma2ForCausalLM. Any other value is refused naming it.
//
// Errors: ConfigError (exit 2) "FILE:LINE: ..." for JSON that does not parse (truncated, a duplicate key), and
// "FILE: FIELD: ..." for a missing field, a value of the wrong type or out of shardsim's bounds (docs/CONFIG.md,
// "Bounds"), or an unknown architecture. Values are echoed escaped.
#pragma once

#include <cstdint>
#include <string>

#include "interop/imported.h"

namespace shardsim::interop {

struct HfOptions {
  int64_t seq = 0;          // tokens per sequence; 0 = min(max_position_embeddings, 4096)
  int64_t batch = 1;        // global batch in sequences
  int64_t micro_batch = 0;  // 0 = none
  std::string dtype;        // fp32 | bf16; "" = from torch_dtype (bfloat16 / float16 -> bf16, float32 -> fp32)
  std::string label;        // model.model; "" = the file's stem
};

// Imports the config.json at PATH (a regular file of at most 4 MiB).
Imported import_hf(const std::string& path, const HfOptions& opt = {});
// The same for TEXT read from WHERE (tests; `model: {from_hf: ...}` readers).
Imported import_hf_text(const std::string& text, const std::string& where, const HfOptions& opt = {});

}  // namespace shardsim::interop

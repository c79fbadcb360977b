// Megatron-LM (and NeMo's Megatron) launch arguments in and out (Megatron-LM's megatron/training/arguments.py
// defines the flags and their defaults; docs/IMPORT.md has the table of every flag read, ignored or refused).
//
// Import: the arguments of a launch line or a launch script: torchrun's own flags (--nproc_per_node, --nnodes give
// the world size), then pretrain_gpt.py's. A script's shell scalars (NAME=value), arrays (NAME=( ... )) and their
// uses ($NAME, ${NAME}, ${NAME[@]}), comments and line continuations are read; anything else of the shell is
// not (an unexpanded $VAR stays literal, and a numeric flag holding one is an error naming the flag).
// Megatron's defaults apply to absent flags (learned positions, LayerNorm, GeLU, tied embeddings, biases, dropout
// 0.1, ffn 4h or 8h/3 rounded down to 64 with --swiglu, the vocabulary padded to a multiple of
// --make-vocab-size-divisible-by x tp).
//
// Errors (ConfigError, exit 2): "WHERE:LINE: --flag: ..." for a value that is not a number or out of bounds, two
// flags that contradict (--fp16 with --bf16), tp x pp x cp not dividing the world size, a global batch that
// micro-batch x dp does not divide, virtual stages that do not divide the layers; values echoed escaped.
#pragma once

#include <string>
#include <vector>

#include "interop/imported.h"
#include "interop/launch.h"

namespace shardsim::interop {

// ARG: a file holding the arguments (a launch script or one line), or the arguments themselves as one string.
Imported import_megatron(const std::string& arg, const LaunchOptions& opt = {});
// The same for TEXT named WHERE in messages.
Imported import_megatron_text(const std::string& text, const std::string& where, const LaunchOptions& opt = {});

// The launch line of SRC's model and plan: `torchrun --nnodes N --nproc_per_node G pretrain_gpt.py \` and one
// Megatron-LM flag per line. What Megatron-LM cannot express is listed first as comment lines ("# not expressible
// ..."), also returned in UNEXPRESSED when given.
std::string export_megatron(const PlanSource& src, std::vector<Unexpressed>* unexpressed = nullptr);

}  // namespace shardsim::interop

// Activation memory of one transformer layer: the tensors a layer's forward keeps for its backward, one by one,
// under tensor parallelism, sequence parallelism and the three recomputation schemes (parallel.recompute: none |
// selective | full), for two attention implementations:
//
//   Megatron's (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
//   arXiv:2205.05198, §4.1 and Table 2): the attention core materialises the [s, s] scores per head: the softmax
//   output (2·a·s²·b bytes in 16-bit), its dropout mask (a·s²·b) and the dropout output (2·a·s²·b) = 5·a·s²·b,
//   with dropout masks of 1 byte per element after the attention and the MLP.
//   shardsim's trainer with model.attention_impl: flash (models/lm_tp.h): flash-style attention keeps no [s, s]
//   tensor, only the fp32 log-sum-exp per (head, token), and its backward recomputes the core from q, k and it;
//   no dropout. With attention_impl: unfused and dropout > 0 the trainer keeps Megatron's inventory (the softmax
//   output as a tensor, the charged dropout's masks and output as bytes: BlockActivations::charged_bytes).
//
// Per layer, s = seq, b = sequences of the micro-batch, h = hidden, a = query heads, t = tp, e = bytes per element
// of the compute dtype (2 for 16-bit), with the paper's GPT block (MHA, MLP h -> 4h -> h, GELU), none kept:
//   layer input (LayerNorm 1's)    e·sbh          /t under sp
//   LayerNorm 1 output (QKV input) e·sbh          /t under sp (Megatron keeps it sharded and re-gathers it)
//   Q, K                           2e·sbh /t      (q: a·d columns, k: kv_heads·d)
//   V                              e·sbh /t
//   attention core [s, s]          5as²b /t       (Megatron; selective recomputation drops it) | 4·a·s·b/t lse (flash)
//   projection input               e·sbh /t
//   attention dropout mask         sbh            /t under sp (Megatron only)
//   LayerNorm 2 input and output   2e·sbh         /t under sp
//   MLP: GELU input and output     2e·sb·ffn /t   (SwiGLU: gate, up and their product, 3e·sb·ffn /t)
//   MLP dropout mask               sbh            /t under sp (Megatron only)
// With e = 2 and ffn = 4h the sum is the paper's Table 2: sbh(34 + 5as/h) without parallelism, sbh(10 + 24/t +
// 5as/(ht)) with tp, sbh(34/t + 5as/(ht)) with tp + sp; selective recomputation drops the 5as/h terms; full
// recomputation keeps only the layer input: 2sbh (2sbh/t with sp). tests/unit/lm_activations_test.cpp checks
// these, and that the trainer's kept tensors (LmCache) are the flash inventory's.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "models/lm_model.h"

namespace shardsim::models {

enum class Recompute { none, selective, full };
const char* recompute_name(Recompute r);  // "none" | "selective" | "full"

struct ActivationScheme {
  int tp = 1;
  bool sp = false;
  Recompute recompute = Recompute::none;
  bool megatron_core = true;  // Megatron's materialised core and dropout masks; false: shardsim's flash, no dropout
  double element_bytes = 2;   // bytes per element of the compute dtype
};

struct ActivationTerm {
  std::string name;
  double bytes = 0;
};

// The tensors one layer of C keeps per micro-batch of MICRO_BATCH sequences of c.seq tokens, on one chip.
std::vector<ActivationTerm> lm_layer_activation_terms(const ModelSpec& c, int64_t micro_batch, const ActivationScheme& s);
double lm_layer_activation_bytes(const ModelSpec& c, int64_t micro_batch, const ActivationScheme& s);

}  // namespace shardsim::models

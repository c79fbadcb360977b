// The elementwise work of Megatron's linear-layer biases and dropout (model.linear_bias, model.dropout), charged on
// the timeline without computing it: shardsim's blocks have no bias parameters and drop no element (the losses
// are those of a bias-free model with dropout 0), but the published Megatron runs executed these kernels, and a
// step time that leaves them out is too fast. What is charged, per block and chip (N = the GEMMs' token rows,
// R = the residual stream's rows, N / tp under sequence parallelism, h = hidden, e = bytes per element):
//
//   forward
//     bias_add.qkv            QKV output [N, qkv columns] read and written (3-D torch.matmul + bias add); the other
//                             biases ride in fused kernels (bias-GELU, bias-dropout-add): their vectors only
//     dropout.attention_out   the 1-byte mask of the fused bias-dropout-add after the attention projection, R·h
//     dropout.mlp_out         the same after the MLP
//   backward
//     dropout_backward.*      gradient and mask read, gradient written: (2e + 1)·R·h each
//     bias_grad.*             each bias's gradient, a column sum of its output's gradient: QKV e·N·qkv, fc1
//                             e·N·ffn, projection and fc2 e·R·h
//   activations (kept for the backward): the two hidden dropout masks, R·h bytes each (Korthikanti et al. 2022,
//   Table 2's sbh terms); the attention dropout's mask and output belong to the attention core
//   (kernels/attention_unfused.h; models/lm_activations.h).
// Attention dropout itself is charged by the unfused attention core (kernels/attention_unfused.h); flash-style
// kernels fuse it (no extra traffic).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/kernel_cost.h"
#include "runtime/dtype.h"

namespace shardsim::kernels {

struct BlockExtras {
  int64_t rows = 0;           // N: token rows of the GEMMs on this chip
  int64_t residual_rows = 0;  // R: rows of the residual stream on this chip
  int64_t qkv_cols = 0;       // this chip's q, k and v columns
  int64_t ffn_cols = 0;       // this chip's MLP columns (fc1's output)
  int64_t hidden = 0;
  runtime::DType dtype = runtime::DType::fp32;
  double dropout = 0;
  bool bias = false;
};

std::vector<KernelCost> block_extras_forward(const BlockExtras& x);
std::vector<KernelCost> block_extras_backward(const BlockExtras& x);
// Bytes the charged dropout keeps for the backward (the two hidden masks).
double block_extras_activation_bytes(const BlockExtras& x);

}  // namespace shardsim::kernels

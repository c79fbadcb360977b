// FP8 GEMM inputs, simulated on the host: the FP8 training recipes of NVIDIA Transformer Engine and DeepSeek-V3.
//
// An FP8 GEMM C = A · B multiplies A and B quantised to an FP8 format, each block of elements with its own scale,
// accumulates in fp32 and writes C in the model's dtype (bf16 or fp32). Quantising a block X with format F:
//   s = max_finite(F) / amax(X)          (amax 0 or not finite: s = 1)
//   x̂ = F(x · s) / s                      F(): round to nearest even, saturating at ±max_finite (runtime/dtype.h)
// The GEMM then computes with the x̂ values in fp32, which is what an FP8 tensor core computes (products of the FP8
// codes, the 1/(s_a · s_b) applied in the epilogue), up to the order of the fp32 accumulation.
//
// Scalings (Fp8Scaling):
//   tensor  one scale per operand: per-tensor *current* scaling (Transformer Engine's Float8CurrentScaling recipe).
//           TE's DelayedScaling takes the scale from the amax history of earlier steps instead; that needs state per
//           tensor across steps and is not modelled (the current amax is its steady state).
//   block   DeepSeek-V3's fine-grained scaling (arXiv 2412.19437, section 3.3.2; TE's Float8BlockScaling): the
//           activation-side operand A in 1 x 128 tiles along the contraction (one scale per row and 128 columns
//           of K), the weight-side operand B in 128 x 128 blocks of (K, N).
// Format: one FP8 format for both operands (E4M3 by default: DeepSeek-V3 uses E4M3 for every tensor; TE's
// Format.E4M3). TE's HYBRID recipe (E5M2 for gradients only) needs the caller to say which operand is a gradient:
// not offered.
//
// What an FP8 GEMM costs (gemm(), kernels/gemm.h, while a recipe is active): its FLOPs at the device's fp8 peak
// (KernelCost::dtype fp8_e4m3 or fp8_e5m2; devices without an fp8 peak fall back to fp16/bf16), A and B read as
// one byte per element, C written in its dtype. The casts are not charged per GEMM: fp8_block_cast_cost charges
// a block's activation and gradient casts as Transformer Engine runs them (fused into LayerNorm and the activation
// where TE fuses them, cast-transposes elsewhere), and fp8_weight_cast_cost each weight's once-per-step cast.
//
// The recipe is process-wide (set_fp8_recipe / Fp8Scope): every kernels::gemm and gemm_rows call on this process
// while it is active quantises its inputs. The default is none (no FP8).
#pragma once

#include <cstdint>
#include <string>

#include "kernels/kernel_cost.h"
#include "runtime/dtype.h"

namespace shardsim::kernels {

enum class Fp8Scaling { none, tensor, block };

struct Fp8Recipe {
  Fp8Scaling scaling = Fp8Scaling::none;
  runtime::DType format = runtime::DType::fp8_e4m3;  // fp8_e4m3 or fp8_e5m2
  bool active() const { return scaling != Fp8Scaling::none; }
};

// "none", "tensor", "block" <-> Fp8Scaling; parse throws std::invalid_argument listing the names.
std::string fp8_scaling_name(Fp8Scaling s);
Fp8Scaling parse_fp8_scaling(const std::string& name);

// The active recipe (none unless set).
const Fp8Recipe& fp8_recipe();
// Sets it; std::invalid_argument when the format is not fp8_e4m3 or fp8_e5m2.
void set_fp8_recipe(const Fp8Recipe& r);

// Sets a recipe for its lifetime and restores the previous one.
class Fp8Scope {
 public:
  explicit Fp8Scope(const Fp8Recipe& r) : saved_(fp8_recipe()) { set_fp8_recipe(r); }
  ~Fp8Scope() { set_fp8_recipe(saved_); }
  Fp8Scope(const Fp8Scope&) = delete;
  Fp8Scope& operator=(const Fp8Scope&) = delete;

 private:
  Fp8Recipe saved_;
};

// Quantises (and dequantises) a logical ROWS x COLS matrix in place, fp32 values at X[r · row_stride + c ·
// col_stride], with FORMAT: one scale for the whole matrix (TILE_ROWS = TILE_COLS = 0) or one per tile of
// TILE_ROWS x TILE_COLS (the last tiles clipped). Used by gemm(); public for tests.
void fp8_quantize_dequantize(float* x, int64_t rows, int64_t cols, int64_t row_stride, int64_t col_stride,
                             runtime::DType format, int64_t tile_rows, int64_t tile_cols);

// The activation-side FP8 casts of one transformer block's linear layers, as Transformer Engine runs them in
// training (TE 1.x: pytorch/module/{linear,layernorm_linear,layernorm_mlp}.py with cpp_extensions/transpose.py):
// every FP8 GEMM input is needed twice, row-wise for the forward GEMM and transposed for the weight gradient, so
//   forward   an input cast by its own kernel (the attention output before the output projection:
//             fp8_cast_transpose_fused) reads its dtype and writes both FP8 copies (dtype + 2 bytes per element);
//             an input whose cast the producing kernel fuses (LayerNorm before QKV and FC1, the activation before
//             FC2) still needs its FP8 transpose (fp8_transpose: 2 bytes per element);
//   backward  every output gradient dY is cast and transposed (fp8_cast_transpose_fused, or its bgrad / dgelu
//             fusions) before its dX and dW GEMMs: dtype + 2 bytes per element.
// Amax and scale are computed inside those kernels (2 FLOPs per element). Units: TOKENS rows; features summed over
// the block's linears on this chip. One kernel per pass and block (TE launches one per linear: the launches are
// under-counted, the bytes are not).
struct Fp8BlockLinears {
  double tokens = 0;    // rows every linear of the block sees on this chip
  double fused_in = 0;  // input features whose FP8 cast the producer fuses (LN -> QKV, LN -> FC1, act -> FC2)
  double cast_in = 0;   // input features cast by their own kernel (attention output -> proj)
  double out = 0;       // output features of every linear (their dY is cast in the backward)
};
// The block of a dense transformer layer: weights [in, out] on this chip (W_GATE may be empty: no gated MLP; an
// empty W_UP: the MLP is not a dense one, e.g. MoE experts, and only the attention's linears count).
Fp8BlockLinears fp8_block_linears(double tokens, const runtime::Tensor& wq, const runtime::Tensor& wk,
                                  const runtime::Tensor& wv, const runtime::Tensor& wo, const runtime::Tensor& w_gate,
                                  const runtime::Tensor& w_up, const runtime::Tensor& w_down);
// "fp8.cast_transpose" (forward) / "fp8.cast_transpose_dgrad" (backward); 0 FLOPs and bytes when R is inactive.
KernelCost fp8_block_cast_cost(const Fp8BlockLinears& b, runtime::DType from, const Fp8Recipe& r, bool backward);

// The once-per-step cast of NUMEL weight elements of dtype FROM to the recipe's format, with its amax: one vector
// kernel reading each element once and writing one byte ("fp8.cast_weights"; 0 elements: 0 FLOPs and bytes).
KernelCost fp8_weight_cast_cost(double numel, runtime::DType from, const Fp8Recipe& r);

// The FP8 casts around a grouped (MoE experts') MLP, as Transformer Engine's GroupedLinear runs them in training
// (TE 1.x pytorch/module/grouped_linear.py: fp8_multi_cast_transpose, one kernel over every group's input per
// grouped GEMM, no LayerNorm or activation fusion): ELEMENTS of dtype FROM read once and written twice in FP8
// (row-wise for the GEMM, transposed for the weight gradient), 2 FLOPs each. Forward: one such kernel for the
// dispatched tokens before FC1 and one for the activation before FC2 ("fp8.cast_transpose.experts"); backward:
// one for FC2's output gradient and one for FC1's ("fp8.cast_transpose_dgrad.experts"). 0 FLOPs and bytes when R
// is inactive or ELEMENTS <= 0 (the caller then charges nothing).
KernelCost fp8_grouped_cast_cost(double elements, runtime::DType from, const Fp8Recipe& r, bool backward);

// Delayed scaling's once-per-pass bookkeeping (Transformer Engine's DelayedScaling recipe, the default of
// Megatron-LM / NeMo FP8 training: fp8_autocast's exit, TE 1.x pytorch/fp8.py reduce_and_update_fp8_tensors with
// tex.fused_amax_and_scale_update_after_reduction): after each forward and each backward pass of a micro-batch,
// one fused kernel rolls the amax history of every FP8 tensor of the pass (HISTORY fp32 entries each, read and
// written) and recomputes its scale (a few fp32 values). TENSORS: the FP8 tensors of the pass on this chip
// (forward: each linear's input and weight; backward: each linear's output gradient). "fp8.amax_scale_update";
// 0 FLOPs and bytes when R is inactive, TENSORS <= 0, or R's scaling is not per-tensor (block scaling keeps no
// history). The amax all-reduce across the data- and tensor-parallel group that precedes it is not charged.
KernelCost fp8_amax_update_cost(double tensors, double history, const Fp8Recipe& r);
// The amax history length charged: NeMo's FP8 default (fp8_amax_history_len: 1024 in its GPT / Llama training
// configs; Megatron-LM's own --fp8-amax-history-len defaults to 1).
inline constexpr double kFp8AmaxHistory = 1024;

}  // namespace shardsim::kernels

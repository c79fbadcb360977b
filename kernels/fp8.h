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
// one byte per element, C written in its dtype. The casts are not charged per GEMM: Transformer Engine fuses the
// cast (and its amax) of activations and gradients into the kernels that produce them (LayerNorm, GELU, the
// cast-transpose of dY), and casts each weight once per step; fp8_weight_cast_cost charges that once-per-step cast.
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

// The once-per-step cast of NUMEL weight elements of dtype FROM to the recipe's format, with its amax: one vector
// kernel reading each element once and writing one byte ("fp8.cast_weights"; 0 elements: 0 FLOPs and bytes).
KernelCost fp8_weight_cast_cost(double numel, runtime::DType from, const Fp8Recipe& r);

}  // namespace shardsim::kernels

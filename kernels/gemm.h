// C = A · B on one chip, through CBLAS (OpenBLAS).
//
// Shapes: A [M, K] (or [K, M] with trans_a), B [K, N] (or [N, K] with trans_b), C [M, N]; all row-major.
// Dtypes: all three tensors share one dtype. fp32 calls cblas_sgemm directly. bf16 widens A and B to fp32,
// multiplies with fp32 accumulation and rounds C to bf16 once (what bf16 tensor engines do).
// Cost: 2·M·N·K FLOPs; bytes = (M·K + K·N + M·N) · element size.
// FP8: while an FP8 recipe is active (kernels/fp8.h), A and B are quantised by it before the multiply (fp32
// accumulation, C rounded once to its dtype) and the cost is the FP8 GEMM's: dtype fp8_e4m3/e5m2 (the device's fp8
// peak), A and B one byte per element. gemm_rows alike.
// Errors: std::invalid_argument naming the shapes when they do not fit.
#pragma once

#include "kernels/kernel_cost.h"
#include "runtime/tensor.h"

namespace shardsim::kernels {

struct GemmOptions {
  bool trans_a = false;
  bool trans_b = false;
};

// C must already have shape [M, N] and the dtype of A and B.
KernelCost gemm(const runtime::Tensor& a, const runtime::Tensor& b, runtime::Tensor& c, const GemmOptions& o = {});

// C[c_row0 : c_row0 + rows] = A[a_row0 : a_row0 + rows] · B, in place in C (no copies of A or C): the row-block
// form the fused ops use. A [*, K], B [K, N], C [*, N]; fp32 or bf16 as above. Cost: that of a [rows, K] x [K, N]
// GEMM. Errors: std::invalid_argument naming the shapes and rows.
KernelCost gemm_rows(const runtime::Tensor& a, int64_t a_row0, int64_t rows, const runtime::Tensor& b,
                     runtime::Tensor& c, int64_t c_row0);

// A [M, N] -> A^T [N, M] (same dtype; shape-only in, shape-only out). Not a kernel and not charged: it stands for
// a GEMM reading its operand transposed (BLAS op T, as the tied LM head reads the embedding table), which costs
// what the untransposed GEMM costs; callers charge the GEMM.
runtime::Tensor transposed(const runtime::Tensor& a);

// Threads OpenBLAS may use in this process (1 per rank when ranks share the host's cores).
void set_blas_threads(int n);

}  // namespace shardsim::kernels

// Fitting the shaped kernel model (sim/kernel_model.h) to measured kernel times (`shardsim calibrate --kernels`).
//
// Input: a CSV table (RFC 4180, common/csv.h), one measured kernel per row, lines starting with # ignored:
//     kernel,dtype,m,n,k,batch,causal,time_us
//     gemm,bf16,8192,8192,8192,1,0,1391.2
//   kernel   gemm (C[m, n] = A[m, k]·B[k, n], BATCH independent ones), gemm_backward (dX and dW of that GEMM),
//            attention_forward / attention_backward (flash attention: M query rows, N key rows, head dim K, BATCH
//            = sequences x query heads, CAUSAL 0 or 1), copy (M x N elements read and written: the HBM rate)
//   dtype    fp32, bf16, fp16, ... (runtime/dtype.h names): the peak the kernel runs at
//   time_us  the measured time of one kernel, microseconds (> 0)
// The causal column may be omitted (0). FLOPs and bytes of each row are the simulator's own kernels' (shape-only
// calls of kernels/), so a fit describes exactly what the simulation charges.
//
// Model fitted: t = launch + max(flops·q / (peak·e_C), bytes / (hbm·e_hbm), engines) with the device's peaks,
// launch overhead, compute units, tiles, tensor engine and element-wise engine rates as given; the fit chooses
// e_gemm, e_gemm_fp8 (GEMM rows at the device's fp8 peak: gemm_efficiency_fp8; listed only when the table has
// such rows), e_attention_forward, e_attention_backward and e_hbm. Each row is bound by one term (a row bound by the
// element-wise engines, whose rates are fixed, informs no parameter and is reported "engine"); the fit alternates between assigning rows to their binding term and
// a least-squares solve of each term's 1/e over its rows (relative errors, so small and large kernels weigh
// alike), until the assignment stops changing. A parameter with no row bound by it keeps the device's value and
// is reported as not fitted. A fitted e above 1 (faster than the datasheet) is reported as impossible; with strict
// it is an error.
//
// Errors: ConfigError (exit 2) "FILE:LINE: ..." for a bad header, an unknown kernel or dtype, a size that is
// not a positive integer (or overflows), a time that is not a finite positive number, a wrong field count, or a
// table with no rows.
#pragma once

#include <string>
#include <vector>

#include "sim/device_spec.h"
#include "sim/kernel_model.h"

namespace shardsim::kernels {

struct KernelRow {
  int line = 0;
  std::string kernel;  // as written
  sim::KernelShape shape;
  sim::Precision precision = sim::Precision::fp32;
  double flops = 0, bytes = 0;
  double measured_ns = 0;
  double predicted_ns = 0;  // after the fit
  std::string bound;        // "compute", "memory" or "engine" after the fit
};

// The rows of TEXT (FILE names it in errors).
std::vector<KernelRow> parse_kernel_table(const std::string& text, const std::string& file);

struct KernelFit {
  sim::KernelParams fitted;           // DEVICE's params with the fitted fractions
  std::vector<std::string> fitted_names;      // e.g. "gemm_efficiency"
  std::vector<std::string> not_fitted;        // parameters no row was bound by
  std::vector<std::string> impossible;        // fitted above 1
  std::vector<KernelRow> rows;                // with predictions
  double rms_relative_error = 0;
  int iterations = 0;
};

// Fits DEVICE's kernel model to ROWS (the shaped model is switched on). Throws ConfigError when ROWS is empty.
KernelFit fit_kernel_model(const sim::DeviceSpec& device, std::vector<KernelRow> rows);

// A device: section that every command accepts (--device-file / `device:` in a config): the preset, or the
// device's own numbers, plus the fitted kernel keys.
std::string device_override_yaml(const sim::DeviceSpec& device, const sim::KernelParams& fitted,
                                 const std::string& comment);

}  // namespace shardsim::kernels

#include "kernels/kernel_calibrate.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <iterator>
#include <sstream>

#include "common/checked.h"
#include "common/csv.h"
#include "common/error.h"
#include "common/number.h"
#include "common/text.h"
#include "kernels/attention.h"
#include "kernels/attention_backward.h"
#include "kernels/backward.h"
#include "kernels/gemm.h"
#include "runtime/dtype.h"
#include "runtime/tensor.h"

namespace shardsim::kernels {

using runtime::DType;
using runtime::Tensor;

namespace {

constexpr const char* kColumns[] = {"kernel", "dtype", "m", "n", "k", "batch", "causal", "time_us"};
constexpr int64_t kMaxDim = int64_t(1) << 24;  // 16 Mi elements per dimension: far above any real kernel

[[noreturn]] void fail(const std::string& file, int line, const std::string& what) {
  throw ConfigError(file + ":" + std::to_string(line) + ": " + what);
}

int64_t parse_dim(const std::string& file, int line, const std::string& col, const std::string& v) {
  const int64_t x = decimal_int(v).value_or(0);  // decimal only (common/number.h)
  if (x < 1 || x > kMaxDim)
    fail(file, line, col + " must be an integer in 1.." + std::to_string(kMaxDim) + " (got '" + escape_control(v) + "')");
  return x;
}

Tensor shape_only(DType d, runtime::Shape s) { return Tensor::make(d, std::move(s), false); }

// FLOPs, bytes and shape of row R from the simulator's own kernels, called shape-only.
void cost_row(KernelRow& r, DType dt, int64_t m, int64_t n, int64_t k, int64_t batch, bool causal) {
  KernelCost c;
  if (r.kernel == "gemm") {
    Tensor a = shape_only(dt, {m, k}), b = shape_only(dt, {k, n}), out = shape_only(dt, {m, n});
    c = gemm(a, b, out);
  } else if (r.kernel == "gemm_backward") {
    Tensor x = shape_only(dt, {m, k}), w = shape_only(dt, {k, n}), dy = shape_only(dt, {m, n});
    Tensor dx = shape_only(dt, {m, k}), dw = shape_only(dt, {k, n});
    c = gemm_backward(x, w, dy, &dx, &dw);
  } else if (r.kernel == "attention_forward" || r.kernel == "attention_backward") {
    AttentionOptions o;
    o.causal = causal;
    c = r.kernel == "attention_forward" ? attention_cost(m, n, batch, batch, k, dt, dt, o)
                                        : attention_backward_cost(m, n, batch, batch, k, dt, dt, o);
    batch = 1;  // the heads are the batch, already counted
  } else {      // copy
    c.bytes = 2.0 * double(m) * double(n) * double(runtime::dtype_size(dt));
  }
  r.flops = c.flops * double(batch);
  r.bytes = c.bytes * double(batch);
  r.shape = c.shape;
  if (r.kernel != "copy" && r.kernel.rfind("attention", 0) != 0) r.shape.batch = batch;
}

}  // namespace

std::vector<KernelRow> parse_kernel_table(const std::string& text, const std::string& file) {
  const CsvRecords split = csv_records(text);
  std::vector<CsvRecord> recs;
  for (const auto& r : split.records) {
    const bool blank = r.fields.size() == 1 && r.fields[0].find_first_not_of(" \t") == std::string::npos;
    if (blank || (!r.fields.empty() && !r.fields[0].empty() && r.fields[0][0] == '#')) continue;
    recs.push_back(r);
  }
  if (split.truncated) fail(file, int(std::count(text.begin(), text.end(), '\n')) + 1, "last line has no newline (truncated file?)");
  if (recs.empty()) throw ConfigError(file + ": no header and no rows (want: kernel,dtype,m,n,k,batch,causal,time_us)");
  // Header: the columns by name; causal is optional.
  const auto& head = recs[0].fields;
  std::vector<int> col(8, -1);
  for (size_t i = 0; i < head.size(); ++i) {
    int found = -1;
    for (int c = 0; c < 8; ++c)
      if (head[i] == kColumns[c]) found = c;
    if (found < 0 || col[size_t(found)] >= 0)
      fail(file, recs[0].line, "unexpected column '" + escape_control(head[i]) +
                                   "' (want: kernel,dtype,m,n,k,batch,causal,time_us; causal optional)");
    col[size_t(found)] = int(i);
  }
  for (int c = 0; c < 8; ++c)
    if (c != 6 && col[size_t(c)] < 0) fail(file, recs[0].line, std::string("missing column '") + kColumns[c] + "'");
  std::vector<KernelRow> rows;
  for (size_t i = 1; i < recs.size(); ++i) {
    const auto& f = recs[i].fields;
    const int line = recs[i].line;
    if (f.size() != head.size())
      fail(file, line, std::to_string(f.size()) + " fields, the header has " + std::to_string(head.size()));
    auto at = [&](int c) { return f[size_t(col[size_t(c)])]; };
    KernelRow r;
    r.line = line;
    r.kernel = at(0);
    if (r.kernel != "gemm" && r.kernel != "gemm_backward" && r.kernel != "attention_forward" &&
        r.kernel != "attention_backward" && r.kernel != "copy")
      fail(file, line, "unknown kernel '" + escape_control(r.kernel) +
                           "' (known: gemm, gemm_backward, attention_forward, attention_backward, copy)");
    DType dt;
    try {
      dt = runtime::parse_dtype(at(1));
    } catch (const std::exception& e) {
      fail(file, line, "dtype: " + escape_control(e.what()));
    }
    r.precision = runtime::precision_of(dt);
    const int64_t m = parse_dim(file, line, "m", at(2)), n = parse_dim(file, line, "n", at(3));
    const int64_t k = parse_dim(file, line, "k", at(4)), batch = parse_dim(file, line, "batch", at(5));
    if (!checked_product({m, n, k, batch}) || !checked_product({m, n, batch, 16}))
      fail(file, line, "m x n x k x batch overflows");
    bool causal = false;
    if (col[6] >= 0) {
      const std::string c = at(6);
      if (c != "0" && c != "1" && !c.empty()) fail(file, line, "causal must be 0 or 1 (got '" + escape_control(c) + "')");
      causal = c == "1";
    }
    const std::string t = at(7);
    const double us = decimal_double(t).value_or(NAN);  // decimal only (common/number.h): strtod took '0x10'
    if (!(us >= 1e-3 && us <= 1e9))  // 1 ns .. 1000 s; false for NaN
      fail(file, line, "time_us must be a number from 0.001 to 1e9 (got '" + escape_control(t) + "')");
    r.measured_ns = us * 1e3;
    try {  // the simulator's kernels check their arguments (e.g. attention takes fp32 or bf16 only)
      cost_row(r, dt, m, n, k, batch, causal);
    } catch (const ConfigError&) {
      throw;
    } catch (const std::exception& e) {
      fail(file, line, r.kernel + " with dtype " + escape_control(at(1)) + ": " + escape_control(e.what()));
    }
    rows.push_back(std::move(r));
  }
  if (rows.empty()) throw ConfigError(file + ": a header but no rows");
  return rows;
}

namespace {

// The efficiency field of the term that binds ROW's compute side on DEV: a GEMM that runs at the fp8 peak has its
// own ceiling (gemm_efficiency_fp8, sim/kernel_model.h), the others gemm_efficiency.
double* compute_param(const sim::DeviceSpec& dev, sim::KernelParams& p, const KernelRow& r) {
  switch (r.shape.cls) {
    case sim::KernelClass::gemm:
    case sim::KernelClass::gemm_backward:
      return dev.effective_precision(r.precision) == sim::Precision::fp8 ? &p.gemm_efficiency_fp8
                                                                          : &p.gemm_efficiency;
    case sim::KernelClass::attention_forward: return &p.attention_forward_efficiency;
    case sim::KernelClass::attention_backward: return &p.attention_backward_efficiency;
    case sim::KernelClass::vector: return nullptr;
  }
  return nullptr;
}

// Which term binds KT: 1 compute (the tensor engine), 0 memory (HBM), 2 the element-wise engines (the model's
// fixed rates: no parameter of the fit).
char binding(const sim::KernelTime& kt) {
  if (kt.engine_bound()) return 2;
  return kt.compute_ns >= kt.memory_ns ? 1 : 0;
}

}  // namespace

KernelFit fit_kernel_model(const sim::DeviceSpec& device, std::vector<KernelRow> rows) {
  if (rows.empty()) throw ConfigError("calibrate --kernels: no rows to fit");
  // The model's kernel takes at least the launch overhead: a faster measurement cannot be fitted (its relative
  // error would be any number).
  for (const auto& r : rows)
    if (r.measured_ns <= device.launch_overhead_ns)
      throw ConfigError("calibrate --kernels: line " + std::to_string(r.line) + ": time_us " +
                        std::to_string(r.measured_ns / 1e3) + " is not above the device's launch overhead (" +
                        std::to_string(device.launch_overhead_ns / 1e3) + " us; device.launch_overhead_ns)");
  sim::DeviceSpec dev = device;
  dev.kernel.shaped = true;
  sim::KernelParams& p = dev.kernel;
  // FP8 GEMM rows fit their own ceiling; it starts where the model starts it (unset: gemm_efficiency).
  if (p.gemm_efficiency_fp8 <= 0) p.gemm_efficiency_fp8 = p.gemm_efficiency;
  const std::pair<const char*, double*> params[] = {
      {"gemm_efficiency", &p.gemm_efficiency},
      {"gemm_efficiency_fp8", &p.gemm_efficiency_fp8},
      {"attention_forward_efficiency", &p.attention_forward_efficiency},
      {"attention_backward_efficiency", &p.attention_backward_efficiency},
      {"hbm_efficiency", &p.hbm_efficiency}};
  KernelFit fit;
  std::vector<char> bound(rows.size(), 0), prev;  // 1: compute-bound, 0: memory-bound, 2: engine-bound (no parameter)
  for (int it = 0; it < 100; ++it) {
    fit.iterations = it + 1;
    for (size_t i = 0; i < rows.size(); ++i) {
      const auto kt = sim::kernel_time(dev, rows[i].flops, rows[i].bytes, rows[i].precision, rows[i].shape);
      bound[i] = binding(kt);
    }
    if (bound == prev) break;
    prev = bound;
    // Least squares of u = 1/e per parameter on relative errors: residual (launch + x·u - t) / t.
    for (const auto& [name, field] : params) {
      double sxx = 0, sxy = 0;
      for (size_t i = 0; i < rows.size(); ++i) {
        const KernelRow& r = rows[i];
        double x;  // the term's time at e = 1
        if (bound[i] == 2) continue;
        if (bound[i]) {
          if (compute_param(dev, p, r) != field) continue;
          x = r.flops * sim::kernel_quantization(dev, r.shape) / dev.peak_flops_per_ns(r.precision);
        } else {
          if (field != &p.hbm_efficiency) continue;
          x = r.bytes / dev.hbm_gbps;
        }
        const double t = r.measured_ns;
        sxx += (x / t) * (x / t);
        sxy += (x / t) * ((t - dev.launch_overhead_ns) / t);
      }
      if (sxx > 0 && sxy > 0) *field = sxx / sxy;
    }
  }
  double sq = 0;
  constexpr size_t kParams = std::size(params);
  std::vector<char> used(kParams, 0);
  for (size_t i = 0; i < rows.size(); ++i) {
    KernelRow& r = rows[i];
    const auto kt = sim::kernel_time(dev, r.flops, r.bytes, r.precision, r.shape);
    r.predicted_ns = kt.total_ns;
    const char b = binding(kt);
    r.bound = b == 1 ? "compute" : b == 0 ? "memory" : "engine";
    const double e = (r.predicted_ns - r.measured_ns) / r.measured_ns;
    sq += e * e;
    for (size_t j = 0; j < kParams; ++j)
      if ((b == 1 && compute_param(dev, p, r) == params[j].second) || (b == 0 && params[j].second == &p.hbm_efficiency))
        used[j] = 1;
  }
  fit.rms_relative_error = std::sqrt(sq / double(rows.size()));
  // gemm_efficiency_fp8 unfitted stays as the device had it (unset: 0, gemm_efficiency), not the fit's start.
  if (!used[1]) p.gemm_efficiency_fp8 = device.kernel.gemm_efficiency_fp8;
  bool any_fp8 = false;  // a table without FP8 GEMM rows has nothing to say about their ceiling: not listed
  for (const auto& r : rows)
    any_fp8 = any_fp8 || compute_param(dev, p, r) == &p.gemm_efficiency_fp8;
  for (size_t j = 0; j < kParams; ++j) {
    if (j == 1 && !any_fp8) continue;
    (used[j] ? fit.fitted_names : fit.not_fitted).push_back(params[j].first);
    if (used[j] && *params[j].second > 1.0) fit.impossible.push_back(params[j].first);
  }
  fit.fitted = p;
  fit.fitted.source = "fitted by shardsim calibrate --kernels";
  fit.rows = std::move(rows);
  return fit;
}

std::string device_override_yaml(const sim::DeviceSpec& device, const sim::KernelParams& k,
                                 const std::string& comment) {
  std::ostringstream os;
  os.precision(10);
  os << "# " << escape_control(comment) << "\n";
  os << "device:\n";
  bool preset = false;
  for (const auto& n : sim::device_preset_names()) preset = preset || n == device.name;
  if (preset) {
    os << "  preset: " << device.name << "\n";
  } else {
    os << "  peak_tflops_fp32: " << device.peak_tflops_fp32 << "\n  peak_tflops_bf16: " << device.peak_tflops_bf16
       << "\n  hbm_gbps: " << device.hbm_gbps << "\n  hbm_gib: " << device.hbm_gib
       << "\n  launch_overhead_ns: " << device.launch_overhead_ns << "\n";
  }
  os << "  kernel_model: shaped\n  compute_units: " << k.compute_units << "\n  gemm_tile_m: " << k.gemm_tile_m
     << "\n  gemm_tile_n: " << k.gemm_tile_n << "\n  attention_tile_q: " << k.attention_tile_q;
  if (k.tensor_engine == sim::TensorEngine::systolic)
    os << "\n  tensor_engine: systolic\n  gemm_tile_k: " << k.gemm_tile_k
       << "\n  matmul_min_columns: " << k.matmul_min_columns;
  if (k.scalar_engine_gelems > 0) os << "\n  scalar_engine_gelems: " << k.scalar_engine_gelems;
  if (k.vector_engine_gelems > 0) os << "\n  vector_engine_gelems: " << k.vector_engine_gelems;
  os
     << "\n  gemm_efficiency: " << k.gemm_efficiency;
  if (k.gemm_efficiency_fp8 > 0) os << "\n  gemm_efficiency_fp8: " << k.gemm_efficiency_fp8;
  os
     << "\n  attention_forward_efficiency: " << k.attention_forward_efficiency
     << "\n  attention_backward_efficiency: " << k.attention_backward_efficiency
     << "\n  hbm_efficiency: " << k.hbm_efficiency << "\n";
  return os.str();
}

}  // namespace shardsim::kernels

#include "sim/kernel_model.h"

#include <algorithm>
#include <cmath>

namespace shardsim::sim {

std::string kernel_class_name(KernelClass c) {
  switch (c) {
    case KernelClass::vector: return "vector";
    case KernelClass::gemm: return "gemm";
    case KernelClass::gemm_backward: return "gemm_backward";
    case KernelClass::attention_forward: return "attention_forward";
    case KernelClass::attention_backward: return "attention_backward";
  }
  return "?";
}

namespace {

double ceil_div(double a, double b) { return std::ceil(a / b); }

// The tile edge a library would use for a dimension of D elements: T, or the next power of two >= D (at
// least 16) when D is smaller.
double tile_edge(int64_t d, int tile) {
  double t = 16;
  while (t < double(d) && t < tile) t *= 2;
  return std::min<double>(t, tile);
}

// q of one GEMM grid: output [rows, cols], BATCH of them. The tile: the device's Tm x Tn (each edge clipped to the
// dimension, see tile_edge), or, when that leaves some compute units without a tile in the first wave, the largest
// of the halvings down to 16 x 16 (the longer edge halved first) that fills a wave, else 16 x 16: libraries pick
// smaller tiles when big ones would leave units idle.
double gemm_grid_quantization(const KernelParams& k, int64_t rows, int64_t cols, int64_t batch) {
  if (rows <= 0 || cols <= 0 || batch <= 0) return 1;
  double tm = tile_edge(rows, k.gemm_tile_m), tn = tile_edge(cols, k.gemm_tile_n);
  auto tiles_of = [&](double a, double b) { return ceil_div(double(rows), a) * ceil_div(double(cols), b) * double(batch); };
  while (tiles_of(tm, tn) < k.compute_units && (tm > 16 || tn > 16)) {
    if (tn >= tm && tn > 16) tn /= 2;
    else if (tm > 16) tm /= 2;
    else tn /= 2;
  }
  const double tiles = tiles_of(tm, tn);
  const double waves = ceil_div(tiles, k.compute_units);
  return waves * k.compute_units * tm * tn / (double(rows) * double(cols) * double(batch));
}

}  // namespace

double kernel_quantization(const DeviceSpec& dev, const KernelShape& s) {
  const KernelParams& k = dev.kernel;
  if (!k.shaped) return 1;
  switch (s.cls) {
    case KernelClass::vector: return 1;
    case KernelClass::gemm: return gemm_grid_quantization(k, s.m, s.n, s.batch);
    case KernelClass::gemm_backward:
      return 0.5 * (gemm_grid_quantization(k, s.m, s.k, s.batch) + gemm_grid_quantization(k, s.k, s.n, s.batch));
    case KernelClass::attention_forward:
    case KernelClass::attention_backward: {
      if (s.m <= 0 || s.batch <= 0) return 1;
      const double items = double(s.batch) * ceil_div(double(s.m), k.attention_tile_q);
      return ceil_div(items, k.compute_units) * k.compute_units / items;
    }
  }
  return 1;
}

KernelTime kernel_time(const DeviceSpec& dev, double flops, double bytes, Precision p, const KernelShape& s) {
  KernelTime t;
  const KernelParams& k = dev.kernel;
  if (k.shaped) {
    switch (s.cls) {
      case KernelClass::gemm:
      case KernelClass::gemm_backward: t.efficiency = k.gemm_efficiency; break;
      case KernelClass::attention_forward: t.efficiency = k.attention_forward_efficiency; break;
      case KernelClass::attention_backward: t.efficiency = k.attention_backward_efficiency; break;
      case KernelClass::vector: break;
    }
    t.quantization = kernel_quantization(dev, s);
    t.compute_ns = flops * t.quantization / (dev.peak_flops_per_ns(p) * t.efficiency);
    t.memory_ns = bytes / (dev.hbm_gbps * k.hbm_efficiency);  // GB/s == bytes per ns
  } else {
    // The peak roofline, written exactly as sim::compute_time_ns so every number of the peak model is unchanged.
    t.compute_ns = flops / dev.peak_flops_per_ns(p);
    t.memory_ns = bytes / dev.hbm_gbps;
  }
  t.total_ns = dev.launch_overhead_ns + std::max(t.compute_ns, t.memory_ns);
  return t;
}

}  // namespace shardsim::sim

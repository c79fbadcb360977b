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

// A grid of work: PAD = the machine's work in its tiles over the useful work (>= 1, before waves), ITEMS = the
// work items the compute units share.
struct Grid {
  double pad = 1, items = 1;
};

// The partial last wave: ceil(items / units) · units / items.
double wave_factor(const KernelParams& k, double items) {
  return items > 0 ? ceil_div(items, k.compute_units) * k.compute_units / items : 1;
}

// The tile edge a library would use for a dimension of D elements: T, or the next power of two >= D (at
// least 16) when D is smaller.
double tile_edge(int64_t d, int tile) {
  double t = 16;
  while (t < double(d) && t < tile) t *= 2;
  return std::min<double>(t, tile);
}

// Tile model, one grid of a grouped GEMM: output [rows, cols], BATCH of them, in tiles of the device's Tm x Tn,
// each edge clipped to the dimension (tile_edge); no shrinking (the groups share the waves).
Grid tile_grid(const KernelParams& k, int64_t rows, int64_t cols, int64_t batch) {
  if (rows <= 0 || cols <= 0 || batch <= 0) return {1, 0};
  const double tm = tile_edge(rows, k.gemm_tile_m), tn = tile_edge(cols, k.gemm_tile_n);
  const double tiles = ceil_div(double(rows), tm) * ceil_div(double(cols), tn) * double(batch);
  return {tiles * tm * tn / (double(rows) * double(cols) * double(batch)), tiles};
}

// Tile model, one GEMM grid: output [rows, cols], BATCH of them. The tile: the device's Tm x Tn (each edge clipped
// to the dimension, see tile_edge), or, when that leaves some compute units without a tile in the first wave, the
// largest of the halvings down to 16 x 16 (the longer edge halved first) that fills a wave, else 16 x 16:
// libraries pick smaller tiles when big ones would leave units idle.

// q of one GEMM grid on the tile model (the formula of the header, evaluated as written there).
double tile_quantization(const KernelParams& k, int64_t rows, int64_t cols, int64_t batch) {
  if (rows <= 0 || cols <= 0 || batch <= 0) return 1;
  double tm = tile_edge(rows, k.gemm_tile_m), tn = tile_edge(cols, k.gemm_tile_n);
  auto tiles_of = [&](double a, double b) { return ceil_div(double(rows), a) * ceil_div(double(cols), b) * double(batch); };
  while (tiles_of(tm, tn) < k.compute_units && (tm > 16 || tn > 16)) {
    if (tn >= tm && tn > 16) tn /= 2;
    else if (tm > 16) tm /= 2;
    else tn /= 2;
  }
  const double waves = ceil_div(tiles_of(tm, tn), k.compute_units);
  return waves * k.compute_units * tm * tn / (double(rows) * double(cols) * double(batch));
}

// Systolic model, one orientation: STAT output elements on the stationary free axis (<= Tm per instruction), MOV
// on the moving free axis (<= Tn), contraction KDIM (<= Tk per instruction, accumulated in PSUM; 0: unknown, no
// K padding).
Grid systolic_orientation(const KernelParams& k, int64_t stat, int64_t mov, int64_t kdim, int64_t batch) {
  const double st = ceil_div(double(stat), k.gemm_tile_m), nt = ceil_div(double(mov), k.gemm_tile_n);
  const double columns = std::max(std::ceil(double(mov) / nt), double(k.matmul_min_columns));
  const double kpad = kdim > 0 ? ceil_div(double(kdim), k.gemm_tile_k) * k.gemm_tile_k / double(kdim) : 1.0;
  const double items = st * nt * double(batch);
  return {items * double(k.gemm_tile_m) * columns * kpad / (double(stat) * double(mov) * double(batch)), items};
}

// Systolic model, one GEMM grid: output [rows, cols], contraction KDIM; the orientation that costs less (either
// operand may be the stationary one).
Grid systolic_grid(const KernelParams& k, int64_t rows, int64_t cols, int64_t kdim, int64_t batch) {
  if (rows <= 0 || cols <= 0 || batch <= 0) return {1, 0};
  const Grid a = systolic_orientation(k, rows, cols, kdim, batch), b = systolic_orientation(k, cols, rows, kdim, batch);
  return a.pad * wave_factor(k, a.items) <= b.pad * wave_factor(k, b.items) ? a : b;
}

bool systolic(const KernelParams& k) { return k.tensor_engine == TensorEngine::systolic; }

// q of one GEMM grid (output [rows, cols], contraction kdim) on K's tensor engine.
// GEMM on the systolic engine: the array cycles of transposing the token-major operand T [rows, kdim] (kdim its
// contraction axis, moved onto the partitions) in Tm x Tk blocks of max(Tm, Nmin) cycles each, over the useful
// work rows·cols·kdim (both in multiply-accumulate slots of the Tk x Tm array).
double systolic_transpose_pad(const KernelParams& k, int64_t rows, int64_t cols, int64_t kdim, int64_t batch) {
  if (rows <= 0 || cols <= 0 || kdim <= 0 || batch <= 0) return 0;
  const double blocks = ceil_div(double(rows), k.gemm_tile_m) * ceil_div(double(kdim), k.gemm_tile_k) * double(batch);
  const double slots = blocks * std::max(double(k.gemm_tile_m), double(k.matmul_min_columns)) * k.gemm_tile_k *
                       k.gemm_tile_m;
  return slots / (double(rows) * double(cols) * double(kdim) * double(batch));
}

// The systolic grid of a GEMM; TRANSPOSED: its token-major operand [rows, kdim] is transposed on the array first
// (the forward GEMM and dX; sim/kernel_model.h).
Grid systolic_gemm(const KernelParams& k, int64_t rows, int64_t cols, int64_t kdim, int64_t batch, bool transposed) {
  Grid g = systolic_grid(k, rows, cols, kdim, batch);
  if (transposed) g.pad += systolic_transpose_pad(k, rows, cols, kdim, batch);
  return g;
}

double gemm_q(const KernelParams& k, int64_t rows, int64_t cols, int64_t kdim, int64_t batch, bool transposed) {
  if (!systolic(k)) return tile_quantization(k, rows, cols, batch);
  const Grid g = systolic_gemm(k, rows, cols, kdim, batch, transposed);
  return g.pad * wave_factor(k, g.items);
}

// Attention on the systolic engine: the tensor engine's cycles over the ideal ones, per Tm query rows and key
// (in units of Tk cycles; the header's formula). TR: the transpose of one Tq x Tm block of P (forward) or dS
// (backward) through the array, max(Tq, Nmin) cycles per Tm keys; the backward also transposes its dO and Q
// tiles (ceil(d/Tk) each) once per Tq query rows and Tn keys.
double systolic_attention_pad(const KernelParams& k, int64_t d, bool backward) {
  if (d <= 0) return 1;
  const double tk = k.gemm_tile_k, dtiles = ceil_div(double(d), tk), qk = tk * dtiles;
  const double pv = std::max(double(d), double(k.matmul_min_columns));
  const double block = std::max(double(k.attention_tile_q), double(k.matmul_min_columns));
  const double tr = tk * block / double(k.gemm_tile_m);
  if (!backward) return (qk + pv + tr) / (2.0 * double(d));
  const double tiles_tr = tk * 2.0 * dtiles * block / double(k.gemm_tile_n);
  return (2 * qk + 3 * pv + tr + tiles_tr) / (5.0 * double(d));
}


// The element-wise engines' time beside the tensor engine (0 unless the device models them).
double engine_time_ns(const KernelParams& k, const KernelShape& s, double flops) {
  if (k.scalar_engine_gelems <= 0 && k.vector_engine_gelems <= 0) return 0;
  auto on = [](double elements, double rate) { return rate > 0 ? elements / rate : 0.0; };
  const double b = double(std::max<int64_t>(s.batch, 1));
  switch (s.cls) {
    case KernelClass::vector: return 0;
    case KernelClass::gemm: return on(double(s.m) * double(s.n) * b, k.scalar_engine_gelems);
    case KernelClass::gemm_backward:
      return on((double(s.m) * double(s.k) + double(s.k) * double(s.n)) * b, k.scalar_engine_gelems);
    case KernelClass::attention_forward:
    case KernelClass::attention_backward: {
      if (s.k <= 0) return 0;
      const bool bwd = s.cls == KernelClass::attention_backward;
      const double scores = flops / ((bwd ? 10.0 : 4.0) * double(s.k));
      // Passes over the scores: the exp on the activation engine, the row max (forward) or dS = P∘(dP − D)
      // (backward, two inputs) on the vector engine, and the PSUM evictions (forward: S and the transposed P;
      // backward: S, dP and the transposed dS) on whichever of the two is free: the busier engine, or all passes
      // shared over both.
      const double pinned_vector = bwd ? 2.0 : 1.0, evictions = bwd ? 3.0 : 2.0;
      const double both = k.scalar_engine_gelems + k.vector_engine_gelems;
      return std::max({on(scores, k.scalar_engine_gelems), on(pinned_vector * scores, k.vector_engine_gelems),
                       on((1.0 + pinned_vector + evictions) * scores, both)});
    }
  }
  return 0;
}

// The ceiling of class C at precision P (P as the device runs it: gemm_efficiency_fp8 for GEMMs at the fp8 peak).
double class_efficiency(const DeviceSpec& dev, KernelClass c, Precision p) {
  const KernelParams& k = dev.kernel;
  switch (c) {
    case KernelClass::gemm:
    case KernelClass::gemm_backward:
      return k.gemm_efficiency_fp8 > 0 && dev.effective_precision(p) == Precision::fp8 ? k.gemm_efficiency_fp8
                                                                                      : k.gemm_efficiency;
    case KernelClass::attention_forward: return k.attention_forward_efficiency;
    case KernelClass::attention_backward: return k.attention_backward_efficiency;
    case KernelClass::vector: break;
  }
  return 1;
}

}  // namespace

double kernel_quantization(const DeviceSpec& dev, const KernelShape& s) {
  const KernelParams& k = dev.kernel;
  if (!k.shaped) return 1;
  if (s.groups) return grouped_kernel_time(dev, *s.groups, Precision::bf16).quantization;
  switch (s.cls) {
    case KernelClass::vector: return 1;
    case KernelClass::gemm: return gemm_q(k, s.m, s.n, s.k, s.batch, true);
    case KernelClass::gemm_backward:
      return 0.5 * (gemm_q(k, s.m, s.k, s.n, s.batch, true) + gemm_q(k, s.k, s.n, s.m, s.batch, false));
    case KernelClass::attention_forward:
    case KernelClass::attention_backward: {
      if (s.m <= 0 || s.batch <= 0) return 1;
      const double blocks = ceil_div(double(s.m), k.attention_tile_q);
      const double items = double(s.batch) * blocks;
      const double waves = ceil_div(items, k.compute_units) * k.compute_units / items;
      if (!systolic(k)) return waves;
      const double rows = blocks * k.attention_tile_q / double(s.m);
      return waves * rows * systolic_attention_pad(k, s.k, s.cls == KernelClass::attention_backward);
    }
  }
  return 1;
}

KernelTime kernel_time(const DeviceSpec& dev, double flops, double bytes, Precision p, const KernelShape& s) {
  if (s.groups) return grouped_kernel_time(dev, *s.groups, p);
  KernelTime t;
  const KernelParams& k = dev.kernel;
  if (k.shaped) {
    t.efficiency = class_efficiency(dev, s.cls, p);
    t.quantization = kernel_quantization(dev, s);
    t.compute_ns = flops * t.quantization / (dev.peak_flops_per_ns(p) * t.efficiency);
    t.memory_ns = bytes / (dev.hbm_gbps * k.hbm_efficiency);  // GB/s == bytes per ns
    t.engine_ns = engine_time_ns(k, s, flops);
  } else {
    // The peak roofline, written exactly as sim::compute_time_ns so every number of the peak model is unchanged.
    t.compute_ns = flops / dev.peak_flops_per_ns(p);
    t.memory_ns = bytes / dev.hbm_gbps;
  }
  t.total_ns = dev.kernel_gap_ns() + std::max({t.compute_ns, t.memory_ns, t.engine_ns});
  return t;
}

KernelTime grouped_kernel_time(const DeviceSpec& dev, const std::vector<KernelWork>& groups, Precision p) {
  KernelTime t;
  double flops = 0, bytes = 0, padded = 0, items = 0;
  const KernelParams& k = dev.kernel;
  for (const auto& g : groups) {
    if (g.flops <= 0) continue;
    flops += g.flops;
    bytes += g.bytes;
    if (!k.shaped) continue;
    const KernelShape& s = g.shape;
    // Each forward-or-backward grid: (output rows, cols, contraction, share of the group's FLOPs).
    struct Part { int64_t rows, cols, kdim; double share; bool transposed; };
    std::vector<Part> parts;
    if (s.cls == KernelClass::gemm_backward) parts = {{s.m, s.k, s.n, 0.5, true}, {s.k, s.n, s.m, 0.5, false}};
    else parts = {{s.m, s.n, s.k, 1.0, true}};
    for (const auto& part : parts) {
      const Grid grid = systolic(k) ? systolic_gemm(k, part.rows, part.cols, part.kdim, s.batch, part.transposed)
                                    : tile_grid(k, part.rows, part.cols, s.batch);
      padded += g.flops * part.share * grid.pad;
      items += grid.items;
    }
    t.engine_ns += engine_time_ns(k, s, g.flops);
  }
  if (flops <= 0) return t;
  if (k.shaped) {
    t.efficiency = class_efficiency(dev, KernelClass::gemm, p);
    t.quantization = padded / flops * wave_factor(k, items);
    t.compute_ns = flops * t.quantization / (dev.peak_flops_per_ns(p) * t.efficiency);
    t.memory_ns = bytes / (dev.hbm_gbps * k.hbm_efficiency);
  } else {
    t.compute_ns = flops / dev.peak_flops_per_ns(p);
    t.memory_ns = bytes / dev.hbm_gbps;
  }
  t.total_ns = dev.kernel_gap_ns() + std::max({t.compute_ns, t.memory_ns, t.engine_ns});
  return t;
}

}  // namespace shardsim::sim

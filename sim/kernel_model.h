// The kernel model: how long one kernel takes on a modelled device, from its FLOPs, HBM bytes, precision and
// shape. Pure functions, no state. Time in simulated ns.
//
// Two models, chosen per device (DeviceSpec::kernel.shaped):
//
//   peak (the default; every preset that has no sourced kernel figures): the roofline of Williams, Waterman &
//     Patterson (CACM 2009) at the datasheet rates, for every kernel class:
//         t = launch_overhead + max(flops / peak(p), bytes / hbm_bandwidth)
//
//   shaped (presets with kernel figures, e.g. a100 and h100; or `device.kernel_model: shaped`): the achieved rate
//     follows from the kernel's shape. For a kernel of class C:
//         t = launch_overhead + max(flops · q / (peak(p) · e_C), bytes / (hbm_bandwidth · e_hbm))
//     e_C       per-class ceiling: the fraction of peak a large, well-shaped kernel of that class reaches
//               (gemm_efficiency, attention_forward_efficiency, attention_backward_efficiency; 1 for vector
//               kernels, which are bandwidth-bound on every modelled device).
//     e_hbm     achievable HBM bandwidth as a fraction of the datasheet figure (hbm_efficiency).
//     q >= 1    quantization: the work the machine spends over the useful work.
//       GEMM C[m, n] = A[m, k] · B[k, n] (batch of them): the output is cut into tiles of Tm x Tn (each clipped
//         to the next power of two >= the dimension, at least 16: libraries pick small tiles for skinny GEMMs;
//         when the tiles would not fill one wave, halved, the longer edge first, down to 16 x 16, until they do),
//         the tiles run in waves over the device's compute units (SMs), a partial tile or a partial last wave
//         costs a whole one:  tiles = ceil(m/Tm)·ceil(n/Tn)·batch,  waves = ceil(tiles / units),
//         q = waves·units·Tm·Tn / (m·n·batch).  (Wave quantization: NVIDIA, "Matrix Multiplication Background
//         User's Guide", sections on tile and wave quantization.)
//       GEMM backward (dX = dY·W^T [m, k] and dW = X^T·dY [k, n], half of the FLOPs each): the mean of the two
//         grids' q.
//       Attention (flash-style: one work item per (sequence, query head, block of Tq query rows)):
//         items = batch·ceil(m/Tq), q = ceil(items/units)·units / items.
//       Vector kernels (elementwise, norms, embedding, cross-entropy, optimizer): q = 1.
//
// Both models are one function, kernel_time_ns; the simulator's timelines (and so the single-device reference,
// every plan, real-data and shape-only runs alike) charge every kernel through it.
#pragma once

#include <cstdint>
#include <string>

#include "sim/device_spec.h"

namespace shardsim::sim {

enum class KernelClass { vector, gemm, gemm_backward, attention_forward, attention_backward };
std::string kernel_class_name(KernelClass c);  // "vector", "gemm", ...

// The shape a kernel ran on (kernels::KernelCost::shape). Units: elements.
//   gemm, gemm_backward: the forward GEMM C[m, n] = A[m, k] · B[k, n], BATCH independent ones.
//   attention_*: M = query rows per (sequence, head), N = key rows, K = head dim, BATCH = sequences x query heads.
//   vector: no shape (only FLOPs and bytes count).
struct KernelShape {
  KernelClass cls = KernelClass::vector;
  int64_t m = 0, n = 0, k = 0;
  int64_t batch = 1;
};

// The model's parts for one kernel, for reports and the profiler.
struct KernelTime {
  double total_ns = 0;     // launch + max(compute, memory)
  double compute_ns = 0;   // flops · q / (peak · e_C)
  double memory_ns = 0;    // bytes / (hbm · e_hbm)
  double quantization = 1; // q
  double efficiency = 1;   // e_C
  bool memory_bound() const { return memory_ns > compute_ns; }
};

KernelTime kernel_time(const DeviceSpec& dev, double flops, double bytes, Precision p, const KernelShape& shape);
inline double kernel_time_ns(const DeviceSpec& dev, double flops, double bytes, Precision p,
                             const KernelShape& shape) {
  return kernel_time(dev, flops, bytes, p, shape).total_ns;
}
// The quantization factor q of SHAPE on DEV (1 for the peak model and vector kernels).
double kernel_quantization(const DeviceSpec& dev, const KernelShape& shape);

}  // namespace shardsim::sim

// The kernel model: how long one kernel takes on a modelled device, from its FLOPs, HBM bytes, precision and
// shape. Pure functions, no state. Time in simulated ns.
//
// Two models, chosen per device (DeviceSpec::kernel.shaped):
//
//   peak (the default; every preset that has no sourced kernel figures): the roofline of Williams, Waterman &
//     Patterson (CACM 2009) at the datasheet rates, for every kernel class:
//         t = launch_overhead + max(flops / peak(p), bytes / hbm_bandwidth)
//
//   shaped (presets with kernel figures: a100, h100, h200, mi300x, trainium1, trainium2, inferentia2; or
//     `device.kernel_model: shaped`): the achieved rate follows from the kernel's shape. For a kernel of class C:
//         t = launch_overhead + max(flops · q / (peak(p) · e_C), bytes / (hbm_bandwidth · e_hbm), engines)
//     e_C       per-class ceiling: the fraction of peak a large, well-shaped kernel of that class reaches
//               (gemm_efficiency, attention_forward_efficiency, attention_backward_efficiency; 1 for vector
//               kernels, which are bandwidth-bound on every modelled device).
//     e_hbm     achievable HBM bandwidth as a fraction of the datasheet figure (hbm_efficiency).
//     q >= 1    quantization: the work the machine spends over the useful work, from how the kernel tiles on
//               the device's tensor engine (KernelParams::tensor_engine):
//       tiles (GPUs). GEMM C[m, n] = A[m, k] · B[k, n] (batch of them): the output is cut into tiles of Tm x Tn
//         (each clipped to the next power of two >= the dimension, at least 16: libraries pick small tiles for
//         skinny GEMMs; when the tiles would not fill one wave, halved, the longer edge first, down to 16 x 16,
//         until they do), the tiles run in waves over the device's compute units (SMs), a partial tile or a
//         partial last wave costs a whole one:  tiles = ceil(m/Tm)·ceil(n/Tn)·batch,  waves = ceil(tiles /
//         units),  q = waves·units·Tm·Tn / (m·n·batch).  (Wave quantization: NVIDIA, "Matrix Multiplication
//         Background User's Guide", sections on tile and wave quantization.)
//         Attention (flash-style: one work item per (sequence, query head, block of Tq query rows)):
//         items = batch·ceil(m/Tq), q = ceil(items/units)·units / items.
//       systolic (AWS NeuronCores; AWS Neuron "Trainium/Inferentia2 Architecture Guide for NKI"). The tensor
//         engine is a Tk x Tm array of processing elements (128 x 128). One matmul instruction holds a stationary
//         block [K <= Tk, M <= Tm] and streams a moving block [K, N <= Tn] (Tn = 512: one PSUM bank) through it
//         in max(N, Nmin) engine cycles (Nmin = matmul_min_columns, the guide's MM_INIT_LATENCY of 64); K above
//         Tk accumulates in PSUM. GEMM output [R, C], contraction K: stationary tiles ceil(R/Tm), moving tiles
//         ceil(C/Tn) of N = ceil(C / ceil(C/Tn)) columns each; each (stationary, moving) pair is one work item
//         of ceil(K/Tk) instructions on one NeuronCore (compute_units = cores per chip), items in waves over the
//         cores:  q = waves·units·ceil(K/Tk)·max(N, Nmin)·Tk·Tm / (R·C·K·batch), the smaller of the two
//         orientations (either operand may be stationary). Attention per Tm query rows and key: QK^T costs
//         ceil(d/Tk) cycles, P·V max(d, Nmin)/Tk (its contraction runs over the keys), against 2d/Tk ideal:
//         q = (Tk·ceil(d/Tk) + max(d, Nmin)) / 2d (backward, five matmuls: (2·Tk·ceil(d/Tk) + 3·max(d, Nmin))
//         / 5d), times the row padding ceil(m/Tq)·Tq/m and the waves of the (sequence, head, row block) items.
//       GEMM backward (dX = dY·W^T [m, k], contraction n; dW = X^T·dY [k, n], contraction m; half of the FLOPs
//         each): the mean of the two grids' q.
//       Vector kernels (elementwise, norms, embedding, cross-entropy, optimizer): q = 1.
//     engines   (devices with scalar_engine_gelems / vector_engine_gelems > 0: the NeuronCores' activation and
//               vector engines, 128 lanes each, one element per lane and cycle; NKI guide, engine table and cost
//               model) the element-wise work that runs beside the tensor engine, in elements / rate:
//               GEMM: its output evicted from PSUM once (m·n·batch, dX and dW for the backward) on the
//               activation engine; attention forward: one exp per score on the activation engine and one
//               row-max element on the vector engine (scores = flops / 4d); backward: the exp again and
//               dS = P∘(dP − D), a two-input vector instruction (2 element-cycles per score; scores = flops /
//               10d). The engines overlap with each other and with the tensor engine (the max), an optimistic
//               simplification for NeuronCore-v2, where the vector and activation engines cannot read PSUM at
//               the same time.
//
// Both models are one function, kernel_time; the simulator's timelines (and so the single-device reference,
// every plan, real-data and shape-only runs alike) charge every kernel through it. grouped_kernel_time charges a
// grouped GEMM (several GEMMs of different shapes in one launch) through the same quantization.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "sim/device_spec.h"

namespace shardsim::sim {

enum class KernelClass { vector, gemm, gemm_backward, attention_forward, attention_backward };
std::string kernel_class_name(KernelClass c);  // "vector", "gemm", ...

// The shape a kernel ran on (kernels::KernelCost::shape). Units: elements.
//   gemm, gemm_backward: the forward GEMM C[m, n] = A[m, k] · B[k, n], BATCH independent ones.
//   attention_*: M = query rows per (sequence, head), N = key rows, K = head dim, BATCH = sequences x query heads.
//   vector: no shape (only FLOPs and bytes count).
//   GROUPS (non-null; class gemm or gemm_backward): a grouped GEMM, one launch over GEMMs of their own shapes;
//     kernel_time charges it as grouped_kernel_time (m, n, k, batch unused). kernels/moe.h's grouped GEMMs.
struct KernelWork;
struct KernelShape {
  KernelClass cls = KernelClass::vector;
  int64_t m = 0, n = 0, k = 0;
  int64_t batch = 1;
  std::shared_ptr<const std::vector<KernelWork>> groups = nullptr;
};

// The model's parts for one kernel, for reports and the profiler.
struct KernelTime {
  double total_ns = 0;     // launch + max(compute, memory, engine)
  double compute_ns = 0;   // flops · q / (peak · e_C)
  double memory_ns = 0;    // bytes / (hbm · e_hbm)
  double engine_ns = 0;    // element-wise engines beside the tensor engine (0 unless the device models them)
  double quantization = 1; // q
  double efficiency = 1;   // e_C
  bool memory_bound() const { return memory_ns > compute_ns && memory_ns >= engine_ns; }
  bool engine_bound() const { return engine_ns > compute_ns && engine_ns > memory_ns; }
};

// A shape with GROUPS: grouped_kernel_time of them (FLOPS and BYTES are their sums; not re-read).
KernelTime kernel_time(const DeviceSpec& dev, double flops, double bytes, Precision p, const KernelShape& shape);
inline double kernel_time_ns(const DeviceSpec& dev, double flops, double bytes, Precision p,
                             const KernelShape& shape) {
  return kernel_time(dev, flops, bytes, p, shape).total_ns;
}
// The quantization factor q of SHAPE on DEV (1 for the peak model and vector kernels; a grouped shape's q at
// bf16, q does not depend on the precision).
double kernel_quantization(const DeviceSpec& dev, const KernelShape& shape);

// One GEMM of a grouped GEMM: its FLOPs, HBM bytes and shape (class gemm or gemm_backward).
struct KernelWork {
  double flops = 0, bytes = 0;
  KernelShape shape;
};
// A grouped GEMM (CUTLASS grouped GEMM, Megatron-Core's GroupedMLP): GROUPS run as one kernel at precision P, one
// launch. Each group keeps its own tile padding (the tile model's tiles clipped to the group's dimensions, no
// shrinking; the systolic model's orientation and PSUM tiles), and the work items of all groups share the waves
// over the compute units: q = (sum_g flops_g · pad_g / sum_g flops_g) · ceil(I/units)·units / I with I the items
// of all groups. Bytes and FLOPs add up; the engines term adds each group's PSUM eviction. Groups with no FLOPs
// cost nothing; no groups (or only empty ones): 0 ns, no launch. The peak model: the roofline of the sums.
KernelTime grouped_kernel_time(const DeviceSpec& dev, const std::vector<KernelWork>& groups, Precision p);

}  // namespace shardsim::sim

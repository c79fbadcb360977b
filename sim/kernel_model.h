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
//         cores:  q = waves·units·(ceil(K/Tk)·max(N, Nmin)·Tk·Tm / (R·C·K·batch) + tr), the smaller of the
//         two orientations (either operand may be stationary). TensorE reads both operands with the contraction
//         on the SBUF partitions (the guide: nki.language.matmul is an nc_transpose of one input followed by
//         nc_matmul), so the token-major operand, as PyTorch lays activations out ([tokens, features]), is first
//         transposed through the array: tr = ceil(R/Tm)·ceil(K/Tk)·max(Tm, Nmin)·Tk·Tm / (R·C·K) (about Tm/C)
//         for the activation A [m, k] of the forward and dY [m, n] of dX; dW's operands are token-major already.
//         (Assumption: the compiler keeps activations token-major between kernels; the weights' transposes are
//         once per step and not charged.)
//         Attention, as AWS's NKI flash-attention kernels run it (aws-neuron/nki-samples,
//         src/nki_samples/reference/attention.py: flash_fwd, flash_attn_bwd), per Tm query rows and key, in
//         units of Tk cycles: QK^T Tk·ceil(d/Tk), P·V max(d, Nmin) (its contraction runs over the keys), and the
//         transpose of each Tq x Tm block of P that P·V needs, tr = Tk·max(Tq, Nmin)/Tm, against 2d ideal:
//         q = (Tk·ceil(d/Tk) + max(d, Nmin) + tr) / 2d (1.5 at d = 128). Backward, five matmuls, the transpose of
//         dS for dQ and of the dO and Q tiles once per Tq rows and Tn keys: (2·Tk·ceil(d/Tk) + 3·max(d, Nmin) +
//         tr + Tk·2·ceil(d/Tk)·max(Tq, Nmin)/Tn) / 5d (1.3 at d = 128). Both times the row padding
//         ceil(m/Tq)·Tq/m and the waves of the (sequence, head, row block) items.
//       GEMM backward (dX = dY·W^T [m, k], contraction n; dW = X^T·dY [k, n], contraction m; half of the FLOPs
//         each): the mean of the two grids' q.
//       Vector kernels (elementwise, norms, embedding, cross-entropy, optimizer): q = 1.
//     engines   (devices with scalar_engine_gelems / vector_engine_gelems > 0: the NeuronCores' activation and
//               vector engines, 128 lanes each, one element per lane and cycle; NKI guide, engine table and cost
//               model) the element-wise work that runs beside the tensor engine, in elements / rate:
//               GEMM: its output evicted from PSUM once (m·n·batch, dX and dW for the backward) on the
//               activation engine. Attention, the passes of the NKI kernels above over every score: forward
//               (scores = flops / 4d) the exp on the activation engine, the row max on the vector engine and two
//               PSUM evictions (S, and P after its transpose) on either; backward (scores = flops / 10d) the exp,
//               dS = P∘(dP − D) on the vector engine (two inputs: 2 element-cycles per score) and three evictions
//               (S, dP, dS after its transpose): time = max(exp / scalar, vector passes / vector, all passes /
//               (scalar + vector)). The engines overlap with each other and with the tensor engine (the max),
//               an optimistic simplification for NeuronCore-v2, where the vector and activation engines cannot
//               read PSUM at the same time.
//     GEMMs at the fp8 peak use gemm_efficiency_fp8 as e_C when the device sets it (a measured FP8 ceiling).
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
// shrinking; the systolic model's orientation, PSUM tiles and transposes), and the work items of all groups share the waves
// over the compute units: q = (sum_g flops_g · pad_g / sum_g flops_g) · ceil(I/units)·units / I with I the items
// of all groups. Bytes and FLOPs add up; the engines term adds each group's PSUM eviction. Groups with no FLOPs
// cost nothing; no groups (or only empty ones): 0 ns, no launch. The peak model: the roofline of the sums.
KernelTime grouped_kernel_time(const DeviceSpec& dev, const std::vector<KernelWork>& groups, Precision p);

}  // namespace shardsim::sim

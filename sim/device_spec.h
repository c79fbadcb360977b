// The modelled accelerator: peak compute per precision, HBM bandwidth and capacity, launch overhead.
//
// Units: FLOP/s as TFLOP/s (1e12; for int8, tera-operations/s); HBM bandwidth GB/s (1e9 B/s); capacity GiB
// (2^30 B); overhead ns. Presets carry the public source of each number (configs/devices.yaml) and
// say which numbers are assumptions. Peaks are dense (no structured-sparsity figures).
//
//   device:
//     preset: trainium1        # a name in configs/devices.yaml (sim/device_presets.h); optional
//     peak_tflops_fp32: 47.5   # any field overrides the preset; without a preset, fp32, bf16, hbm_gbps and
//     peak_tflops_bf16: 190    # hbm_gib are required
//     peak_tflops_fp64: 10     # optional (0 / absent: falls back, see Precision below)
//     peak_tflops_fp16: 190    # optional
//     peak_tflops_fp8: 190     # optional
//     peak_tflops_int8: 380    # optional (TOPS)
//     hbm_gbps: 820
//     hbm_gib: 32
//     launch_overhead_ns: 900  # the device's gap between back-to-back kernels issued eagerly
//     launch_mode: eager       # eager | cuda_graph | compiled: how kernels reach the device (see DeviceSpec)
//     host_launch_ns: 5000     # eager: host (framework + driver) time to issue one kernel; 0: not modelled
//     graph_launch_overhead_ns: 500  # cuda_graph / compiled: the gap between kernels replayed from the graph
//     kernel_fusion: fused     # fused | eager: element-wise work as fused kernels or as PyTorch eager's ATen ops
//     kernel_model: shaped     # peak | shaped (sim/kernel_model.h); the keys below tune the shaped model
//     compute_units: 108       # SMs / cores the tiles of a kernel spread over (integer >= 1)
//     gemm_tile_m: 128         # a GEMM's output tile (elements, >= 16)
//     gemm_tile_n: 256
//     attention_tile_q: 128    # query rows per flash-attention work item
//     gemm_efficiency: 0.8     # fractions of peak in (0, 1]: the ceiling of large GEMMs,
//     gemm_efficiency_fp8: 0.78  #   of large GEMMs at the fp8 peak (absent: gemm_efficiency),
//     attention_forward_efficiency: 0.73   # of attention forward and backward kernels,
//     attention_backward_efficiency: 0.5
//     hbm_efficiency: 0.88     # and of the datasheet HBM bandwidth that kernels achieve
//     tensor_engine: systolic  # tiles (GPU SMs, the default) | systolic (a NeuronCore's tensor engine):
//     gemm_tile_k: 128         #   systolic: contraction rows of the array (elements, >= 16)
//     matmul_min_columns: 64   #   systolic: the fewest moving columns one matmul instruction costs (>= 1)
//     scalar_engine_gelems: 358.4  # element-wise engines, G elements/s per chip (0: not modelled): the
//     vector_engine_gelems: 286.72 #   activation (exp, PSUM eviction) and the vector (reductions) engines
//
// Errors: ConfigError "FILE:LINE: device.KEY: ..." for unknown presets/keys and for numbers that are not finite
// and > 0 (launch_overhead_ns, graph_launch_overhead_ns, host_launch_ns: >= 0), including .nan and .inf; efficiencies outside (0, 1], tiles below 16 or
// above 65536, compute_units outside 1..1e6, kernel_model other than peak or shaped, tensor_engine other than
// tiles or systolic, matmul_min_columns outside 1..65536, engine rates not finite or < 0.
#pragma once

#include <array>
#include <string>
#include <string_view>
#include <vector>

#include "common/config.h"

namespace shardsim::sim {

// Arithmetic precision of a compute op: which peak of the chip it runs at (runtime::precision_of maps a DType).
//   fp64  IEEE binary64 arithmetic            fp32  IEEE binary32 (not TF32: the kernels are exact fp32)
//   fp16  IEEE binary16 inputs                bf16  bfloat16 inputs
//   fp8   OCP FP8 (E4M3 or E5M2) inputs       int8  8-bit integer inputs (peak in TOPS)
// A precision whose peak is unset (0) runs at the rate of the next one in its fallback chain:
//   fp64 -> fp32;  fp16 -> bf16;  fp8 -> fp16 -> bf16;  int8 -> fp8 -> fp16 -> bf16.
// fp32 and bf16 end every chain and must be set. So a config that gives only fp32 and bf16 (the format before
// the other keys existed) runs fp16/fp8/int8 at the bf16 rate and fp64 at the fp32 rate.
enum class Precision { fp64, fp32, fp16, bf16, fp8, int8 };

inline constexpr std::array<Precision, 6> kAllPrecisions = {Precision::fp64, Precision::fp32, Precision::fp16,
                                                            Precision::bf16, Precision::fp8,  Precision::int8};
std::string precision_name(Precision p);  // "fp64", "fp32", ...
// The precision P falls back to when its peak is unset; P itself for fp32 and bf16 (the ends of the chains).
Precision fallback_of(Precision p);

// How a GEMM's work maps onto the compute units (sim/kernel_model.h).
//   tiles     GPU thread blocks: output tiles of gemm_tile_m x gemm_tile_n (shrunk for small shapes) in waves
//             over the SMs (NVIDIA, "Matrix Multiplication Background User's Guide").
//   systolic  a NeuronCore's tensor engine (AWS NKI architecture guides): a gemm_tile_k x gemm_tile_m array of
//             processing elements; each matmul instruction holds a stationary [K <= tile_k, M <= tile_m] block
//             and streams a moving [K, N <= gemm_tile_n] block through it, costing max(N, matmul_min_columns)
//             cycles; K beyond tile_k accumulates in PSUM.
enum class TensorEngine { tiles, systolic };

// Parameters of the shaped kernel model (sim/kernel_model.h). SHAPED false: every kernel at the datasheet
// roofline, the other fields unused. Each preset's values carry their source in configs/devices.yaml.
struct KernelParams {
  bool shaped = false;
  TensorEngine tensor_engine = TensorEngine::tiles;
  int compute_units = 1;
  int gemm_tile_m = 128, gemm_tile_n = 128;  // elements
  int gemm_tile_k = 128;                     // elements (systolic only)
  int matmul_min_columns = 1;                // moving columns (systolic only)
  int attention_tile_q = 128;                // query rows
  double gemm_efficiency = 1;                // fractions of peak (0, 1]
  double gemm_efficiency_fp8 = 0;            // GEMMs at the fp8 peak; 0: gemm_efficiency
  double attention_forward_efficiency = 1;
  double attention_backward_efficiency = 1;
  double hbm_efficiency = 1;                 // fraction of hbm_gbps
  double scalar_engine_gelems = 0;           // G elements/s per chip (= elements per ns); 0: not modelled
  double vector_engine_gelems = 0;
  std::string source;                        // where these come from
};

struct DeviceSpec {
  std::string name;
  double peak_tflops_fp64 = 0;  // 0: the fp32 rate
  double peak_tflops_fp32 = 0;
  double peak_tflops_fp16 = 0;  // 0: the bf16 rate
  double peak_tflops_bf16 = 0;
  double peak_tflops_fp8 = 0;   // 0: the fp16 rate (and so on)
  double peak_tflops_int8 = 0;  // TOPS; 0: the fp8 rate (and so on)
  double hbm_gbps = 0;
  double hbm_gib = 0;
  // Device side, added to every kernel: the gap between back-to-back kernels of one stream when they are issued
  // eagerly (launch_mode eager); kernel_gap_ns() is the gap in the device's launch mode.
  double launch_overhead_ns = 0;
  // How kernels reach the device (device.launch_mode; sim/timeline.h, "Host issue"):
  //   eager       one host call of host_launch_ns per kernel (a kernel cannot start before the host has issued
  //               it; the host runs ahead of the device except at synchronisations), launch_overhead_ns between
  //               kernels. PyTorch's default; Megatron-LM and NeMo unless CUDA graphs are enabled.
  //   cuda_graph  the step's kernels replayed from a captured CUDA graph: no per-kernel host time, and
  //               graph_launch_overhead_ns between kernels (NVIDIA: the graph's work is submitted to the device at
  //               once, so the per-kernel launch work is done ahead).
  //   compiled    the step compiled into one device program (the Neuron compiler's NEFF on Trainium/Inferentia,
  //               XLA on TPUs): no per-kernel host time, graph_launch_overhead_ns between ops, and no
  //               framework-level multi-tensor launches (the compiler emits the optimizer's element-wise work as
  //               its own fused loops: kernels/optimizer.h, multi_tensor_launches is not used).
  // host_launch_ns 0: the host is never the bottleneck (the model before this key existed).
  bool cuda_graph = false;  // cuda_graph or compiled: no per-kernel host issue
  bool compiled = false;    // compiled
  double host_launch_ns = 0;
  // The gap between kernels under cuda_graph / compiled; < 0 (unset): launch_overhead_ns.
  double graph_launch_overhead_ns = -1;
  double kernel_gap_ns() const {
    return cuda_graph && graph_launch_overhead_ns >= 0 ? graph_launch_overhead_ns : launch_overhead_ns;
  }
  std::string launch_mode_name() const { return compiled ? "compiled" : cuda_graph ? "cuda_graph" : "eager"; }
  // How the framework issues element-wise work (kernel_fusion: fused | eager; sim/eager_kernels.h): fused, one
  // kernel per norm, rotary, activation and loss pass (Megatron-LM, Transformer Engine, Apex, torch.compile);
  // eager, PyTorch eager's sequence of ATen kernels for each (plain PyTorch model code without torch.compile).
  bool eager_kernels = false;
  // HBM a training framework cannot give to the model's state and activations (the CUDA/Neuron context, the
  // communication library's buffers, the allocator's fragmentation): "fits" means at most hbm_gib minus this.
  // Assumption: 1 GiB (PyTorch's CUDA context alone takes about 0.5 GiB on an H100; vLLM keeps 10 % by default).
  double hbm_reserve_gib = 1;
  std::string source;  // where the numbers come from
  KernelParams kernel;  // the kernel model (peak roofline unless kernel.shaped)

  // The peak as set for P (0 if unset), without fallback.
  double explicit_peak_tflops(Precision p) const;
  // The precision whose peak P actually runs at: P if set, else the first set one along P's fallback chain.
  Precision effective_precision(Precision p) const;
  // Peak TFLOP/s at P after the fallback (0 only if fp32/bf16 are unset, which load_device rejects).
  double peak_tflops(Precision p) const { return explicit_peak_tflops(effective_precision(p)); }
  double peak_flops_per_ns(Precision p) const { return peak_tflops(p) * 1e3; }  // FLOP per simulated ns
  double hbm_bytes() const { return hbm_gib * 1073741824.0; }
  double hbm_reserve_bytes() const { return hbm_reserve_gib * 1073741824.0; }
  // What a run may allocate (run's simulated memory and train's "fits" use this one rule; docs/CONFIG.md): the
  // capacity less the reserve.
  double usable_hbm_bytes() const { return hbm_bytes() - hbm_reserve_bytes(); }
};

// Bounds of a device's figures (docs/CONFIG.md, Bounds): far outside every published chip (the largest peak,
// B200's fp4, is about 2e4 TFLOP/s; HBM3e about 8e3 GB/s and 192 GiB), they keep every simulated time finite and
// printable. A peak or bandwidth of 1e-300 would make a step 1e300 ns (or inf); a capacity of 1e-9 GiB is one byte.
struct DeviceBounds {
  static constexpr double min_tflops = 1e-3, max_tflops = 1e6;      // 1 GFLOP/s .. 1 EFLOP/s per chip
  static constexpr double min_hbm_gbps = 1e-3, max_hbm_gbps = 1e6;  // 1 MB/s .. 1 PB/s
  static constexpr double min_hbm_gib = 1.0 / 1048576, max_hbm_gib = 1e6;  // 1 KiB .. about 1 PiB
  static constexpr double max_launch_ns = 1e9;                      // 1 s per kernel launch
};
// "" when VALUE is a valid figure for device key KEY (a peak_tflops_*, hbm_gbps, hbm_gib, launch_overhead_ns,
// graph_launch_overhead_ns, host_launch_ns or hbm_reserve_gib), else why not ("must be between 0.001 and 1e+06 TFLOP/s (got 1e-300)"); other keys: "".
// The one check of load_device and of --what-if's device changes.
std::string device_figure_obstacle(std::string_view key, double value);

DeviceSpec device_preset(const std::string& name);  // throws std::invalid_argument listing the known names
std::vector<std::string> device_preset_names();      // every name device_preset accepts (aliases excluded)
DeviceSpec load_device(const ConfigNode& node);
// The keys a device: section accepts (docs/CONFIG.md documents each; tests/unit/config_doc_test.cpp checks).
inline constexpr std::string_view kDeviceKeys[] = {
    "preset", "name", "peak_tflops_fp64", "peak_tflops_fp32", "peak_tflops_fp16", "peak_tflops_bf16",
    "peak_tflops_fp8", "peak_tflops_int8", "hbm_gbps", "hbm_gib", "hbm_reserve_gib", "launch_overhead_ns",
    "launch_mode", "host_launch_ns", "graph_launch_overhead_ns", "kernel_fusion", "kernel_model",
    "compute_units", "gemm_tile_m", "gemm_tile_n", "attention_tile_q", "gemm_efficiency",
    "attention_forward_efficiency", "attention_backward_efficiency", "hbm_efficiency", "tensor_engine",
    "gemm_tile_k", "matmul_min_columns", "scalar_engine_gelems", "vector_engine_gelems", "gemm_efficiency_fp8"};
// One line: "NAME: 47.5 TFLOP/s fp32, 190 TFLOP/s bf16 (fp16 190, fp8 190, int8 380), HBM 820 GB/s 32 GiB,
// launch 2000 ns" (", host 5000 ns per kernel (eager)" when a host issue time is set; ", CUDA graph: 500 ns between
// kernels" or ", compiled step: 2000 ns between kernels" in those modes); the parenthesis lists the other explicitly set peaks. A shaped kernel model adds
// "; kernels shaped: gemm 80% (fp8 78.3%), attention 73%/50%, HBM 88%, 108 units, tile 128x256" (the fp8
// parenthesis only when gemm_efficiency_fp8 is set); a systolic tensor engine
// says "; kernels shaped (systolic 128x128 array, moving tile 512): ..."; a peak
// one "; kernels at peak (no kernel model: every kernel at the roofline)".
std::string describe(const DeviceSpec& d);

}  // namespace shardsim::sim

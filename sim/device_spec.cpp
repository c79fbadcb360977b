#include "sim/device_spec.h"

#include <cmath>
#include <sstream>
#include <stdexcept>
#include <utility>

namespace shardsim::sim {

std::string precision_name(Precision p) {
  switch (p) {
    case Precision::fp64: return "fp64";
    case Precision::fp32: return "fp32";
    case Precision::fp16: return "fp16";
    case Precision::bf16: return "bf16";
    case Precision::fp8: return "fp8";
    case Precision::int8: return "int8";
  }
  return "?";
}

Precision fallback_of(Precision p) {
  switch (p) {
    case Precision::fp64: return Precision::fp32;
    case Precision::fp16: return Precision::bf16;
    case Precision::fp8: return Precision::fp16;
    case Precision::int8: return Precision::fp8;
    case Precision::fp32:
    case Precision::bf16: break;
  }
  return p;
}

double DeviceSpec::explicit_peak_tflops(Precision p) const {
  switch (p) {
    case Precision::fp64: return peak_tflops_fp64;
    case Precision::fp32: return peak_tflops_fp32;
    case Precision::fp16: return peak_tflops_fp16;
    case Precision::bf16: return peak_tflops_bf16;
    case Precision::fp8: return peak_tflops_fp8;
    case Precision::int8: return peak_tflops_int8;
  }
  return 0;
}

Precision DeviceSpec::effective_precision(Precision p) const {
  while (explicit_peak_tflops(p) <= 0 && fallback_of(p) != p) p = fallback_of(p);
  return p;
}

namespace {

// Every preset below: dense peaks (no structured-sparsity figures), HBM bandwidth in GB = 1e9 B, capacity in GiB.
// launch_overhead_ns is not published for any of these chips. Each real preset uses the same assumed 2 us (a
// few microseconds per kernel launch or per op dispatch is the order seen on current accelerators), so that
// comparing presets compares the published numbers and not this guess. Sweep it with launch_overhead_ns.

DeviceSpec trainium1() {
  DeviceSpec d;
  d.name = "trainium1";
  // AWS Neuron documentation, "Trainium Architecture" (awsdocs-neuron, about-neuron/arch/neuron-hardware/
  // trainium, 2023-2025 revisions): two NeuronCore-v2 per chip delivering 380 INT8 TOPS, 190 FP16/BF16/cFP8/TF32
  // TFLOPS and 47.5 FP32 TFLOPS. (Earlier revisions, e.g. Neuron 2.9 in 2023, said 420 INT8 TOPS.)
  d.peak_tflops_fp32 = 47.5;
  d.peak_tflops_fp16 = 190.0;
  d.peak_tflops_bf16 = 190.0;
  d.peak_tflops_fp8 = 190.0;  // cFP8, the same rate as bf16
  d.peak_tflops_int8 = 380.0;
  // fp64: not supported by the NeuronCore-v2 tensor engine and not published; left unset, so fp64 runs at the
  // fp32 rate (the documented fallback; optimistic for a chip that would emulate it).
  // Same page: 32 GiB device memory at 820 GB/s (written "820 GB/sec" in the Neuron 2.9 revision, "820
  // GiB/sec" in later ones; kept at 820 GB/s, the value the shipped results were computed with).
  d.hbm_gbps = 820.0;
  d.hbm_gib = 32.0;
  // Assumption, not published: see above.
  d.launch_overhead_ns = 2000.0;
  d.source = "AWS Neuron docs, Trainium Architecture (compute, HBM); fp64 and launch overhead assumed";
  return d;
}

DeviceSpec tpu_v4() {
  DeviceSpec d;
  d.name = "tpu_v4";
  // Jouppi et al., "TPU v4: An Optically Reconfigurable Supercomputer for Machine Learning with Hardware Support
  // for Embeddings", ISCA 2023 (and Google Cloud's "TPU v4" system architecture page): 275 peak TFLOPS per chip
  // in bf16 or int8, 32 GiB HBM2 at 1200 GB/s.
  d.peak_tflops_bf16 = 275.0;
  d.peak_tflops_int8 = 275.0;
  // fp32: assumption, not published. The MXUs multiply bf16; XLA computes a full-precision fp32 matmul as six
  // bf16 passes (precision HIGHEST, "bf16_6x"), so 275 / 6. The simulator's fp32 kernels are exact fp32, hence
  // the full-precision rate and not the default single-pass one.
  d.peak_tflops_fp32 = 275.0 / 6.0;
  // fp16, fp8: no native support is published; unset, so they fall back to the bf16 rate (fp8 -> fp16 -> bf16).
  // fp64: no hardware support; unset, so it runs at the fp32 rate above (optimistic).
  d.hbm_gbps = 1200.0;
  d.hbm_gib = 32.0;
  // Assumption, not published: see above.
  d.launch_overhead_ns = 2000.0;
  d.source = "Jouppi et al., ISCA 2023 (bf16, int8, HBM); fp32 = bf16/6 and launch overhead assumed";
  return d;
}

DeviceSpec h100() {
  DeviceSpec d;
  d.name = "h100";
  // NVIDIA H100 Tensor Core GPU datasheet (2023), H100 SXM column, dense rates (the datasheet's tensor-core
  // figures are quoted with 2:4 sparsity; the dense rates are half of them).
  // FP64 34 TFLOPS: the general (non-tensor-core) rate. The FP64 Tensor Core rate (67) applies to DGEMM-shaped
  // work only; the model has one fp64 peak for every kernel, so the general rate is used.
  d.peak_tflops_fp64 = 34.0;
  // FP32 67 TFLOPS (CUDA cores). TF32 tensor cores (495 dense) are not used for fp32: they round the inputs to a
  // 10-bit mantissa, and the simulator's fp32 kernels are exact fp32.
  d.peak_tflops_fp32 = 67.0;
  d.peak_tflops_fp16 = 989.0;  // FP16 Tensor Core, 1979 with sparsity
  d.peak_tflops_bf16 = 989.0;  // BF16 Tensor Core, 1979 with sparsity
  d.peak_tflops_fp8 = 1979.0;  // FP8 Tensor Core, 3958 with sparsity
  d.peak_tflops_int8 = 1979.0; // INT8 Tensor Core TOPS, 3958 with sparsity
  // Same datasheet: 80 GB HBM3 at 3.35 TB/s. The 80 GB is taken as 80 GiB: HBM stacks are built from
  // binary-sized DRAM dies (5 active stacks of 16 GiB); the part the driver reserves is not modelled.
  d.hbm_gbps = 3350.0;
  d.hbm_gib = 80.0;
  // Assumption, not published: see above.
  d.launch_overhead_ns = 2000.0;
  d.source = "NVIDIA H100 Tensor Core GPU datasheet, SXM, dense (compute, HBM); launch overhead assumed";
  // Shaped kernel model (sim/kernel_model.h).
  d.kernel.shaped = true;
  d.kernel.compute_units = 132;  // SMs of the H100 SXM5 (NVIDIA Hopper architecture white paper / tuning guide)
  // Tiles: assumption (128 x 256 is CUTLASS's large tensor-core tile; libraries pick among several).
  d.kernel.gemm_tile_m = 128;
  d.kernel.gemm_tile_n = 256;
  d.kernel.attention_tile_q = 128;  // assumption: FlashAttention's query block of 128 rows
  d.kernel.gemm_efficiency = 0.8;   // assumption (large cuBLAS GEMMs); calibrate with `calibrate --kernels`
  // FlashAttention-3 (Shah et al., arXiv 2407.08608), abstract: FP16 forward "reaching up to 740 TFLOPs/s (75%
  // utilization)" on H100. Backward: assumption, the low end of FlashAttention-2's 50-73 % (arXiv 2307.08691).
  d.kernel.attention_forward_efficiency = 0.75;
  d.kernel.attention_backward_efficiency = 0.5;
  // NVIDIA Hopper tuning guide: HBM3 "up to 3 TB/s" against the datasheet's 3.35 TB/s: 3.0 / 3.35.
  d.kernel.hbm_efficiency = 3.0 / 3.35;
  d.kernel.source = "132 SMs (Hopper white paper); attention forward FlashAttention-3; HBM Hopper tuning guide; "
                    "tiles, GEMM ceiling and attention backward assumed";
  return d;
}

DeviceSpec a100() {
  DeviceSpec d;
  d.name = "a100";
  // NVIDIA A100 Tensor Core GPU datasheet (A100 80GB SXM column), dense rates (the tensor-core figures with 2:4
  // sparsity are twice these). FP64 9.7 TFLOPS is the general rate (19.5 with FP64 tensor cores, DGEMM only; as
  // for h100 the general rate is used). FP32 19.5 (CUDA cores; TF32 156 rounds inputs, not used for exact fp32).
  d.peak_tflops_fp64 = 9.7;
  d.peak_tflops_fp32 = 19.5;
  d.peak_tflops_fp16 = 312.0;
  d.peak_tflops_bf16 = 312.0;  // the peak Megatron-LM's papers use (Narayanan et al. 2021, section 5)
  d.peak_tflops_int8 = 624.0;  // TOPS; no FP8 on A100: fp8 falls back to the fp16 rate (never used by A100 runs)
  // Same datasheet: 80 GB HBM2e at 2,039 GB/s (taken as 80 GiB, as for h100).
  d.hbm_gbps = 2039.0;
  d.hbm_gib = 80.0;
  d.launch_overhead_ns = 2000.0;  // assumption, as every preset
  d.source = "NVIDIA A100 Tensor Core GPU datasheet, 80GB SXM, dense (compute, HBM); launch overhead assumed";
  d.kernel.shaped = true;
  d.kernel.compute_units = 108;  // SMs of the A100 (NVIDIA Ampere GA100 architecture white paper)
  d.kernel.gemm_tile_m = 128;    // assumption, as for h100
  d.kernel.gemm_tile_n = 256;
  d.kernel.attention_tile_q = 128;  // assumption, as for h100
  d.kernel.gemm_efficiency = 0.8;   // assumption, as for h100
  // FlashAttention-2 (Dao, arXiv 2307.08691), abstract: "reaching 50-73% of the theoretical maximum FLOPs/s on
  // A100": the forward at the top of that range, the backward (the slower pass) at its bottom.
  d.kernel.attention_forward_efficiency = 0.73;
  d.kernel.attention_backward_efficiency = 0.5;
  // Measured: 1.80 of 2.04 TB/s on an A100 80GB SXM, 88 % (Nsight Compute agrees; NVIDIA developer forum,
  // "Trouble to reach peak bandwidth of A100", which cites a GTC talk where no kernel exceeded about 90 %).
  d.kernel.hbm_efficiency = 0.88;
  d.kernel.source = "108 SMs (Ampere white paper); attention FlashAttention-2; HBM measured 88 %; tiles and "
                    "GEMM ceiling assumed";
  return d;
}

DeviceSpec generic() {
  DeviceSpec d;
  d.name = "generic";
  // A round-number chip for tests and examples: 100 TFLOP/s fp32, 400 bf16, 1000 GB/s HBM, 16 GiB, 1 us.
  // fp64, fp16, fp8 and int8 are unset on purpose: they follow the fallback rules (fp64 at 100, the rest at 400).
  d.peak_tflops_fp32 = 100.0;
  d.peak_tflops_bf16 = 400.0;
  d.hbm_gbps = 1000.0;
  d.hbm_gib = 16.0;
  d.launch_overhead_ns = 1000.0;
  d.source = "synthetic round numbers";
  return d;
}

struct Preset {
  const char* name;
  DeviceSpec (*make)();
};
constexpr Preset kPresets[] = {{"trainium1", trainium1}, {"tpu_v4", tpu_v4}, {"h100", h100}, {"a100", a100},
                               {"generic", generic}};
// Accepted as well, not listed.
constexpr Preset kAliases[] = {{"trainium", trainium1}, {"h100_sxm", h100}, {"a100_sxm", a100}};

void load_kernel_params(const ConfigNode& node, KernelParams& k) {
  if (node.has("kernel_model")) {
    const std::string m = node.get_string("kernel_model");
    if (m != "peak" && m != "shaped")
      node.child("kernel_model").fail("device.kernel_model: must be peak or shaped (got '" + m + "')");
    k.shaped = m == "shaped";
  }
  const std::pair<const char*, int*> ints[] = {{"gemm_tile_m", &k.gemm_tile_m},
                                               {"gemm_tile_n", &k.gemm_tile_n},
                                               {"attention_tile_q", &k.attention_tile_q}};
  for (const auto& [key, field] : ints)
    if (node.has(key)) *field = static_cast<int>(node.get_int_in(key, 16, 65536));
  if (node.has("compute_units")) k.compute_units = static_cast<int>(node.get_int_in("compute_units", 1, 1000000));
  const std::pair<const char*, double*> fractions[] = {
      {"gemm_efficiency", &k.gemm_efficiency},
      {"attention_forward_efficiency", &k.attention_forward_efficiency},
      {"attention_backward_efficiency", &k.attention_backward_efficiency},
      {"hbm_efficiency", &k.hbm_efficiency}};
  for (const auto& [key, field] : fractions) {
    if (!node.has(key)) continue;
    const double v = node.get_positive_double(key);
    if (v > 1.0) node.child(key).fail(std::string("device.") + key + ": must be in (0, 1] (a fraction of peak)");
    *field = v;
  }
  bool overridden = false;
  for (auto key : {"compute_units", "gemm_tile_m", "gemm_tile_n", "attention_tile_q", "gemm_efficiency",
                   "attention_forward_efficiency", "attention_backward_efficiency", "hbm_efficiency"})
    overridden = overridden || node.has(key);
  if (overridden) k.source = k.source.empty() ? "config file" : k.source + "; overridden in the config";
}

}  // namespace

std::vector<std::string> device_preset_names() {
  std::vector<std::string> names;
  for (const auto& p : kPresets) names.emplace_back(p.name);
  return names;
}

DeviceSpec device_preset(const std::string& name) {
  for (const auto& p : kPresets)
    if (name == p.name) return p.make();
  for (const auto& p : kAliases)
    if (name == p.name) return p.make();
  std::string known;
  for (const auto& n : device_preset_names()) known += (known.empty() ? "" : ", ") + n;
  throw std::invalid_argument("unknown device preset '" + name + "' (known: " + known + ")");
}

DeviceSpec load_device(const ConfigNode& node) {
  node.expect_keys(kDeviceKeys);
  DeviceSpec d;
  if (node.has("preset")) {
    try {
      d = device_preset(node.get_string("preset"));
    } catch (const std::invalid_argument& e) {
      node.child("preset").fail(std::string("device.preset: ") + e.what());
    }
  } else {
    d.name = "custom";
    d.source = "config file";
    for (auto key : {"peak_tflops_fp32", "peak_tflops_bf16", "hbm_gbps", "hbm_gib"})
      if (!node.has(key)) node.fail(std::string("device: without a preset, '") + key + "' is required");
  }
  if (node.has("name")) d.name = node.get_string("name");
  const std::pair<const char*, double*> positive[] = {
      {"peak_tflops_fp64", &d.peak_tflops_fp64}, {"peak_tflops_fp32", &d.peak_tflops_fp32},
      {"peak_tflops_fp16", &d.peak_tflops_fp16}, {"peak_tflops_bf16", &d.peak_tflops_bf16},
      {"peak_tflops_fp8", &d.peak_tflops_fp8},   {"peak_tflops_int8", &d.peak_tflops_int8},
      {"hbm_gbps", &d.hbm_gbps},                 {"hbm_gib", &d.hbm_gib}};
  for (const auto& [key, field] : positive)
    if (node.has(key)) *field = node.get_positive_double(key);
  d.launch_overhead_ns = node.get_nonnegative_double("launch_overhead_ns", d.launch_overhead_ns);
  load_kernel_params(node, d.kernel);
  return d;
}

std::string describe(const DeviceSpec& d) {
  std::ostringstream os;
  os << d.name << ": " << d.peak_tflops_fp32 << " TFLOP/s fp32, " << d.peak_tflops_bf16 << " TFLOP/s bf16";
  std::string others;
  for (Precision p : {Precision::fp64, Precision::fp16, Precision::fp8, Precision::int8}) {
    if (d.explicit_peak_tflops(p) <= 0) continue;
    std::ostringstream o;
    o << precision_name(p) << " " << d.explicit_peak_tflops(p);
    others += (others.empty() ? "" : ", ") + o.str();
  }
  if (!others.empty()) os << " (" << others << ")";
  os << ", HBM " << d.hbm_gbps << " GB/s " << d.hbm_gib << " GiB, launch " << d.launch_overhead_ns << " ns";
  if (d.kernel.shaped) {
    const auto& k = d.kernel;
    const auto pct = [](double f) { return std::round(f * 1000.0) / 10.0; };
    os << "; kernels shaped: gemm " << pct(k.gemm_efficiency) << "%, attention "
       << pct(k.attention_forward_efficiency) << "%/" << pct(k.attention_backward_efficiency) << "%, HBM "
       << pct(k.hbm_efficiency) << "%, " << k.compute_units << " units, tile " << k.gemm_tile_m << "x"
       << k.gemm_tile_n;
  }
  return os.str();
}

}  // namespace shardsim::sim

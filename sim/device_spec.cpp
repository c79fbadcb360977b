#include "sim/device_spec.h"

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
constexpr Preset kPresets[] = {{"trainium1", trainium1}, {"tpu_v4", tpu_v4}, {"h100", h100}, {"generic", generic}};
// Accepted as well, not listed.
constexpr Preset kAliases[] = {{"trainium", trainium1}, {"h100_sxm", h100}};

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
  return os.str();
}

}  // namespace shardsim::sim

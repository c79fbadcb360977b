#include "sim/device_spec.h"

#include "sim/device_presets.h"

#include <algorithm>
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

void load_kernel_params(const ConfigNode& node, KernelParams& k) {
  if (node.has("kernel_model")) {
    const std::string m = node.get_string("kernel_model");
    if (m != "peak" && m != "shaped")
      node.child("kernel_model").fail("device.kernel_model: must be peak or shaped (got '" + m + "')");
    k.shaped = m == "shaped";
  }
  if (node.has("tensor_engine")) {
    const std::string e = node.get_string("tensor_engine");
    if (e != "tiles" && e != "systolic")
      node.child("tensor_engine").fail("device.tensor_engine: must be tiles or systolic (got '" + e + "')");
    k.tensor_engine = e == "systolic" ? TensorEngine::systolic : TensorEngine::tiles;
  }
  const std::pair<const char*, int*> ints[] = {{"gemm_tile_m", &k.gemm_tile_m},
                                               {"gemm_tile_n", &k.gemm_tile_n},
                                               {"gemm_tile_k", &k.gemm_tile_k},
                                               {"attention_tile_q", &k.attention_tile_q}};
  for (const auto& [key, field] : ints)
    if (node.has(key)) *field = static_cast<int>(node.get_int_in(key, 16, 65536));
  if (node.has("compute_units")) k.compute_units = static_cast<int>(node.get_int_in("compute_units", 1, 1000000));
  if (node.has("matmul_min_columns"))
    k.matmul_min_columns = static_cast<int>(node.get_int_in("matmul_min_columns", 1, 65536));
  for (const auto& [key, field] : {std::pair<const char*, double*>{"scalar_engine_gelems", &k.scalar_engine_gelems},
                                   std::pair<const char*, double*>{"vector_engine_gelems", &k.vector_engine_gelems}})
    if (node.has(key)) *field = node.get_nonnegative_double(key, 0);
  const std::pair<const char*, double*> fractions[] = {
      {"gemm_efficiency", &k.gemm_efficiency},
      {"gemm_efficiency_fp8", &k.gemm_efficiency_fp8},
      {"attention_forward_efficiency", &k.attention_forward_efficiency},
      {"attention_backward_efficiency", &k.attention_backward_efficiency},
      {"hbm_efficiency", &k.hbm_efficiency}};
  for (const auto& [key, field] : fractions) {
    if (!node.has(key)) continue;
    // At least 1 %: a fraction of 1e-300 would stretch a kernel to 1e300 times its peak time (not finite in print).
    const double v = node.get_double(key);
    if (!(v >= 0.01 && v <= 1.0))
      node.child(key).fail(std::string("device.") + key + ": must be in [0.01, 1] (a fraction of peak)");
    *field = v;
  }
  bool overridden = false;
  for (auto key : {"compute_units", "gemm_tile_m", "gemm_tile_n", "attention_tile_q", "gemm_efficiency",
                   "attention_forward_efficiency", "attention_backward_efficiency", "hbm_efficiency",
                   "tensor_engine", "gemm_tile_k", "matmul_min_columns", "scalar_engine_gelems",
                   "vector_engine_gelems", "gemm_efficiency_fp8"})
    overridden = overridden || node.has(key);
  if (overridden) k.source = k.source.empty() ? "config file" : k.source + "; overridden in the config";
}

}  // namespace

std::vector<std::string> device_preset_names() {
  std::vector<std::string> names;
  for (const auto& p : device_presets()) names.push_back(p.name);
  return names;
}

DeviceSpec device_preset(const std::string& name) {
  for (const auto& p : device_presets()) {
    if (name == p.name) return p.spec;
    for (const auto& a : p.aliases)
      if (name == a) return p.spec;
  }
  std::string known;
  for (const auto& n : device_preset_names()) known += (known.empty() ? "" : ", ") + n;
  throw std::invalid_argument("unknown device preset '" + name + "' (known: " + known + ")");
}

std::string device_figure_obstacle(std::string_view key, double value) {
  const auto range = [&](double lo, double hi, const char* unit) {
    if (value >= lo && value <= hi) return std::string();  // false for NaN
    std::ostringstream os;
    os << "must be between " << lo << " and " << hi << " " << unit << " (got " << value << "; docs/CONFIG.md, Bounds)";
    return os.str();
  };
  if (key.rfind("peak_tflops_", 0) == 0)
    return range(DeviceBounds::min_tflops, DeviceBounds::max_tflops, key == "peak_tflops_int8" ? "TOPS" : "TFLOP/s");
  if (key == "hbm_gbps") return range(DeviceBounds::min_hbm_gbps, DeviceBounds::max_hbm_gbps, "GB/s");
  if (key == "hbm_gib") return range(DeviceBounds::min_hbm_gib, DeviceBounds::max_hbm_gib, "GiB");
  if (key == "launch_overhead_ns" || key == "host_launch_ns" || key == "graph_launch_overhead_ns") return range(0, DeviceBounds::max_launch_ns, "ns");
  if (key == "hbm_reserve_gib") return range(0, DeviceBounds::max_hbm_gib, "GiB");
  return "";
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
  const auto bounded = [&](const char* key, double* field) {
    if (!node.has(key)) return;
    *field = node.get_double(key);  // finite (ConfigNode refuses .nan and .inf)
    if (const std::string why = device_figure_obstacle(key, *field); !why.empty())
      node.child(key).fail(node.child(key).path() + ": " + why);
  };
  for (const auto& [key, field] : positive) bounded(key, field);
  bounded("launch_overhead_ns", &d.launch_overhead_ns);
  bounded("host_launch_ns", &d.host_launch_ns);
  bounded("graph_launch_overhead_ns", &d.graph_launch_overhead_ns);
  if (node.has("launch_mode")) {
    const std::string m = node.get_string("launch_mode");
    if (m != "eager" && m != "cuda_graph" && m != "compiled")
      node.child("launch_mode").fail("device.launch_mode: must be eager, cuda_graph or compiled (got '" + m + "')");
    d.cuda_graph = m != "eager";
    d.compiled = m == "compiled";
  }
  if (node.has("kernel_fusion")) {
    const std::string m = node.get_string("kernel_fusion");
    if (m != "fused" && m != "eager")
      node.child("kernel_fusion").fail("device.kernel_fusion: must be fused or eager (got '" + m + "')");
    d.eager_kernels = m == "eager";
  }
  if (!node.has("hbm_reserve_gib")) d.hbm_reserve_gib = std::min(d.hbm_reserve_gib, d.hbm_gib / 2);  // tiny devices
  bounded("hbm_reserve_gib", &d.hbm_reserve_gib);
  if (node.has("hbm_reserve_gib") && d.hbm_reserve_gib >= d.hbm_gib)
    node.child("hbm_reserve_gib").fail(node.child("hbm_reserve_gib").path() + ": must be below hbm_gib (" + std::to_string(d.hbm_gib) +
                                      " GiB)");
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
  if (d.cuda_graph) os << (d.compiled ? ", compiled step: " : ", CUDA graph: ") << d.kernel_gap_ns() << " ns between kernels";
  else if (d.host_launch_ns > 0) os << ", host " << d.host_launch_ns << " ns per kernel (eager)";
  if (d.eager_kernels) os << ", element-wise work as PyTorch eager's kernels";
  if (d.kernel.shaped) {
    const auto& k = d.kernel;
    const auto pct = [](double f) { return std::round(f * 1000.0) / 10.0; };
    os << "; kernels shaped";
    if (k.tensor_engine == TensorEngine::systolic)
      os << " (systolic " << k.gemm_tile_k << "x" << k.gemm_tile_m << " array, moving tile " << k.gemm_tile_n << ")";
    os << ": gemm " << pct(k.gemm_efficiency) << "%";
    if (k.gemm_efficiency_fp8 > 0) os << " (fp8 " << pct(k.gemm_efficiency_fp8) << "%)";
    os << ", attention "
       << pct(k.attention_forward_efficiency) << "%/" << pct(k.attention_backward_efficiency) << "%, HBM "
       << pct(k.hbm_efficiency) << "%, " << k.compute_units << " units";
    if (k.tensor_engine == TensorEngine::tiles) os << ", tile " << k.gemm_tile_m << "x" << k.gemm_tile_n;
  } else {
    os << "; kernels at peak (no kernel model: every kernel at the roofline)";
  }
  return os.str();
}

}  // namespace shardsim::sim

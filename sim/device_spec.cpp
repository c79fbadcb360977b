#include "sim/device_spec.h"

#include <stdexcept>

namespace shardsim::sim {

namespace {

DeviceSpec trainium1() {
  DeviceSpec d;
  d.name = "trainium1";
  // AWS Neuron documentation, "Trainium Architecture" (awsdocs-neuron, general/arch/neuron-hardware/trainium):
  // two NeuronCore-v2 per chip, 190 FP16/BF16 TFLOPS and 47.5 FP32 TFLOPS per chip.
  d.peak_tflops_fp32 = 47.5;
  d.peak_tflops_bf16 = 190.0;
  // Same page: 32 GiB device memory at 820 GB/s.
  d.hbm_gbps = 820.0;
  d.hbm_gib = 32.0;
  // Assumption, not published: a few microseconds per kernel launch, the order seen on current accelerators.
  d.launch_overhead_ns = 2000.0;
  d.source = "AWS Neuron docs, Trainium Architecture (compute, HBM); launch overhead assumed";
  return d;
}

DeviceSpec generic() {
  DeviceSpec d;
  d.name = "generic";
  // A round-number chip for tests and examples: 100 TFLOP/s fp32, 400 bf16, 1000 GB/s HBM, 16 GiB, 1 us.
  d.peak_tflops_fp32 = 100.0;
  d.peak_tflops_bf16 = 400.0;
  d.hbm_gbps = 1000.0;
  d.hbm_gib = 16.0;
  d.launch_overhead_ns = 1000.0;
  d.source = "synthetic round numbers";
  return d;
}

}  // namespace

std::vector<std::string> device_preset_names() { return {"trainium1", "generic"}; }

DeviceSpec device_preset(const std::string& name) {
  if (name == "trainium1" || name == "trainium") return trainium1();
  if (name == "generic") return generic();
  throw std::invalid_argument("unknown device preset '" + name + "' (known: trainium1, generic)");
}

DeviceSpec load_device(const ConfigNode& node) {
  node.expect_keys({"preset", "name", "peak_tflops_fp32", "peak_tflops_bf16", "hbm_gbps", "hbm_gib",
                    "launch_overhead_ns"});
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
  if (node.has("peak_tflops_fp32")) d.peak_tflops_fp32 = node.get_positive_double("peak_tflops_fp32");
  if (node.has("peak_tflops_bf16")) d.peak_tflops_bf16 = node.get_positive_double("peak_tflops_bf16");
  if (node.has("hbm_gbps")) d.hbm_gbps = node.get_positive_double("hbm_gbps");
  if (node.has("hbm_gib")) d.hbm_gib = node.get_positive_double("hbm_gib");
  d.launch_overhead_ns = node.get_nonnegative_double("launch_overhead_ns", d.launch_overhead_ns);
  return d;
}

}  // namespace shardsim::sim

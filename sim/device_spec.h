// The modelled accelerator: peak compute per precision, HBM bandwidth and capacity, launch overhead.
//
// Units: FLOP/s as TFLOP/s (1e12); HBM bandwidth GB/s (1e9 B/s); capacity GiB (2^30 B); overhead ns.
// Presets carry the public source of each number in a comment (device_spec.cpp).
//
//   device:
//     preset: trainium1        # trainium1 | generic; optional
//     peak_tflops_fp32: 47.5   # any field overrides the preset
//     peak_tflops_bf16: 190
//     hbm_gbps: 820
//     hbm_gib: 32
//     launch_overhead_ns: 2000
//
// Errors: ConfigError for unknown presets/keys or non-positive numbers.
#pragma once

#include <string>
#include <vector>

#include "common/config.h"

namespace shardsim::sim {

// Arithmetic precision of a compute op (what the tensor engine runs at).
enum class Precision { fp32, bf16 };

struct DeviceSpec {
  std::string name;
  double peak_tflops_fp32 = 0;
  double peak_tflops_bf16 = 0;
  double hbm_gbps = 0;
  double hbm_gib = 0;
  double launch_overhead_ns = 0;
  std::string source;  // where the numbers come from

  double peak_flops_per_ns(Precision p) const {  // FLOP per simulated ns
    return (p == Precision::fp32 ? peak_tflops_fp32 : peak_tflops_bf16) * 1e3;
  }
};

DeviceSpec device_preset(const std::string& name);  // throws std::invalid_argument if unknown
std::vector<std::string> device_preset_names();
DeviceSpec load_device(const ConfigNode& node);

}  // namespace shardsim::sim

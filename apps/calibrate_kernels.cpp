// `shardsim calibrate --kernels TABLE.csv --device PRESET|FILE [--out FILE] [--json FILE] [--strict]`: fits the
// device's shaped kernel model (sim/kernel_model.h) to measured kernel times (kernels/kernel_calibrate.h), prints
// the fitted fractions and the error per row, and writes a device: section every command accepts (--device FILE).
// Rank 0 alone reads and fits; every rank agrees on its errors.
#include <cmath>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "apps/calibrate_kernels.h"
#include "apps/cli_common.h"
#include "common/config.h"
#include "common/error.h"
#include "common/input_file.h"
#include "common/output_file.h"
#include "common/text.h"
#include "kernels/kernel_calibrate.h"
#include "sharding/engine_config.h"

namespace shardsim::apps {

namespace {

constexpr size_t kMaxTableBytes = 64u << 20;

sim::DeviceSpec device_of(const std::string& arg) {
  YAML::Node root(YAML::NodeType::Map);
  root["device"] = sharding::device_flag_node(arg);  // the one --device rule of every command
  return sharding::load_workload_device(ConfigNode(root, arg, ""));
}

void print_fit(const sim::DeviceSpec& dev, const kernels::KernelFit& fit, const std::string& table) {
  std::printf("# shardsim calibrate --kernels: %zu rows of %s on device %s\n", fit.rows.size(),
              escape_control(table).c_str(), dev.name.c_str());
  std::printf("# model: t = launch + max(flops x q / (peak x e_class), bytes / (HBM x e_hbm)); launch %g ns, %d "
              "units, tile %dx%d, attention tile %d (as the device gives them)\n",
              dev.launch_overhead_ns, dev.kernel.compute_units, dev.kernel.gemm_tile_m, dev.kernel.gemm_tile_n,
              dev.kernel.attention_tile_q);
  const auto& k = fit.fitted;
  const std::pair<const char*, double> values[] = {{"gemm_efficiency", k.gemm_efficiency},
                                                  {"attention_forward_efficiency", k.attention_forward_efficiency},
                                                  {"attention_backward_efficiency", k.attention_backward_efficiency},
                                                  {"hbm_efficiency", k.hbm_efficiency}};
  for (const auto& [name, v] : values) {
    const bool fitted = std::find(fit.fitted_names.begin(), fit.fitted_names.end(), name) != fit.fitted_names.end();
    std::printf("fit   %-30s %.6g%s\n", name, v, fitted ? "" : "  (not fitted: no row bound by it; the device's value)");
  }
  for (const auto& name : fit.impossible)
    std::printf("warning: physically impossible fit: %s above 1 (faster than the datasheet peak; check the dtype "
                "and the device)\n", name.c_str());
  std::printf("#\n#  %-24s %-19s %-5s %28s %12s %12s %8s  %s\n", "file:line", "kernel", "dtype", "m x n x k x batch",
              "measured us", "predicted us", "error", "bound");
  for (const auto& r : fit.rows) {
    const std::string where = escape_control(table) + ":" + std::to_string(r.line);
    char shape[64];
    std::snprintf(shape, sizeof shape, "%lldx%lldx%lldx%lld", (long long)r.shape.m, (long long)r.shape.n,
                  (long long)r.shape.k, (long long)r.shape.batch);
    std::printf("   %-24s %-19s %-5s %28s %12.3f %12.3f %+7.2f%%  %s\n", where.c_str(), r.kernel.c_str(),
                sim::precision_name(r.precision).c_str(), r.kernel == "copy" ? "-" : shape, r.measured_ns / 1e3,
                r.predicted_ns / 1e3, 100 * (r.predicted_ns - r.measured_ns) / r.measured_ns, r.bound.c_str());
  }
  std::printf("#\nerror rms %.2f%% over %zu rows (%d assignment round(s))\n", 100 * fit.rms_relative_error,
              fit.rows.size(), fit.iterations);
}

nlohmann::json fit_json(const sim::DeviceSpec& dev, const kernels::KernelFit& fit) {
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& r : fit.rows)
    rows.push_back({{"line", r.line}, {"kernel", r.kernel}, {"precision", sim::precision_name(r.precision)},
                    {"m", r.shape.m}, {"n", r.shape.n}, {"k", r.shape.k}, {"batch", r.shape.batch},
                    {"flops", r.flops}, {"bytes", r.bytes}, {"measured_us", r.measured_ns / 1e3},
                    {"predicted_us", r.predicted_ns / 1e3}, {"bound", r.bound}});
  const auto& k = fit.fitted;
  return {{"device", dev.name},
          {"fitted", {{"gemm_efficiency", k.gemm_efficiency},
                      {"attention_forward_efficiency", k.attention_forward_efficiency},
                      {"attention_backward_efficiency", k.attention_backward_efficiency},
                      {"hbm_efficiency", k.hbm_efficiency}}},
          {"fitted_parameters", fit.fitted_names},
          {"not_fitted", fit.not_fitted},
          {"impossible", fit.impossible},
          {"rms_relative_error", fit.rms_relative_error},
          {"rows", rows}};
}

}  // namespace

int run_calibrate_kernels(const runtime::World& world, const KernelCalibrateFlags& f) {
  sim::DeviceSpec dev;
  kernels::KernelFit fit;
  world.agree([&] {
    if (f.device.empty()) throw UsageError("calibrate --kernels: give --device PRESET or a file with a device: section");
    std::vector<std::pair<std::string, std::string>> outs;
    if (!f.out.empty()) outs.emplace_back("--out", f.out);
    if (!f.json.empty()) outs.emplace_back("--json", f.json);
    check_outputs_distinct(outs, {{"the kernel table", f.table}, {"the --device file", f.device}});
    dev = device_of(f.device);
    if (world.rank() != 0) return;
    fit = kernels::fit_kernel_model(dev, kernels::parse_kernel_table(
                                             read_input_file(f.table, kMaxTableBytes, "a kernel timing table"), f.table));
    if (!fit.impossible.empty() && (f.strict || !f.out.empty()))
      throw ConfigError("calibrate --kernels: the fit is physically impossible: " + fit.impossible.front() +
                        " above 1 (faster than the datasheet peak; check the dtype and the device)" +
                        (f.strict ? "" : "; no --out written"));
  });
  if (world.rank() == 0) print_fit(dev, fit, f.table);
  if (!f.json.empty()) world.agree([&] {
    if (world.rank() == 0) write_file(f.json, fit_json(dev, fit).dump(2) + "\n");
  });
  if (!f.out.empty()) {
    world.agree([&] {
      if (world.rank() == 0)
        write_file(f.out, kernels::device_override_yaml(dev, fit.fitted,
                                                               "written by shardsim calibrate --kernels from " + f.table));
    });
    if (world.rank() == 0) std::printf("wrote %s (use it with --device)\n", escape_control(f.out).c_str());
  }
  return 0;
}

}  // namespace shardsim::apps

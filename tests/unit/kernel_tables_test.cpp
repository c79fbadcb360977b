// The published kernel tables (configs/kernel_tables/, named by each preset's kernel_table fact): `shardsim
// calibrate --kernels` fed with a preset's table reproduces the preset's kernel ceilings.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>

#include "kernels/kernel_calibrate.h"
#include "sim/device_presets.h"

using namespace shardsim;

namespace {

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

double fitted_value(const sim::KernelParams& k, const std::string& name) {
  if (name == "gemm_efficiency") return k.gemm_efficiency;
  if (name == "attention_forward_efficiency") return k.attention_forward_efficiency;
  if (name == "attention_backward_efficiency") return k.attention_backward_efficiency;
  if (name == "hbm_efficiency") return k.hbm_efficiency;
  ADD_FAILURE() << "unknown parameter " << name;
  return 0;
}

}  // namespace

TEST(KernelTables, TheFitOfEachPublishedTableIsThePreset) {
  int tables = 0;
  for (const auto& p : sim::device_presets()) {
    for (const auto& [key, file] : p.facts) {
      if (key != "kernel_table") continue;
      ++tables;
      const std::string text = read_text(std::string(SHARDSIM_CONFIG_DIR) + "/" + file);
      ASSERT_FALSE(text.empty()) << p.name << ": " << file;
      // Start the fit away from the preset's values, so agreement is not the starting point.
      sim::DeviceSpec start = p.spec;
      start.kernel.gemm_efficiency = start.kernel.attention_forward_efficiency = 0.5;
      start.kernel.attention_backward_efficiency = 0.5;  // (HBM efficiency: the preset's; no table row is HBM-bound)
      const auto fit = kernels::fit_kernel_model(start, kernels::parse_kernel_table(text, file));
      EXPECT_NE(std::find(fit.fitted_names.begin(), fit.fitted_names.end(), "gemm_efficiency"),
                fit.fitted_names.end())
          << p.name;
      EXPECT_TRUE(fit.impossible.empty()) << p.name;
      for (const auto& name : fit.fitted_names) {
        const double preset = fitted_value(p.spec.kernel, name), fitted = fitted_value(fit.fitted, name);
        EXPECT_NEAR(fitted, preset, 1e-9 * preset) << p.name << " " << name << " (" << file << ")";
      }
    }
  }
  EXPECT_GE(tables, 3);  // a100, h100, mi300x
}

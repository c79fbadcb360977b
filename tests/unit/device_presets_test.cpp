// The device presets data file (configs/devices.yaml, sim/device_presets.h): every preset loads through the one
// device parser, every number the model uses names a source, names are unique, node configs load; a crafted
// file fails with FILE:LINE and the key.
#include <gtest/gtest.h>

#include <filesystem>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <set>
#include <string>

#include "common/error.h"
#include "sim/device_presets.h"
#include "sim/embedded_data.h"
#include "topology/topology_yaml.h"

namespace shardsim {
namespace {

std::string write_temp(const std::string& name, const std::string& text) {
  const auto path = std::filesystem::temp_directory_path() / name;
  std::ofstream(path) << text;
  return path.string();
}

std::string error_of(const std::string& text) {
  try {
    (void)sim::read_device_presets(write_temp("shardsim_presets_test.yaml", text));
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(DevicePresets, TheIssueListLoadsWithSourcesAndPlausibleFigures) {
  const auto& presets = sim::device_presets();
  std::set<std::string> names;
  for (const auto& p : presets) {
    names.insert(p.name);
    EXPECT_EQ(p.spec.name, p.name);
    EXPECT_FALSE(p.sources.empty()) << p.name;
    EXPECT_FALSE(p.spec.source.empty()) << p.name;
    // Dense low precision is never slower than fp32; HBM figures are set.
    EXPECT_GE(p.spec.peak_tflops(sim::Precision::bf16), p.spec.peak_tflops(sim::Precision::fp32)) << p.name;
    EXPECT_GT(p.spec.hbm_gbps, 0) << p.name;
    EXPECT_GT(p.spec.hbm_gib, 0) << p.name;
    for (const auto& [key, text] : p.facts)
      if (key == "node_config") {
        const std::string path = std::string(SHARDSIM_CONFIG_DIR) + "/../" + text;
        EXPECT_NO_THROW((void)topology::load_topology_file(path)) << p.name << ": " << path;
      }
  }
  for (const char* n : {"trainium1", "trainium2", "inferentia2", "tpu_v4", "tpu_v5e", "tpu_v5p", "tpu_v6e", "a100",
                        "h100", "h200", "b200", "mi300x", "mi325x", "mi355x"})
    EXPECT_TRUE(names.count(n)) << n;
}

// The binary carries its presets and kernel tables (sim/embedded_data.h; a copied binary must not read the source
// tree it was built from): the compiled-in copies are the source tree's files, byte for byte, and the presets
// are read from them unless SHARDSIM_DEVICES names a file.
TEST(DevicePresets, TheCompiledInFilesAreTheSourceTreesFiles) {
  ASSERT_GE(sim::embedded_files().size(), 2u);
  for (const auto& f : sim::embedded_files()) {
    std::ifstream in(std::string(SHARDSIM_CONFIG_DIR) + "/" + std::string(f.path), std::ios::binary);
    ASSERT_TRUE(in) << f.path;
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_EQ(text, f.text) << f.path;
  }
  if (!std::getenv("SHARDSIM_DEVICES")) EXPECT_EQ(sim::device_presets_file(), "configs/devices.yaml (compiled in)");
  EXPECT_NE(sim::preset_data_text("kernel_tables/h100.csv", "a kernel table").find("gemm"), std::string::npos);
  EXPECT_THROW((void)sim::preset_data_text("kernel_tables/nonesuch.csv", "a kernel table"), ConfigError);
}

TEST(DevicePresets, AliasesAreTheSameSpec) {
  EXPECT_EQ(sim::describe(sim::device_preset("trainium")), sim::describe(sim::device_preset("trainium1")));
  EXPECT_EQ(sim::describe(sim::device_preset("h100_sxm")), sim::describe(sim::device_preset("h100")));
  EXPECT_THROW((void)sim::device_preset("h100_pcie"), std::invalid_argument);
}

TEST(DevicePresets, PresetsAreReadWithTheDeviceParserAndItsChecks) {
  const std::string head = "devices:\n  x:\n    source: s\n    model:\n";
  const std::string ok_model = "      peak_tflops_fp32: 1\n      peak_tflops_bf16: 2\n      hbm_gbps: 3\n      hbm_gib: 4\n";
  const std::string ok_sources = "    sources:\n      \"peak_tflops_fp32, peak_tflops_bf16, hbm_gbps, hbm_gib\": t\n";
  const auto ok = sim::read_device_presets(write_temp("shardsim_presets_ok.yaml", head + ok_model + ok_sources));
  ASSERT_EQ(ok.size(), 1u);
  EXPECT_EQ(ok[0].spec.peak_tflops_bf16, 2);
  // A number without a source.
  const std::string unsourced = error_of(head + ok_model + "      launch_overhead_ns: 5\n" + ok_sources);
  EXPECT_NE(unsourced.find(":9: devices.x.model.launch_overhead_ns: no entry of sources: names this key"),
            std::string::npos) << unsourced;
  // The device parser's own checks (a negative peak) name the line.
  const std::string negative = error_of(head + "      peak_tflops_fp32: -1\n" + ok_model.substr(ok_model.find('\n') + 1) + ok_sources);
  EXPECT_NE(negative.find(":5: devices.x.model.peak_tflops_fp32: must be between 0.001 and"), std::string::npos) << negative;
  // A preset naming another, an unknown entry key, a name used twice.
  EXPECT_NE(error_of(head + "      preset: h100\n" + ok_sources).find("a preset cannot name another"), std::string::npos);
  EXPECT_NE(error_of(head + ok_model + ok_sources + "    colour: red\n").find("unknown key"), std::string::npos);
  const std::string twice = error_of(head + ok_model + ok_sources + "    aliases: [x]\n");
  EXPECT_NE(twice.find("the name is used twice"), std::string::npos) << twice;
  EXPECT_NE(error_of("devices: {}\n").find("expected a map of presets"), std::string::npos);
}

}  // namespace
}  // namespace shardsim

// `shardsim help config`: every config section and the keys its parser accepts (experiments/config_keys.h),
// and where the full reference (defaults, units, meaning) is: docs/CONFIG.md.
// `shardsim help plans`: every parallel plan of the plan registry (sharding/plans/registry.h) with its mesh axis,
// relations and keys.
// `shardsim help devices`: every device preset (configs/devices.yaml) with its figures and their sources, as
// Markdown; docs/DEVICES.md is this output (tests/e2e/new_user.sh keeps them equal). A preset whose facts name a
// kernel_table (published kernel measurements, kernels/kernel_calibrate.h format, next to the presets file) gets
// a table of the model's kernel rates against them.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "apps/commands.h"
#include "common/error.h"
#include "common/input_file.h"
#include "common/text.h"
#include "experiments/config_keys.h"
#include "sharding/plans/registry.h"
#include "kernels/kernel_calibrate.h"
#include "sim/device_presets.h"
#include "sim/kernel_model.h"

namespace shardsim::apps {

namespace {

std::string figure(double v) {
  if (v <= 0) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

// The preset's kernel rates against the published measurements of TABLE (a path relative to the presets file's
// folder), then the table's comment lines, which cite each measurement.
void print_kernel_ceilings(const sim::DevicePreset& p, const std::string& table) {
  const std::string text = sim::preset_data_text(table, "a kernel table");
  const auto rows = kernels::parse_kernel_table(text, table);
  std::printf("\nKernel rates against published measurements (`%s`; tests/unit/kernel_tables_test.cpp checks that "
              "`shardsim calibrate --kernels` fed with it reproduces the preset):\n\n"
              "| kernel | dtype | m x n x k x batch | published TFLOP/s | shardsim TFLOP/s | error |\n"
              "|---|---|---:|---:|---:|---:|\n", escape_control(table).c_str());
  for (const auto& r : rows) {
    const double ns = sim::kernel_time_ns(p.spec, r.flops, r.bytes, r.precision, r.shape);
    const double published = r.flops / r.measured_ns / 1e3, model = r.flops / ns / 1e3;
    const double error = std::round(1000 * (model - published) / published) / 10;  // %, one decimal, no "-0.0"
    std::printf("| %s | %s | %lld x %lld x %lld x %lld | %.1f | %.1f | %+.1f%% |\n", r.kernel.c_str(),
                sim::precision_name(r.precision).c_str(), (long long)r.shape.m, (long long)r.shape.n,
                (long long)r.shape.k, (long long)r.shape.batch, published, model, error == 0 ? 0.0 : error);
  }
  std::printf("\n```\n");
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);)
    if (!line.empty() && line[0] == '#') std::printf("%s\n", escape_control(line).c_str());
  std::printf("```\n");
}

// The shaped model's rates at reference shapes (a Llama-style layer's GEMM and flash attention, and an FP8 GEMM
// where the preset sets its own ceiling), for every preset with a kernel model: what the model charges where no
// measurement is published, and the published ceilings that have no shape (gemm_efficiency_fp8).
void print_model_rates(const sim::DevicePreset& p, bool has_table) {
  const auto& d = p.spec;
  if (!d.kernel.shaped) return;
  struct Ref { const char* kernel; sim::Precision prec; sim::KernelShape shape; double flops; };
  const int64_t g = 4096, s = 4096, hd = 128, heads = 32;
  const double gemm_flops = 2.0 * g * g * g, attn = 4.0 * double(s) * s * hd * heads;  // not causal
  std::vector<Ref> refs = {{"gemm", sim::Precision::bf16, {sim::KernelClass::gemm, g, g, g, 1}, gemm_flops},
                           {"gemm_backward", sim::Precision::bf16, {sim::KernelClass::gemm_backward, g, g, g, 1},
                            2 * gemm_flops},
                           {"attention_forward", sim::Precision::bf16,
                            {sim::KernelClass::attention_forward, s, s, hd, heads}, attn},
                           {"attention_backward", sim::Precision::bf16,
                            {sim::KernelClass::attention_backward, s, s, hd, heads}, 2.5 * attn}};
  if (d.explicit_peak_tflops(sim::Precision::fp8) > 0)
    refs.push_back({"gemm", sim::Precision::fp8, {sim::KernelClass::gemm, g, g, g, 1}, gemm_flops});
  std::printf("\nThe kernel model's rates at reference shapes (%s; attention not causal, batch = heads):\n\n"
              "| kernel | dtype | m x n x k x batch | shardsim TFLOP/s | of peak | bound by |\n"
              "|---|---|---:|---:|---:|---|\n",
              has_table ? "beside the measured rows above"
                        : "no published kernel measurement of this device was found to set against them");
  for (const auto& r : refs) {
    const auto t = sim::kernel_time(d, r.flops, 0, r.prec, r.shape);
    const double tflops = r.flops / t.total_ns / 1e3;
    std::printf("| %s | %s | %lld x %lld x %lld x %lld | %.1f | %.1f%% | %s |\n", r.kernel,
                sim::precision_name(r.prec).c_str(), (long long)r.shape.m, (long long)r.shape.n,
                (long long)r.shape.k, (long long)r.shape.batch, tflops, 100 * tflops / d.peak_tflops(r.prec),
                t.engine_bound() ? "element-wise engines" : "compute");
  }
  if (d.kernel.gemm_efficiency_fp8 > 0) {
    const double published = d.kernel.gemm_efficiency_fp8 * d.peak_tflops(sim::Precision::fp8);
    std::printf("\nFP8 GEMM ceiling: published %.0f TFLOP/s without a shape (`gemm_efficiency_fp8`'s source), "
                "shardsim %.0f TFLOP/s for a GEMM of whole tiles and waves (q = 1): the ceiling itself, not a "
                "prediction.\n",
                published, published);
  }
}

void print_devices() {
  const auto& presets = sim::device_presets();
  const char* env = std::getenv("SHARDSIM_DEVICES");
  const std::string file = env && *env ? sim::device_presets_file() : "configs/devices.yaml";
  std::printf("# Device presets\n\n"
              "Generated by `shardsim help devices` from `%s`: use one as `device: NAME`, `--device NAME`, or\n"
              "`device: {preset: NAME, KEY: VALUE}` to change a figure (docs/CONFIG.md). Peaks are dense TFLOP/s (int8:\n"
              "TOPS); `-` = not set, the precision runs at the rate of its fallback (fp64 -> fp32; fp16 -> bf16; fp8 ->\n"
              "fp16; int8 -> fp8). HBM in GiB and GB/s. Kernels: `peak` = every kernel at the roofline, `shaped` = the\n"
              "kernel model (docs/MODEL.md; `systolic`: a NeuronCore's tensor engine). Every figure's source, or why it\n"
              "is an assumption, follows the table.\n\n",
              file.c_str());
  std::printf("| preset | bf16 | fp16 | fp8 | int8 | fp32 | fp64 | HBM GiB | HBM GB/s | kernels | node config |\n"
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|\n");
  for (const auto& p : presets) {
    const auto& d = p.spec;
    std::string node = "-";
    for (const auto& [k, v] : p.facts)
      if (k == "node_config") node = "`" + v + "`";
    std::printf("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", p.name.c_str(),
                figure(d.peak_tflops_bf16).c_str(), figure(d.peak_tflops_fp16).c_str(),
                figure(d.peak_tflops_fp8).c_str(), figure(d.peak_tflops_int8).c_str(),
                figure(d.peak_tflops_fp32).c_str(), figure(d.peak_tflops_fp64).c_str(), figure(d.hbm_gib).c_str(),
                figure(d.hbm_gbps).c_str(),
                !d.kernel.shaped ? "peak"
                : d.kernel.tensor_engine == sim::TensorEngine::systolic ? "shaped (systolic)" : "shaped",
                node.c_str());
  }
  for (const auto& p : presets) {
    std::string aliases;
    for (const auto& a : p.aliases) aliases += (aliases.empty() ? " (also " : ", ") + a;
    std::printf("\n## %s%s\n\n", p.name.c_str(), aliases.empty() ? "" : (aliases + ")").c_str());
    for (const auto& [keys, text] : p.sources) std::printf("- `%s`: %s\n", keys.c_str(), text.c_str());
    for (const auto& [key, text] : p.facts) std::printf("- %s: %s\n", key.c_str(), text.c_str());
    bool has_table = false;
    for (const auto& [key, text] : p.facts)
      if (key == "kernel_table") {
        print_kernel_ceilings(p, text);
        has_table = true;
      }
    print_model_rates(p, has_table);
  }
}

// The topics of `shardsim help TOPIC` (`shardsim help` alone lists them).
const std::pair<const char*, const char*> kHelpTopics[] = {
    {"config", "every config key per section (docs/CONFIG.md)"},
    {"devices", "every device preset with its sources (docs/DEVICES.md)"},
    {"plans", "every parallel plan with its mesh axis and keys (sharding/plans/registry.h)"}};

}  // namespace

Command add_help(CLI::App& app, const runtime::World& world) {
  auto* cmd = app.add_subcommand("help", "reference: `shardsim help config` lists every config key (docs/CONFIG.md), "
                                         "`shardsim help devices` every device preset with sources (docs/DEVICES.md), "
                                         "`shardsim help plans` every parallel plan and its keys");
  auto topic = std::make_shared<std::string>();
  std::vector<std::string> names;
  for (const auto& [name, what] : kHelpTopics) names.emplace_back(name);
  cmd->add_option("topic", *topic, "config | devices | plans (none: the list of topics)")->check(CLI::IsMember(names));
  return {cmd, [&world, topic]() -> int {
            if (topic->empty()) {  // `shardsim help`: what there is to ask for
              if (world.rank() != 0) return kExitOk;
              std::printf("shardsim help TOPIC, where TOPIC is one of:\n");
              for (const auto& [name, what] : kHelpTopics) std::printf("  %-9s %s\n", name, what);
              std::printf("Commands: shardsim --help; a command's flags: shardsim COMMAND --help\n");
              return kExitOk;
            }
            // A malformed presets file is one FILE:LINE line and exit 2 from every rank.
            if (*topic == "devices") world.agree([] { (void)sim::device_presets(); });
            if (world.rank() != 0) return kExitOk;
            if (*topic == "devices") {
              print_devices();
              return kExitOk;
            }
            if (*topic == "plans") {
              std::printf("Parallel plans (the plan registry, sharding/plans/registry.h), in the order the plan line "
                          "lists them;\nkeys of a config's parallel: section, --plan KEY=VALUE,... and a sweep's plan "
                          "entries (docs/CONFIG.md). modes: where each works: forward (run), train, serve; a mode\n"
                          "with no effect accepts it, a refused one exits 2 naming the key:\n\n%s",
                          sharding::plans::catalogue_text().c_str());
              return kExitOk;
            }
            std::printf("Config keys shardsim accepts, per section (full reference with defaults and units:\n"
                        "docs/CONFIG.md, also at %s/../docs/CONFIG.md)\n",
                        SHARDSIM_CONFIG_DIR);
            for (const auto& s : experiments::config_key_sections()) {
              std::string keys;
              for (auto k : s.keys) keys += (keys.empty() ? "" : ", ") + std::string(k);
              std::printf("\n%.*s  (%.*s)\n  %s\n", static_cast<int>(s.section.size()), s.section.data(),
                          static_cast<int>(s.applies.size()), s.applies.data(), keys.c_str());
            }
            std::printf("\nA run config's model: section is also read under its older name workload:.\n"
                        "run overrides: --topology FILE, --ring N, --torus AxB, --mesh AxB, --bandwidth GBPS, "
                        "--latency NS,\n  --device PRESET, --plan tp=2,cp=4, --set key.path=value\n");
            return kExitOk;
          }};
}

}  // namespace shardsim::apps

// The kernel model (sim/kernel_model.h) and its calibration (kernels/kernel_calibrate.h).
#include <algorithm>
#include <gtest/gtest.h>

#include <cmath>
#include <sstream>
#include <string>

#include "common/config.h"
#include "common/csv.h"
#include "common/error.h"
#include "kernels/gemm.h"
#include "kernels/kernel_calibrate.h"
#include "runtime/tensor.h"
#include "sim/kernel_model.h"

using namespace shardsim;
using sim::KernelClass;
using sim::KernelShape;
using P = sim::Precision;

namespace {

sim::DeviceSpec shaped() {
  sim::DeviceSpec d = sim::device_preset("generic");  // 100 fp32 / 400 bf16 TFLOP/s, 1000 GB/s, 1000 ns launch
  d.kernel.shaped = true;
  d.kernel.compute_units = 4;
  d.kernel.gemm_tile_m = 64;
  d.kernel.gemm_tile_n = 128;
  d.kernel.attention_tile_q = 128;
  d.kernel.gemm_efficiency = 0.8;
  d.kernel.attention_forward_efficiency = 0.7;
  d.kernel.attention_backward_efficiency = 0.5;
  d.kernel.hbm_efficiency = 0.9;
  return d;
}

}  // namespace

TEST(KernelModel, PeakModelIsTheDatasheetRoofline) {
  const auto d = sim::device_preset("generic");
  ASSERT_FALSE(d.kernel.shaped);
  const KernelShape g{KernelClass::gemm, 100, 100, 100, 1};
  // 4e8 FLOP at 400 TFLOP/s = 1000 ns; 1e5 B at 1000 GB/s = 100 ns; + 1000 ns launch.
  EXPECT_DOUBLE_EQ(sim::kernel_time_ns(d, 4e8, 1e5, P::bf16, g), 2000.0);
  EXPECT_DOUBLE_EQ(sim::kernel_quantization(d, g), 1.0);
}

TEST(KernelModel, AlignedGemmRunsAtTheCeiling) {
  const auto d = shaped();
  // 64x128 tiles: m = 128, n = 256 -> 2 x 2 = 4 tiles = one full wave on 4 units: q = 1.
  const KernelShape g{KernelClass::gemm, 128, 256, 4096, 1};
  EXPECT_DOUBLE_EQ(sim::kernel_quantization(d, g), 1.0);
  const double flops = 2.0 * 128 * 256 * 4096;
  const auto t = sim::kernel_time(d, flops, 0, P::bf16, g);
  EXPECT_DOUBLE_EQ(t.compute_ns, flops / (400e3 * 0.8));
  EXPECT_DOUBLE_EQ(t.total_ns, 1000.0 + flops / (400e3 * 0.8));
}

TEST(KernelModel, PartialTilesAndWavesCostWholeOnes) {
  const auto d = shaped();
  // m = 129: 3 row tiles of 64 (the last holds 1 row) x 2 column tiles = 6 tiles -> 2 waves of 4 = 8 tile slots.
  const KernelShape g{KernelClass::gemm, 129, 256, 64, 1};
  EXPECT_DOUBLE_EQ(sim::kernel_quantization(d, g), 8.0 * 64 * 128 / (129.0 * 256));
  // 5 full tiles: 2 waves for 5 tiles.
  const KernelShape h{KernelClass::gemm, 64, 640, 64, 1};
  EXPECT_DOUBLE_EQ(sim::kernel_quantization(d, h), 8.0 / 5.0);
  // Skinny: m = 8 -> the row tile shrinks to 16 (not 64); 1 x 2 tiles would leave 2 of the 4 units idle, so the
  // column tile halves to 64: 1 x 4 tiles, one wave.
  const KernelShape s{KernelClass::gemm, 8, 256, 64, 1};
  EXPECT_DOUBLE_EQ(sim::kernel_quantization(d, s), 4.0 * 16 * 64 / (8.0 * 256));
  // One 64 x 128 tile would fill a quarter of the wave: halved to 64 x 64 (2 tiles), then 64 x 32: 4 tiles, q = 1.
  const KernelShape one{KernelClass::gemm, 64, 128, 64, 1};
  EXPECT_DOUBLE_EQ(sim::kernel_quantization(d, one), 1.0);
  // The floor is 16 x 16: a 16 x 16 GEMM is one tile on 4 units.
  const KernelShape tiny{KernelClass::gemm, 16, 16, 64, 1};
  EXPECT_DOUBLE_EQ(sim::kernel_quantization(d, tiny), 4.0);
  // Batch multiplies the tiles: 4 GEMMs of one tile each fill one wave.
  const KernelShape b{KernelClass::gemm, 64, 128, 64, 4};
  EXPECT_DOUBLE_EQ(sim::kernel_quantization(d, b), 1.0);
}

TEST(KernelModel, GemmBackwardAveragesItsTwoGrids) {
  const auto d = shaped();
  const KernelShape g{KernelClass::gemm_backward, 128, 256, 129, 1};
  const double dx = sim::kernel_quantization(d, {KernelClass::gemm, 128, 129, 0, 1});
  const double dw = sim::kernel_quantization(d, {KernelClass::gemm, 129, 256, 0, 1});
  EXPECT_DOUBLE_EQ(sim::kernel_quantization(d, g), 0.5 * (dx + dw));
  EXPECT_GT(sim::kernel_quantization(d, g), 1.0);
}

TEST(KernelModel, AttentionWavesAndCeilings) {
  const auto d = shaped();
  // 3 heads x ceil(200/128) = 6 work items -> 2 waves of 4 units = 8 slots.
  const KernelShape f{KernelClass::attention_forward, 200, 200, 64, 3};
  EXPECT_DOUBLE_EQ(sim::kernel_quantization(d, f), 8.0 / 6.0);
  const auto tf = sim::kernel_time(d, 1e9, 0, P::bf16, f);
  EXPECT_DOUBLE_EQ(tf.compute_ns, 1e9 * (8.0 / 6.0) / (400e3 * 0.7));
  const KernelShape b{KernelClass::attention_backward, 200, 200, 64, 3};
  EXPECT_DOUBLE_EQ(sim::kernel_time(d, 1e9, 0, P::bf16, b).compute_ns, 1e9 * (8.0 / 6.0) / (400e3 * 0.5));
}

TEST(KernelModel, VectorKernelsAreBoundByAchievableHbm) {
  const auto d = shaped();
  const auto t = sim::kernel_time(d, 1e3, 9e5, P::fp32, KernelShape{});
  EXPECT_TRUE(t.memory_bound());
  EXPECT_DOUBLE_EQ(t.total_ns, 1000.0 + 9e5 / (1000.0 * 0.9));
}

TEST(KernelModel, Fp8GemmsUseTheirOwnCeiling) {
  auto d = shaped();
  d.peak_tflops_fp8 = 800;
  const KernelShape g{KernelClass::gemm, 128, 256, 4096, 1};  // q = 1 (AlignedGemmRunsAtTheCeiling)
  const double flops = 2.0 * 128 * 256 * 4096;
  // Unset (0): fp8 GEMMs at gemm_efficiency.
  EXPECT_DOUBLE_EQ(sim::kernel_time(d, flops, 0, P::fp8, g).compute_ns, flops / (800e3 * 0.8));
  d.kernel.gemm_efficiency_fp8 = 0.6;
  const auto t = sim::kernel_time(d, flops, 0, P::fp8, g);
  EXPECT_DOUBLE_EQ(t.efficiency, 0.6);
  EXPECT_DOUBLE_EQ(t.compute_ns, flops / (800e3 * 0.6));
  // int8 falls back to the fp8 peak, and so to its ceiling; bf16 and attention keep theirs.
  EXPECT_DOUBLE_EQ(sim::kernel_time(d, flops, 0, P::int8, g).efficiency, 0.6);
  EXPECT_DOUBLE_EQ(sim::kernel_time(d, flops, 0, P::bf16, g).efficiency, 0.8);
  EXPECT_DOUBLE_EQ(sim::kernel_time(d, flops, 0, P::fp8, KernelShape{KernelClass::attention_forward, 128, 128, 64, 4})
                       .efficiency, 0.7);
  // A device without an fp8 peak runs fp8 at bf16's rate and ceiling.
  d.peak_tflops_fp8 = 0;
  EXPECT_DOUBLE_EQ(sim::kernel_time(d, flops, 0, P::fp8, g).efficiency, 0.8);
  // The h100 preset's measured FP8 ceiling (DeepGEMM's 1550 of the 1979 dense TFLOP/s).
  EXPECT_NEAR(sim::device_preset("h100").kernel.gemm_efficiency_fp8, 1550.0 / 1979, 1e-12);
  EXPECT_NE(sim::describe(sim::device_preset("h100")).find("gemm 80.2% (fp8 78.3%)"), std::string::npos);
}

TEST(KernelModel, GemmKernelCarriesItsShape) {
  using runtime::DType;
  using runtime::Tensor;
  Tensor a = Tensor::make(DType::bf16, {48, 32}, false), b = Tensor::make(DType::bf16, {32, 80}, false);
  Tensor c = Tensor::make(DType::bf16, {48, 80}, false);
  const auto cost = kernels::gemm(a, b, c);
  EXPECT_EQ(cost.shape.cls, KernelClass::gemm);
  EXPECT_EQ(cost.shape.m, 48);
  EXPECT_EQ(cost.shape.n, 80);
  EXPECT_EQ(cost.shape.k, 32);
}

TEST(KernelModel, PresetsCiteTheirKernelFigures) {
  for (const char* name : {"a100", "h100"}) {
    const auto d = sim::device_preset(name);
    EXPECT_TRUE(d.kernel.shaped) << name;
    EXPECT_FALSE(d.kernel.source.empty()) << name;
    for (double e : {d.kernel.gemm_efficiency, d.kernel.attention_forward_efficiency,
                     d.kernel.attention_backward_efficiency, d.kernel.hbm_efficiency}) {
      EXPECT_GT(e, 0.0) << name;
      EXPECT_LE(e, 1.0) << name;
    }
  }
  EXPECT_EQ(sim::device_preset("a100").kernel.compute_units, 108);
  EXPECT_EQ(sim::device_preset("h100").kernel.compute_units, 132);
  for (const char* name : {"tpu_v4", "generic"}) EXPECT_FALSE(sim::device_preset(name).kernel.shaped);
}

TEST(KernelModel, DeviceKeysLoadAndRejectBadValues) {
  auto load = [](const std::string& body) {
    return sim::load_device(ConfigNode::load_string("device:\n" + body, "d.yaml").child("device"));
  };
  const auto d = load("  preset: generic\n  kernel_model: shaped\n  compute_units: 8\n  gemm_efficiency: 0.5\n");
  EXPECT_TRUE(d.kernel.shaped);
  EXPECT_EQ(d.kernel.compute_units, 8);
  EXPECT_DOUBLE_EQ(d.kernel.gemm_efficiency, 0.5);
  EXPECT_DOUBLE_EQ(load("  preset: h100\n  gemm_efficiency_fp8: 0.5\n").kernel.gemm_efficiency_fp8, 0.5);
  EXPECT_DOUBLE_EQ(d.kernel.gemm_efficiency_fp8, 0.0);  // generic: unset, fp8 GEMMs at gemm_efficiency
  EXPECT_FALSE(load("  preset: h100\n  kernel_model: peak\n").kernel.shaped);
  auto error_of = [&](const std::string& body) {
    try {
      load(body);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error_of("  preset: h100\n  gemm_efficiency: 1.5\n").find("d.yaml:3: device.gemm_efficiency"),
            std::string::npos);
  EXPECT_NE(error_of("  preset: h100\n  gemm_efficiency_fp8: 0\n").find("device.gemm_efficiency_fp8"),
            std::string::npos);
  EXPECT_NE(error_of("  preset: h100\n  hbm_efficiency: .nan\n").find("hbm_efficiency"), std::string::npos);
  EXPECT_NE(error_of("  preset: h100\n  kernel_model: fast\n").find("must be peak or shaped"), std::string::npos);
  EXPECT_NE(error_of("  preset: h100\n  gemm_tile_m: 8\n").find("gemm_tile_m"), std::string::npos);
  EXPECT_NE(error_of("  preset: h100\n  compute_units: 0\n").find("compute_units"), std::string::npos);
}

TEST(Csv, RecordsKeepTheirLinesAndQuotes) {
  const auto r = csv_records("a,b\n\"x, \"\"y\"\"\",2\n\"multi\nline\",3\nlast");
  ASSERT_EQ(r.records.size(), 3u);
  EXPECT_EQ(r.records[1].fields[0], "x, \"y\"");
  EXPECT_EQ(r.records[1].line, 2);
  EXPECT_EQ(r.records[2].fields[0], "multi\nline");
  EXPECT_EQ(r.records[2].line, 3);
  EXPECT_TRUE(r.truncated);
  EXPECT_FALSE(csv_records("a\n").truncated);
}

namespace {

// A measured table written by the model itself with TRUTH's parameters.
std::string table_from_model(const sim::DeviceSpec& truth) {
  struct Row {
    const char* kernel;
    int64_t m, n, k, batch;
    int causal;
  };
  const Row rows[] = {{"gemm", 4096, 4096, 4096, 1, 0},   {"gemm", 8192, 1024, 8192, 1, 0},
                      {"gemm", 1000, 3000, 512, 1, 0},    {"gemm", 16, 8192, 8192, 1, 0},
                      {"gemm_backward", 4096, 11008, 4096, 1, 0},
                      {"attention_forward", 4096, 4096, 128, 64, 1}, {"attention_forward", 2048, 2048, 128, 96, 0},
                      {"attention_backward", 4096, 4096, 128, 64, 1}, {"attention_backward", 1024, 1024, 64, 512, 0},
                      {"copy", 65536, 4096, 1, 1, 0},     {"copy", 8192, 8192, 1, 1, 0}};
  std::ostringstream csv;
  csv << "# generated by the model\nkernel,dtype,m,n,k,batch,causal,time_us\n";
  csv.precision(17);
  for (const auto& r : rows) {
    std::ostringstream line;
    line << r.kernel << ",bf16," << r.m << "," << r.n << "," << r.k << "," << r.batch << "," << r.causal << ",1\n";
    auto parsed = kernels::parse_kernel_table("kernel,dtype,m,n,k,batch,causal,time_us\n" + line.str(), "x.csv");
    const auto& p = parsed.at(0);
    const double ns = sim::kernel_time_ns(truth, p.flops, p.bytes, p.precision, p.shape);
    csv << r.kernel << ",bf16," << r.m << "," << r.n << "," << r.k << "," << r.batch << "," << r.causal << ","
        << ns / 1e3 << "\n";
  }
  return csv.str();
}

}  // namespace

TEST(KernelCalibration, RoundTripRecoversTheParameters) {
  sim::DeviceSpec truth = sim::device_preset("a100");
  truth.kernel.gemm_efficiency = 0.71;
  truth.kernel.attention_forward_efficiency = 0.62;
  truth.kernel.attention_backward_efficiency = 0.43;
  truth.kernel.hbm_efficiency = 0.83;
  const auto rows = kernels::parse_kernel_table(table_from_model(truth), "t.csv");
  const auto fit = kernels::fit_kernel_model(sim::device_preset("a100"), rows);  // starts from the preset's values
  EXPECT_NEAR(fit.fitted.gemm_efficiency, 0.71, 0.71 * 0.01);
  EXPECT_NEAR(fit.fitted.attention_forward_efficiency, 0.62, 0.62 * 0.01);
  EXPECT_NEAR(fit.fitted.attention_backward_efficiency, 0.43, 0.43 * 0.01);
  EXPECT_NEAR(fit.fitted.hbm_efficiency, 0.83, 0.83 * 0.01);
  EXPECT_LT(fit.rms_relative_error, 1e-6);
  EXPECT_TRUE(fit.not_fitted.empty());
  EXPECT_TRUE(fit.impossible.empty());
  // The override it writes loads back to the same parameters.
  const auto yaml = kernels::device_override_yaml(sim::device_preset("a100"), fit.fitted, "test");
  const auto back = sim::load_device(ConfigNode::load_string(yaml, "o.yaml").child("device"));
  EXPECT_NEAR(back.kernel.gemm_efficiency, fit.fitted.gemm_efficiency, 1e-9);
  EXPECT_NEAR(back.kernel.hbm_efficiency, fit.fitted.hbm_efficiency, 1e-9);
}

// FP8 GEMM rows fit gemm_efficiency_fp8 (the ceiling the model uses for GEMMs at the fp8 peak), bf16 rows
// gemm_efficiency: one table with both recovers both, and the fp8 rows do not pull the bf16 ceiling.
TEST(KernelCalibration, Fp8GemmRowsFitTheirOwnCeiling) {
  sim::DeviceSpec truth = sim::device_preset("h100");
  truth.kernel.gemm_efficiency = 0.74;
  truth.kernel.gemm_efficiency_fp8 = 0.61;
  std::ostringstream csv;
  csv.precision(17);
  csv << "kernel,dtype,m,n,k,batch,causal,time_us\n";
  const int64_t shapes[][3] = {{8192, 8192, 8192}, {4096, 16384, 4096}, {16384, 4096, 8192}};
  for (const char* dtype : {"bf16", "fp8_e4m3"})
    for (const auto& s : shapes) {
      std::ostringstream line;
      line << "gemm," << dtype << "," << s[0] << "," << s[1] << "," << s[2] << ",1,0,1\n";
      const auto p = kernels::parse_kernel_table("kernel,dtype,m,n,k,batch,causal,time_us\n" + line.str(), "x.csv")
                         .at(0);
      csv << "gemm," << dtype << "," << s[0] << "," << s[1] << "," << s[2] << ",1,0,"
          << sim::kernel_time_ns(truth, p.flops, p.bytes, p.precision, p.shape) / 1e3 << "\n";
    }
  const auto fit = kernels::fit_kernel_model(sim::device_preset("h100"), kernels::parse_kernel_table(csv.str(), "t.csv"));
  EXPECT_NEAR(fit.fitted.gemm_efficiency, 0.74, 0.74 * 1e-3);
  EXPECT_NEAR(fit.fitted.gemm_efficiency_fp8, 0.61, 0.61 * 1e-3);
  EXPECT_NE(std::find(fit.fitted_names.begin(), fit.fitted_names.end(), "gemm_efficiency_fp8"), fit.fitted_names.end());
  // Written and loaded back.
  const auto yaml = kernels::device_override_yaml(sim::device_preset("h100"), fit.fitted, "test");
  const auto back = sim::load_device(ConfigNode::load_string(yaml, "o.yaml").child("device"));
  EXPECT_NEAR(back.kernel.gemm_efficiency_fp8, fit.fitted.gemm_efficiency_fp8, 1e-9);
  // A table of bf16 rows only leaves the device's fp8 ceiling as it was, and does not list it.
  sim::DeviceSpec generic = sim::device_preset("a100");
  const auto bf16_only = kernels::fit_kernel_model(generic, kernels::parse_kernel_table(table_from_model(generic), "t.csv"));
  EXPECT_DOUBLE_EQ(bf16_only.fitted.gemm_efficiency_fp8, generic.kernel.gemm_efficiency_fp8);
  EXPECT_EQ(std::find(bf16_only.not_fitted.begin(), bf16_only.not_fitted.end(), "gemm_efficiency_fp8"),
            bf16_only.not_fitted.end());
}

TEST(KernelCalibration, FasterThanPeakIsReportedImpossible) {
  sim::DeviceSpec truth = sim::device_preset("a100");
  truth.kernel.gemm_efficiency = 1.0;
  truth.peak_tflops_bf16 *= 1.5;  // measured on a faster chip than the one named
  const auto fit = kernels::fit_kernel_model(sim::device_preset("a100"),
                                             kernels::parse_kernel_table(table_from_model(truth), "t.csv"));
  ASSERT_FALSE(fit.impossible.empty());
  EXPECT_EQ(fit.impossible.front(), "gemm_efficiency");
}

TEST(KernelCalibration, MalformedTablesNameFileAndLine) {
  auto error_of = [](const std::string& text) {
    try {
      kernels::parse_kernel_table(text, "k.csv");
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string head = "kernel,dtype,m,n,k,batch,causal,time_us\n";
  EXPECT_NE(error_of(head + "gemv,bf16,1,1,1,1,0,1\n").find("k.csv:2: unknown kernel 'gemv'"), std::string::npos);
  EXPECT_NE(error_of(head + "gemm,bf17,1,1,1,1,0,1\n").find("k.csv:2: dtype"), std::string::npos);
  EXPECT_NE(error_of(head + "gemm,bf16,0,1,1,1,0,1\n").find("k.csv:2: m must be"), std::string::npos);
  EXPECT_NE(error_of(head + "gemm,bf16,1,1,1,1,0,nan\n").find("k.csv:2: time_us"), std::string::npos);
  EXPECT_NE(error_of(head + "gemm,bf16,1,1,1,1,0,-3\n").find("k.csv:2: time_us"), std::string::npos);
  EXPECT_NE(error_of(head + "\n# c\ngemm,bf16,1,1,1\n").find("k.csv:4: 5 fields"), std::string::npos);
  EXPECT_NE(error_of("kernel,dtype,m,n,k,batch,time_us,extra\n").find("k.csv:1: unexpected column 'extra'"),
            std::string::npos);
  EXPECT_NE(error_of("kernel,dtype,m,n,k,time_us\n").find("missing column 'batch'"), std::string::npos);
  EXPECT_NE(error_of(head).find("no rows"), std::string::npos);
  EXPECT_NE(error_of(head + "gemm,bf16,1,1,1,1,0,1").find("truncated"), std::string::npos);
  // A control character in a value is escaped in the message, so it cannot drive the terminal.
  const std::string msg = error_of(head + "ge\x1b[2Jmm,bf16,1,1,1,1,0,1\n");
  EXPECT_EQ(msg.find('\x1b'), std::string::npos) << msg;
  EXPECT_EQ(error_of(head + "gemm,bf16,8,8,8,1,0,1.5\n"), "no error");
  // What the simulator's kernels refuse is a bad row too (its attention takes fp32 or bf16).
  EXPECT_NE(error_of(head + "attention_forward,fp16,8,8,8,1,0,1\n").find("k.csv:2: attention_forward with dtype fp16"),
            std::string::npos);
  // causal is optional.
  EXPECT_EQ(error_of("kernel,dtype,m,n,k,batch,time_us\ncopy,fp32,4,4,1,1,2\n"), "no error");
}

// The kernel model's systolic tensor engine (NeuronCores), its element-wise engines and grouped GEMMs
// (sim/kernel_model.h).
#include <gtest/gtest.h>

#include <cmath>

#include "sim/kernel_model.h"

using namespace shardsim;
using sim::KernelClass;
using sim::KernelShape;
using P = sim::Precision;

namespace {

// A NeuronCore-v2-like chip: 2 cores of a 128 x 128 array, moving tiles up to 512 columns, 64-column minimum.
sim::DeviceSpec neuron() {
  sim::DeviceSpec d = sim::device_preset("generic");  // 100 fp32 / 400 bf16 TFLOP/s, 1000 GB/s, 1000 ns launch
  auto& k = d.kernel;
  k.shaped = true;
  k.tensor_engine = sim::TensorEngine::systolic;
  k.compute_units = 2;
  k.gemm_tile_m = 128;
  k.gemm_tile_n = 512;
  k.gemm_tile_k = 128;
  k.matmul_min_columns = 64;
  k.attention_tile_q = 128;
  return d;
}

double q(const sim::DeviceSpec& d, KernelClass c, int64_t m, int64_t n, int64_t k, int64_t batch = 1) {
  return sim::kernel_quantization(d, KernelShape{c, m, n, k, batch});
}

// The forward GEMM's transpose of its token-major operand A [m, k] through the array: ceil(m/128)·ceil(k/128)
// blocks of 128 cycles on the 128 x 128 array, over the useful m·n·k.
double tr(int64_t m, int64_t n, int64_t k) {
  const double blocks = std::ceil(m / 128.0) * std::ceil(k / 128.0);
  return blocks * 128.0 * 128 * 128 / (double(m) * double(n) * double(k));
}

}  // namespace

TEST(SystolicModel, FullTilesOnEveryCoreRunAtTheArrayRate) {
  const auto d = neuron();
  // [256 x 512] output, K = 128: two stationary tiles x one moving tile = 2 items on 2 cores, 1 instruction each;
  // plus the transpose of A (one 128-cycle block per 128 rows and 128 of K: 128/512 of the matmul's cycles).
  EXPECT_DOUBLE_EQ(tr(256, 512, 128), 0.25);
  EXPECT_DOUBLE_EQ(q(d, KernelClass::gemm, 256, 512, 128), 1.25);
  EXPECT_DOUBLE_EQ(q(d, KernelClass::gemm, 256, 512, 4096), 1.25);
  // Wider outputs amortise the transpose: 128 / 4096 of the work.
  EXPECT_DOUBLE_EQ(q(d, KernelClass::gemm, 256, 4096, 4096), 1.0 + 1.0 / 32);
}

TEST(SystolicModel, ShortContractionLeavesArrayRowsIdle) {
  const auto d = neuron();
  // K = 64 uses 64 of the 128 rows in every instruction; K = 192 takes two instructions, the second half full.
  EXPECT_DOUBLE_EQ(q(d, KernelClass::gemm, 256, 512, 64), 2.0 + tr(256, 512, 64));
  EXPECT_DOUBLE_EQ(q(d, KernelClass::gemm, 256, 512, 192), 256.0 / 192.0 + tr(256, 512, 192));
}

TEST(SystolicModel, FewMovingColumnsPayTheInstructionMinimum) {
  const auto d = neuron();
  // [256 x 32]: as stationary 256 (2 tiles) x moving 32, each instruction costs 64 columns: q = 2; the other
  // orientation (stationary 32 of 128 columns, one item for two cores) costs 8: the model takes the cheaper.
  EXPECT_DOUBLE_EQ(q(d, KernelClass::gemm, 256, 32, 128), 2.0 + tr(256, 32, 128));
  EXPECT_DOUBLE_EQ(q(d, KernelClass::gemm, 32, 256, 128), 2.0 + tr(32, 256, 128));
}

TEST(SystolicModel, MovingTilesSplitEvenlyAndItemsRunInWaves) {
  const auto d = neuron();
  // The default job's GEMM: [512 x 1376], K = 4096: 4 stationary tiles x 3 moving tiles of 459 columns (1376 / 3
  // rounded up) = 12 items, 6 waves on 2 cores, 32 instructions each.
  const double expect = 6.0 * 2 * 32 * 459 * 128 * 128 / (512.0 * 1376 * 4096);
  EXPECT_DOUBLE_EQ(q(d, KernelClass::gemm, 512, 1376, 4096), expect + tr(512, 1376, 4096));
  EXPECT_LT(expect, 1.001);
  // One item for two cores (either orientation): half the chip idles (the transpose too).
  EXPECT_DOUBLE_EQ(q(d, KernelClass::gemm, 128, 128, 128), 2.0 * (1 + tr(128, 128, 128)));
  // A batch fills the cores.
  EXPECT_DOUBLE_EQ(q(d, KernelClass::gemm, 128, 128, 128, 2), 1.0 + tr(128, 128, 128));
  // [128 x 512]: as stationary 128 x moving 512 one item, as stationary 512 x moving 128 four: the model takes
  // the orientation that fills both cores.
  EXPECT_DOUBLE_EQ(q(d, KernelClass::gemm, 128, 512, 128), 1.0 + tr(128, 512, 128));
}

TEST(SystolicModel, GemmBackwardPadsEachGridByItsOwnContraction) {
  const auto d = neuron();
  // Forward [256 x 512] with K = 64: dX = [256 x 64] contracts over 512 (no K padding) after transposing dY [256 x
  // 512] (a forward GEMM's shape: its q), dW = [64 x 512] over 256 from token-major X and dY (no transpose).
  const double dx = q(d, KernelClass::gemm, 256, 64, 512), dw = q(d, KernelClass::gemm, 64, 512, 256) - tr(64, 512, 256);
  EXPECT_DOUBLE_EQ(q(d, KernelClass::gemm_backward, 256, 512, 64), 0.5 * (dx + dw));
}

TEST(SystolicModel, AttentionHeadDimBelowTheArrayCostsMore) {
  const auto d = neuron();
  // Head dim 128: QK^T 128 cycles, P.V 128 and the transpose of P 128 per 128 keys, against the ideal 256:
  // q = 1.5 (2 heads x 2 row blocks on 2 cores).
  EXPECT_DOUBLE_EQ(q(d, KernelClass::attention_forward, 256, 256, 128, 2), 1.5);
  // Head dim 64: QK^T still takes 128 cycles (K = 64 rows idle half the array), P.V 64, the transpose 128:
  // 320 against 128.
  EXPECT_DOUBLE_EQ(q(d, KernelClass::attention_forward, 256, 256, 64, 2), 2.5);
  // Backward (5 matmuls, the transpose of dS per 128 keys, dO's and Q's per 512): (2 x 128 + 3 x 64 + 128 +
  // 2 x 128 x 128 / 512) / (5 x 64).
  EXPECT_DOUBLE_EQ(q(d, KernelClass::attention_backward, 256, 256, 64, 2), (2.0 * 128 + 3 * 64 + 128 + 64) / 320.0);
  // Head dim 128: 1.3 (NeuronCore-v2 runs the backward's matmuls at 10/13 of the array rate).
  EXPECT_DOUBLE_EQ(q(d, KernelClass::attention_backward, 256, 256, 128, 2), 1.3);
  // 200 query rows fill two row blocks of 128.
  EXPECT_DOUBLE_EQ(q(d, KernelClass::attention_forward, 200, 200, 128, 2), 1.5 * 256.0 / 200.0);
}

TEST(SystolicModel, EnginesBindWhenTheTensorEngineOutrunsThem) {
  auto d = neuron();
  d.kernel.scalar_engine_gelems = 100;  // elements per ns
  d.kernel.vector_engine_gelems = 50;
  // Attention forward, head dim 64: scores = flops / 256; four passes over them (exp, row max, two PSUM
  // evictions) shared by both engines (150 elements per ns) bind before the vector engine's own pass.
  const KernelShape f{KernelClass::attention_forward, 256, 256, 64, 2};
  const double flops = 4.0 * 64 * 256 * 256 * 2;
  const auto t = sim::kernel_time(d, flops, 0, P::bf16, f);
  EXPECT_DOUBLE_EQ(t.engine_ns, 4 * (flops / 256) / 150);
  EXPECT_TRUE(t.engine_bound());
  EXPECT_DOUBLE_EQ(t.total_ns, 1000 + t.engine_ns);
  // Backward: six passes (exp, dS's two vector element-cycles, three evictions; scores = flops / 640).
  const KernelShape b{KernelClass::attention_backward, 256, 256, 64, 2};
  EXPECT_DOUBLE_EQ(sim::kernel_time(d, 2.5 * flops, 0, P::bf16, b).engine_ns, 6 * (2.5 * flops / 640) / 150);
  // A slow vector engine binds on its own passes: the row max alone, one element-cycle per score.
  d.kernel.vector_engine_gelems = 10;
  EXPECT_DOUBLE_EQ(sim::kernel_time(d, flops, 0, P::bf16, f).engine_ns, (flops / 256) / 10);
  d.kernel.vector_engine_gelems = 50;
  // A GEMM evicts its output once on the activation engine: small beside a long contraction.
  const KernelShape g{KernelClass::gemm, 256, 512, 4096, 1};
  const auto tg = sim::kernel_time(d, 2.0 * 256 * 512 * 4096, 0, P::bf16, g);
  EXPECT_DOUBLE_EQ(tg.engine_ns, 256.0 * 512 / 100);
  EXPECT_FALSE(tg.engine_bound());
  // Without engine rates (GPUs) there is no engine term.
  EXPECT_DOUBLE_EQ(sim::kernel_time(neuron(), flops, 0, P::bf16, f).engine_ns, 0.0);
}

TEST(SystolicModel, TrainiumPresetsDescribeTheirNeuronCores) {
  for (const char* name : {"trainium1", "inferentia2", "trainium2"}) {
    const auto d = sim::device_preset(name);
    EXPECT_TRUE(d.kernel.shaped) << name;
    EXPECT_EQ(d.kernel.tensor_engine, sim::TensorEngine::systolic) << name;
    EXPECT_EQ(d.kernel.gemm_tile_k, 128) << name;
    EXPECT_EQ(d.kernel.gemm_tile_n, 512) << name;
    EXPECT_GT(d.kernel.scalar_engine_gelems, 0) << name;
    EXPECT_FALSE(d.kernel.source.empty()) << name;
    EXPECT_NE(sim::describe(d).find("systolic 128x128 array, moving tile 512"), std::string::npos) << name;
  }
  EXPECT_EQ(sim::device_preset("trainium1").kernel.compute_units, 2);
  EXPECT_EQ(sim::device_preset("trainium2").kernel.compute_units, 8);
  // The tensor engine's clocked rate (2 cores x 128 x 128 x 2 FLOP x 2.8 GHz) over the datasheet's 190 TFLOP/s.
  EXPECT_NEAR(sim::device_preset("trainium1").kernel.gemm_efficiency, 2 * 2 * 128 * 128 * 2.8e9 / 190e12, 1e-12);
}

TEST(GroupedGemm, OneGroupEqualsTheKernelWhenTilesFillTheWave) {
  auto d = neuron();
  const KernelShape s{KernelClass::gemm, 512, 1376, 4096, 1};
  const double flops = 2.0 * 512 * 1376 * 4096, bytes = 1e6;
  const auto one = sim::kernel_time(d, flops, bytes, P::bf16, s);
  const auto grouped = sim::grouped_kernel_time(d, {{flops, bytes, s}}, P::bf16);
  EXPECT_DOUBLE_EQ(grouped.total_ns, one.total_ns);
}

TEST(GroupedGemm, GroupsShareTheWavesAndOneLaunch) {
  auto d = neuron();
  // Two groups of one item each: alone each leaves a core idle (q = 2, times the transpose of A); grouped they
  // fill one wave.
  const KernelShape s{KernelClass::gemm, 128, 128, 128, 1};
  const double f = 2.0 * 128 * 128 * 128, t1 = tr(128, 128, 128);
  EXPECT_DOUBLE_EQ(sim::kernel_time(d, f, 0, P::bf16, s).quantization, 2.0 * (1 + t1));
  const auto g = sim::grouped_kernel_time(d, {{f, 0, s}, {f, 0, s}, {0, 0, s}}, P::bf16);
  EXPECT_DOUBLE_EQ(g.quantization, 1.0 + t1);
  EXPECT_DOUBLE_EQ(g.total_ns, 1000 + 2 * f * (1 + t1) / 400e3);
  // Different sizes: FLOP-weighted padding. A K = 64 group pads 2x, the K = 128 one not (each with its transpose).
  const KernelShape half{KernelClass::gemm, 128, 128, 64, 1};
  const auto mixed = sim::grouped_kernel_time(d, {{f, 0, s}, {f / 2, 0, half}}, P::bf16);
  EXPECT_DOUBLE_EQ(mixed.quantization, (f * (1 + t1) + f / 2 * (2 + tr(128, 128, 64))) / (1.5 * f));
  // Nothing to do: no time, no launch.
  EXPECT_DOUBLE_EQ(sim::grouped_kernel_time(d, {}, P::bf16).total_ns, 0.0);
  // The GPU tile model: tiles of every group in one set of waves.
  auto gpu = sim::device_preset("generic");
  gpu.kernel.shaped = true;
  gpu.kernel.compute_units = 4;
  gpu.kernel.gemm_tile_m = 64;
  gpu.kernel.gemm_tile_n = 128;
  const KernelShape t{KernelClass::gemm, 64, 128, 64, 1};  // one tile each: 4 groups = one wave
  const double ft = 2.0 * 64 * 128 * 64;
  EXPECT_DOUBLE_EQ(sim::grouped_kernel_time(gpu, {{ft, 0, t}, {ft, 0, t}, {ft, 0, t}, {ft, 0, t}}, P::bf16).quantization,
                   1.0);
  EXPECT_DOUBLE_EQ(sim::grouped_kernel_time(gpu, {{ft, 0, t}}, P::bf16).quantization, 4.0);
}

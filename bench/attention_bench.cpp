// Local attention kernel (kernels::attention) against OpenBLAS sgemm on this host, and its memory at long sequences.
//
//   BM_sgemm/M/N/K                 cblas_sgemm C[M,N] = A[M,K]·B[K,N], GFLOP/s = 2MNK / time
//   BM_attention/seq/H/causal/bf16 Q,K,V [seq, H, 128]; GFLOP/s = KernelCost.flops / time (4·d per visible pair)
//   BM_attention_tiles/Br/Bc       seq 2048, 1 head, d 128, non-causal: tile-size sweep
//   BM_attention_memory/seq/bf16   one causal head, d 128, one iteration; counters: the process's max RSS before
//                                  allocating and after the call (getrusage), the kernel's workspace bytes, the
//                                  input+output bytes, and what one seq x seq fp32 score matrix would take.
//                                  Run each size in its own process (max RSS is a high-water mark):
//                                  --benchmark_filter='BM_attention_memory/32768/0/'
// OpenBLAS runs single-threaded (shardsim's per-rank default) unless OPENBLAS_NUM_THREADS is set.
#include <benchmark/benchmark.h>
#include <cblas.h>
#include <sys/resource.h>

#include <cstdlib>
#include <random>
#include <vector>

#include "kernels/attention.h"
#include "kernels/gemm.h"

using shardsim::kernels::AttentionOptions;
using shardsim::runtime::DType;
using shardsim::runtime::Tensor;

namespace {

constexpr int64_t kHeadDim = 128;

Tensor random_tensor(DType t, shardsim::runtime::Shape shape, uint32_t seed) {
  Tensor x(t, shape);
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (int64_t i = 0; i < x.numel(); ++i) x.set(i, u(gen));
  return x;
}

double max_rss_mib() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return double(ru.ru_maxrss) / 1024.0;  // Linux: KiB
}

void BM_sgemm(benchmark::State& state) {
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  std::vector<float> a(size_t(m * k), 0.5f), b(size_t(k * n), 0.25f), c(size_t(m * n));
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, blasint(m), blasint(n), blasint(k), 1.0f, a.data(),
                blasint(k), b.data(), blasint(n), 0.0f, c.data(), blasint(n));
    benchmark::DoNotOptimize(c.data());
  }
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * double(m) * double(n) * double(k) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_sgemm)
    ->Args({2048, 2048, 2048})
    ->Args({2048, 2048, 128})   // the shape of Q·K^T for one head
    ->Args({2048, 128, 2048})   // the shape of P·V for one head
    ->Args({128, 256, 128})     // one Q·K^T tile (Br=128, Bc=256)
    ->Args({128, 128, 256})     // one P·V tile
    ->Unit(benchmark::kMillisecond);

void run_attention(benchmark::State& state, int64_t seq, int64_t heads, bool causal, DType dt, AttentionOptions o) {
  Tensor q = random_tensor(dt, {seq, heads, kHeadDim}, 1), k = random_tensor(dt, {seq, heads, kHeadDim}, 2),
         v = random_tensor(dt, {seq, heads, kHeadDim}, 3);
  Tensor out(dt, {seq, heads, kHeadDim}), lse(DType::fp32, {heads, seq});
  o.causal = causal;
  double flops = 0;
  for (auto _ : state) {
    flops = shardsim::kernels::attention(q, k, v, out, lse, o).flops;
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["GFLOP/s"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_attention(benchmark::State& state) {
  run_attention(state, state.range(0), state.range(1), state.range(2) != 0,
                state.range(3) != 0 ? DType::bf16 : DType::fp32, {});
}
BENCHMARK(BM_attention)
    ->ArgsProduct({{2048}, {1, 4}, {0, 1}, {0}})
    ->Args({2048, 1, 0, 1})
    ->Args({2048, 1, 1, 1})
    ->Unit(benchmark::kMillisecond);

void BM_attention_tiles(benchmark::State& state) {
  AttentionOptions o;
  o.block_q = state.range(0);
  o.block_k = state.range(1);
  run_attention(state, 2048, 1, false, DType::fp32, o);
}
BENCHMARK(BM_attention_tiles)
    ->ArgsProduct({{32, 64, 128, 256}, {64, 128, 256, 512}})
    ->Unit(benchmark::kMillisecond);

void BM_attention_memory(benchmark::State& state) {
  const int64_t seq = state.range(0);
  const DType dt = state.range(1) != 0 ? DType::bf16 : DType::fp32;
  const double rss_before = max_rss_mib();
  Tensor q = random_tensor(dt, {seq, 1, kHeadDim}, 1), k = random_tensor(dt, {seq, 1, kHeadDim}, 2),
         v = random_tensor(dt, {seq, 1, kHeadDim}, 3);
  Tensor out(dt, {seq, 1, kHeadDim}), lse(DType::fp32, {1, seq});
  const double rss_inputs = max_rss_mib();
  AttentionOptions o;
  o.causal = true;
  double flops = 0;
  for (auto _ : state) {
    flops = shardsim::kernels::attention(q, k, v, out, lse, o).flops;
    benchmark::DoNotOptimize(out.data());
  }
  const double mib = 1.0 / (1024.0 * 1024.0);
  state.counters["GFLOP/s"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["rss_before_MiB"] = rss_before;
  state.counters["rss_growth_inputs_MiB"] = rss_inputs - rss_before;
  state.counters["rss_growth_kernel_MiB"] = max_rss_mib() - rss_inputs;
  state.counters["tensors_MiB"] = double(q.nbytes() + k.nbytes() + v.nbytes() + out.nbytes() + lse.nbytes()) * mib;
  state.counters["workspace_MiB"] =
      double(shardsim::kernels::attention_workspace_bytes(seq, kHeadDim, dt, o)) * mib;
  state.counters["score_matrix_MiB"] = double(seq) * double(seq) * 4.0 * mib;
}
BENCHMARK(BM_attention_memory)
    ->ArgsProduct({{8192, 16384, 32768}, {0, 1}})
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) {
  if (!std::getenv("OPENBLAS_NUM_THREADS")) shardsim::kernels::set_blas_threads(1);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

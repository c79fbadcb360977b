// This host's memcpy bandwidth (Google Benchmark), the ceiling any shared-memory collective works against.
// Reports bytes_per_second = bytes copied / time (one read + one write of each byte).
#include <benchmark/benchmark.h>

#include <cstring>
#include <vector>

static void BM_memcpy(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0));
  std::vector<char> src(n, 1), dst(n, 0);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), n);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(n));
}
BENCHMARK(BM_memcpy)->RangeMultiplier(4)->Range(4 << 20, 256 << 20)->Unit(benchmark::kMicrosecond);

BENCHMARK_MAIN();

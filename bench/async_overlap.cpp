// Wall-clock overlap of compute and communication with the async engine (a benchmark, not a test).
//
// Every rank: an fp32 all_reduce of --mib MiB (ring) and a loop of --gemm-sized sgemms (kernels::gemm) whose
// count is calibrated so the compute takes about as long as the all_reduce alone (unless --reps is given).
// Measured, each as the max over ranks of the wall time, best of --trials:
//   comm        sync all_reduce alone            async_comm  all_reduce_async + wait, nothing else
//   compute     the gemm loop alone              sequential  gemm loop, then the sync all_reduce
//   overlapped  all_reduce_async, gemm loop, wait
// and the fused op sharding::gemm_all_reduce (--chunks pieces, default 8) against its GEMM then the sync all_reduce.
// Run: mpirun -np 2 build/bench/shardsim_async_overlap --mib 128   (bench/async_overlap.sh runs 2 and 4 ranks)
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "collectives/all_reduce.h"
#include "collectives/async.h"
#include "common/error.h"
#include "kernels/gemm.h"
#include "runtime/world.h"
#include "sharding/fused.h"
#include "sim/device_spec.h"

using namespace shardsim;

namespace {
double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

double max_over_ranks(double v) {
  double out = 0;
  MPI_Allreduce(&v, &out, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return out;
}

int run(int argc, char** argv, const runtime::World& world) {
  double mib = 128;
  long gemm_n = 512;
  long reps = 0;
  int trials = 3;
  int chunks = 8;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--mib") mib = std::atof(argv[i + 1]);
    else if (a == "--gemm") gemm_n = std::atol(argv[i + 1]);
    else if (a == "--reps") reps = std::atol(argv[i + 1]);
    else if (a == "--trials") trials = std::atoi(argv[i + 1]);
    else if (a == "--chunks") chunks = std::atoi(argv[i + 1]);
    else throw UsageError("unknown option " + a + " (--mib M --gemm N --reps R --trials T --chunks C)");
  }
  const size_t count = static_cast<size_t>(mib * 1024 * 1024 / 4);
  const auto topo = topology::Topology::ring(world.size(), topology::LinkSpec{100, 500});
  std::vector<int> chips(static_cast<size_t>(world.size()));
  for (int r = 0; r < world.size(); ++r) chips[static_cast<size_t>(r)] = r;
  sim::Timeline tl(world.rank(), topo, sim::device_preset("generic"));
  runtime::Transport tp(world.comm(), tl, chips);
  collectives::CollectiveOptions opt;
  opt.algorithm = "ring";

  std::vector<float> send(count, 1.0f + static_cast<float>(world.rank())), recv(count);
  runtime::Tensor a(runtime::DType::fp32, {gemm_n, gemm_n}), b(runtime::DType::fp32, {gemm_n, gemm_n}),
      c(runtime::DType::fp32, {gemm_n, gemm_n});
  for (int64_t i = 0; i < gemm_n * gemm_n; ++i) {
    a.set(i, static_cast<float>(i % 7) * 0.1f);
    b.set(i, static_cast<float>(i % 5) * 0.1f);
  }
  auto compute = [&](long n) {
    for (long i = 0; i < n; ++i) kernels::gemm(a, b, c);
  };
  auto comm = [&] { collectives::all_reduce(tp, send.data(), recv.data(), count, runtime::DType::fp32,
                                            collectives::ReduceOp::sum, 0.0, opt); };
  auto async_comm = [&] {
    return collectives::all_reduce_async(tp, send.data(), recv.data(), count, runtime::DType::fp32,
                                         collectives::ReduceOp::sum, 0.0, opt);
  };
  auto timed = [&](auto&& fn) {
    double best = 1e300;
    for (int t = 0; t < trials; ++t) {
      world.sleepy_barrier();
      const double t0 = now();
      fn();
      best = std::min(best, max_over_ranks(now() - t0));
    }
    return best;
  };
  // Warm-up: scratch buffers, the engine and its communicator, BLAS.
  comm();
  async_comm().wait();
  compute(1);
  const double t_comm = timed(comm);
  if (reps <= 0) {
    const double t_gemm = timed([&] { compute(3); }) / 3;
    reps = std::max(1L, std::lround(t_comm / t_gemm));
    reps = static_cast<long>(max_over_ranks(static_cast<double>(reps)));
  }
  const double t_async = timed([&] { async_comm().wait(); });
  const double t_compute = timed([&] { compute(reps); });
  const double t_seq = timed([&] {
    compute(reps);
    comm();
  });
  const double t_overlap = timed([&] {
    auto h = async_comm();
    compute(reps);
    h.wait();
  });
  if (recv[0] != static_cast<float>(world.size() * (world.size() + 1) / 2))
    throw RuntimeFault("all_reduce result wrong: " + std::to_string(recv[0]));

  // The fused op (sharding/fused.h): C [m, 1024] = A [m, K] · B [K, 1024] then all_reduce(C), m so that C is
  // --mib MiB and K so that the GEMM takes about as long as the all_reduce; unfused (GEMM, then the sync
  // all_reduce) vs gemm_all_reduce with --chunks pieces (their all_reduces on the engine while the next piece's
  // GEMM runs here).
  const int64_t fn = 1024, fm = static_cast<int64_t>(count) / fn;  // tall: the rows cut, pieces in place in C
  int64_t fk = 64;
  runtime::Tensor fa, fb, fc(runtime::DType::fp32, {fm, fn});
  auto make_ab = [&] {
    fa = runtime::Tensor(runtime::DType::fp32, {fm, fk});
    fb = runtime::Tensor(runtime::DType::fp32, {fk, fn});
    for (int64_t i = 0; i < fa.numel(); ++i) fa.set(i, static_cast<float>((i + world.rank()) % 7) * 0.1f);
    for (int64_t i = 0; i < fb.numel(); ++i) fb.set(i, static_cast<float>(i % 5) * 0.1f);
  };
  make_ab();
  const double t_k64 = timed([&] { kernels::gemm(fa, fb, fc); });
  fk = std::clamp<int64_t>(static_cast<int64_t>(std::lround(max_over_ranks(64.0 * t_comm / t_k64))), 8, 8192);
  make_ab();
  auto fused_comm = [&] {
    collectives::all_reduce(tp, fc.data(), fc.data(), static_cast<size_t>(fc.numel()), runtime::DType::fp32,
                            collectives::ReduceOp::sum, 0.0, opt);
  };
  const double t_fgemm = timed([&] { kernels::gemm(fa, fb, fc); });
  const double t_fcomm = timed(fused_comm);
  const double t_unfused = timed([&] {
    kernels::gemm(fa, fb, fc);
    fused_comm();
  });
  runtime::Tensor want = fc;
  const double t_fused = timed([&] {
    tl.reset();
    sharding::gemm_all_reduce(tp, fa, fb, fc, chunks, 0.0, "fused");
  });
  double err = 0;
  for (int64_t i = 0; i < fc.numel(); ++i) err = std::max(err, std::fabs(double(fc.get(i)) - want.get(i)) / (1 + std::fabs(double(want.get(i)))));
  if (max_over_ranks(err) > 1e-5) throw RuntimeFault("gemm_all_reduce differs from the unfused path: " + std::to_string(err));
  if (world.rank() == 0) {
    std::printf("ranks %d, all_reduce %.0f MiB fp32 (ring), compute %ld x sgemm %ld^3, best of %d, wall seconds "
                "(max over ranks)\n", world.size(), mib, reps, gemm_n, trials);
    std::printf("comm %.3f  async_comm %.3f  compute %.3f  sequential %.3f  overlapped %.3f  "
                "overlapped/sequential %.2f  hidden %.0f%%\n",
                t_comm, t_async, t_compute, t_seq, t_overlap, t_overlap / t_seq,
                100.0 * (t_seq - t_overlap) / std::min(t_comm, t_compute));
    std::printf("fused gemm_all_reduce C[%lld, %lld] = A[.., %lld] B, %d pieces: gemm %.3f  comm %.3f  unfused %.3f  "
                "fused %.3f  fused/unfused %.2f  hidden %.0f%%\n",
                static_cast<long long>(fm), static_cast<long long>(fn), static_cast<long long>(fk), chunks, t_fgemm,
                t_fcomm, t_unfused, t_fused, t_fused / t_unfused,
                100.0 * (t_unfused - t_fused) / std::min(t_fgemm, t_fcomm));
  }
  return 0;
}
}  // namespace

int main(int argc, char** argv) {
  if (!std::getenv("OPENBLAS_NUM_THREADS")) kernels::set_blas_threads(1);
  runtime::MpiSession mpi(&argc, &argv);
  runtime::World world;
  try {
    return mpi.finish(run(argc, argv, world));
  } catch (const Error& e) {
    world.abort(e.exit_code(), "shardsim_async_overlap: error on rank " + std::to_string(world.rank()) + ": " + e.what());
  }
}

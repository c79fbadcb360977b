// Ring all_reduce / reduce_scatter / all_gather over real ranks: simulated times against the closed forms,
// determinism, and the argument check. (Results against the single-device references, special values included,
// are checked per collective and algorithm from the registry: all_reduce_test.cpp, reduce_scatter_test.cpp, ...)
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstring>

#include "collectives/all_gather.h"
#include "collectives/all_reduce.h"
#include "collectives/reduce_scatter.h"
#include "verification/reference.h"
#include "mpi/collective_fixture.h"
#include "mpi/mpi_util.h"

using namespace shardsim;
using collectives::Partition;
using collectives::ReduceOp;
using verification::reference::Buffer;
using runtime::DType;

namespace {


// The shared fixture on a bidirectional ring of the world's size.
struct RingFixture : Fixture {
  RingFixture(double bw, double lat) : Fixture(topology::Topology::ring(world_size(), topology::LinkSpec{bw, lat})) {}
};

}  // namespace

// The simulated time of the ring algorithms equals the closed form on a contention-free ring:
//   all_reduce 2(p-1)(alpha + S/(wpB)), reduce_scatter and all_gather (p-1)(alpha + S/(wpB)),
//   w = 1 for the one-way ring, 2 for the bidirectional ring (with more than 2 chips).
TEST(ClosedForm, RingTimesMatchWithinOnePercent) {
  const double p = world_size();
  for (const std::string algo : {"ring", "bidir_ring"})
    for (double bw : {25.0, 100.0, 400.0})
      for (double alpha : {0.0, 500.0, 5000.0})
        for (size_t count : {size_t(1) << 10, size_t(1) << 16, size_t(3) << 18}) {
          if (count % size_t(2 * p) != 0) continue;  // the closed form assumes equal chunks
          RingFixture f(bw, alpha);
          collectives::CollectiveOptions o;
          o.algorithm = algo;
          const double w = algo == "bidir_ring" && p > 2 ? 2 : 1;
          const double S = double(count) * 4;
          std::vector<float> buf(count, 1.0f);
          const auto ar =
              collectives::all_reduce(f.tp, buf.data(), buf.data(), count, DType::fp32, ReduceOp::sum, 0.0, o);
          const double want_ar = 2 * (p - 1) * (alpha + S / (w * p * bw));
          EXPECT_NEAR(ar.span.duration(), want_ar, 0.01 * want_ar + 1e-9)
              << algo << " p=" << p << " S=" << S << " B=" << bw;
          EXPECT_DOUBLE_EQ(ar.bytes_sent, 2 * (p - 1) / p * S);
          EXPECT_EQ(ar.algorithm, algo);

          std::vector<float> out(count / size_t(p));
          const double t0 = ar.span.end;
          const auto rs =
              collectives::reduce_scatter(f.tp, buf.data(), out.data(), count, DType::fp32, ReduceOp::sum, t0, o);
          const double want_half = (p - 1) * (alpha + S / (w * p * bw));
          EXPECT_NEAR(rs.span.duration(), want_half, 0.01 * want_half + 1e-9) << algo;
          const auto ag = collectives::all_gather(f.tp, out.data(), buf.data(), count, DType::fp32, rs.span.end, o);
          EXPECT_NEAR(ag.span.duration(), want_half, 0.01 * want_half + 1e-9) << algo;
        }
}

TEST(Determinism, SameInputsSameSimulatedTimes) {
  std::vector<double> times;
  for (int run = 0; run < 2; ++run) {
    RingFixture f(50, 700);
    std::vector<float> buf(13440, 2.0f);  // divisible by 1..8: equal chunks, symmetric ranks
    auto a = collectives::all_reduce(f.tp, buf.data(), buf.data(), buf.size(), DType::fp32, ReduceOp::sum, 10.0);
    auto b = collectives::all_gather(f.tp, buf.data(), buf.data(), buf.size(), DType::fp32, a.span.end);
    times.push_back(a.span.end);
    times.push_back(b.span.end);
  }
  EXPECT_EQ(times[0], times[2]);
  EXPECT_EQ(times[1], times[3]);
  // All ranks finish the symmetric all_reduce at the same simulated time.
  double mine = times[0], lo = 0, hi = 0;
  MPI_Allreduce(&mine, &lo, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&mine, &hi, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  EXPECT_EQ(lo, hi);
}

namespace {

// Issue 15: arguments are agreed once per (communicator, signature); a later mismatch between two signatures
// that were each agreed before skips the agreement round and must still be an exit-2 error, raised where a
// rank receives a message whose header carries the other signature (2 ranks: each receives from the other).
TEST(ArgumentCheck, CachedSignatureMismatchIsCaughtOnReceipt) {
  if (world_size() != 2) GTEST_SKIP() << "two ranks: each receives from the other, so both detect it";
  RingFixture f(100, 1000);
  // A private communicator: the mismatched call leaves nothing behind on the fixture's one.
  runtime::Transport tp = f.tp.split(0, world_rank());
  std::vector<float> a(64, 1.0f), b(128, 1.0f);
  auto call = [&](std::vector<float>& v) {
    collectives::all_reduce(tp, v.data(), v.data(), v.size(), DType::fp32, ReduceOp::sum, 0.0, opts("ring"));
  };
  call(a);  // agreed: 64
  call(b);  // agreed: 128
  EXPECT_EQ(b[0], 2.0f);
  try {
    call(world_rank() == 0 ? a : b);  // rank 0: 64, rank 1: 128, both signatures already agreed
    ADD_FAILURE() << "no error from mismatched counts";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(e.exit_code(), kExitBadInput) << msg;
    EXPECT_NE(msg.find("ranks disagree on count"), std::string::npos) << msg;
    EXPECT_NE(msg.find("64"), std::string::npos) << msg;
    EXPECT_NE(msg.find("128"), std::string::npos) << msg;
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

// The first call with a new signature still agrees in one round: every rank throws the same AgreedError.
TEST(ArgumentCheck, NewSignatureMismatchIsAgreed) {
  if (world_size() < 2) GTEST_SKIP() << "needs two ranks to disagree";
  RingFixture f(100, 1000);
  runtime::Transport tp = f.tp.split(0, world_rank());
  const size_t count = 40 + static_cast<size_t>(world_rank() == 1);
  std::vector<float> v(count, 1.0f);
  try {
    collectives::all_reduce(tp, v.data(), v.data(), count, DType::fp32, ReduceOp::sum, 0.0, opts("ring"));
    ADD_FAILURE() << "no error from mismatched counts";
  } catch (const AgreedError& e) {
    EXPECT_EQ(e.exit_code(), kExitBadInput);
    EXPECT_NE(std::string(e.what()).find("ranks disagree on count: chip 0 40, chip 1 41"), std::string::npos)
        << e.what();
  }
  // The communicator stays usable, and the agreed call runs.
  std::vector<float> ok(40, 1.0f);
  collectives::all_reduce(tp, ok.data(), ok.data(), ok.size(), DType::fp32, ReduceOp::sum, 0.0, opts("ring"));
  EXPECT_EQ(ok[39], static_cast<float>(world_size()));
}

}  // namespace

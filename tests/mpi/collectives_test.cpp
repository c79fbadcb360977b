// Ring all_reduce / reduce_scatter / all_gather over real ranks, checked bit-exactly against the
// single-device references, and their simulated times against the closed forms.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstring>

#include "collectives/all_gather.h"
#include "collectives/all_reduce.h"
#include "collectives/reduce_scatter.h"
#include "collectives/reference.h"
#include "mpi/collective_fixture.h"
#include "mpi/mpi_util.h"

using namespace shardsim;
using collectives::Partition;
using collectives::ReduceOp;
using collectives::reference::Buffer;
using runtime::DType;

namespace {


// The shared fixture on a bidirectional ring of the world's size.
struct RingFixture : Fixture {
  RingFixture(double bw, double lat) : Fixture(topology::Topology::ring(world_size(), topology::LinkSpec{bw, lat})) {}
};

// "Verifiable" input of rank R (as nccl-tests does): small integers, so sums/products/min/max are exact in
// fp32 and bf16 in any order. prod uses values in {1, 2} with few 2s so products stay exact.
Buffer input(size_t count, DType t, ReduceOp op, int rank) {
  Buffer b(count * runtime::dtype_size(t));
  for (size_t i = 0; i < count; ++i) {
    float v;
    if (op == ReduceOp::prod) {
      v = ((i + static_cast<size_t>(rank)) % 5 == 0) ? 2.0f : 1.0f;
    } else {
      v = static_cast<float>(static_cast<int>((i * 7 + static_cast<size_t>(rank) * 13) % 17) - 8);
    }
    runtime::store_from_float(b.data(), i, t, v);
  }
  return b;
}

std::vector<Buffer> all_inputs(size_t count, DType t, ReduceOp op) {
  std::vector<Buffer> v;
  for (int r = 0; r < world_size(); ++r) v.push_back(input(count, t, op, r));
  return v;
}

const size_t kCounts[] = {0, 1, 2, 3, 5, 7, 8, 13, 97, 1000, 4099};
const DType kTypes[] = {DType::fp32, DType::bf16};
const ReduceOp kOps[] = {ReduceOp::sum, ReduceOp::prod, ReduceOp::min, ReduceOp::max, ReduceOp::avg};

std::string label(size_t count, DType t, ReduceOp op, bool in_place) {
  return "count=" + std::to_string(count) + " " + runtime::dtype_name(t) + " " + collectives::reduce_op_name(op) +
         (in_place ? " in-place" : " out-of-place");
}

}  // namespace

TEST(AllReduce, BitExactAgainstReference) {
  RingFixture f(100, 500);
  const int r = world_rank();
  for (size_t count : kCounts)
    for (DType t : kTypes)
      for (ReduceOp op : kOps)
        for (bool in_place : {false, true}) {
          const auto inputs = all_inputs(count, t, op);
          const Buffer want = collectives::reference::all_reduce(inputs, count, t, op);
          Buffer send = inputs[size_t(r)], recv(send.size(), 0xAB);
          void* out = in_place ? send.data() : recv.data();
          collectives::all_reduce(f.tp, send.data(), out, count, t, op, 0.0);
          const Buffer& got = in_place ? send : recv;
          EXPECT_EQ(got, want) << label(count, t, op, in_place);
          if (!in_place) {
            EXPECT_EQ(send, inputs[size_t(r)]) << "input modified, " << label(count, t, op, in_place);
          }
        }
}

TEST(ReduceScatter, BitExactAgainstReference) {
  RingFixture f(100, 500);
  const int r = world_rank();
  const size_t p = size_t(world_size());
  for (size_t count : kCounts)
    for (DType t : kTypes)
      for (ReduceOp op : kOps)
        for (bool in_place : {false, true}) {
          const size_t es = runtime::dtype_size(t);
          const Partition part{count, p};
          const auto inputs = all_inputs(count, t, op);
          const Buffer want = collectives::reference::reduce_scatter(inputs, count, t, op, size_t(r));
          Buffer send = inputs[size_t(r)];
          Buffer recv(part.size(size_t(r)) * es, 0xCD);
          void* out = in_place ? send.data() + part.offset(size_t(r)) * es : recv.data();
          collectives::reduce_scatter(f.tp, send.data(), out, count, t, op, 0.0);
          Buffer got = in_place ? Buffer(send.begin() + long(part.offset(size_t(r)) * es),
                                         send.begin() + long((part.offset(size_t(r)) + part.size(size_t(r))) * es))
                                : recv;
          EXPECT_EQ(got, want) << label(count, t, op, in_place);
        }
}

TEST(AllGather, BitExactAgainstReference) {
  RingFixture f(100, 500);
  const int r = world_rank();
  const size_t p = size_t(world_size());
  for (size_t count : kCounts)
    for (DType t : kTypes)
      for (bool in_place : {false, true}) {
        const size_t es = runtime::dtype_size(t);
        const Partition part{count, p};
        std::vector<Buffer> chunks;
        for (size_t q = 0; q < p; ++q) {
          Buffer full = input(count, t, ReduceOp::sum, int(q) + 100);
          chunks.emplace_back(full.begin() + long(part.offset(q) * es),
                              full.begin() + long((part.offset(q) + part.size(q)) * es));
        }
        const Buffer want = collectives::reference::all_gather(chunks, count, t);
        Buffer recv(count * es, 0xEF);
        if (in_place) {
          if (!chunks[size_t(r)].empty())
            std::memcpy(recv.data() + part.offset(size_t(r)) * es, chunks[size_t(r)].data(), chunks[size_t(r)].size());
          collectives::all_gather(f.tp, recv.data() + part.offset(size_t(r)) * es, recv.data(), count, t, 0.0);
        } else {
          Buffer send = chunks[size_t(r)];
          collectives::all_gather(f.tp, send.data(), recv.data(), count, t, 0.0);
        }
        EXPECT_EQ(recv, want) << label(count, t, ReduceOp::sum, in_place);
      }
}

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

// Issue 14: with 3 ranks, fp32, count 3, rank r holding NaN at element r and r + 1 elsewhere, op max,
// halving_doubling returned "3 nan nan" (the non-power-of-two fold compared with std::max, which drops a NaN
// in its second argument). Every algorithm must give NaN in every element, for max and min, every float dtype.
// Count = world size, so every rank holds exactly one NaN at every rank count the suite runs (1, 2, 3, 4, 8).
TEST(AllReduce, NaNSurvivesEveryAlgorithmAndOp) {
  RingFixture f(100, 500);
  const int r = world_rank(), p = world_size();
  const size_t count = static_cast<size_t>(p);
  for (DType t : {DType::fp32, DType::fp64, DType::bf16, DType::fp16, DType::fp8_e4m3, DType::fp8_e5m2})
    for (ReduceOp op : kOps)
      for (const std::string& algo : collectives::algorithm_names(collectives::Collective::all_reduce)) {
        if (!collectives::obstacle(collectives::Collective::all_reduce, algo, f.tp).empty()) continue;
        Buffer send(count * runtime::dtype_size(t)), recv(send.size(), 0);
        for (size_t i = 0; i < count; ++i)
          runtime::store_from_double(send.data(), i, t, i == size_t(r) ? std::nan("") : r + 1.0);
        collectives::all_reduce(f.tp, send.data(), recv.data(), count, t, op, 0.0, opts(algo));
        for (size_t i = 0; i < count; ++i)
          EXPECT_TRUE(std::isnan(runtime::load_as_double(recv.data(), i, t)))
              << algo << " " << runtime::dtype_name(t) << " " << collectives::reduce_op_name(op) << " element " << i
              << " on " << p << " ranks: " << runtime::load_as_double(recv.data(), i, t);
      }
}

// The same input through reduce (binomial tree and chain) to the last rank.
TEST(Reduce, NaNSurvivesTreeAndChain) {
  RingFixture f(100, 500);
  const int r = world_rank(), p = world_size();
  const size_t count = static_cast<size_t>(p);
  for (ReduceOp op : {ReduceOp::max, ReduceOp::min, ReduceOp::sum})
    for (const std::string& algo : collectives::algorithm_names(collectives::Collective::reduce)) {
      Buffer send(count * 4), recv(send.size(), 0);
      for (size_t i = 0; i < count; ++i) runtime::store_from_double(send.data(), i, DType::fp32, i == size_t(r) ? std::nan("") : r + 1.0);
      collectives::reduce(f.tp, send.data(), recv.data(), count, DType::fp32, op, 0.0, opts(algo, 0, p - 1));
      if (r == p - 1) {
        for (size_t i = 0; i < count; ++i)
          EXPECT_TRUE(std::isnan(runtime::load_as_double(recv.data(), i, DType::fp32)))
              << algo << " " << collectives::reduce_op_name(op) << " element " << i;
      }
    }
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

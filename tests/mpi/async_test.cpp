// Async all_reduce on the communication engine: the same bytes and the same simulated spans as the synchronous
// call, several ops in flight at once, test() eventually true, and errors raised on the engine surfacing at wait()
// on every rank (without hanging).
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>

#include "collectives/all_reduce.h"
#include "collectives/reduce_scatter.h"
#include "collectives/reduce.h"
#include "collectives/broadcast.h"
#include "collectives/all_to_all.h"
#include "collectives/all_gather.h"
#include "collectives/async.h"
#include "common/error.h"
#include "mpi/collective_fixture.h"
#include "mpi/mpi_util.h"

using namespace shardsim;
using collectives::ReduceOp;
using runtime::DType;

namespace {

struct Ring : Fixture {
  Ring() : Fixture(topology::Topology::ring(world_size(), topology::LinkSpec{100, 500})) {}
};

// Non-trivial fp32/bf16 data (rounding differs with the order of additions, so "bit-exact" means something).
std::vector<unsigned char> data(size_t count, DType t, int seed) {
  std::vector<unsigned char> b(count * runtime::dtype_size(t));
  for (size_t i = 0; i < count; ++i)
    runtime::store_from_float(b.data(), i, t,
                              std::sin(0.37f * static_cast<float>(i) + 1.3f * static_cast<float>(seed)) * 3.1f);
  return b;
}

void expect_same_events(const sim::Timeline& a, const sim::Timeline& b, const std::string& what) {
  ASSERT_EQ(a.events().size(), b.events().size()) << what;
  for (size_t i = 0; i < a.events().size(); ++i) {
    const auto& x = a.events()[i];
    const auto& y = b.events()[i];
    EXPECT_EQ(x.name, y.name) << what << " event " << i;
    EXPECT_EQ(x.engine, y.engine) << what << " event " << i;
    EXPECT_EQ(x.span.start, y.span.start) << what << " event " << i << " " << x.name;
    EXPECT_EQ(x.span.end, y.span.end) << what << " event " << i << " " << x.name;
    EXPECT_EQ(x.bytes, y.bytes) << what << " event " << i;
  }
}

}  // namespace

TEST(AsyncAllReduce, SameBytesAndSpansAsSync) {
  const int r = world_rank();
  for (const char* algorithm : {"auto", "ring", "bidir_ring"})
    for (DType t : {DType::fp32, DType::bf16})
      for (size_t count : {size_t{0}, size_t{1}, size_t{1000}, size_t{100003}}) {
        const std::string what = std::string(algorithm) + " " + runtime::dtype_name(t) + " count=" +
                                 std::to_string(count);
        Ring sync, async;
        const auto in = data(count, t, r);
        std::vector<unsigned char> want(in.size()), got(in.size(), 0xAB);
        // Some prior activity on the timeline so the ops do not start on an idle chip.
        sync.tl.compute("gemm", 1e9, 1e6, sim::Precision::fp32, 0, {});
        async.tl.compute("gemm", 1e9, 1e6, sim::Precision::fp32, 0, {});
        const auto a = collectives::all_reduce(sync.tp, in.data(), want.data(), count, t, ReduceOp::sum, 1000.0,
                                               opts(algorithm));
        auto h = collectives::all_reduce_async(async.tp, in.data(), got.data(), count, t, ReduceOp::sum, 1000.0,
                                               opts(algorithm));
        const auto b = h.wait();
        EXPECT_EQ(got, want) << what;
        EXPECT_EQ(a.span.start, b.span.start) << what;
        EXPECT_EQ(a.span.end, b.span.end) << what;
        EXPECT_EQ(a.algorithm, b.algorithm) << what;
        EXPECT_EQ(a.bytes_sent, b.bytes_sent) << what;
        EXPECT_EQ(sync.tp.bytes_sent(), async.tp.bytes_sent()) << what;
        expect_same_events(sync.tl, async.tl, what);
      }
}

// The other async collectives: the same bytes and spans as their synchronous calls, several in flight at once.
TEST(AsyncCollectives, EveryVariantMatchesItsSyncCall) {
  const int r = world_rank(), p = world_size();
  const size_t count = 6 * static_cast<size_t>(p) + 0;  // divisible by p (reduce_scatter/all_gather/all_to_all)
  const auto in = data(count, DType::fp32, r);
  const auto part = data(count / static_cast<size_t>(p), DType::fp32, r + 7);
  Ring sync, async;
  struct Out {
    std::vector<unsigned char> want, got;
    collectives::CollectiveResult a;
  };
  const size_t es = 4;
  std::vector<Out> outs(5);
  for (auto& o : outs) {
    o.want.assign(count * es, 0);
    o.got.assign(count * es, 0xAB);
  }
  auto o0 = opts("auto");
  outs[0].a = collectives::reduce_scatter(sync.tp, in.data(), outs[0].want.data(), count, DType::fp32, ReduceOp::sum, 10, o0);
  outs[1].a = collectives::all_gather(sync.tp, part.data(), outs[1].want.data(), count, DType::fp32, 20, o0);
  outs[2].a = collectives::broadcast(sync.tp, in.data(), outs[2].want.data(), count, DType::fp32, 30, o0);
  outs[3].a = collectives::reduce(sync.tp, in.data(), outs[3].want.data(), count, DType::fp32, ReduceOp::max, 40, o0);
  outs[4].a = collectives::all_to_all(sync.tp, in.data(), outs[4].want.data(), count, DType::fp32, 50, o0);
  std::vector<collectives::AsyncHandle> hs;
  hs.push_back(collectives::reduce_scatter_async(async.tp, in.data(), outs[0].got.data(), count, DType::fp32, ReduceOp::sum, 10, o0));
  hs.push_back(collectives::all_gather_async(async.tp, part.data(), outs[1].got.data(), count, DType::fp32, 20, o0));
  hs.push_back(collectives::broadcast_async(async.tp, in.data(), outs[2].got.data(), count, DType::fp32, 30, o0));
  hs.push_back(collectives::reduce_async(async.tp, in.data(), outs[3].got.data(), count, DType::fp32, ReduceOp::max, 40, o0));
  hs.push_back(collectives::all_to_all_async(async.tp, in.data(), outs[4].got.data(), count, DType::fp32, 50, o0));
  const char* names[] = {"reduce_scatter", "all_gather", "broadcast", "reduce", "all_to_all"};
  for (size_t i = 0; i < hs.size(); ++i) {
    const auto b = hs[i].wait();
    // Compare only what each collective defines on this rank (reduce_scatter: the first count/p elements;
    // reduce: the root's buffer).
    size_t n = count * es;
    if (i == 0) n = count / static_cast<size_t>(p) * es;
    if (i == 3 && r != 0) n = 0;
    EXPECT_TRUE(std::equal(outs[i].want.begin(), outs[i].want.begin() + static_cast<long>(n), outs[i].got.begin()))
        << names[i];
    EXPECT_EQ(outs[i].a.span.start, b.span.start) << names[i];
    EXPECT_EQ(outs[i].a.span.end, b.span.end) << names[i];
    EXPECT_EQ(outs[i].a.algorithm, b.algorithm) << names[i];
  }
  EXPECT_EQ(sync.tp.bytes_sent(), async.tp.bytes_sent());
  expect_same_events(sync.tl, async.tl, "five async collectives");
}

TEST(AsyncAllReduce, SeveralInFlightMatchSyncSequence) {
  const int r = world_rank();
  constexpr int kOps = 4;
  const size_t counts[kOps] = {4099, 1, 65536, 777};
  Ring sync, async;
  std::vector<std::vector<unsigned char>> in, want, got;
  std::vector<collectives::CollectiveResult> sres;
  for (int i = 0; i < kOps; ++i) {
    in.push_back(data(counts[i], DType::fp32, r * 10 + i));
    want.emplace_back(in.back().size());
    got.emplace_back(in.back().size(), 0xCD);
    sres.push_back(collectives::all_reduce(sync.tp, in[i].data(), want[i].data(), counts[i], DType::fp32,
                                           ReduceOp::sum, 100.0 * i));
  }
  std::vector<collectives::AsyncHandle> hs;
  for (int i = 0; i < kOps; ++i)
    hs.push_back(collectives::all_reduce_async(async.tp, in[i].data(), got[i].data(), counts[i], DType::fp32,
                                               ReduceOp::sum, 100.0 * i));
  // test() becomes true without wait() (the engine progresses on its own).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (!hs.back().test() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_TRUE(hs.back().test());
  EXPECT_EQ(hs[0].seq() + kOps - 1, hs.back().seq());
  // Wait out of order: commits still happen in issue order.
  std::vector<collectives::CollectiveResult> ares(kOps);
  ares[2] = hs[2].wait();
  ares[0] = hs[0].wait();
  ares[3] = hs[3].wait();
  ares[1] = hs[1].wait();
  for (int i = 0; i < kOps; ++i) {
    EXPECT_EQ(got[i], want[i]) << "op " << i;
    EXPECT_EQ(ares[i].span.start, sres[i].span.start) << "op " << i;
    EXPECT_EQ(ares[i].span.end, sres[i].span.end) << "op " << i;
  }
  expect_same_events(sync.tl, async.tl, "four ops in flight");
  // The main thread's own communicator is untouched by the async traffic.
  expect_clean_communicator(async.tp);
}

TEST(AsyncAllReduce, ErrorSurfacesAtWaitOnEveryRank) {
  if (world_size() < 2) GTEST_SKIP() << "needs two ranks to disagree";
  Ring f;
  const int r = world_rank();
  const size_t count = 100 + static_cast<size_t>(r == 1);  // rank 1 disagrees
  std::vector<float> in(count, 1.0f), out(count);
  auto h = collectives::all_reduce_async(f.tp, in.data(), out.data(), count, DType::fp32, ReduceOp::sum, 0.0);
  try {
    h.wait();
    ADD_FAILURE() << "no error from mismatched counts";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(e.exit_code(), kExitBadInput) << msg;
    EXPECT_NE(msg.find("async all_reduce #"), std::string::npos) << msg;
    EXPECT_NE(msg.find("count"), std::string::npos) << msg;
  }
  // The engine stays usable after an agreed error.
  std::vector<float> ok(10, 1.0f);
  auto h2 = collectives::all_reduce_async(f.tp, ok.data(), ok.data(), ok.size(), DType::fp32, ReduceOp::sum, 0.0);
  h2.wait();
  EXPECT_EQ(ok[9], static_cast<float>(world_size()));
}

TEST(AsyncAllReduce, DestroyingAHandleWaits) {
  Ring f;
  std::vector<int32_t> buf(1000, world_rank() + 1);
  {
    auto h = collectives::all_reduce_async(f.tp, buf.data(), buf.data(), buf.size(), DType::int32, ReduceOp::sum, 0.0);
  }
  const int p = world_size();
  EXPECT_EQ(buf[999], p * (p + 1) / 2);
}

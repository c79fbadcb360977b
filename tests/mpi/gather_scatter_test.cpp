// gather, scatter over real ranks (ctest runs them at np 1, 2, 3, 4 and 8):
//  - Matrix: every algorithm the registry lists (and auto) x dtypes x ops x counts, bit-exact against the
//    single-device reference, special values included (tests/mpi/collective_params.h); a new algorithm is
//    covered by registering it.
//  - ClosedForm / Correctness: simulated times against closed forms or first-principles schedules of the
//    documented cost model (docs/MODEL.md), and cases the matrix does not reach (every root, uneven counts,
//    other topologies), checked against expectations computed here (tests/mpi/algorithm_helpers.h).
#include "mpi/algorithm_helpers.h"
#include "mpi/collective_params.h"

using namespace algtest;

class GatherMatrix : public CollectiveTest {};
TEST_P(GatherMatrix, MatchesReference) { run_matrix(); }
SHARDSIM_REGISTRY_SUITES(GatherMatrix, Collective::gather);

class ScatterMatrix : public CollectiveTest {};
TEST_P(ScatterMatrix, MatchesReference) { run_matrix(); }
SHARDSIM_REGISTRY_SUITES(ScatterMatrix, Collective::scatter);

// ---- closed forms and gather scatter-specific cases (moved from algorithms_test.cpp) ----

// gather.h: every non-root rank injects its block at once; the root books them (docs/MODEL.md, "Receive side")
// in (start, chip) order, i.e. chip order here (all start at 0). On a ring the flows reach the root over its two
// ingress links, from the chips below it (+ direction, ties included) and above it; flows of one side share the
// last link and every link they have in common lies on the same chain, so in terms of tau = the time a flow's
// head reaches the root's ingress link (its desired tau = (hops - 1) alpha) every link reduces to that one link:
// each flow takes the earliest gap of S/B at or after its desired tau, in chip order, and arrives at
// tau + alpha + S/B. Without contention (alpha >= S/B, or one flow per side) this is max(hops alpha + S/B).
TEST(ClosedForm, GatherMaxRoute) {
  const int p = world_size(), r = world_rank();
  const size_t count = 1000;  // per rank, int32
  for (double bw : kBws)
    for (double alpha : kAlphas)
      for (int root = 0; root < p; ++root) {
        Fixture f(ring_topo(bw, alpha));
        std::vector<int32_t> in(count, r), out(count * size_t(p), -1);
        const auto res = collectives::gather(f.tp, in.data(), out.data(), count, DType::int32, 0.0,
                                             opts("direct", 0, root));
        if (r != root) continue;
        const double o = count * 4.0 / bw;
        std::vector<std::pair<double, double>> busy[2];  // per side: booked [tau, tau + o)
        double want = 0, contention_free = 0;
        for (int q = 0; q < p; ++q) {
          if (q == root) continue;
          const int fwd = (root - q + p) % p, side = fwd <= p - fwd ? 0 : 1;
          double tau = (ring_hops(p, q, root) - 1) * alpha;
          for (bool moved = true; moved;) {
            moved = false;
            for (const auto& [a, b] : busy[side])
              if (a < tau + o && tau < b) tau = b, moved = true;
          }
          busy[side].push_back({tau, tau + o});
          want = std::max(want, tau + alpha + o);
          contention_free = std::max(contention_free, ring_hops(p, q, root) * alpha + o);
        }
        expect_time(res.span.duration(), want, "gather root " + std::to_string(root));
        if (p <= 3 || alpha >= o) {  // one flow per side, or no overlap
          EXPECT_EQ(want, contention_free);
        }
        if (p == 8 && alpha == 0) {  // 4 flows share the + side's link
          EXPECT_NEAR(want, 4 * o, 1e-9 * o);
        }
      }
}

TEST(Correctness, GatherAndScatterEveryRoot) {
  const int p = world_size(), r = world_rank();
  Fixture f(ring_topo(100, 500));
  for (int root = 0; root < p; ++root)
    for (size_t count : {size_t(0), size_t(1), size_t(5), size_t(1000)})
      for (DType t : {DType::fp16, DType::int32})
        for (bool in_place : {false, true}) {
          const size_t es = runtime::dtype_size(t), block = count * es;
          const std::string what = "root " + std::to_string(root) + " count " + std::to_string(count) + " " + dt(t) +
                                   (in_place ? " in-place" : "");
          // gather: rank q's block lands at block q of the root's buffer; other ranks' RECVBUF is ignored.
          const Bytes mine = pattern(block, r, root);
          Bytes all(block * size_t(p), 0xC3);
          const void* send = mine.data();
          if (in_place && r == root) {
            std::copy(mine.begin(), mine.end(), all.begin() + long(size_t(root) * block));
            send = all.data() + size_t(root) * block;
          }
          // Non-roots pass a null RECVBUF half of the time (it must not be touched).
          void* recvbuf = (r != root && in_place) ? nullptr : all.data();
          collectives::gather(f.tp, send, recvbuf, count, t, 0.0, opts("direct", 0, root));
          if (r == root) {
            Bytes want;
            for (int q = 0; q < p; ++q) {
              const Bytes b = pattern(block, q, root);
              want.insert(want.end(), b.begin(), b.end());
            }
            EXPECT_TRUE(same_bytes(all, want, es)) << "gather " << what;
          } else if (recvbuf) {
            EXPECT_TRUE(same_bytes(all, Bytes(all.size(), 0xC3))) << "gather touched a non-root's RECVBUF, " << what;
          }

          // scatter: block q of the root's buffer lands in rank q's RECVBUF; SENDBUF is ignored on non-roots.
          Bytes src;
          if (r == root)
            for (int q = 0; q < p; ++q) {
              const Bytes b = pattern(block, q, root + 50);
              src.insert(src.end(), b.begin(), b.end());
            }
          Bytes out(block, 0x3C);
          void* dst = out.data();
          if (in_place && r == root) dst = src.data() + size_t(root) * block;
          collectives::scatter(f.tp, r == root ? src.data() : nullptr, dst, count, t, 0.0, opts("direct", 0, root));
          const Bytes got = (in_place && r == root)
                                ? Bytes(src.begin() + long(size_t(root) * block),
                                        src.begin() + long(size_t(root + 1) * block))
                                : out;
          EXPECT_TRUE(same_bytes(got, pattern(block, r, root + 50), es)) << "scatter " << what;
        }
}

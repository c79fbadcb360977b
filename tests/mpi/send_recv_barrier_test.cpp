// send_recv and barrier over real ranks: every algorithm the registry lists for them, checked against the
// single-device reference (tests/mpi/collective_params.h); one dtype each (they move bytes, no arithmetic).
#include "mpi/algorithm_helpers.h"
#include "mpi/collective_params.h"

using namespace algtest;


class SendRecvMatrix : public CollectiveTest {};
TEST_P(SendRecvMatrix, MatchesReference) { run_matrix(); }
INSTANTIATE_TEST_SUITE_P(Count, SendRecvMatrix, ::testing::ValuesIn(count_params(Collective::send_recv)), param_name);

class BarrierMatrix : public CollectiveTest {};
TEST_P(BarrierMatrix, Completes) { run_matrix(); }
INSTANTIATE_TEST_SUITE_P(Count, BarrierMatrix, ::testing::ValuesIn(count_params(Collective::barrier, {0})),
                         param_name);

// ---- closed forms and send recv barrier-specific cases (moved from algorithms_test.cpp) ----

// Dissemination barrier, send_recv.h: round k talks to rank r + 2^k with zero bytes, so on a ring each round
// costs the route latency of distance 2^k: sum_k hops(2^k) alpha. On a unidirectional ring hops(d) = d.
TEST(ClosedForm, BarrierRounds) {
  const int p = world_size();
  for (bool bidir : {true, false})
    for (double alpha : {250.0, 1000.0}) {
      Fixture f(ring_topo(100, alpha, bidir));
      double want = 0;
      for (int d = 1; d < p; d *= 2) want += (bidir ? ring_hops(p, 0, d) : d) * alpha;
      const auto res = collectives::barrier(f.tp, 0.0);
      expect_time(res.span.duration(), want, std::string("barrier ") + (bidir ? "bidirectional" : "unidirectional"));
      EXPECT_EQ(res.bytes_sent, 0.0);
      expect_time(collectives::estimate_ns(Collective::barrier, "dissemination", f.tp, 0), want, "barrier estimate");
    }
}

// A barrier with ranks arriving at different times: nobody leaves before the last one arrived, and each rank's
// end follows the dissemination recurrence t_r <- max(t_r, t_{r-2^k} + hops(2^k) alpha), round by round.
TEST(ClosedForm, BarrierWaitsForTheLastArrival) {
  const int p = world_size(), r = world_rank();
  const double alpha = 300;
  Fixture f(ring_topo(100, alpha));
  auto ready = [](int q) { return 1000.0 * ((q * 5) % 7); };
  std::vector<double> t(static_cast<size_t>(p));
  double latest = 0;
  for (int q = 0; q < p; ++q) {
    t[static_cast<size_t>(q)] = ready(q);
    latest = std::max(latest, ready(q));
  }
  for (int d = 1; d < p; d *= 2) {
    std::vector<double> next = t;
    for (int q = 0; q < p; ++q) {
      const int src = ((q - d) % p + p) % p;
      next[static_cast<size_t>(q)] =
          std::max(t[static_cast<size_t>(q)], t[static_cast<size_t>(src)] + ring_hops(p, src, q) * alpha);
    }
    t = next;
  }
  const auto res = collectives::barrier(f.tp, ready(r));
  EXPECT_EQ(res.span.start, ready(r));
  EXPECT_GE(res.span.end, latest) << "rank " << r << " left the barrier before every rank arrived";
  expect_time(res.span.end, t[static_cast<size_t>(r)], "barrier end rank " + std::to_string(r));
}

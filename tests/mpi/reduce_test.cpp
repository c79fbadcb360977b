// reduce over real ranks (ctest runs them at np 1, 2, 3, 4 and 8):
//  - Matrix: every algorithm the registry lists (and auto) x dtypes x ops x counts, bit-exact against the
//    single-device reference, special values included (tests/mpi/collective_params.h); a new algorithm is
//    covered by registering it.
//  - ClosedForm / Correctness: simulated times against closed forms or first-principles schedules of the
//    documented cost model (docs/MODEL.md), and cases the matrix does not reach (every root, uneven counts,
//    other topologies), checked against expectations computed here (tests/mpi/algorithm_helpers.h).
#include "mpi/algorithm_helpers.h"
#include "mpi/collective_params.h"

using namespace algtest;

class ReduceMatrix : public CollectiveTest {};
TEST_P(ReduceMatrix, MatchesReference) { run_matrix(); }
SHARDSIM_REGISTRY_SUITES(ReduceMatrix, Collective::reduce);

// ---- closed forms and reduce-specific cases (moved from algorithms_test.cpp) ----

// Reduce mirrors broadcast: binomial (every rank sends once to its parent: critical path of the tree) and chain
// ((p-1)(alpha + c/B) + (m-1) c/B at the root).
TEST(ClosedForm, ReduceBinomialAndChain) {
  const int p = world_size(), r = world_rank();
  const size_t count = 6144;
  const double S = count * 4.0;
  for (double bw : kBws)
    for (double alpha : kAlphas)
      for (int root = 0; root < p; ++root) {
        Fixture f(ring_topo(bw, alpha));
        std::vector<float> in(count, float(r + 1)), out(count, -1.0f);
        const auto tb = collectives::reduce(f.tp, in.data(), out.data(), count, DType::fp32, ReduceOp::sum, 0.0,
                                            opts("binomial_tree", 0, root));
        const auto want = binomial_reduce_done(p, root, S, bw, alpha);
        const std::string what = "reduce root " + std::to_string(root) + " rank " + std::to_string(r);
        expect_time(tb.span.end, want[static_cast<size_t>(r)], what + " binomial");
        if (r == root) {
          EXPECT_EQ(out[7], float(p * (p + 1) / 2)) << what;
        }

        Fixture g(ring_topo(bw, alpha));  // a fresh clock: every rank ready at 0
        const auto ch = collectives::reduce(g.tp, in.data(), out.data(), count, DType::fp32, ReduceOp::max, 0.0,
                                            opts("chain", 4096, root));
        EXPECT_EQ(ch.algorithm, "ring");
        // Root-relative v: data flows 1 -> 2 -> ... -> p-1 -> 0 (the ring's forward links), so the rank at
        // position w = v-1 (mod p) of that chain is done when the last piece came from position w-1.
        const int v = (r - root + p) % p, w = (v - 1 + p) % p;
        const double c = 4096, m = 6;
        const double want_chain = w == 0 ? 0 : w * (alpha + c / bw) + (m - 1) * c / bw;
        expect_time(ch.span.end, want_chain, what + " chain");
        if (r == root) {
          EXPECT_EQ(out[0], float(p)) << what;
        }
      }
}

TEST(Correctness, ReduceEveryRootEveryOpBothAlgorithms) {
  const int p = world_size(), r = world_rank();
  Fixture f(ring_topo(100, 500));
  std::vector<int> roots = {0, p - 1, p / 2};
  std::sort(roots.begin(), roots.end());
  roots.erase(std::unique(roots.begin(), roots.end()), roots.end());
  int salt = 0;
  for (int root : roots)
    for (const char* algorithm : {"binomial_tree", "ring"})
      for (size_t chunk : {size_t(0), size_t(20)})
        for (ReduceOp op : collectives::all_reduce_ops())
          for (DType t : {DType::fp32, DType::bf16, DType::int8, DType::uint32, DType::int64})
            for (size_t count : {size_t(1), size_t(333)}) {
              ++salt;
              const Bytes in = make_input(t, op, p, r, count, salt);
              const Bytes want = expected_reduce(t, op, p, count, salt);
              Bytes out(in.size(), 0x99);
              const bool null_recv = r != root && (salt % 2 == 0);  // RECVBUF may be null on non-roots
              const auto res = collectives::reduce(f.tp, in.data(), null_recv ? nullptr : out.data(), count, t, op,
                                                   0.0, opts(algorithm, chunk, root));
              const std::string what = std::string(algorithm) + " root " + std::to_string(root) + " chunk " +
                                       std::to_string(chunk) + " " + opname(op) + " " + dt(t) + " count " +
                                       std::to_string(count);
              EXPECT_EQ(res.algorithm, algorithm) << what;
              if (r == root) {
                EXPECT_TRUE(same_bytes(out, want, runtime::dtype_size(t))) << "reduce " << what;
              } else {
                EXPECT_TRUE(same_bytes(out, Bytes(out.size(), 0x99))) << "reduce touched a non-root's RECVBUF " << what;
              }
              EXPECT_EQ(in, make_input(t, op, p, r, count, salt)) << "reduce modified SENDBUF " << what;
            }
}

TEST(Correctness, ReduceInPlaceAtRoot) {
  const int p = world_size(), r = world_rank();
  Fixture f(ring_topo(100, 500));
  const int root = p - 1;
  for (const char* algorithm : {"tree", "chain"}) {
    Bytes buf = make_input(DType::int32, ReduceOp::sum, p, r, 257, 7);
    collectives::reduce(f.tp, buf.data(), buf.data(), 257, DType::int32, ReduceOp::sum, 0.0, opts(algorithm, 0, root));
    if (r == root) {
      EXPECT_TRUE(same_bytes(buf, expected_reduce(DType::int32, ReduceOp::sum, p, 257, 7), 4)) << algorithm;
    }
  }
}

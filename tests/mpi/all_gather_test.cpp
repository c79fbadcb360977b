// all_gather, all_gatherv over real ranks (ctest runs them at np 1, 2, 3, 4 and 8):
//  - Matrix: every algorithm the registry lists (and auto) x dtypes x ops x counts, bit-exact against the
//    single-device reference, special values included (tests/mpi/collective_params.h); a new algorithm is
//    covered by registering it.
//  - ClosedForm / Correctness: simulated times against closed forms or first-principles schedules of the
//    documented cost model (docs/MODEL.md), and cases the matrix does not reach (every root, uneven counts,
//    other topologies), checked against expectations computed here (tests/mpi/algorithm_helpers.h).
#include "mpi/algorithm_helpers.h"
#include "mpi/collective_params.h"

using namespace algtest;

class AllGatherMatrix : public CollectiveTest {};
TEST_P(AllGatherMatrix, MatchesReference) { run_matrix(); }
SHARDSIM_REGISTRY_SUITES(AllGatherMatrix, Collective::all_gather);

class AllGathervMatrix : public CollectiveTest {};
TEST_P(AllGathervMatrix, MatchesReference) { run_matrix(); }
SHARDSIM_REGISTRY_SUITES(AllGathervMatrix, Collective::all_gatherv);

// ---- closed forms and all gather-specific cases (moved from algorithms_test.cpp) ----

TEST(Correctness, AllGathervUnevenCountsWithZeros) {
  const int p = world_size(), r = world_rank();
  Fixture f(ring_topo(100, 500));
  for (const auto& counts : gatherv_patterns(p))
    for (const char* algorithm : kFlatAlgorithms)
      for (size_t chunk : {size_t(0), size_t(8)})
        for (DType t : {DType::uint8, DType::fp16, DType::fp64})
          for (bool in_place : {false, true}) {
            const size_t es = runtime::dtype_size(t);
            size_t total = 0, mine_at = 0;
            for (int q = 0; q < p; ++q) {
              if (q == r) mine_at = total;
              total += counts[size_t(q)];
            }
            Bytes want;
            for (int q = 0; q < p; ++q) {
              const Bytes part = pattern(counts[size_t(q)] * es, q, int(chunk) + 3);
              want.insert(want.end(), part.begin(), part.end());
            }
            const Bytes mine = pattern(counts[size_t(r)] * es, r, int(chunk) + 3);
            Bytes recv(total * es, 0xEE);
            const void* send = mine.data();
            if (in_place) {
              std::copy(mine.begin(), mine.end(), recv.begin() + long(mine_at * es));
              send = recv.data() + mine_at * es;
            }
            std::string cs;
            for (size_t c : counts) cs += std::to_string(c) + ",";
            const auto res = collectives::all_gatherv(f.tp, send, recv.data(), counts, t, 0.0, opts(algorithm, chunk));
            EXPECT_TRUE(same_bytes(recv, want, es)) << "all_gatherv counts {" << cs << "} " << algorithm << " chunk "
                                                    << chunk << " " << dt(t) << (in_place ? " in-place" : "");
            if (std::string(algorithm) != "auto") {
              EXPECT_EQ(res.algorithm, algorithm);
            }
          }
}

// The concurrent-dimension torus algorithm (collectives/torus_concurrent.h) and the physical lower bound of every
// algorithm (collectives/cost/cost_model.h, lower_bound_ns). ctest runs this binary at np 1, 2, 3, 4 and 8.
//
//  - TorusConcurrent.ClosedFormOnCubes: on the contention-free 2x2 (p = 4) and 2x2x2 (p = 8) tori, all_reduce,
//    reduce_scatter and all_gather take the closed form of torus_concurrent.h within 1 %, the estimate equals the
//    simulated time, the data are exact, and `auto` picks it over the per-dimension torus (whose closed form sends
//    S/2 through the first dimension) and every other algorithm.
//  - LowerBound.NoAlgorithmBeatsItsLinks: no all_reduce / reduce_scatter / all_gather algorithm that can run on a
//    ring, a torus, a switch or a fully-connected topology of the world's size finishes below lower_bound_ns.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "collectives/collectives.h"
#include "collectives/cost/cost_model.h"
#include "collectives/registry.h"
#include "mpi/collective_fixture.h"
#include "mpi/mpi_util.h"

using namespace shardsim;
using collectives::Collective;
using collectives::ReduceOp;
using runtime::DType;
using topology::LinkSpec;
using topology::Topology;

namespace {

// Divisible by 2 x 3 x 8 x 2 (parts x ranks x halves at p = 4 and 8), so every piece has the same size.
constexpr size_t kCount = 262080;
constexpr double kS = kCount * 4.0;
const LinkSpec kSpecs[] = {LinkSpec{50, 700}, LinkSpec{400, 150}};

}  // namespace

// A 2^D cube (each dimension of size 2, so each a one-way ring of one step): D parts of S/D bytes; phase i
// carries S/D / 2^i, T_dim = alpha + S_i / (2B). T_rs = sum_i T_dim, T_all_reduce = 2 T_rs (torus_concurrent.h).
TEST(TorusConcurrent, ClosedFormOnCubes) {
  const int p = world_size(), r = world_rank();
  if (p != 4 && p != 8) GTEST_SKIP() << "2x2 (p = 4) and 2x2x2 (p = 8) tori";
  const std::vector<int> dims = p == 4 ? std::vector<int>{2, 2} : std::vector<int>{2, 2, 2};
  const double d = static_cast<double>(dims.size());
  for (const LinkSpec& l : kSpecs) {
    const std::string what = "torus " + std::to_string(p) + " B=" + std::to_string(l.bandwidth_gbps);
    double t_rs = 0, t_torus_rs = 0, s = kS / d, s_torus = kS;
    for (size_t i = 0; i < dims.size(); ++i) {
      t_rs += l.latency_ns + s / (2 * l.bandwidth_gbps);
      t_torus_rs += l.latency_ns + s_torus / (2 * l.bandwidth_gbps);
      s /= 2, s_torus /= 2;
    }
    Fixture f(Topology::torus(dims, {l}));
    const auto in = make_input(r, kCount);
    std::vector<float> out(kCount, -1.0f);
    const auto ar = collectives::all_reduce(f.tp, in.data(), out.data(), kCount, DType::fp32, ReduceOp::sum, 0.0,
                                            opts("torus_concurrent"));
    expect_time(max_over_ranks(ar.span.end), 2 * t_rs, what + " all_reduce");
    EXPECT_NEAR(collectives::estimate_ns(Collective::all_reduce, "torus_concurrent", f.tp, kS),
                max_over_ranks(ar.span.end), 1e-9 * 2 * t_rs)
        << what;
    EXPECT_EQ(std::memcmp(out.data(), expected_sum(p, kCount).data(), kCount * 4), 0) << what;
    // The per-dimension torus sends S/2 through its first dimension, the concurrent one S/D through each.
    expect_time(collectives::estimate_ns(Collective::all_reduce, "torus", f.tp, kS), 2 * t_torus_rs, what + " torus");
    EXPECT_EQ(collectives::choose(Collective::all_reduce, opts("auto"), f.tp, kS).algorithm, "torus_concurrent")
        << what;

    std::vector<float> part(kCount / static_cast<size_t>(p), -1.0f);
    Fixture g(Topology::torus(dims, {l}));
    const auto rs = collectives::reduce_scatter(g.tp, in.data(), part.data(), kCount, DType::fp32, ReduceOp::sum, 0.0,
                                                opts("torus_concurrent"));
    expect_time(max_over_ranks(rs.span.end), t_rs, what + " reduce_scatter");
    const auto want = expected_sum(p, kCount);
    EXPECT_EQ(std::memcmp(part.data(), want.data() + static_cast<size_t>(r) * part.size(), part.size() * 4), 0) << what;
    Fixture h(Topology::torus(dims, {l}));
    std::vector<float> gathered(kCount, -1.0f);
    const auto ag = collectives::all_gather(h.tp, part.data(), gathered.data(), kCount, DType::fp32, 0.0,
                                            opts("torus_concurrent"));
    expect_time(max_over_ranks(ag.span.end), t_rs, what + " all_gather");
    EXPECT_EQ(std::memcmp(gathered.data(), want.data(), kCount * 4), 0) << what;
  }
}

// Every chip must send (p-1)/p x S per pass over its outgoing links (no in-network reduction), so no algorithm
// finishes below lower_bound_ns; checked for every algorithm that can run, on four topology kinds.
TEST(LowerBound, NoAlgorithmBeatsItsLinks) {
  const int p = world_size(), r = world_rank();
  if (p == 1) GTEST_SKIP() << "nothing moves on one chip";
  const LinkSpec l{100, 500};
  std::vector<std::pair<std::string, Topology>> topos = {{"ring", Topology::ring(p, l)},
                                                         {"switch", Topology::switched(p, l)},
                                                         {"fully_connected", Topology::fully_connected(p, l)}};
  for (int a = 2; a * a <= p; ++a)
    if (p % a == 0) {
      topos.emplace_back("torus", Topology::torus({a, p / a}, {l}));
      break;
    }
  const size_t count = 65520;  // 256 KiB of fp32, divisible by 2 lcm(1..8) x 3
  for (const auto& [name, topo] : topos)
    for (Collective c : {Collective::all_reduce, Collective::reduce_scatter, Collective::all_gather})
      for (const auto& a : collectives::algorithm_names(c)) {
        Fixture f(topo);
        if (!collectives::obstacle(c, a, f.tp).empty()) continue;
        const size_t per_rank = count / static_cast<size_t>(p);
        std::vector<float> big = make_input(r, count), small(per_rank, 1.0f);
        double end = 0;
        if (c == Collective::all_reduce)
          end = collectives::all_reduce(f.tp, big.data(), big.data(), count, DType::fp32, ReduceOp::sum, 0.0, opts(a))
                    .span.end;
        else if (c == Collective::reduce_scatter)
          end = collectives::reduce_scatter(f.tp, big.data(), small.data(), count, DType::fp32, ReduceOp::sum, 0.0,
                                            opts(a))
                    .span.end;
        else
          end = collectives::all_gather(f.tp, small.data(), big.data(), count, DType::fp32, 0.0, opts(a)).span.end;
        const double bound = collectives::cost::lower_bound_ns(c, f.tp, count * 4.0);
        EXPECT_GT(bound, 0) << name << " " << a;
        EXPECT_GE(max_over_ranks(end), bound * (1 - 1e-12))
            << name << " " << collectives::collective_name(c) << " " << a << ": below the physical bound";
      }
}

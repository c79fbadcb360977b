// In-switch reduction (collectives/in_switch.h): a switch with `reduction: true` reduces what its chips send up and
// multicasts the result down. ctest runs this binary at np 1, 2, 3, 4 and 8.
//
//  - InSwitch.ClosedForm: on a reducing switch of the world's size, all_reduce, reduce_scatter and all_gather take
//    the closed form of in_switch.h within 1 % (the switch's rate below and above the link rate), the estimate
//    equals the simulated time, the data are exact, and no run is below cost::in_network_lower_bound_ns.
//  - InSwitch.Obstacles: a switch without reduction, a ring and a group of part of the switch's chips refuse it
//    with the reason; auto never picks it there.
//  - InSwitch.H100Nvls (p = 8): configs/topologies/dgx_h100_nvls.yaml, shape-only: in_switch all_reduce busbw
//    within 5 % of NVLS's published ~480 GB/s at 1 and 4 GiB, auto picks it, and ring all_gather / all_reduce
//    within 5 % of NCCL's ~370 GB/s on the same config (nccl-tests#212, nccl#1455).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstring>
#include <string>
#include <vector>

#include "collectives/collectives.h"
#include "collectives/cost/cost_model.h"
#include "collectives/registry.h"
#include "common/config.h"
#include "mpi/collective_fixture.h"
#include "mpi/mpi_util.h"
#include "topology/topology_yaml.h"

using namespace shardsim;
using collectives::Collective;
using collectives::ReduceOp;
using runtime::DType;
using topology::LinkSpec;
using topology::Topology;

namespace {

Topology reducing_switch(int p, LinkSpec link, LinkSpec rate) {
  topology::Dim d{topology::DimKind::switch_, p, link, true, {}};
  d.reduction = {true, rate};
  return Topology::stacked({d});
}

}  // namespace

// Every chip ready at 0, efficiency 1, o = 0, m equal pieces of the per-chip transfer (in_switch.h): piece i
// reaches the switch at alpha + (i+1) U/(mB); the switch reduces it when all are in, one piece after the other at
// rate R, sends it down alpha_R later, and the down-link delivers the pieces one after the other (all_gather at
// p = 3, whose pieces come down twice as large as they went up, is down-link bound).
TEST(InSwitch, ClosedForm) {
  const int p = world_size(), r = world_rank();
  if (p == 1) GTEST_SKIP() << "nothing moves on one chip";
  const size_t count = 840 * 1024;            // divisible by 1..8
  const double s = count * 4.0, piece = 64 * 1024;  // 3.28 MB in pieces of 64 KiB: m = 52 (all_reduce)
  const LinkSpec link{200, 700};
  for (const LinkSpec rate : {LinkSpec{120, 400}, LinkSpec{1000, 0}}) {
    const std::string what = "p " + std::to_string(p) + " R " + std::to_string(rate.bandwidth_gbps);
    auto closed = [&](double up, double down, double reduced) {
      const double m = std::ceil(std::max(up, down) / piece);
      const double B = link.bandwidth_gbps, R = rate.bandwidth_gbps, a = link.latency_ns;
      // Piece i is in at a + (i+1) U/(mB), reduced by e(i) = max(in(i), e(i-1)) + S_red/(mR), sent down at
      // e(i) + alpha_R; the down-link takes the pieces one after the other, D/(mB) each.
      double e = 0, down_free = 0;
      for (int i = 0; i < static_cast<int>(m); ++i) {
        e = std::max(a + (i + 1) * up / (m * B), e) + reduced / (m * R);
        down_free = std::max(e + rate.latency_ns, down_free) + down / (m * B);
      }
      return down_free + a;
    };
    const auto in = make_input(r, count);
    const auto want = expected_sum(p, count);
    {
      Fixture f(reducing_switch(p, link, rate));
      std::vector<float> out(count, -1.0f);
      const auto res = collectives::all_reduce(f.tp, in.data(), out.data(), count, DType::fp32, ReduceOp::sum, 0.0,
                                               opts("in_switch", piece));
      const double t = max_over_ranks(res.span.end);
      expect_time(t, closed(s, s, s), what + " all_reduce");
      EXPECT_NEAR(collectives::estimate_ns(Collective::all_reduce, "in_switch", f.tp, s, piece), t, 1e-9 * t) << what;
      EXPECT_GE(t, collectives::cost::in_network_lower_bound_ns(Collective::all_reduce, f.tp, s)) << what;
      EXPECT_EQ(std::memcmp(out.data(), want.data(), count * 4), 0) << what;
      EXPECT_EQ(res.bytes_sent, s) << what << ": every chip sends its buffer up once";
    }
    const size_t n = count / static_cast<size_t>(p);
    std::vector<float> part(n, -1.0f);
    {
      Fixture f(reducing_switch(p, link, rate));
      const auto res = collectives::reduce_scatter(f.tp, in.data(), part.data(), count, DType::fp32, ReduceOp::sum, 0.0,
                                                   opts("in_switch", piece));
      const double t = max_over_ranks(res.span.end);
      expect_time(t, closed(s, s / p, s), what + " reduce_scatter");
      EXPECT_NEAR(collectives::estimate_ns(Collective::reduce_scatter, "in_switch", f.tp, s, piece), t, 1e-9 * t);
      EXPECT_GE(t, collectives::cost::in_network_lower_bound_ns(Collective::reduce_scatter, f.tp, s)) << what;
      EXPECT_EQ(std::memcmp(part.data(), want.data() + static_cast<size_t>(r) * n, n * 4), 0) << what;
    }
    {
      Fixture f(reducing_switch(p, link, rate));
      std::vector<float> gathered(count, -1.0f);
      const auto res = collectives::all_gather(f.tp, part.data(), gathered.data(), count, DType::fp32, 0.0,
                                               opts("in_switch", piece));
      const double t = max_over_ranks(res.span.end);
      expect_time(t, closed(s / p, s - s / p, 0), what + " all_gather");
      EXPECT_NEAR(collectives::estimate_ns(Collective::all_gather, "in_switch", f.tp, s, piece), t, 1e-9 * t);
      EXPECT_GE(t, collectives::cost::in_network_lower_bound_ns(Collective::all_gather, f.tp, s)) << what;
      EXPECT_EQ(std::memcmp(gathered.data(), want.data(), count * 4), 0) << what;
    }
  }
}

TEST(InSwitch, Obstacles) {
  const int p = world_size();
  if (p == 1) GTEST_SKIP() << "nothing moves on one chip";
  const LinkSpec l{100, 500};
  Fixture plain(Topology::switched(p, l));
  EXPECT_NE(collectives::obstacle(Collective::all_reduce, "in_switch", plain.tp).find("reduction: true"),
            std::string::npos);
  EXPECT_NE(collectives::choose(Collective::all_reduce, opts("auto"), plain.tp, 1 << 24).algorithm, "in_switch");
  Fixture ring(Topology::ring(p, l));
  EXPECT_FALSE(collectives::obstacle(Collective::all_gather, "nvls", ring.tp).empty());
  // Two nodes' worth of reducing switches [p reducing x 2], the group on the first p chips: chips (q/2, q%2),
  // not the chips of one reducing switch.
  topology::Dim across{topology::DimKind::switch_, 2, l, true, {}}, inside{topology::DimKind::switch_, p, l, true, {}};
  inside.reduction = {true, LinkSpec{50, 0}};
  Fixture strided(Topology::stacked({inside, across}));
  EXPECT_NE(collectives::obstacle(Collective::all_reduce, "in_switch", strided.tp).find("not the chips of one"),
            std::string::npos);
  Fixture line(Topology::stacked({across, inside}));  // ranks 0..p-1: the chips of switch 0 of dimension 1
  EXPECT_EQ(collectives::obstacle(Collective::all_reduce, "in_switch", line.tp), "");
}

TEST(InSwitch, H100Nvls) {
  const int p = world_size();
  if (p != 8) GTEST_SKIP() << "an 8-GPU node";
  const Topology topo = topology::load_topology_file(std::string(SHARDSIM_CONFIG_DIR) +
                                                     "/topologies/dgx_h100_nvls.yaml");
  auto busbw = [&](Collective c, const std::string& a, double bytes) {
    Fixture f(topo);
    f.tp.set_shape_only(true);
    const size_t count = static_cast<size_t>(bytes / 4);
    double end = 0;
    if (c == Collective::all_reduce)
      end = collectives::all_reduce(f.tp, nullptr, nullptr, count, DType::fp32, ReduceOp::sum, 0.0, opts(a)).span.end;
    else
      end = collectives::all_gather(f.tp, nullptr, nullptr, count, DType::fp32, 0.0, opts(a)).span.end;
    const double factor = c == Collective::all_reduce ? 2.0 * (p - 1) / p : (p - 1.0) / p;
    return factor * bytes / max_over_ranks(end);  // GB/s = bytes / ns
  };
  for (double gib : {1.0, 4.0}) {
    const double bytes = gib * (1 << 30);
    const double nvls = busbw(Collective::all_reduce, "in_switch", bytes);
    EXPECT_NEAR(nvls, 480, 0.05 * 480) << gib << " GiB";
    EXPECT_NEAR(busbw(Collective::all_reduce, "ring", bytes), 370, 0.05 * 370) << gib << " GiB";
    EXPECT_NEAR(busbw(Collective::all_gather, "ring", bytes), 370, 0.05 * 370) << gib << " GiB";
    Fixture f(topo);
    EXPECT_EQ(collectives::choose(Collective::all_reduce, opts("auto"), f.tp, bytes).algorithm, "in_switch");
    if (world_rank() == 0) std::printf("[ figures  ] dgx_h100_nvls %.0f GiB: in_switch all_reduce busbw %.1f GB/s\n", gib, nvls);
  }
}

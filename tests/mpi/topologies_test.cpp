// Collectives on the non-ring topologies (topology/topology.h): one switch, fully connected, a mesh line and
// stacks of switch / ring / line / fully-connected dimensions (ctest runs this binary at np 1, 2, 3, 4 and 8):
// simulated times against closed forms.
//
//  - TopologiesSwitch / TopologiesFullyConnected / TopologiesMesh / TopologiesStacked: simulated times against
//    closed forms derived from the cost model (docs/MODEL.md, "Links and contention"; sim/timeline.h): a message
//    of S bytes over links l_1..l_h leaves when its data is ready and every link of its route is free of this
//    chip's own earlier flows, keeps them busy S / min B, and arrives sum(alpha) + S / min B after it left.
//    Within 1% (relative), as tests/mpi/algorithms_test.cpp.
//  (auto's estimates, crossing links, results, determinism and the per-call overhead on the same topologies:
//  tests/mpi/topologies_estimates_test.cpp; the shared cases: tests/mpi/topology_cases.h.)
//
// Every rank runs every test; skips depend only on the world size, so all ranks skip together.
#include "mpi/topology_cases.h"

// ================================================================================================================
// 1. One switch: ring steps cross the uplink and the downlink
// ================================================================================================================

// Ring on switched(p): each step sends S/p bytes chip -> switch -> chip: 2 links, cut-through, so one step takes
// 2 alpha + S/(pB) and nothing else shares a link of this chip's flow (one flow per step; the next step waits for
// the previous step's arrival). T_all_reduce = 2(p-1)(2 alpha + S/(pB)); reduce_scatter and all_gather half of it
// (S = the input of reduce_scatter, the output of all_gather). Every rank ends at the same time.
TEST(TopologiesSwitch, RingClosedFormAllReduceReduceScatterAllGather) {
  const int p = world_size(), r = world_rank();
  for (const LinkSpec& l : kSpecs) {
    const std::string what = "switched(" + std::to_string(p) + ") " + spec_name(l);
    const double step = 2 * l.latency_ns + kS / (p * l.bandwidth_gbps);
    Fixture f(Topology::switched(p, l));
    ASSERT_EQ(f.topo.kind(), topology::Kind::switch_);
    if (p > 1) {
      ASSERT_EQ(f.topo.hop_count(0, p - 1), 2) << what;
    }
    const auto in = make_input(r, kCount, 1);
    std::vector<float> out(kCount, -1.0f);
    const auto ar = collectives::all_reduce(f.tp, in.data(), out.data(), kCount, DType::fp32, ReduceOp::sum, 0.0,
                                            opts("ring"));
    EXPECT_EQ(ar.algorithm, "ring");
    expect_time(ar.span.duration(), 2 * (p - 1) * step, what + " all_reduce rank " + std::to_string(r));
    EXPECT_NEAR(ar.bytes_sent, 2.0 * (p - 1) / p * kS, 1e-6 * kS) << what;
    EXPECT_EQ(count_mismatches(out, expected_sum(p, kCount, 1)), 0u) << what;

    std::vector<float> part(kCount / size_t(p));
    const auto rs = collectives::reduce_scatter(f.tp, out.data(), part.data(), kCount, DType::fp32, ReduceOp::sum,
                                                ar.span.end, opts("ring"));
    expect_time(rs.span.duration(), (p - 1) * step, what + " reduce_scatter");
    const auto ag =
        collectives::all_gather(f.tp, part.data(), out.data(), kCount, DType::fp32, rs.span.end, opts("ring"));
    expect_time(ag.span.duration(), (p - 1) * step, what + " all_gather");
  }
}

// With p = 2, bidir_ring is allowed (both directions are the same neighbour, ring.h); its two half-chunks then
// queue on the one uplink, so it takes exactly as long as the ring: 2(2 alpha + S/(2B)).
TEST(TopologiesSwitch, BidirRingOnTwoChipsQueuesOnTheUplink) {
  const int p = world_size();
  if (p != 2) GTEST_SKIP() << "p = 2 only (p > 2 rejects bidir_ring on a switch: BidirRingIsRejected)";
  for (const LinkSpec& l : kSpecs) {
    Fixture f(Topology::switched(p, l));
    std::vector<float> buf(kCount, 1.0f);
    const auto ar = collectives::all_reduce(f.tp, buf.data(), buf.data(), kCount, DType::fp32, ReduceOp::sum, 0.0,
                                            opts("bidir_ring"));
    expect_time(ar.span.duration(), 2 * (2 * l.latency_ns + kS / (2 * l.bandwidth_gbps)),
                "bidir_ring on switched(2) " + spec_name(l));
    EXPECT_EQ(buf[kCount - 1], 2.0f);
  }
}

// Both ring neighbours of every chip sit behind its single uplink, so bidir_ring cannot use two links: a
// UsageError (exit 2) on every rank, before any message, naming the algorithm, the topology and the shared link;
// `auto` lists it as n/a with the same reason.
TEST(TopologiesSwitch, BidirRingIsRejected) {
  const int p = world_size();
  if (p < 3) GTEST_SKIP() << "with 1 or 2 chips bidir_ring is allowed (one neighbour)";
  Fixture f(Topology::switched(p, kSpecs[0]));
  const std::string why = collectives::obstacle(Collective::all_reduce, "bidir_ring", f.tp);
  EXPECT_NE(why.find("same link"), std::string::npos) << why;
  std::vector<float> a(size_t(p) * 16, 1.0f), b(a.size(), 0.0f);
  const std::vector<std::string> needles = {"bidir_ring", "cannot run", "switch", "same link",
                                            "chip 0 reaches chips 1 and " + std::to_string(p - 1)};
  for (const char* name : {"bidir_ring", "bidirectional_ring"}) {
    expect_usage_error(
        [&] { collectives::all_reduce(f.tp, a.data(), b.data(), a.size(), DType::fp32, ReduceOp::sum, 0, opts(name)); },
        needles, std::string("all_reduce ") + name);
    expect_usage_error(
        [&] {
          collectives::reduce_scatter(f.tp, a.data(), b.data(), a.size(), DType::fp32, ReduceOp::sum, 0, opts(name));
        },
        needles, std::string("reduce_scatter ") + name);
    expect_usage_error(
        [&] { collectives::all_gather(f.tp, a.data(), b.data(), a.size(), DType::fp32, 0, opts(name)); }, needles,
        std::string("all_gather ") + name);
  }
  const auto res = collectives::all_reduce(f.tp, a.data(), b.data(), a.size(), DType::fp32, ReduceOp::sum, 0,
                                           opts("auto"));
  EXPECT_NE(res.algorithm, "bidir_ring");
  EXPECT_NE(res.explanation.find("bidir_ring n/a (" + why + ")"), std::string::npos) << res.explanation;
  EXPECT_EQ(b[0], float(p));
  expect_clean_communicator(f.tp);
}

// Rank r on chip p-1-r: every pair of chips is still 2 links apart, so the ring takes the same time; the torus
// algorithm builds its rings from chip coordinates, so it runs too, in the time of the identity placement.
TEST(TopologiesSwitch, RingWithReversedPlacement) {
  const int p = world_size(), r = world_rank();
  for (const LinkSpec& l : kSpecs) {
    Topology topo = Topology::switched(p, l);
    topo.set_placement(reversed_chips(p));
    Fixture f(topo, reversed_chips(p));
    ASSERT_EQ(f.tp.chip(), p - 1 - r);
    const auto in = make_input(r, kCount, 2);
    std::vector<float> out(kCount, -1.0f);
    const auto ar = collectives::all_reduce(f.tp, in.data(), out.data(), kCount, DType::fp32, ReduceOp::sum, 0.0,
                                            opts("ring"));
    expect_time(ar.span.duration(), 2 * (p - 1) * (2 * l.latency_ns + kS / (p * l.bandwidth_gbps)),
                "ring, reversed placement, " + spec_name(l));
    EXPECT_EQ(count_mismatches(out, expected_sum(p, kCount, 2)), 0u);
    expect_same_time(collectives::estimate_ns(Collective::all_reduce, "ring", f.tp, kS), max_over_ranks(ar.span.end),
                     "ring estimate, reversed placement");
    std::fill(out.begin(), out.end(), -1.0f);
    f.tl.reset();
    const auto tr = collectives::all_reduce(f.tp, in.data(), out.data(), kCount, DType::fp32, ReduceOp::sum, 0.0,
                                            opts("torus"));
    expect_time(tr.span.duration(), 2 * stacked_rs_closed_form({dim(DimKind::switch_, p, l)}, kS),
                "torus, reversed placement, " + spec_name(l));
    EXPECT_EQ(count_mismatches(out, expected_sum(p, kCount, 2)), 0u) << "torus, reversed placement";
  }
}

// ================================================================================================================
// 2. Fully connected: a direct link to every other chip
// ================================================================================================================

// ring = 2(p-1)(alpha + S/(pB)); bidir_ring = 2(p-1)(alpha + S/(2pB)) for p > 2 (the links to r+1 and r-1 are
// different); at p = 2 there is one link to the one neighbour, so both halves queue on it: the ring's time.
// The torus algorithm on a 1-D fully-connected topology is the bidirectional ring (w = 2 when p > 2).
TEST(TopologiesFullyConnected, RingAndBidirRingClosedForms) {
  const int p = world_size(), r = world_rank();
  for (const LinkSpec& l : kSpecs) {
    const std::string what = "fully_connected(" + std::to_string(p) + ") " + spec_name(l);
    const double ring_step = l.latency_ns + kS / (p * l.bandwidth_gbps);
    const double bidir_step = p > 2 ? l.latency_ns + kS / (2 * p * l.bandwidth_gbps) : ring_step;
    const std::pair<const char*, double> cases[] = {{"ring", ring_step}, {"bidir_ring", bidir_step}, {"torus", bidir_step}};
    for (const auto& [algorithm, step] : cases) {
      Fixture f(Topology::fully_connected(p, l));
      const auto in = make_input(r, kCount, 3);
      std::vector<float> out(kCount, -1.0f);
      const auto ar = collectives::all_reduce(f.tp, in.data(), out.data(), kCount, DType::fp32, ReduceOp::sum, 0.0,
                                              opts(algorithm));
      EXPECT_EQ(ar.algorithm, algorithm);
      expect_time(ar.span.duration(), 2 * (p - 1) * step, what + " " + algorithm + " all_reduce");
      EXPECT_EQ(count_mismatches(out, expected_sum(p, kCount, 3)), 0u) << what << " " << algorithm;
      std::vector<float> part(kCount / size_t(p));
      const auto rs = collectives::reduce_scatter(f.tp, out.data(), part.data(), kCount, DType::fp32, ReduceOp::sum,
                                                  ar.span.end, opts(algorithm));
      expect_time(rs.span.duration(), (p - 1) * step, what + " " + algorithm + " reduce_scatter");
      const auto ag = collectives::all_gather(f.tp, part.data(), out.data(), kCount, DType::fp32, rs.span.end,
                                              opts(algorithm));
      expect_time(ag.span.duration(), (p - 1) * step, what + " " + algorithm + " all_gather");
    }
  }
}

// ================================================================================================================
// 3. A mesh line: the ring's wrap-around step p-1 -> 0 crosses p-1 links
// ================================================================================================================

// On mesh({p}) rank r < p-1 sends to r+1 over one link (alpha + c/B, c = S/p); rank p-1 sends to 0 over the p-1
// links of the - direction ((p-1) alpha + c/B). Those links carry only rank p-1's own flows, so nothing queues
// beyond a chip's own port.
//
// A lock-step reading ("every step takes as long as its slowest pair", 2(p-1)((p-1) alpha + S/(pB))) is NOT what
// the model gives: the ring code is dataflow, not lock-step. Rank r's step s+1 leaves when its step-s data has
// arrived (ring.cpp: lane.t = max(lane.t, arrival)), not when every rank's step s is done, so the slow wrap hop
// delays only the chain of chunks that actually crosses it. The end time of rank r is the longest path through
// the (step, rank) dependency graph: 2(p-1) edges, each costing c/B plus alpha per hop; a path of 2(p-1)
// consecutive ring edges crosses the wrap edge p-1 -> 0 at most twice (it covers 2p-2 of a cycle of p edges), and
// exactly twice when it starts at rank r0 >= 2 (i.e. ends at rank r = r0 - 2 <= p-3). Port waits (a rank's next
// send waiting c/B for its own previous one) never lengthen a path, as a move costs at least as much. So
//   end(r) = 2(p-1) S/(pB) + [ 2(p-1) + 2(p-2) ] alpha = 2(p-1)(alpha + S/(pB)) + 2(p-2) alpha   for r <= p-3,
//   end(r) = 2(p-1) S/(pB) + [ (p-1) + (2p-3) ] alpha  = 2(p-1)(alpha + S/(pB)) + (p-2) alpha    for r >= p-2,
//   T_all_reduce = max_r end(r) = 2(p-1)(alpha + S/(pB)) + 2(p-2) alpha = 2(p-1) S/(pB) + (4p-6) alpha,
// against 2(p-1)^2 alpha for the lock-step reading (26 vs 98 alpha at p = 8; they agree only at p <= 2).
// reduce_scatter / all_gather alone ((p-1) edges: the wrap at most once):
//   T = (p-1)(alpha + S/(pB)) + (p-2) alpha, i.e. exactly half of T_all_reduce.
// bidir_ring is rejected for p > 2 (chip 0 reaches 1 and p-1 through its one + link); the torus algorithm on a
// 1-D mesh is the same one-way ring over the line, with the same times.
TEST(TopologiesMesh, LineRingWrapAroundIsOnTheCriticalPathTwice) {
  const int p = world_size(), r = world_rank();
  for (const LinkSpec& l : kSpecs)
    for (const char* algorithm : {"ring", "torus"}) {
      const std::string what = std::string(algorithm) + " on mesh({" + std::to_string(p) + "}) " + spec_name(l);
      const double a = l.latency_ns, c = kS / (p * l.bandwidth_gbps);
      Fixture f(Topology::mesh({p}, {l}));
      if (p > 1) {
        ASSERT_EQ(f.topo.hop_count(p - 1, 0), p - 1);
      }
      const auto in = make_input(r, kCount, 4);
      std::vector<float> out(kCount, -1.0f);
      const auto ar = collectives::all_reduce(f.tp, in.data(), out.data(), kCount, DType::fp32, ReduceOp::sum, 0.0,
                                              opts(algorithm));
      EXPECT_EQ(ar.algorithm, algorithm);
      EXPECT_EQ(count_mismatches(out, expected_sum(p, kCount, 4)), 0u) << what;
      const double t_ar = p == 1 ? 0 : 2 * (p - 1) * (a + c) + 2 * (p - 2) * a;
      const double mine = p == 1 ? 0 : 2 * (p - 1) * (a + c) + (r <= p - 3 ? 2 : 1) * (p - 2) * a;
      expect_time(ar.span.duration(), mine, what + " all_reduce rank " + std::to_string(r));
      const double simulated = max_over_ranks(ar.span.end);
      expect_time(simulated, t_ar, what + " all_reduce (slowest rank)");
      if (p >= 3) {
        const double lock_step = 2 * (p - 1) * ((p - 1) * a + c);
        EXPECT_LT(simulated, lock_step - 0.5 * a) << what << ": the lock-step reading should overestimate";
      }
      expect_same_time(collectives::estimate_ns(Collective::all_reduce, algorithm, f.tp, kS), simulated,
                       what + " estimate_ns");

      std::vector<float> part(kCount / size_t(p));
      Fixture g(Topology::mesh({p}, {l}));  // fresh clocks: every rank ready at 0
      const auto rs = collectives::reduce_scatter(g.tp, out.data(), part.data(), kCount, DType::fp32, ReduceOp::sum,
                                                  0.0, opts(algorithm));
      const double t_half = p == 1 ? 0 : (p - 1) * (a + c) + (p - 2) * a;
      expect_time(max_over_ranks(rs.span.end), t_half, what + " reduce_scatter (slowest rank)");
      Fixture h(Topology::mesh({p}, {l}));
      const auto ag = collectives::all_gather(h.tp, part.data(), out.data(), kCount, DType::fp32, 0.0, opts(algorithm));
      expect_time(max_over_ranks(ag.span.end), t_half, what + " all_gather (slowest rank)");
    }
}

TEST(TopologiesMesh, BidirRingIsRejectedOnALine) {
  const int p = world_size();
  if (p < 3) GTEST_SKIP() << "with 1 or 2 chips bidir_ring is allowed (one neighbour)";
  Fixture f(Topology::mesh({p}, {kSpecs[0]}));
  std::vector<float> a(64, 1.0f);
  expect_usage_error(
      [&] { collectives::all_reduce(f.tp, a.data(), a.data(), 64, DType::fp32, ReduceOp::sum, 0, opts("bidir_ring")); },
      {"bidir_ring", "mesh", "same link", "chip 0 reaches chips 1 and " + std::to_string(p - 1)},
      "bidir_ring on a line");
  expect_clean_communicator(f.tp);
}

// ================================================================================================================
// 4. The torus (per-dimension, hierarchical) algorithm on stacks
// ================================================================================================================

TEST(TopologiesStacked, TorusPerDimensionClosedForm) {
  const int p = world_size(), r = world_rank();
  if (p != 4 && p != 8) GTEST_SKIP() << "stacks of 4 (2x2) and 8 (2x4, 4x2, 2x2x2) chips";
  for (int set = 0; set < 2; ++set)
    for (const auto& sc : stacked_cases(p, set)) {
      const std::string what = "stacked " + sc.name + " set " + std::to_string(set);
      const double t_rs = stacked_rs_closed_form(sc.dims, kS);
      // The algorithm's order is the fastest of all orders (torus.h: the exchange argument).
      std::vector<size_t> perm(sc.dims.size());
      std::iota(perm.begin(), perm.end(), size_t{0});
      do {
        EXPECT_LE(t_rs, stacked_rs_closed_form_in_order(sc.dims, perm, kS) * (1 + 1e-12)) << what;
      } while (std::next_permutation(perm.begin(), perm.end()));
      Fixture f(Topology::stacked(sc.dims));
      for (const char* algorithm : {"torus", "hierarchical"}) {
        const auto in = make_input(r, kCount, 5);
        std::vector<float> out(kCount, -1.0f);
        const auto ar = collectives::all_reduce(f.tp, in.data(), out.data(), kCount, DType::fp32, ReduceOp::sum,
                                                0.0, opts(algorithm));
        EXPECT_EQ(ar.algorithm, "torus") << what;
        expect_time(ar.span.duration(), 2 * t_rs, what + " " + algorithm + " all_reduce rank " + std::to_string(r));
        EXPECT_NEAR(ar.bytes_sent, 2.0 * (p - 1) / p * kS, 1e-6 * kS) << what;
        EXPECT_EQ(count_mismatches(out, expected_sum(p, kCount, 5)), 0u) << what;
        f.tl.reset();
      }
      expect_time(collectives::estimate_ns(Collective::all_reduce, "torus", f.tp, kS), 2 * t_rs,
                  what + " estimate_ns(all_reduce)");

      Fixture g(Topology::stacked(sc.dims));
      std::vector<float> buf = make_input(r, kCount, 6), part(kCount / size_t(p));
      const auto rs = collectives::reduce_scatter(g.tp, buf.data(), part.data(), kCount, DType::fp32, ReduceOp::sum,
                                                  0.0, opts("torus"));
      expect_time(rs.span.duration(), t_rs, what + " reduce_scatter");
      const auto ag =
          collectives::all_gather(g.tp, part.data(), buf.data(), kCount, DType::fp32, rs.span.end, opts("torus"));
      expect_time(ag.span.duration(), t_rs, what + " all_gather");
      EXPECT_EQ(count_mismatches(buf, expected_sum(p, kCount, 6)), 0u) << what;
    }
}

// The user-reported case: ASTRA-sim's two-level system [Ring 4 fast, Switch 2 slow]
// (configs/topologies/astra_ring4_switch2.yml; shardsim lists it outermost first: switch 2 x ring 4), and at p = 4
// switch 2 x ring 2. The torus all_reduce must reduce-scatter over the fast inner ring first, so the slow switch
// carries 1/k_ring of the data: its time is the closed form in that order, well below the reverse order (which
// the algorithm used to run: 2621.8 us against 864.0 us at 64 MiB on the 8-chip config). The same with the fast
// dimension listed first (ring 4 x switch 2): the order follows the bandwidth, not the listing. Results exact,
// estimate == simulated.
TEST(TopologiesStacked, TorusReduceScattersTheFastDimensionFirst) {
  const int p = world_size(), r = world_rank();
  if (p != 4 && p != 8) GTEST_SKIP() << "2 x 2 and 2 x 4 stacks";
  const double gib = 1.073741824;  // ASTRA-sim's GB (2^30 B) in shardsim's GB (1e9 B)
  const Dim slow = dim(DimKind::switch_, 2, LinkSpec{25 * gib, 1000});
  const Dim fast = dim(DimKind::ring, p / 2, LinkSpec{200 * gib, 100});
  struct Case {
    std::string name;
    std::vector<Dim> dims;
    std::vector<size_t> right, reverse;
  };
  const Case cases[] = {{"slow outer: switch 2 x ring " + std::to_string(p / 2), {slow, fast}, {1, 0}, {0, 1}},
                        {"fast outer: ring " + std::to_string(p / 2) + " x switch 2", {fast, slow}, {0, 1}, {1, 0}}};
  for (const auto& c : cases) {
    const double t_right = stacked_rs_closed_form_in_order(c.dims, c.right, kS);
    const double t_reverse = stacked_rs_closed_form_in_order(c.dims, c.reverse, kS);
    ASSERT_LT(t_right, 0.8 * t_reverse) << c.name;  // the case is worth testing
    Fixture f(Topology::stacked(c.dims));
    const auto in = make_input(r, kCount, 9);
    std::vector<float> out(kCount, -1.0f);
    const auto ar =
        collectives::all_reduce(f.tp, in.data(), out.data(), kCount, DType::fp32, ReduceOp::sum, 0.0, opts("torus"));
    expect_time(ar.span.duration(), 2 * t_right, c.name + " all_reduce");
    EXPECT_LT(ar.span.duration(), 2 * t_reverse) << c.name;
    EXPECT_EQ(count_mismatches(out, expected_sum(p, kCount, 9)), 0u) << c.name;
    expect_same_time(collectives::estimate_ns(Collective::all_reduce, "torus", f.tp, kS), max_over_ranks(ar.span.end),
                     c.name + " estimate");
    // reduce_scatter and all_gather (rank-ordered layouts: the chunks go through the position-ordered copy).
    Fixture g(Topology::stacked(c.dims));
    std::vector<float> buf = make_input(r, kCount, 10), part(kCount / size_t(p));
    const auto rs =
        collectives::reduce_scatter(g.tp, buf.data(), part.data(), kCount, DType::fp32, ReduceOp::sum, 0.0, opts("torus"));
    expect_time(rs.span.duration(), t_right, c.name + " reduce_scatter");
    const auto want = expected_sum(p, kCount, 10);
    EXPECT_EQ(count_mismatches(part, std::vector<float>(want.begin() + static_cast<long>(part.size() * size_t(r)),
                                                        want.begin() + static_cast<long>(part.size() * size_t(r + 1)))),
              0u)
        << c.name << " reduce_scatter chunk";
    const auto ag = collectives::all_gather(g.tp, part.data(), buf.data(), kCount, DType::fp32, rs.span.end, opts("torus"));
    expect_time(ag.span.duration(), t_right, c.name + " all_gather");
    EXPECT_EQ(count_mismatches(buf, want), 0u) << c.name << " all_gather";
  }
}

// A sanity check of the closed form's switch term on its own: a 1-D stack of one switch dimension is switched(p),
// and the torus algorithm there is the one-way ring: (p-1)(2 alpha + S/(pB)) per pass.
TEST(TopologiesStacked, TorusOnOneSwitchDimensionIsTheRing) {
  const int p = world_size();
  for (const LinkSpec& l : kSpecs) {
    Fixture f(Topology::stacked({dim(DimKind::switch_, p, l)}));
    std::vector<float> buf(kCount, 1.0f);
    const auto ar = collectives::all_reduce(f.tp, buf.data(), buf.data(), kCount, DType::fp32, ReduceOp::sum, 0.0,
                                            opts("torus"));
    expect_time(ar.span.duration(), 2 * stacked_rs_closed_form({dim(DimKind::switch_, p, l)}, kS),
                "torus on stacked({switch " + std::to_string(p) + "}) " + spec_name(l));
    EXPECT_EQ(buf[kCount / 2], float(p));
  }
}

// all_reduce over real ranks (ctest runs them at np 1, 2, 3, 4 and 8):
//  - Matrix: every algorithm the registry lists (and auto) x dtypes x ops x counts, bit-exact against the
//    single-device reference, special values included (tests/mpi/collective_params.h); a new algorithm is
//    covered by registering it.
//  - ClosedForm / Correctness: simulated times against closed forms or first-principles schedules of the
//    documented cost model (docs/MODEL.md), and cases the matrix does not reach (every root, uneven counts,
//    other topologies), checked against expectations computed here (tests/mpi/algorithm_helpers.h).
#include <array>
#include <functional>

#include "mpi/algorithm_helpers.h"
#include "collectives/multi_ring.h"
#include "mpi/collective_params.h"

using namespace algtest;

class AllReduceMatrix : public CollectiveTest {};
TEST_P(AllReduceMatrix, MatchesReference) { run_matrix(); }
SHARDSIM_REGISTRY_SUITES(AllReduceMatrix, Collective::all_reduce);

// ---- closed forms and all reduce-specific cases (moved from algorithms_test.cpp) ----

// torus.h: T_all_reduce = 2 sum_i (k_i - 1)(alpha_i + S_i/(w_i k_i B_i)) over the dimensions in the algorithm's
// order: ring bandwidth c = w B descending, ties innermost (last) dimension first; S_0 = S, S_{i+1} = S_i/k_i,
// w = 2 when k > 2 (both directions), else 1. Every 2-D factorisation X x Y of the world size (and 2x2x2 at 8),
// uniform and per-dimension link specs; reduce_scatter and all_gather are each half of it.
TEST(ClosedForm, TorusAllReduceReduceScatterAllGather) {
  const int p = world_size(), r = world_rank();
  std::vector<std::vector<int>> shapes;
  for (int x = 1; x <= p; ++x)
    if (p % x == 0) shapes.push_back({x, p / x});
  if (p == 8) shapes.push_back({2, 2, 2});
  const size_t count = 26880;  // divisible by 2p for every p in 1..8: equal chunks and equal halves
  const double S = count * 4.0;
  for (const auto& dims : shapes)
    for (bool per_dim : {false, true}) {
      std::vector<LinkSpec> specs;
      if (!per_dim) {
        specs = {LinkSpec{100, 500}};
      } else {
        const LinkSpec choice[] = {LinkSpec{50, 300}, LinkSpec{200, 1000}, LinkSpec{25, 0}};
        for (size_t d = 0; d < dims.size(); ++d) specs.push_back(choice[d]);
      }
      Fixture f(Topology::torus(dims, specs));
      std::string shape;
      for (int k : dims) {
        if (!shape.empty()) shape += "x";
        shape += std::to_string(k);
      }
      const std::string what = "torus " + shape + (per_dim ? " per-dim links" : " uniform links");

      auto spec = [&](size_t d) { return specs.size() == 1 ? specs[0] : specs[d]; };
      auto ring_bw = [&](size_t d) { return (dims[d] > 2 ? 2.0 : 1.0) * spec(d).bandwidth_gbps; };
      std::vector<size_t> order;
      for (size_t d = dims.size(); d-- > 0;) order.push_back(d);  // innermost first, then by ring bandwidth
      std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return ring_bw(a) > ring_bw(b); });
      double t_half = 0, s = S, sent = 0;
      for (size_t d : order) {
        const double k = dims[d];
        const LinkSpec& l = spec(d);
        const double w = k > 2 ? 2 : 1;
        t_half += (k - 1) * (l.latency_ns + s / (w * k * l.bandwidth_gbps));
        sent += (k - 1) / k * s;
        s /= k;
      }

      std::vector<float> buf(count);
      for (size_t i = 0; i < count; ++i) buf[i] = float(r + 1) + float(i % 7);
      const auto ar = collectives::all_reduce(f.tp, buf.data(), buf.data(), count, DType::fp32, ReduceOp::sum, 0.0,
                                              opts("torus"));
      EXPECT_EQ(ar.algorithm, "torus") << what;
      expect_time(ar.span.duration(), 2 * t_half, what + " all_reduce");
      EXPECT_NEAR(ar.bytes_sent, 2 * sent, 1e-6 * S) << what;
      // algorithms.h: estimates are exact for unpipelined algorithms on contention-free routes.
      expect_time(collectives::estimate_ns(Collective::all_reduce, "torus", f.tp, S), 2 * t_half,
                  what + " estimate_ns(all_reduce)");
      const float total = float(p * (p + 1) / 2);
      size_t bad = 0;
      for (size_t i = 0; i < count; ++i) bad += buf[i] != total + float(p) * float(i % 7);
      EXPECT_EQ(bad, 0u) << what << ": wrong all_reduce results";

      std::vector<float> part(count / size_t(p));
      const auto rs = collectives::reduce_scatter(f.tp, buf.data(), part.data(), count, DType::fp32, ReduceOp::sum,
                                                  ar.span.end, opts("torus"));
      expect_time(rs.span.duration(), t_half, what + " reduce_scatter");
      const auto ag = collectives::all_gather(f.tp, part.data(), buf.data(), count, DType::fp32, rs.span.end,
                                              opts("torus"));
      expect_time(ag.span.duration(), t_half, what + " all_gather");
      expect_time(collectives::estimate_ns(Collective::all_gather, "torus", f.tp, S), t_half,
                  what + " estimate_ns(all_gather)");
    }
}

// The torus algorithm on a ring topology (a 1-D torus) is a bidirectional ring: 2(p-1)(alpha + S/(w p B)).
TEST(ClosedForm, TorusOnRingTopologyIsTheBidirectionalRing) {
  const int p = world_size();
  const size_t count = 26880;
  const double S = count * 4.0;
  for (double bw : kBws)
    for (double alpha : kAlphas) {
      Fixture f(ring_topo(bw, alpha));
      std::vector<float> buf(count, 1.0f);
      const auto ar = collectives::all_reduce(f.tp, buf.data(), buf.data(), count, DType::fp32, ReduceOp::sum, 0.0,
                                              opts("torus"));
      const double w = p > 2 ? 2 : 1;
      expect_time(ar.span.duration(), 2 * (p - 1) * (alpha + S / (w * p * bw)), "torus on ring");
      EXPECT_EQ(buf[123], float(p));
    }
}

// Halving-doubling on a bidirectional ring, power-of-two p: reduce-scatter step i talks to the rank at distance
// d = p/2^(i+1) (d hops, one alpha per hop: cut-through) and moves S/2^(i+1) bytes; the all-gather mirrors it.
// Crossing flows (docs/MODEL.md): in a step of distance d the XOR pattern puts d flows of different senders on the
// busiest link of every route (e.g. p = 4, d = 2: 0->2 and 1->3 both cross 1->2), so each flow moves at B/d. No
// port is used twice at once (each step's send leaves after the previous one's data has arrived).
TEST(ClosedForm, HalvingDoublingOnRing) {
  const int p = world_size();
  if (p & (p - 1)) GTEST_SKIP() << "power-of-two p only (p = 3 is covered by HalvingDoublingNonPowerOfTwo)";
  const size_t count = 26880;
  const double S = count * 4.0;
  for (double bw : kBws)
    for (double alpha : kAlphas) {
      Fixture f(ring_topo(bw, alpha));
      double t_rs = 0;
      for (int dist = p / 2, i = 1; dist >= 1; dist /= 2, ++i)
        t_rs += ring_hops(p, 0, dist) * alpha + dist * S / std::ldexp(1.0, i) / bw;
      const double t_ag = t_rs;  // the same distances and sizes in the opposite order
      const std::string what = "hd p=" + std::to_string(p) + " B=" + std::to_string(bw) + " a=" + std::to_string(alpha);

      std::vector<float> buf(count, 2.0f);
      const auto ar = collectives::all_reduce(f.tp, buf.data(), buf.data(), count, DType::fp32, ReduceOp::sum, 0.0,
                                              opts("halving_doubling"));
      expect_time(ar.span.duration(), t_rs + t_ag, what + " all_reduce");
      EXPECT_DOUBLE_EQ(ar.bytes_sent, 2.0 * (p - 1) / p * S) << what;
      EXPECT_EQ(buf[count - 1], 2.0f * float(p)) << what;
      expect_time(collectives::estimate_ns(Collective::all_reduce, "halving_doubling", f.tp, S), t_rs + t_ag,
                  what + " estimate_ns");
      // On p = 8: 2 (7 alpha + 21/8 S/B), i.e. 2 log2(p) steps but p - 1 hops per phase on a ring, and the
      // crossing flows of the 4- and 2-hop steps share their links (7/8 S/B without that).
      if (p == 8) {
        expect_time(t_rs + t_ag, 2 * (7 * alpha + 21.0 / 8 * S / bw), "closed form itself");
      }

      std::vector<float> part(count / size_t(p));
      const auto rs = collectives::reduce_scatter(f.tp, buf.data(), part.data(), count, DType::fp32, ReduceOp::sum,
                                                  ar.span.end, opts("halving_doubling"));
      expect_time(rs.span.duration(), t_rs, what + " reduce_scatter");
      const auto ag = collectives::all_gather(f.tp, part.data(), buf.data(), count, DType::fp32, rs.span.end,
                                              opts("hd"));
      expect_time(ag.span.duration(), t_ag, what + " all_gather");
      EXPECT_EQ(ag.algorithm, "halving_doubling");
    }
}

// The p = 3 worked examples below: every rank's end time WANT(S, B, alpha)[rank] on a 3-ring (every pair one hop
// apart) for each bandwidth and latency, the sum is right, and estimate_ns is the slowest rank's (rank 0's) time.
void expect_p3_worked_example(const std::string& algorithm,
                              const std::function<std::array<double, 3>(double S, double bw, double alpha)>& want) {
  const int r = world_rank();
  const size_t count = 26880;
  const double S = count * 4.0;
  for (double bw : kBws)
    for (double alpha : kAlphas) {
      Fixture f(ring_topo(bw, alpha));
      std::vector<float> buf(count, float(r));
      const auto ar = collectives::all_reduce(f.tp, buf.data(), buf.data(), count, DType::fp32, ReduceOp::sum, 0.0,
                                              opts(algorithm));
      const auto w = want(S, bw, alpha);
      expect_time(ar.span.end, w[static_cast<size_t>(r)], algorithm + " p=3 rank " + std::to_string(r));
      EXPECT_EQ(buf[0], 3.0f);
      expect_time(collectives::estimate_ns(Collective::all_reduce, algorithm, f.tp, S), w[0],
                  algorithm + " p=3 estimate_ns");
    }
}

// p = 3 on a 3-ring (every pair one hop apart): rank 0 folds its S bytes into rank 1, ranks 1 and 2 run one
// halving and one doubling step with S/2, rank 1 sends the result back to rank 0. Worked through:
//   rank 1 has rank 0's data at a + S/B and sends S/2 to rank 2 (port busy until a + 1.5 S/B);
//   rank 2 sends its half at 0 -> rank 1 at a + S/(2B); rank 1's half arrives at rank 2 at 2a + 1.5 S/B;
//   all-gather: rank 1's port is still busy until a + 1.5 S/B, so its half reaches rank 2 at 2a + 2 S/B;
//   rank 2 sends at 2a + 1.5 S/B, arriving at rank 1 at 3a + 2 S/B; the unfold reaches rank 0 at 4a + 3 S/B.
TEST(ClosedForm, HalvingDoublingNonPowerOfTwo) {
  if (world_size() != 3) GTEST_SKIP() << "worked example for p = 3";
  expect_p3_worked_example("halving_doubling", [](double S, double bw, double alpha) {
    return std::array<double, 3>{4 * alpha + 3 * S / bw, 3 * alpha + 2 * S / bw, 2 * alpha + 2 * S / bw};
  });
}

// Recursive doubling on a bidirectional ring, power-of-two p: step i swaps the WHOLE buffer with the rank at XOR
// distance d = 2^i (ring_hops hops, one alpha each), and d flows of different senders share the busiest link of
// every route (the halving-doubling case above), so T = sum_d (hops(d) alpha + d S/B): log2(p) steps, against the
// ring's 2(p-1). bytes_sent is log2(p) S.
TEST(ClosedForm, RecursiveDoublingOnRing) {
  const int p = world_size();
  if (p & (p - 1)) GTEST_SKIP() << "power-of-two p only (p = 3 is covered by RecursiveDoublingNonPowerOfTwo)";
  const size_t count = 26880;
  const double S = count * 4.0;
  for (double bw : kBws)
    for (double alpha : kAlphas) {
      Fixture f(ring_topo(bw, alpha));
      double want = 0;
      int steps = 0;
      for (int dist = 1; dist < p; dist *= 2, ++steps) want += ring_hops(p, 0, dist) * alpha + dist * S / bw;
      const std::string what = "rd p=" + std::to_string(p) + " B=" + std::to_string(bw) + " a=" + std::to_string(alpha);
      std::vector<float> buf(count, 3.0f);
      const auto ar = collectives::all_reduce(f.tp, buf.data(), buf.data(), count, DType::fp32, ReduceOp::sum, 0.0,
                                              opts("rd"));
      EXPECT_EQ(ar.algorithm, "recursive_doubling") << what;
      expect_time(ar.span.duration(), want, what + " all_reduce");
      EXPECT_DOUBLE_EQ(ar.bytes_sent, steps * S) << what;
      EXPECT_EQ(buf[count - 1], 3.0f * float(p)) << what;
      expect_time(collectives::estimate_ns(Collective::all_reduce, "recursive_doubling", f.tp, S), want,
                  what + " estimate_ns");
    }
}

// p = 3 on a 3-ring: rank 0 folds S into rank 1 (arrives a + S/B); ranks 1 and 2 swap S (rank 2's leaves at 0 and
// arrives at rank 1 at a + S/B; rank 1's leaves at a + S/B and arrives at rank 2 at 2a + 2 S/B); rank 1 sends
// the result back to rank 0 over its other link: 2a + 2 S/B.
TEST(ClosedForm, RecursiveDoublingNonPowerOfTwo) {
  if (world_size() != 3) GTEST_SKIP() << "worked example for p = 3";
  expect_p3_worked_example("recursive_doubling", [](double S, double bw, double alpha) {
    return std::array<double, 3>{2 * alpha + 2 * S / bw, alpha + S / bw, 2 * alpha + 2 * S / bw};
  });
}

// auto never picks an opt-in algorithm (registry.h: in_auto), even where its estimate is the lowest: recursive
// doubling beats the ring on 2 chips at every size (one exchange against two), yet auto keeps the ring and says so.
TEST(Registry, AutoSkipsOptInRecursiveDoubling) {
  const int p = world_size();
  if (p < 2) GTEST_SKIP() << "needs 2 or more ranks";
  Fixture f(ring_topo(100, 1000));
  const size_t count = 64;
  const double S = count * 4.0;
  const double rd = collectives::estimate_ns(Collective::all_reduce, "recursive_doubling", f.tp, S);
  if (p == 2) {
    EXPECT_LT(rd, collectives::estimate_ns(Collective::all_reduce, "ring", f.tp, S));
  }
  std::vector<float> buf(count, 1.0f);
  const auto ar = collectives::all_reduce(f.tp, buf.data(), buf.data(), count, DType::fp32, ReduceOp::sum, 0.0,
                                          opts("auto"));
  EXPECT_NE(ar.algorithm, "recursive_doubling");
  EXPECT_NE(ar.explanation.find("recursive_doubling"), std::string::npos) << ar.explanation;
  EXPECT_NE(ar.explanation.find("(opt-in only)"), std::string::npos) << ar.explanation;
  EXPECT_EQ(buf[0], float(p));
}

// The torus algorithm on real multi-dimensional tori (every factorisation of p, and 2x2x2) with uneven counts:
// all_reduce, reduce_scatter and all_gatherv, unpipelined and with small pieces.
TEST(Correctness, TorusAlgorithmOnToriUnevenCounts) {
  const int p = world_size(), r = world_rank();
  std::vector<std::vector<int>> shapes;
  for (int x = 1; x <= p; ++x)
    if (p % x == 0) shapes.push_back({x, p / x});
  if (p == 8) shapes.push_back({2, 2, 2});
  int salt = 20000;
  for (const auto& dims : shapes) {
    Fixture f(Topology::torus(dims, {LinkSpec{100, 500}}));
    std::string shape;
    for (int k : dims) {
      if (!shape.empty()) shape += "x";
      shape += std::to_string(k);
    }
    for (size_t chunk : {size_t(0), size_t(12)})
      for (DType t : {DType::fp16, DType::int32})
        for (ReduceOp op : {ReduceOp::sum, ReduceOp::max})
          for (size_t count : {size_t(1), size_t(5), size_t(203)}) {
            ++salt;
            const size_t es = runtime::dtype_size(t);
            const std::string what = "torus " + shape + " chunk " + std::to_string(chunk) + " " + dt(t) + " " +
                                     opname(op) + " count " + std::to_string(count);
            const Bytes in = make_input(t, op, p, r, count, salt);
            const Bytes want = expected_reduce(t, op, p, count, salt);
            Bytes out(in.size(), 0x42);
            collectives::all_reduce(f.tp, in.data(), out.data(), count, t, op, 0.0, opts("torus", chunk));
            EXPECT_TRUE(same_bytes(out, want, es)) << "all_reduce " << what;

            const collectives::Partition part{count, size_t(p)};
            Bytes mine(part.size(size_t(r)) * es, 0x42);
            collectives::reduce_scatter(f.tp, in.data(), mine.data(), count, t, op, 0.0, opts("torus", chunk));
            const Bytes want_mine(want.begin() + long(part.offset(size_t(r)) * es),
                                  want.begin() + long((part.offset(size_t(r)) + part.size(size_t(r))) * es));
            EXPECT_TRUE(same_bytes(mine, want_mine, es)) << "reduce_scatter " << what;
          }
    for (const auto& counts : gatherv_patterns(p)) {
      size_t total = 0;
      for (size_t c : counts) total += c;
      Bytes want, recv(total * 2, 0x42);
      for (int q = 0; q < p; ++q) {
        const Bytes b = pattern(counts[size_t(q)] * 2, q, 77);
        want.insert(want.end(), b.begin(), b.end());
      }
      const Bytes mine = pattern(counts[size_t(r)] * 2, r, 77);
      collectives::all_gatherv(f.tp, mine.data(), recv.data(), counts, DType::bf16, 0.0, opts("torus", 6));
      EXPECT_TRUE(same_bytes(recv, want, 2)) << "all_gatherv torus " << shape;
    }
  }
}

// The torus algorithm builds each dimension's rings from chip coordinates, so any rank -> chip placement works
// (torus.h): same results and the same simulated time as the identity placement, for all_reduce, reduce_scatter
// and all_gather. Two ranks on one chip is refused, naming them.
TEST(Correctness, TorusWithPermutedPlacement) {
  const int p = world_size(), r = world_rank();
  if (p < 2) GTEST_SKIP() << "one rank is always on its own chip";
  std::vector<std::pair<std::vector<int>, std::vector<int>>> cases;  // torus dims, rank -> chip
  std::vector<int> reversed(static_cast<size_t>(p));
  for (int q = 0; q < p; ++q) reversed[size_t(q)] = p - 1 - q;
  cases.push_back({{p}, reversed});
  if (p == 8) cases.push_back({{2, 4}, {5, 2, 7, 0, 3, 6, 1, 4}});
  if (p == 4) cases.push_back({{2, 2}, {3, 0, 2, 1}});
  const size_t count = 26880;  // divisible by 2p: equal chunks
  for (const auto& [dims, chips] : cases) {
    const std::vector<LinkSpec> specs = {LinkSpec{100, 500}, LinkSpec{40, 200}};
    const std::vector<LinkSpec> used(specs.begin(), specs.begin() + static_cast<long>(dims.size()));
    const std::string what = "torus of " + std::to_string(dims.size()) + " dims, chip of rank 0 = " +
                             std::to_string(chips[0]);
    std::vector<float> in(count), want(count);
    for (size_t i = 0; i < count; ++i) {
      in[i] = float((r * 7 + int(i)) % 13);
      int sum = 0;
      for (int q = 0; q < p; ++q) sum += (q * 7 + int(i)) % 13;
      want[i] = float(sum);
    }
    double t_identity = 0;
    {
      Fixture id(Topology::torus(dims, used));
      std::vector<float> out(count);
      t_identity = collectives::all_reduce(id.tp, in.data(), out.data(), count, DType::fp32, ReduceOp::sum, 0.0,
                                           opts("torus")).span.duration();
    }
    Fixture f(Topology::torus(dims, used), chips);
    std::vector<float> out(count, -1.0f);
    const auto ar = collectives::all_reduce(f.tp, in.data(), out.data(), count, DType::fp32, ReduceOp::sum, 0.0,
                                            opts("torus"));
    EXPECT_EQ(ar.algorithm, "torus") << what;
    EXPECT_EQ(out, want) << what << ": all_reduce";
    EXPECT_NEAR(ar.span.duration(), t_identity, 1e-9 * t_identity) << what << ": all_reduce time";
    EXPECT_NEAR(collectives::estimate_ns(Collective::all_reduce, "torus", f.tp, count * 4.0), t_identity,
                1e-9 * t_identity) << what << ": estimate";
    const size_t n = count / size_t(p);
    std::vector<float> mine(n);
    collectives::reduce_scatter(f.tp, in.data(), mine.data(), count, DType::fp32, ReduceOp::sum, 0.0, opts("torus"));
    EXPECT_TRUE(std::equal(mine.begin(), mine.end(), want.begin() + static_cast<long>(n * size_t(r))))
        << what << ": reduce_scatter chunk of rank " << r;
    std::vector<float> all(count, -1.0f);
    collectives::all_gather(f.tp, mine.data(), all.data(), count, DType::fp32, 0.0, opts("torus"));
    EXPECT_EQ(all, want) << what << ": all_gather";
  }
  // Two ranks on one chip: refused, naming them.
  std::vector<int> doubled = identity_chips(p);
  doubled[1] = 0;
  Fixture g(Topology::torus({p}, {LinkSpec{100, 500}}), doubled);
  std::vector<float> a(64, 1.0f);
  expect_usage_error(
      [&] { collectives::all_reduce(g.tp, a.data(), a.data(), 64, DType::fp32, ReduceOp::sum, 0, opts("torus")); },
      {"torus", "ranks 0 and 1 are both on chip 0", "one rank on every chip"}, "torus with two ranks on a chip");
}

// double_binary_tree.h: the cost estimate replays the run's schedule (both trees, pipelined pieces, the order of
// every rank's sends and receives), so on every topology below it equals the slowest rank's simulated end time
// to rounding, one piece and pipelined, even and odd sizes; and the result is the reference sum.
TEST(DoubleBinaryTree, EstimateIsTheSimulatedTimeAndTheSumIsRight) {
  const int p = world_size(), r = world_rank();
  const std::vector<std::pair<std::string, Topology>> topos = {
      {"bidirectional ring", ring_topo(100, 700)},
      {"one-way ring", ring_topo(50, 300, false)},
      {"switch", Topology::switched(p, LinkSpec{200, 1000})},
      {"fully connected", Topology::fully_connected(p, LinkSpec{25, 0})}};
  for (const auto& [tname, topo] : topos)
    for (size_t count : {size_t{2}, size_t{26880}, size_t{262147}})
      for (size_t chunk : {size_t{0}, size_t{16384}}) {
        Fixture f(topo);
        std::vector<float> buf(count);
        for (size_t i = 0; i < count; ++i) buf[i] = float(r + 1) + float(i % 5);
        const auto res = collectives::all_reduce(f.tp, buf.data(), buf.data(), count, DType::fp32, ReduceOp::sum, 0.0,
                                                 opts("double_binary_tree", chunk));
        const auto ends = all_ends(res.span.end);
        const double slowest = *std::max_element(ends.begin(), ends.end());
        const std::string what = tname + ", count " + std::to_string(count) + ", chunk " + std::to_string(chunk);
        if (p > 1) {
          const double est = collectives::estimate_ns(Collective::all_reduce, "dbt", f.tp, count * 4.0, chunk);
          // Odd counts split into halves one element apart; the estimate takes equal halves of the bytes.
          const double tol = count % 2 ? 1e-3 * slowest : 1e-9 * slowest + 1e-6;
          EXPECT_NEAR(est, slowest, tol) << what;
          // Closed form (double_binary_tree.h) where every tree edge is its own link and each half is one piece:
          // D levels up and D down, each alpha + (S/2)/B, D = ceil(log2(p + 1)) - 1 (here alpha = 0, B = 25 GB/s).
          if (tname == "fully connected" && chunk == 0 && count == 26880) {
            const int depth = static_cast<int>(std::ceil(std::log2(p + 1.0))) - 1;
            expect_time(slowest, 2.0 * depth * (count * 4.0 / 2 / 25.0), what + " closed form");
          }
        }
        const float base = float(p * (p + 1) / 2);
        size_t bad = 0;
        for (size_t i = 0; i < count; ++i) bad += buf[i] != base + float(p) * float(i % 5);
        EXPECT_EQ(bad, 0u) << what << ": wrong sums";
      }
}

// multi_ring.h: on a fully connected group every directed ring of multi_ring::directions(p) has its own links, so
// all_reduce takes 2(p-1)(alpha + S/(k p B)) with k directed rings (4 at p = 8: twice the bidirectional ring's
// busbw), reduce_scatter and all_gather half of it; the estimate equals the run; the sums are exact. On a ring
// topology of 5+ chips the strides beyond 1 have no direct link: the obstacle names the pair.
TEST(MultiRing, ClosedFormOnAFullyConnectedGroup) {
  const int p = world_size(), r = world_rank();
  const size_t count = 26880 * 2;  // divisible by k p for every p in 1..8 and its k
  const double S = count * 4.0;
  const int k = static_cast<int>(collectives::multi_ring::directions(p).size());
  for (double bw : kBws)
    for (double alpha : kAlphas) {
      Fixture f(Topology::fully_connected(p, LinkSpec{bw, alpha}));
      const std::string what = "p " + std::to_string(p) + ", " + std::to_string(k) + " rings, bw " +
                               std::to_string(bw) + ", alpha " + std::to_string(alpha);
      std::vector<float> buf(count);
      for (size_t i = 0; i < count; ++i) buf[i] = float(r + 1) + float(i % 3);
      const auto ar = collectives::all_reduce(f.tp, buf.data(), buf.data(), count, DType::fp32, ReduceOp::sum, 0.0,
                                              opts("multi_ring"));
      const double t_half = p == 1 ? 0 : (p - 1) * (alpha + S / (k * p * bw));
      expect_time(ar.span.duration(), 2 * t_half, what + " all_reduce");
      if (p > 1)
        expect_time(collectives::estimate_ns(Collective::all_reduce, "multi_ring", f.tp, S), 2 * t_half,
                    what + " estimate_ns");
      size_t bad = 0;
      const float base = float(p * (p + 1) / 2);
      for (size_t i = 0; i < count; ++i) bad += buf[i] != base + float(p) * float(i % 3);
      EXPECT_EQ(bad, 0u) << what << ": wrong sums";
      std::vector<float> part(count / size_t(p));
      const auto rs = collectives::reduce_scatter(f.tp, buf.data(), part.data(), count, DType::fp32, ReduceOp::sum,
                                                  ar.span.end, opts("multi_ring"));
      expect_time(rs.span.duration(), t_half, what + " reduce_scatter");
      const auto ag = collectives::all_gather(f.tp, part.data(), buf.data(), count, DType::fp32, rs.span.end,
                                              opts("multi_ring"));
      expect_time(ag.span.duration(), t_half, what + " all_gather");
    }
  if (p >= 5 && k > 2) {  // p = 6 has only the strides +-1: the bidirectional ring, which a ring topology runs
    Fixture ring(ring_topo(100, 500));
    const std::string why = collectives::obstacle(Collective::all_reduce, "multi_ring", ring.tp);
    EXPECT_NE(why.find("needs a direct link"), std::string::npos) << why;
  }
}

// rail_ring.h: n nodes of g chips, chip x of every node on rail switch x (NICs of bandwidth B, zero latency) and an
// intra-node switch 64x faster. Each NIC sends one piece of S/(g p) per ring step, back to back, so all_reduce
// takes 2(p-1) S/(g p B) (its physical bound: every NIC must send that much) and the flat ring, which crosses the
// nodes on one rail each way, about g times as long; reduce_scatter / all_gather half; the estimate equals the run;
// sums exact. An odd number of nodes cannot close the rings on rails: the obstacle says so.
TEST(RailRing, EveryRailCarriesItsShareOfTheRing) {
  const int p = world_size(), r = world_rank();
  if (p < 4 || p % 2) GTEST_SKIP() << "needs an even number of ranks >= 4 (two or more nodes of two or more chips)";
  const double B = 25.0;
  for (const int g : {p / 2, 2}) {
    const int n = p / g;
    const topology::Dim rails{topology::DimKind::switch_, n, LinkSpec{B, 0.0}};
    const topology::Dim node{topology::DimKind::switch_, g, LinkSpec{64 * B, 0.0}};
    Fixture f(Topology::stacked({rails, node}));
    const std::string what = std::to_string(n) + " nodes x " + std::to_string(g);
    if (n % 2) {
      const std::string why = collectives::obstacle(Collective::all_reduce, "rail_ring", f.tp);
      EXPECT_NE(why.find("even number of nodes"), std::string::npos) << what << ": " << why;
      continue;
    }
    const size_t count = 288 * 400;  // divisible by g p for every even p <= 8 and g in {p/2, 2}
    const double S = count * 4.0;
    std::vector<float> buf(count);
    for (size_t i = 0; i < count; ++i) buf[i] = float(r + 1) + float(i % 3);
    const auto ar = collectives::all_reduce(f.tp, buf.data(), buf.data(), count, DType::fp32, ReduceOp::sum, 0.0,
                                            opts("rail_ring"));
    const double bound = 2.0 * (p - 1) * S / (g * p * B);
    expect_time(ar.span.duration(), bound, what + " all_reduce");
    EXPECT_GE(ar.span.duration(), bound * (1 - 1e-12)) << what << ": below the NICs' bound";
    const double est = collectives::estimate_ns(Collective::all_reduce, "rail_ring", f.tp, S);
    EXPECT_NEAR(est, ar.span.duration(), 1e-9 * est) << what << ": estimate";
    size_t bad = 0;
    const float base = float(p * (p + 1) / 2);
    for (size_t i = 0; i < count; ++i) bad += buf[i] != base + float(p) * float(i % 3);
    EXPECT_EQ(bad, 0u) << what << ": wrong sums";
    std::vector<float> part(count / size_t(p));
    const auto rs = collectives::reduce_scatter(f.tp, buf.data(), part.data(), count, DType::fp32, ReduceOp::sum,
                                                ar.span.end, opts("rail_ring"));
    expect_time(rs.span.duration(), bound / 2, what + " reduce_scatter");
    const auto ag = collectives::all_gather(f.tp, part.data(), buf.data(), count, DType::fp32, rs.span.end,
                                            opts("rail_ring"));
    expect_time(ag.span.duration(), bound / 2, what + " all_gather");
    // The flat ring on a fresh clock: its slowest rank against the rail rings' (both started at 0 everywhere).
    Fixture fresh(Topology::stacked({rails, node}));
    std::vector<float> flat(count, 1.0f);
    double times[2] = {ar.span.duration(), collectives::all_reduce(fresh.tp, flat.data(), flat.data(), count,
                                                                   DType::fp32, ReduceOp::sum, 0.0, opts("ring"))
                                               .span.end};
    MPI_Allreduce(MPI_IN_PLACE, times, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    EXPECT_GE(times[1], 0.95 * g * times[0]) << what << ": one rail against all of them";
  }
}

// Cross-cutting collective tests over real ranks (ctest runs them at np 1, 2, 3, 4 and 8): subgroups
// (Transport::split), bad input (UsageError on every rank before any message: unknown names, aliases, roots,
// inapplicable algorithms, shapes), determinism, and auto picking the lowest estimate. The per-collective closed
// forms and correctness cases live in <collective>_test.cpp, the registry's own checks in registry_test.cpp.
//
// Every rank runs every test; skips depend only on the world size, so all ranks skip together.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "collectives/collectives.h"
#include "collectives/registry.h"
#include "mpi/algorithm_helpers.h"
#include "mpi/collective_fixture.h"
#include "mpi/mpi_util.h"
#include "common/error.h"

using namespace algtest;  // shardsim, the collectives' names, DType, Topology, Bytes (algorithm_helpers.h)

// ================================================================================================================
// a. Closed-form simulated times
// ================================================================================================================

// ================================================================================================================
// b. Results against single-device expectations computed here
// ================================================================================================================

// ================================================================================================================
// c. Subgroups: Transport::split
// ================================================================================================================

TEST(Subgroups, EvenOddSplitRankMapAndAllReduce) {
  const int p = world_size(), r = world_rank();
  const double bw = 100, alpha = 500;
  for (const char* algorithm : {"ring", "bidir_ring", "halving_doubling", "auto"})
    for (bool reversed : {false, true}) {
      Fixture f(ring_topo(bw, alpha));
      const int color = r % 2;
      runtime::Transport sub = f.tp.split(color, reversed ? -r : r);
      std::vector<int> members;  // world ranks (= chips) of my group, in group-rank order
      for (int q = color; q < p; q += 2) members.push_back(q);
      if (reversed) std::reverse(members.begin(), members.end());
      const int n = int(members.size());
      EXPECT_EQ(sub.size(), n);
      EXPECT_EQ(sub.rank_to_chip(), members);
      const int my_index = int(std::find(members.begin(), members.end(), r) - members.begin());
      EXPECT_EQ(sub.rank(), my_index);
      EXPECT_EQ(sub.chip(), r);
      EXPECT_EQ(&sub.timeline(), &f.tl) << "a split shares the chip's timeline";

      const size_t count = 1680;  // divisible by 2n for every group size here
      std::vector<int32_t> buf(count);
      for (size_t i = 0; i < count; ++i) buf[i] = r * 1000 + int32_t(i % 13);
      const double sent_before = f.tp.bytes_sent();
      const auto res = collectives::all_reduce(sub, buf.data(), buf.data(), count, DType::int32, ReduceOp::sum, 0.0,
                                               opts(algorithm));
      int32_t members_sum = 0;
      for (int q : members) members_sum += q * 1000;
      size_t bad = 0;
      for (size_t i = 0; i < count; ++i) bad += buf[i] != members_sum + n * int32_t(i % 13);
      EXPECT_EQ(bad, 0u) << algorithm << (reversed ? " reversed" : "") << ": wrong sums in group " << color;
      EXPECT_DOUBLE_EQ(f.tp.bytes_sent() - sent_before, res.bytes_sent)
          << "the parent's byte counter includes its splits";
      // Ring all_reduce over the chips of one parity: neighbours in the group are 2 hops apart when p >= 4 is even.
      if (std::string(algorithm) == "ring" && p % 2 == 0 && p >= 4) {
        const double S = count * 4.0;
        expect_time(res.span.duration(), 2 * (n - 1) * (2 * alpha + S / (n * bw)), "ring all_reduce in subgroup");
      }
    }
}

TEST(Subgroups, ThreeWaySplitAndCachedSubgroup) {
  const int p = world_size(), r = world_rank();
  Fixture f(ring_topo(100, 500));
  runtime::Transport& a = f.tp.subgroup("thirds", r % 3, r);
  runtime::Transport& b = f.tp.subgroup("thirds", r % 3, r);
  EXPECT_EQ(&a, &b) << "subgroup() caches by name";
  std::vector<int> members;
  for (int q = r % 3; q < p; q += 3) members.push_back(q);
  EXPECT_EQ(a.rank_to_chip(), members);
  // Equal keys: ordered by rank in the parent (MPI_Comm_split).
  runtime::Transport tied = f.tp.split(r % 3, 0);
  EXPECT_EQ(tied.rank_to_chip(), members);
  // Keys decide the order before ranks do.
  runtime::Transport by_key = f.tp.split(r % 3, (r * 7) % 5);
  std::vector<int> sorted = members;
  std::stable_sort(sorted.begin(), sorted.end(), [](int x, int y) { return (x * 7) % 5 < (y * 7) % 5; });
  EXPECT_EQ(by_key.rank_to_chip(), sorted);
  for (DType t : {DType::fp16, DType::uint8})
    for (ReduceOp op : {ReduceOp::max, ReduceOp::prod}) {
      std::vector<int64_t> xs;
      for (int q : members) xs.push_back(op == ReduceOp::max ? q * 3 + 1 : (q % 2 ? 2 : 1));  // exact in both types
      Bytes buf(5 * runtime::dtype_size(t)), want = buf;
      for (size_t i = 0; i < 5; ++i) {
        put(buf, i, t, xs[size_t(a.rank())]);
        put(want, i, t, fold_exact(xs, op, int(xs.size())));
      }
      collectives::all_reduce(a, buf.data(), buf.data(), 5, t, op, 0.0, opts("halving_doubling"));
      EXPECT_TRUE(same_bytes(buf, want, runtime::dtype_size(t))) << dt(t) << " " << opname(op);
    }
  // A broadcast and a barrier inside the group, rooted at the group's last rank.
  std::vector<float> v(9, a.rank() == a.size() - 1 ? 4.5f : 0.0f);
  collectives::broadcast(a, v.data(), v.data(), v.size(), DType::fp32, 0.0, opts("auto", 0, a.size() - 1));
  EXPECT_EQ(v[8], 4.5f);
  collectives::barrier(a, 0.0);
}

// ================================================================================================================
// d. Bad input: UsageError on every rank before any message is sent (nothing hangs; the communicator stays usable)
// ================================================================================================================

namespace {

}  // namespace

TEST(BadInput, UnknownAlgorithmNamesTheKnownOnes) {
  const int p = world_size();
  Fixture f(ring_topo(100, 500));
  std::vector<float> a(size_t(p) * 4, 1.0f), b(size_t(p) * 4, 0.0f);
  std::vector<size_t> counts(size_t(p), 4), displs(static_cast<size_t>(p));
  for (size_t j = 0; j < displs.size(); ++j) displs[j] = j * 4;
  using Run = std::function<void(const CollectiveOptions&)>;
  const std::vector<std::pair<Collective, Run>> runs = {
      {Collective::all_reduce,
       [&](const CollectiveOptions& o) {
         collectives::all_reduce(f.tp, a.data(), b.data(), 4, DType::fp32, ReduceOp::sum, 0, o);
       }},
      {Collective::reduce_scatter,
       [&](const CollectiveOptions& o) {
         collectives::reduce_scatter(f.tp, a.data(), b.data(), size_t(p), DType::fp32, ReduceOp::sum, 0, o);
       }},
      {Collective::all_gather,
       [&](const CollectiveOptions& o) { collectives::all_gather(f.tp, a.data(), b.data(), size_t(p), DType::fp32, 0, o); }},
      {Collective::all_gatherv,
       [&](const CollectiveOptions& o) { collectives::all_gatherv(f.tp, a.data(), b.data(), counts, DType::fp32, 0, o); }},
      {Collective::broadcast,
       [&](const CollectiveOptions& o) { collectives::broadcast(f.tp, a.data(), b.data(), 4, DType::fp32, 0, o); }},
      {Collective::reduce,
       [&](const CollectiveOptions& o) {
         collectives::reduce(f.tp, a.data(), b.data(), 4, DType::fp32, ReduceOp::max, 0, o);
       }},
      {Collective::all_to_all,
       [&](const CollectiveOptions& o) { collectives::all_to_all(f.tp, a.data(), b.data(), size_t(p), DType::fp32, 0, o); }},
      {Collective::all_to_allv,
       [&](const CollectiveOptions& o) {
         collectives::all_to_allv(f.tp, a.data(), counts, displs, b.data(), counts, displs, DType::fp32, 0, o);
       }},
      {Collective::gather,
       [&](const CollectiveOptions& o) { collectives::gather(f.tp, a.data(), b.data(), 1, DType::fp32, 0, o); }},
      {Collective::scatter,
       [&](const CollectiveOptions& o) { collectives::scatter(f.tp, a.data(), b.data(), 1, DType::fp32, 0, o); }},
  };
  for (const auto& [c, run] : runs) {
    const std::string cname = collectives::collective_name(c);
    std::vector<std::string> needles = {cname, "'bogus_algo'", "auto"};
    for (const auto& n : collectives::algorithm_names(c)) needles.push_back(n);
    expect_usage_error([&] { run(opts("bogus_algo")); }, needles, cname + " bogus_algo");
    // A name that is an algorithm of some other collective is still unknown here.
    const std::string foreign = collectives::algorithm_names(c).front() == "direct" ? "ring" : "direct";
    expect_usage_error([&] { run(opts(foreign)); }, {cname, "'" + foreign + "'"}, cname + " " + foreign);
    expect_usage_error([&] { run(opts("dissemination")); }, {cname, "'dissemination'"}, cname + " dissemination");
    // Names are case-sensitive and not trimmed.
    expect_usage_error([&] { run(opts(" " + collectives::algorithm_names(c).front())); }, {cname},
                       cname + " leading space");
  }
  expect_clean_communicator(f.tp);
}

TEST(BadInput, AliasesResolveToCanonicalNames) {
  const int p = world_size();
  Fixture f(ring_topo(100, 500));
  std::vector<float> a(size_t(p) * 4, 1.0f);
  const std::vector<std::pair<std::string, std::string>> flat = {
      {"hd", "halving_doubling"}, {"rabenseifner", "halving_doubling"},
      {"recursive_halving_doubling", "halving_doubling"}, {"bidirectional_ring", "bidir_ring"}};
  for (const auto& [alias, canonical] : flat) {
    const auto res = collectives::all_reduce(f.tp, a.data(), a.data(), a.size(), DType::fp32, ReduceOp::max, 0,
                                             opts(alias));
    EXPECT_EQ(res.algorithm, canonical) << alias;
    EXPECT_EQ(res.explanation, "") << "forced algorithms carry no explanation";
  }
  for (const auto& [alias, canonical] : std::vector<std::pair<std::string, std::string>>{
           {"tree", "binomial_tree"}, {"binomial", "binomial_tree"}, {"chain", "ring"}}) {
    const auto res = collectives::broadcast(f.tp, a.data(), a.data(), a.size(), DType::fp32, 0, opts(alias));
    EXPECT_EQ(res.algorithm, canonical) << alias;
  }
  const auto res = collectives::all_to_all(f.tp, a.data(), a.data(), a.size(), DType::fp32, 0, opts("pairwise"));
  EXPECT_EQ(res.algorithm, "direct");
}

TEST(BadInput, RootOutsideTheGroup) {
  const int p = world_size();
  Fixture f(ring_topo(100, 500));
  std::vector<float> a(size_t(p) * 4, 1.0f), b(size_t(p) * 4, 0.0f);
  for (int root : {-1, p, p + 5}) {
    const std::vector<std::string> needles = {"root " + std::to_string(root),
                                              "outside the group of " + std::to_string(p) + " ranks"};
    for (const char* algorithm : {"auto", "binomial_tree", "ring"}) {
      expect_usage_error(
          [&] { collectives::broadcast(f.tp, a.data(), b.data(), 4, DType::fp32, 0, opts(algorithm, 0, root)); },
          needles, "broadcast root " + std::to_string(root));
      expect_usage_error(
          [&] {
            collectives::reduce(f.tp, a.data(), b.data(), 4, DType::fp32, ReduceOp::sum, 0, opts(algorithm, 0, root));
          },
          needles, "reduce root " + std::to_string(root));
    }
    expect_usage_error([&] { collectives::gather(f.tp, a.data(), b.data(), 1, DType::fp32, 0, opts("auto", 0, root)); },
                       needles, "gather root " + std::to_string(root));
    expect_usage_error(
        [&] { collectives::scatter(f.tp, a.data(), b.data(), 1, DType::fp32, 0, opts("direct", 0, root)); }, needles,
        "scatter root " + std::to_string(root));
    expect_usage_error([&] { collectives::send(f.tp, a.data(), 1, DType::fp32, root, 0); },
                       {"peer " + std::to_string(root), "outside the group"}, "send peer");
    expect_usage_error([&] { collectives::recv(f.tp, b.data(), 1, DType::fp32, root, 0); },
                       {"peer " + std::to_string(root), "outside the group"}, "recv peer");
  }
  expect_clean_communicator(f.tp);
}

TEST(BadInput, TorusOnASubgroup) {
  const int p = world_size(), r = world_rank();
  if (p < 2) GTEST_SKIP() << "with one rank every split is the whole topology";
  Fixture f(Topology::torus({p}, {LinkSpec{100, 500}}));
  runtime::Transport sub = f.tp.split(r % 2, r);
  std::vector<float> a(64, 1.0f);
  expect_usage_error(
      [&] { collectives::all_reduce(sub, a.data(), a.data(), 64, DType::fp32, ReduceOp::sum, 0, opts("torus")); },
      {"all_reduce", "torus", "sub-group", "of the topology's " + std::to_string(p) + " chips"},
      "torus all_reduce on a subgroup");
  expect_usage_error([&] { collectives::all_gather(sub, a.data(), a.data(), 8, DType::fp32, 0, opts("torus")); },
                     {"all_gather", "sub-group"}, "torus all_gather on a subgroup");
  // "auto" never picks an algorithm that cannot run; it says why torus was left out.
  const auto res = collectives::all_reduce(sub, a.data(), a.data(), 64, DType::fp32, ReduceOp::sum, 0, opts("auto"));
  EXPECT_NE(res.algorithm, "torus");
  if (sub.size() > 1) {
    EXPECT_NE(res.explanation.find("torus n/a"), std::string::npos) << res.explanation;
  }
  expect_clean_communicator(f.tp);
}

TEST(BadInput, BidirectionalRingOnAUnidirectionalRing) {
  const int p = world_size();
  if (p < 3) GTEST_SKIP() << "with 2 ranks both directions are the same neighbour (allowed)";
  Fixture f(ring_topo(100, 500, /*bidirectional=*/false));
  std::vector<float> a(64, 1.0f);
  expect_usage_error(
      [&] { collectives::all_reduce(f.tp, a.data(), a.data(), 64, DType::fp32, ReduceOp::sum, 0, opts("bidir_ring")); },
      {"bidir_ring", "same link", "unidirectional"}, "bidir_ring on a one-way ring");
  expect_clean_communicator(f.tp);
}

TEST(BadInput, ShapeErrorsBeforeAnyMessage) {
  const int p = world_size(), r = world_rank();
  Fixture f(ring_topo(100, 500));
  std::vector<float> a(size_t(p) * 8 + 8, 1.0f), b(a.size(), 0.0f);
  if (p >= 2)
    expect_usage_error([&] { collectives::all_to_all(f.tp, a.data(), b.data(), size_t(p) + 1, DType::fp32, 0); },
                       {"all_to_all", "not a multiple"}, "all_to_all count");
  expect_usage_error(
      [&] { collectives::all_gatherv(f.tp, a.data(), b.data(), std::vector<size_t>(size_t(p) + 1, 1), DType::fp32, 0); },
      {"all_gatherv", std::to_string(p + 1) + " counts"}, "all_gatherv counts length");
  const std::vector<size_t> ok(size_t(p), 1), short_v(size_t(p) + 2, 1);
  std::vector<size_t> displs(static_cast<size_t>(p));
  std::iota(displs.begin(), displs.end(), 0);
  expect_usage_error(
      [&] { collectives::all_to_allv(f.tp, a.data(), short_v, displs, b.data(), ok, displs, DType::fp32, 0); },
      {"all_to_allv"}, "all_to_allv sendcounts length");
  // Every rank mismatches its own block (1 sent to itself, 2 expected): caught before any exchange.
  std::vector<size_t> sc(size_t(p), 0), rc(size_t(p), 0);
  sc[size_t(r)] = 1;
  rc[size_t(r)] = 2;
  expect_usage_error([&] { collectives::all_to_allv(f.tp, a.data(), sc, displs, b.data(), rc, displs, DType::fp32, 0); },
                     {"all_to_allv", "chip " + std::to_string(r)}, "all_to_allv self mismatch");
  expect_clean_communicator(f.tp);
}

// ================================================================================================================
// e. Determinism
// ================================================================================================================

namespace {
struct Recorded {
  std::vector<double> times;
  std::vector<std::string> names;
};

Recorded run_once(bool perturb_host_timing) {
  const int p = world_size(), r = world_rank();
  Fixture f(ring_topo(50, 700));
  Recorded out;
  const size_t count = 4099;  // not a multiple of p: uneven chunks
  std::vector<float> buf(count);
  for (size_t i = 0; i < count; ++i) buf[i] = float((i * 7 + size_t(r)) % 11);
  double t = 37.5 * r;  // ranks start at different simulated times
  for (const char* algorithm : {"ring", "bidir_ring", "torus", "halving_doubling", "auto"})
    for (size_t chunk : {size_t(0), size_t(1000)}) {
      if (perturb_host_timing && r == p - 1) std::this_thread::sleep_for(std::chrono::milliseconds(2));
      const auto res = collectives::all_reduce(f.tp, buf.data(), buf.data(), count, DType::fp32, ReduceOp::max, t,
                                               opts(algorithm, chunk));
      out.times.push_back(res.span.start);
      out.times.push_back(res.span.end);
      out.times.push_back(res.bytes_sent);
      out.names.push_back(res.algorithm + "|" + res.explanation);
      t = res.span.end;
    }
  const auto b = collectives::broadcast(f.tp, buf.data(), buf.data(), count, DType::fp32, t, opts("auto", 512, p - 1));
  out.times.push_back(b.span.end);
  out.names.push_back(b.algorithm);
  for (const auto& e : f.tl.events()) {
    out.times.push_back(e.span.start);
    out.times.push_back(e.span.end);
    out.times.push_back(e.bytes);
    out.names.push_back(e.name + "|" + e.category + "|" + std::to_string(e.engine) + "|" + std::to_string(e.peer));
  }
  return out;
}
}  // namespace

// The same sequence of collectives on fresh timelines gives bit-identical simulated times and events, even when
// one rank is delayed on the host.
TEST(Determinism, BitIdenticalAcrossRunsAndHostDelays) {
  const Recorded a = run_once(false), b = run_once(true);
  ASSERT_EQ(a.times.size(), b.times.size());
  size_t differ = 0;
  for (size_t i = 0; i < a.times.size(); ++i) differ += std::memcmp(&a.times[i], &b.times[i], sizeof(double)) != 0;
  EXPECT_EQ(differ, 0u) << "simulated times differ between identical runs";
  EXPECT_EQ(a.names, b.names);
}

// "auto" picks the algorithm with the lowest estimate among those that can run (ties: earlier in the list) and
// the explanation lists every candidate.
TEST(Determinism, AutoPicksTheLowestEstimate) {
  const int p = world_size();
  Fixture f(ring_topo(100, 2000));
  for (double bytes : {64.0, 65536.0, 16777216.0}) {
    const auto choice = collectives::choose(Collective::all_reduce, opts("auto"), f.tp, bytes);
    std::string best;
    double best_ns = 0;
    for (const auto& a : collectives::algorithm_names(Collective::all_reduce)) {
      EXPECT_NE(choice.explanation.find(a), std::string::npos) << choice.explanation;
      if (!collectives::obstacle(Collective::all_reduce, a, f.tp).empty()) continue;
      if (!collectives::find_algorithm(a)->in_auto(Collective::all_reduce)) continue;  // opt-in only: listed, never chosen
      const double t = collectives::estimate_ns(Collective::all_reduce, a, f.tp, bytes);
      if (best.empty() || t < best_ns) {
        best = a;
        best_ns = t;
      }
    }
    EXPECT_EQ(choice.algorithm, best) << "bytes " << bytes << " p " << p << ": " << choice.explanation;
    EXPECT_NE(choice.explanation.find(best + " "), std::string::npos);
    EXPECT_NE(choice.explanation.find("(chosen)"), std::string::npos);
  }
}

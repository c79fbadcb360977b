// Node-limited routing (kernels/moe.h RouterOptions::groups / group_limit, DeepSeek-V3 §2.1.2), the node fan-out
// of a routing against its closed form, and expert placement by load (sharding/plans/expert_parallel.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <set>

#include "kernels/moe.h"
#include "sharding/plans/expert_parallel.h"

using namespace shardsim;
using namespace shardsim::kernels;
using runtime::DType;
using runtime::Tensor;

namespace {

Tensor iid_logits(int64_t T, int64_t E, uint32_t seed) {
  Tensor l(DType::fp32, {T, E});
  std::mt19937 gen(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  for (int64_t i = 0; i < l.numel(); ++i) l.set(i, n(gen));
  return l;
}

}  // namespace

// One token, 8 experts in 4 groups of 2, top-2 among the best 2 groups by the sum of each group's top 1 (V2's
// device-limited form) or top 2 (V3's K_r / M with k 4, M 2).
TEST(MoeNodeLimited, ChoosesAmongTheBestGroupsOnly) {
  RouterOptions o;
  o.experts = 8;
  o.top_k = 2;
  o.score = RouterScore::sigmoid;
  o.groups = 4;
  o.group_limit = 2;
  // logits: group 0 {3, -5}, group 1 {2.5, 2.4}, group 2 {2.6, -5}, group 3 {0, 0}
  const Tensor l = Tensor::from_float({3, -5, 2.5f, 2.4f, 2.6f, -5, 0, 0}, DType::fp32, {1, 8});
  Routing r;
  o.group_top = 1;  // groups by their best: 0 (3) and 2 (2.6); top-2 there: experts 0 and 4
  route(l, o, r);
  EXPECT_EQ(r.expert, (std::vector<int32_t>{0, 4}));
  o.group_top = 2;  // by the sum of the best two: group 1 (2.5 + 2.4) and group 3 (0 + 0) beat 0 and 2's -5
  route(l, o, r);
  EXPECT_EQ(r.expert, (std::vector<int32_t>{2, 3}));
  o.group_limit = 0;  // off: the global top-2
  route(l, o, r);
  EXPECT_EQ(r.expert, (std::vector<int32_t>{0, 4}));
  o.group_limit = 1;
  o.top_k = 3;  // 3 experts from one group of 2: refused
  EXPECT_THROW(route(l, o, r), std::invalid_argument);
  o.groups = 3;  // 8 experts do not split into 3 groups
  EXPECT_THROW(route(l, o, r), std::invalid_argument);
}

// DeepSeek-V3's router shape scaled down: 64 experts in 8 node groups, top-8, M = 4. Every token's experts lie in
// at most 4 groups; with iid scores the distinct remote nodes per token match the closed forms (unlimited: the
// hypergeometric expectation; limited: M (n-1)/n, an upper bound reached almost always), and a per-assignment
// dispatch sends the same remote rows either way ((n-1)/n of T·k).
TEST(MoeNodeLimited, NodeFanoutAgainstTheClosedForm) {
  const int64_t T = 4000, E = 64, k = 8, n = 8, M = 4;
  const Tensor l = iid_logits(T, E, 7);
  RouterOptions o;
  o.experts = E;
  o.top_k = k;
  o.score = RouterScore::sigmoid;
  o.groups = n;
  Routing free, limited;
  route(l, o, free);
  apply_capacity(free, {});
  o.group_limit = M;
  route(l, o, limited);
  apply_capacity(limited, {});
  for (int64_t t = 0; t < T; ++t) {
    std::set<int64_t> nodes;
    for (int64_t j = 0; j < k; ++j) nodes.insert(limited.expert[size_t(t * k + j)] / (E / n));
    ASSERT_LE(int64_t(nodes.size()), M) << "token " << t;
  }
  const NodeFanout f0 = node_fanout(free, n, 0), f1 = node_fanout(limited, n, 0);
  const double d0 = double(f0.remote_tokens) / T, d1 = double(f1.remote_tokens) / T;
  const double c0 = expected_remote_nodes(E, k, n, 0), c1 = expected_remote_nodes(E, k, n, M);
  EXPECT_NEAR(d0, c0, 0.02 * c0) << "unlimited: measured " << d0 << " closed form " << c0;
  EXPECT_LE(d1, c1 + 1e-12);
  EXPECT_GT(d1, 0.97 * c1) << "limited: measured " << d1 << " bound " << c1;
  EXPECT_LT(c1, c0);
  std::printf("[moe_routing] remote nodes per token (E %lld, k %lld, %lld nodes): unlimited %.4f (closed form %.4f), "
              "M = %lld %.4f (bound %.4f); remote rows per token %.4f and %.4f ((n-1)/n k = %.4f)\n",
              (long long)E, (long long)k, (long long)n, d0, c0, (long long)M, d1, c1, double(f0.remote_rows) / T,
              double(f1.remote_rows) / T, double(k) * (n - 1) / n);
  const double rows = double(T * k) * (n - 1) / n;
  EXPECT_NEAR(double(f0.remote_rows), rows, 0.02 * rows);
  EXPECT_NEAR(double(f1.remote_rows), rows, 0.02 * rows);
  // DeepSeek-V3's own shape: 256 experts, 8 nodes, top-8, M = 4.
  EXPECT_NEAR(expected_remote_nodes(256, 8, 8, 0), 4.6328, 1e-3);
  EXPECT_DOUBLE_EQ(expected_remote_nodes(256, 8, 8, 4), 3.5);
}

TEST(MoePlacement, ByLoadEvensTheRanksAndIsAPermutation) {
  // Skewed loads of 8 experts over 4 ranks of 2 slots: contiguous placement's busiest rank holds 8 + 4 = 12.
  const std::vector<double> load = {8, 4, 2, 1, 1, 1, 3, 1};
  const std::vector<int64_t> p = sharding::plans::placement_by_load(load, 4);
  std::vector<int64_t> sorted = p;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> ids(8);
  std::iota(ids.begin(), ids.end(), 0);
  EXPECT_EQ(sorted, ids);
  double worst = 0;
  for (int r = 0; r < 4; ++r) worst = std::max(worst, load[size_t(p[size_t(2 * r)])] + load[size_t(p[size_t(2 * r + 1)])]);
  EXPECT_DOUBLE_EQ(worst, 9.0);  // expert 0 (8) pairs with a 1; the mean is 21 / 4
  EXPECT_EQ(p, (std::vector<int64_t>{0, 7, 1, 5, 4, 6, 2, 3}));
  EXPECT_THROW(sharding::plans::placement_by_load(load, 3), std::invalid_argument);
}

TEST(MoePlacement, SuccessiveLayersPutTheirHottestExpertOnDifferentRanks) {
  // One expert per rank: a layer's placement cannot even its loads, so the tie-break decides where the hottest expert
  // (and the activations its rows keep for the backward) lands; layer l starts at rank l mod ep.
  const int ep = 4;
  std::vector<int> hottest_rank;
  for (int64_t layer = 0; layer < 8; ++layer) {
    kernels::Routing r;
    r.counts = {1, 9, 2, 3};  // expert 1 is the hottest in every layer
    const std::vector<int64_t> p = sharding::plans::placement_by_layer_load({r}, ep, layer);
    const auto at = std::find(p.begin(), p.end(), int64_t(1));
    ASSERT_NE(at, p.end());
    hottest_rank.push_back(int(at - p.begin()));  // one slot per rank
  }
  EXPECT_EQ(hottest_rank, (std::vector<int>{0, 1, 2, 3, 0, 1, 2, 3}));
  // With several slots per rank the rotation only moves ties: the packing's worst rank is the same.
  const std::vector<double> load = {8, 4, 2, 1, 1, 1, 3, 1};
  for (int first = 0; first < 4; ++first) {
    const std::vector<int64_t> p = sharding::plans::placement_by_load(load, 4, first);
    double worst = 0;
    for (int r = 0; r < 4; ++r)
      worst = std::max(worst, load[size_t(p[size_t(2 * r)])] + load[size_t(p[size_t(2 * r + 1)])]);
    EXPECT_DOUBLE_EQ(worst, 9.0) << "first rank " << first;
  }
  EXPECT_THROW(sharding::plans::placement_by_load(load, 4, 4), std::invalid_argument);
}

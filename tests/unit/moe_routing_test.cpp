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

// The router's logits are one fixed-order dot product per (token, expert): a token's logits have the same bits
// whatever rows share the call (a BLAS GEMM's need not: OpenBLAS's FMA kernels round a row by the row count), so a
// sharded run's top-k and capacity decisions see its reference's values. Against fp64: within fp32 rounding.
TEST(MoeRouterLogits, EveryTokenTheSameBitsAtAnyRowCount) {
  const int64_t T = 37, h = 48, E = 16;
  std::mt19937 gen(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> xv(size_t(T * h)), wv(size_t(h * E));
  for (auto& v : xv) v = nd(gen);
  for (auto& v : wv) v = nd(gen) * 0.2f;
  const Tensor x = Tensor::from_float(xv, DType::fp32, {T, h}), w = Tensor::from_float(wv, DType::fp32, {h, E});
  Tensor all(DType::fp32, {T, E});
  const KernelCost cost = router_logits(x, w, all);
  EXPECT_EQ(cost.name, "gemm");
  EXPECT_DOUBLE_EQ(cost.flops, 2.0 * T * h * E);
  for (const int64_t rows : {int64_t{1}, int64_t{5}, int64_t{13}}) {
    for (int64_t t0 = 0; t0 + rows <= T; t0 += rows) {
      const std::vector<float> part(xv.begin() + t0 * h, xv.begin() + (t0 + rows) * h);
      Tensor l(DType::fp32, {rows, E});
      router_logits(Tensor::from_float(part, DType::fp32, {rows, h}), w, l);
      for (int64_t i = 0; i < rows * E; ++i)
        ASSERT_EQ(l.get(i), all.get(t0 * E + i)) << rows << " rows from token " << t0 << ", entry " << i;
    }
  }
  for (int64_t t = 0; t < T; ++t)
    for (int64_t e = 0; e < E; ++e) {
      double ref = 0;
      for (int64_t i = 0; i < h; ++i) ref += double(xv[size_t(t * h + i)]) * double(wv[size_t(i * E + e)]);
      EXPECT_EQ(all.get(t * E + e), float(ref));
    }
  // Shape-only: the cost alone.
  Tensor xs = Tensor::make(DType::bf16, {T, h}, false), ws = Tensor::make(DType::bf16, {h, E}, false),
         ls = Tensor::make(DType::bf16, {T, E}, false);
  EXPECT_DOUBLE_EQ(router_logits(xs, ws, ls).flops, 2.0 * T * h * E);
  Tensor bad(DType::fp32, {T, E + 1});
  EXPECT_THROW(router_logits(x, w, bad), std::invalid_argument);
}

// Declared node-limited routing: the tokens reaching each expert group. Uniform counts: T·M/G per group (remote
// nodes per token M·(G−1)/G = expected_remote_nodes' bound); Zipf: each group within its bounds, the reaches summing
// to T·M; and against a real router on iid scores routing the same shape (its per-group reaches, node_fanout).
TEST(MoeNodeLimited, DeclaredNodeTokensAgainstTheClosedFormAndARealRouter) {
  const int64_t T = 4096, E = 256, k = 8, G = 8, M = 4;
  RouterOptions o;
  o.experts = E;
  o.top_k = k;
  o.score = RouterScore::sigmoid;
  o.groups = G;
  o.group_limit = M;
  const std::vector<int64_t> uniform(size_t(E), T * k / E);
  const std::vector<int64_t> d = declared_node_tokens(o, uniform, T);
  ASSERT_EQ(int64_t(d.size()), G);
  for (int64_t g = 0; g < G; ++g) EXPECT_EQ(d[size_t(g)], T * M / G);
  double remote = 0;  // the chip of group 0
  for (int64_t g = 1; g < G; ++g) remote += double(d[size_t(g)]) / T;
  EXPECT_DOUBLE_EQ(remote, expected_remote_nodes(E, k, G, M));
  // Skewed: group 0's experts take half the assignments; every token reaches it at most once.
  std::vector<int64_t> zipf(static_cast<size_t>(E));
  int64_t left = T * k;
  for (int64_t e = 0; e < E; ++e) zipf[size_t(e)] = e < 32 ? T / 8 : 0, left -= zipf[size_t(e)];
  for (int64_t e = 32; left > 0; e = 32 + (e - 31) % (E - 32)) ++zipf[size_t(e)], --left;
  const std::vector<int64_t> z = declared_node_tokens(o, zipf, T);
  EXPECT_EQ(std::accumulate(z.begin(), z.end(), int64_t{0}), T * M);
  EXPECT_EQ(z[0], T);  // 4 assignments per token's worth: every token reaches the hot group
  for (int64_t g = 0; g < G; ++g) {
    int64_t q = 0;
    for (int64_t e = g * (E / G); e < (g + 1) * (E / G); ++e) q += zipf[size_t(e)];
    EXPECT_LE(z[size_t(g)], std::min(T, q));
    EXPECT_GE(z[size_t(g)], (q + k - 1) / k);
  }
  // A real router routing T iid tokens: its kept counts declared again give per-group reaches close to its own.
  const Tensor l = iid_logits(T, E, 11);
  Routing r;
  route(l, o, r);
  apply_capacity(r, {});
  const std::vector<int64_t> dr = declared_node_tokens(o, r.counts, T);
  for (int64_t g = 0; g < G; ++g) {
    int64_t real = 0;  // tokens with an expert in group g
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < k; ++j)
        if (r.expert[size_t(t * k + j)] / (E / G) == g) {
          ++real;
          break;
        }
    EXPECT_NEAR(double(dr[size_t(g)]), double(real), 0.05 * double(real)) << "group " << g;
  }
  std::printf("[moe_routing] declared node reaches (T %lld, E %lld, k %lld, M %lld of %lld): uniform %lld per group, "
              "remote nodes per token %.4f (bound %.4f)\n", (long long)T, (long long)E, (long long)k, (long long)M,
              (long long)G, (long long)d[0], remote, expected_remote_nodes(E, k, G, M));
  o.group_limit = 0;
  EXPECT_THROW(declared_node_tokens(o, uniform, T), std::invalid_argument);
}

// Uniform declared routing routes every layer of a rank alike (the extras of an uneven split rotate by rank only), so
// a stage's blocks run alike; Zipf draws each layer's hot experts.
TEST(MoeDeclared, UniformRoutesEveryLayerAlikeZipfDoesNot) {
  kernels::MoeSpec s;
  s.hidden = 8;
  s.router.experts = 8;
  s.router.top_k = 2;
  s.expert_ffn.assign(8, 4);
  const std::vector<int64_t> tokens = {5, 7, 3, 5};  // uneven splits: 10, 14, 6 assignments over 8 experts
  const auto u0 = sharding::plans::declared_ep_routing(s, tokens, {0, 1}, 1);
  const auto u1 = sharding::plans::declared_ep_routing(s, tokens, {0, 1}, 2);
  bool ranks_differ = false;
  for (size_t r = 0; r < tokens.size(); ++r) {
    EXPECT_EQ(u0[r].counts, u1[r].counts) << "rank " << r;
    ranks_differ = ranks_differ || (r > 0 && u0[r].counts != u0[0].counts && tokens[r] == tokens[0]);
  }
  EXPECT_TRUE(ranks_differ) << "ranks 0 and 3 route 5 tokens each: their extras should rotate apart";
  const auto z0 = sharding::plans::declared_ep_routing(s, tokens, {1.2, 1}, 1);
  const auto z1 = sharding::plans::declared_ep_routing(s, tokens, {1.2, 1}, 2);
  bool layers_differ = false;
  for (size_t r = 0; r < tokens.size(); ++r) layers_differ = layers_differ || z0[r].counts != z1[r].counts;
  EXPECT_TRUE(layers_differ);
}

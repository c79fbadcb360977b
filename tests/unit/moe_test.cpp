// The MoE kernels (kernels/moe.h) and the single-device MoE MLP (kernels/moe_mlp.h): the router's choices, capacity
// and dropping, the aux loss's closed forms, the forward against an independent fp64 implementation, every
// gradient against central finite differences of that implementation, special values, the grouped GEMM's
// per-expert cost, shape-only costs equal to real ones, and the declared routing distributions.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <numeric>

#include "grad_check.h"
#include "kernels/moe_mlp.h"
#include "sim/device_spec.h"

using namespace shardsim;
using namespace shardsim::kernels;
using runtime::DType;
using runtime::Tensor;
using shardsim::testing::Vec;

namespace {

Tensor from(const std::vector<float>& v, runtime::Shape shape) { return Tensor::from_float(v, DType::fp32, shape); }

// ---- An independent fp64 MoE MLP: inputs {x, router, then per expert (gate?, up, down), then shared} ----
struct Ref {
  const MoeSpec& s;
  int64_t T;
  double aux_grad = 0;  // adds aux_grad · Σ_g aux_g to the output's cotangent dot through the last entry
  static double act(double v, Activation a) {
    return a == Activation::silu ? v / (1 + std::exp(-v)) : 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)));
  }
  // out_row += w · mlp(x_row) for weights {gate?, up, down} starting at P.
  void mlp(const double* x, const std::vector<Vec>& in, size_t p, int64_t f, double w, double* out) const {
    const int64_t h = s.hidden;
    std::vector<double> a(static_cast<size_t>(f));
    for (int64_t j = 0; j < f; ++j) {
      double g = 0, u = 0;
      for (int64_t i = 0; i < h; ++i) {
        if (s.gated) g += x[i] * in[p][size_t(i * f + j)];
        u += x[i] * in[p + (s.gated ? 1 : 0)][size_t(i * f + j)];
      }
      a[size_t(j)] = s.gated ? act(g, s.activation) * u : act(u, Activation::gelu);
    }
    const Vec& down = in[p + (s.gated ? 2 : 1)];
    for (int64_t i = 0; i < h; ++i) {
      double y = 0;
      for (int64_t j = 0; j < f; ++j) y += a[size_t(j)] * down[size_t(j * h + i)];
      out[i] += w * y;
    }
  }
  // Y [T·h] followed by one entry Σ_g aux_g.
  Vec operator()(const std::vector<Vec>& in) const {
    const int64_t h = s.hidden, E = s.experts(), k = s.router.top_k, G = s.capacity.groups, Tg = T / G;
    const size_t per = s.gated ? 3 : 2;
    Vec y(size_t(T * h + 1), 0.0);
    std::vector<std::vector<int64_t>> pick(static_cast<size_t>(T));
    std::vector<std::vector<double>> wts(static_cast<size_t>(T)), sc(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) {
      std::vector<double> l(static_cast<size_t>(E)), s2(static_cast<size_t>(E));
      for (int64_t e = 0; e < E; ++e)
        for (int64_t i = 0; i < h; ++i) l[size_t(e)] += in[0][size_t(t * h + i)] * in[1][size_t(i * E + e)];
      double m = *std::max_element(l.begin(), l.end()), z = 0;
      for (int64_t e = 0; e < E; ++e) z += std::exp(l[size_t(e)] - m);
      for (int64_t e = 0; e < E; ++e)
        s2[size_t(e)] = s.router.score == RouterScore::softmax ? std::exp(l[size_t(e)] - m) / z
                                                               : 1 / (1 + std::exp(-l[size_t(e)]));
      std::vector<int64_t> order(static_cast<size_t>(E));
      std::iota(order.begin(), order.end(), 0);
      auto key = [&](int64_t e) { return s2[size_t(e)] + (s.router.bias.empty() ? 0.0 : s.router.bias[size_t(e)]); };
      std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return key(a) > key(b); });
      double U = 0;
      for (int64_t j = 0; j < k; ++j) U += s2[size_t(order[size_t(j)])];
      for (int64_t j = 0; j < k; ++j) {
        pick[size_t(t)].push_back(order[size_t(j)]);
        const double u = s2[size_t(order[size_t(j)])];
        wts[size_t(t)].push_back(s.router.scale * (s.router.normalize ? u / U : u));
      }
      sc[size_t(t)] = s2;
    }
    for (int64_t g = 0; g < G; ++g) {  // capacity (position policy) and the aux loss of each group
      const int64_t C = s.capacity.capacity(Tg, k, E);
      std::vector<int64_t> used(static_cast<size_t>(E)), chosen(static_cast<size_t>(E));
      std::vector<double> P(static_cast<size_t>(E));
      for (int64_t t = g * Tg; t < (g + 1) * Tg; ++t) {
        double S = 0;
        for (int64_t e = 0; e < E; ++e) S += sc[size_t(t)][size_t(e)];
        for (int64_t e = 0; e < E; ++e)
          P[size_t(e)] += sc[size_t(t)][size_t(e)] / (s.router.score == RouterScore::softmax ? 1.0 : S);
        for (int64_t j = 0; j < k; ++j) {
          const int64_t e = pick[size_t(t)][size_t(j)];
          ++chosen[size_t(e)];
          if (used[size_t(e)]++ >= C) continue;  // dropped
          mlp(&in[0][size_t(t * h)], in, 2 + per * size_t(e), s.expert_ffn[size_t(e)], wts[size_t(t)][size_t(j)],
              &y[size_t(t * h)]);
        }
      }
      double sum = 0;
      for (int64_t e = 0; e < E; ++e) sum += double(chosen[size_t(e)]) / double(Tg * k) * P[size_t(e)] / double(Tg);
      y.back() += s.aux_coef * double(E) * sum;
    }
    if (s.shared_ffn > 0)
      for (int64_t t = 0; t < T; ++t) mlp(&in[0][size_t(t * h)], in, 2 + per * size_t(E), s.shared_ffn, 1.0, &y[size_t(t * h)]);
    return y;
  }
};

std::vector<Vec> flatten(const Tensor& x, const MoeWeights& w) {
  std::vector<Vec> v{shardsim::testing::widen(x), shardsim::testing::widen(w.router)};
  auto add = [&](const ExpertWeights& e) {
    if (e.w_gate.numel()) v.push_back(shardsim::testing::widen(e.w_gate));
    v.push_back(shardsim::testing::widen(e.w_up));
    v.push_back(shardsim::testing::widen(e.w_down));
  };
  for (const auto& e : w.experts) add(e);
  if (w.shared.w_up.numel()) add(w.shared);
  return v;
}

MoeSpec spec(RouterScore score, bool gated, Activation act, double cf, int64_t groups, int64_t shared) {
  MoeSpec s;
  s.hidden = 5;
  s.router.experts = 4;
  s.router.top_k = 2;
  s.router.score = score;
  s.expert_ffn = {3, 6, 2, 4};
  s.shared_ffn = shared;
  s.gated = gated;
  s.activation = act;
  s.capacity.factor = cf;
  s.capacity.groups = groups;
  s.aux_coef = 0.05;
  return s;
}

double max_rel(const Vec& got, const Vec& want) {
  double e = 0, m = 1e-3;
  for (size_t i = 0; i < got.size(); ++i) {
    e = std::max(e, std::fabs(got[i] - want[i]));
    m = std::max(m, std::fabs(want[i]));
  }
  return e / m;
}

struct Case {
  const char* name;
  RouterScore score;
  bool gated;
  Activation act;
  double cf;
  int64_t groups, shared;
  bool normalize = true;
  double scale = 1.0;
  bool bias = false;
};

class MoeGrad : public ::testing::TestWithParam<Case> {};

// Forward equals the fp64 implementation; every gradient equals central differences of it.
TEST_P(MoeGrad, ForwardAndBackwardMatchFp64FiniteDifferences) {
  const Case c = GetParam();
  MoeSpec s = spec(c.score, c.gated, c.act, c.cf, c.groups, c.shared);
  s.router.normalize = c.normalize;
  s.router.scale = c.scale;
  if (c.bias) s.router.bias = {0.3f, -0.2f, 0.0f, 0.1f};
  const int64_t T = 8;
  const MoeWeights w = make_moe_weights(s, 11, 0, s.experts());
  const Tensor x = shardsim::testing::random_tensor({T, s.hidden}, 5, -2.0f, 2.0f);
  MoeActivations keep;
  int charges = 0;
  const MoeCharge charge{[&](const KernelCost&) { ++charges; }};
  const Tensor y = moe_forward(s, w, x, keep, charge);
  const Ref ref{s, T};
  const std::vector<Vec> in = flatten(x, w);
  const Vec want = ref(in);
  Vec got = shardsim::testing::widen(y);
  got.push_back(keep.aux * double(s.capacity.groups));  // Σ_g aux_g
  EXPECT_LT(max_rel(got, want), 1e-5) << c.name;
  EXPECT_GT(charges, 5);
  if (c.cf > 0) EXPECT_GT(keep.routing.dropped, 0) << c.name << ": the case should drop";

  // L = Σ G·y + a·Σ_g aux_g.
  const Tensor dy = shardsim::testing::random_tensor({T, s.hidden}, 9);
  Vec cot = shardsim::testing::widen(dy);
  const double a = 0.7;
  cot.push_back(a);
  MoeWeights grads = zero_like(w);
  const Tensor dx = moe_backward(s, w, x, keep, dy, a, grads, charge);
  const auto fd = shardsim::testing::fd_gradients(ref, in, cot);
  const std::vector<Vec> mine = flatten(dx, grads);
  ASSERT_EQ(mine.size(), fd.size());
  for (size_t i = 0; i < fd.size(); ++i) EXPECT_LT(max_rel(mine[i], fd[i]), 2e-4) << c.name << " input " << i;
}

INSTANTIATE_TEST_SUITE_P(
    Variants, MoeGrad,
    ::testing::Values(Case{"softmax_swiglu_dropless", RouterScore::softmax, true, Activation::silu, 0, 1, 0},
                      Case{"softmax_swiglu_shared_capacity", RouterScore::softmax, true, Activation::silu, 0.5, 2, 3},
                      Case{"sigmoid_bias_scaled", RouterScore::sigmoid, true, Activation::silu, 0, 2, 2, true, 2.5, true},
                      Case{"softmax_unnormalised_geglu", RouterScore::softmax, true, Activation::gelu, 0, 1, 0, false},
                      Case{"sigmoid_gelu_capacity", RouterScore::sigmoid, false, Activation::gelu, 0.75, 1, 0, false}),
    [](const ::testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

TEST(MoeRouter, SoftmaxTopKNormalisedAndBiasOnlyChooses) {
  RouterOptions o;
  o.experts = 4;
  o.top_k = 2;
  const Tensor logits = from({1.0f, 3.0f, 2.0f, 0.0f}, {1, 4});
  Routing r;
  route(logits, o, r);
  EXPECT_EQ(r.expert, (std::vector<int32_t>{1, 2}));
  const double e1 = std::exp(3.0), e2 = std::exp(2.0);
  EXPECT_NEAR(r.weight[0], e1 / (e1 + e2), 1e-6);
  EXPECT_NEAR(r.weight[0] + r.weight[1], 1.0, 1e-6);
  // A bias moves the choice but not the weight: expert 3 chosen with its own score.
  o.bias = {0, 0, 0, 10};
  o.normalize = false;
  route(logits, o, r);
  EXPECT_EQ(r.expert, (std::vector<int32_t>{3, 1}));
  EXPECT_NEAR(r.weight[0], r.scores[3], 1e-7);
  // Ties go to the lower expert id.
  route(from({0, 0, 0, 0}, {1, 4}), RouterOptions{4, 3}, r);
  EXPECT_EQ(r.expert, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_THROW(route(logits, RouterOptions{4, 5}, r), std::invalid_argument);
  EXPECT_THROW(route(from({0, 0, 0}, {1, 3}), RouterOptions{4, 1}, r), std::invalid_argument);
}

TEST(MoeCapacity, PositionAndProbsPoliciesDropOverCapacity) {
  // 4 tokens all to expert 0 (top-1), capacity factor 1 over 2 experts: C = ceil(1·4·1/2) = 2.
  RouterOptions o{2, 1};
  const Tensor logits = from({3, 0, 1, 0, 5, 0, 2, 0}, {4, 2});
  for (DropPolicy p : {DropPolicy::position, DropPolicy::probs}) {
    Routing r;
    route(logits, o, r);
    apply_capacity(r, {1.0, p, 1});
    EXPECT_EQ(r.counts, (std::vector<int64_t>{2, 0}));
    EXPECT_EQ(r.chosen, (std::vector<int64_t>{4, 0}));
    EXPECT_EQ(r.dropped, 2);
    // Position keeps the first two; probs sees four equal weights (top-1, normalised: 1 each) and keeps the earliest.
    EXPECT_EQ(r.kept, (std::vector<uint8_t>{1, 1, 0, 0}));
    for (size_t i = 0; i < 4; ++i)
      if (!r.kept[i]) EXPECT_EQ(r.weight[i], 0.0f);
  }
  // probs with unnormalised weights keeps the two most probable tokens (1 and 0: logits 5 and 3).
  o.normalize = false;
  Routing r;
  route(logits, o, r);
  apply_capacity(r, {1.0, DropPolicy::probs, 1});
  EXPECT_EQ(r.kept, (std::vector<uint8_t>{1, 0, 1, 0}));
  // Two groups: capacity per group C = ceil(2·1/2) = 1: one token of each group kept.
  route(logits, o, r);
  apply_capacity(r, {1.0, DropPolicy::position, 2});
  EXPECT_EQ(r.kept, (std::vector<uint8_t>{1, 0, 1, 0}));
  EXPECT_EQ(r.chosen, (std::vector<int64_t>{2, 0, 2, 0}));
  EXPECT_THROW(apply_capacity(r, {1.0, DropPolicy::position, 3}), std::invalid_argument);
}

TEST(MoeCapacity, PiecesOfASplitGroupDropLikeEachChipOverItsOwnRows) {
  // 8 tokens all to expert 0 (top-1, 2 experts), one group cut into 2 pieces as a zigzag cp 2 holds them: chip 0
  // tokens {0, 1, 6, 7}, chip 1 {2, 3, 4, 5}. C = ceil(1·4·1/2) = 2 per piece: each chip keeps its first two.
  const RouterOptions o{2, 1};
  const Tensor logits = from({3, 0, 1, 0, 5, 0, 2, 0, 4, 0, 6, 0, 7, 0, 8, 0}, {8, 2});
  CapacityOptions c{1.0, DropPolicy::position, 1, 2, {0, 1, 6, 7, 2, 3, 4, 5}};
  Routing r;
  route(logits, o, r);
  apply_capacity(r, c);
  EXPECT_EQ(r.kept, (std::vector<uint8_t>{1, 1, 1, 1, 0, 0, 0, 0}));
  EXPECT_EQ(r.chosen, (std::vector<int64_t>{8, 0}));  // the aux loss's counts: the whole group, before dropping
  EXPECT_EQ(r.dropped, 4);
  // The same as routing each chip's rows apart (probs: the highest weights of each piece; unnormalised top-1).
  RouterOptions u = o;
  u.normalize = false;
  c.policy = DropPolicy::probs;
  route(logits, u, r);
  apply_capacity(r, c);
  for (const auto& [rows, want_kept] : {std::pair<std::vector<int64_t>, int>{{0, 1, 6, 7}, 0}, {{2, 3, 4, 5}, 1}}) {
    std::vector<float> v;
    for (const int64_t t : rows) v.insert(v.end(), {float(logits.get(2 * t)), float(logits.get(2 * t + 1))});
    Routing alone;
    route(from(v, {4, 2}), u, alone);
    apply_capacity(alone, {1.0, DropPolicy::probs, 1});
    for (size_t i = 0; i < rows.size(); ++i) EXPECT_EQ(r.kept[size_t(rows[i])], alone.kept[i]) << "piece " << want_kept;
  }
  // Consecutive pieces without an order; a split that does not divide the group, or an order out of range, throws.
  route(logits, o, r);
  apply_capacity(r, {1.0, DropPolicy::position, 1, 2, {}});
  EXPECT_EQ(r.kept, (std::vector<uint8_t>{1, 1, 0, 0, 1, 1, 0, 0}));
  EXPECT_THROW(apply_capacity(r, {1.0, DropPolicy::position, 1, 3, {}}), std::invalid_argument);
  EXPECT_THROW(apply_capacity(r, {1.0, DropPolicy::position, 1, 2, {0, 1, 2, 3, 4, 5, 6, 8}}), std::invalid_argument);
}

TEST(MoeAuxLoss, UniformScoresGiveCoefAndOneHotGivesCoefTimesE) {
  RouterOptions o{4, 2};
  Routing r;
  route(Tensor(DType::fp32, {6, 4}), o, r);  // all logits 0: P_i = 1/4, any f gives aux = coef
  apply_capacity(r, {});
  EXPECT_NEAR(aux_loss(r, o, 0.01, 1), 0.01, 1e-9);
  // Every token sure of expert 2 (top-1): f_2 = 1, P_2 -> 1: aux -> coef · E.
  std::vector<float> l(24, -30.0f);
  for (int t = 0; t < 6; ++t) l[size_t(t * 4 + 2)] = 30.0f;
  route(from(l, {6, 4}), RouterOptions{4, 1}, r);
  apply_capacity(r, {});
  EXPECT_NEAR(aux_loss(r, RouterOptions{4, 1}, 0.01, 1), 0.04, 1e-6);
  std::vector<double> per;
  apply_capacity(r, {0, DropPolicy::position, 3});
  EXPECT_NEAR(aux_loss(r, RouterOptions{4, 1}, 0.01, 3, &per), 0.04, 1e-6);
  EXPECT_EQ(per.size(), 3u);
}

// All tokens to one expert; the others get zero rows (zero-row GEMMs charge nothing, their gradients are 0).
TEST(MoeSpecial, AllTokensToOneExpertAndExpertsWithZeroTokens) {
  MoeSpec s = spec(RouterScore::softmax, true, Activation::silu, 0, 1, 0);
  s.router.top_k = 1;
  MoeWeights w = make_moe_weights(s, 3, 0, 4);
  for (int64_t i = 0; i < s.hidden; ++i) w.router.set(i * 4 + 1, 50.0f);  // expert 1 wins for positive x
  const Tensor x = shardsim::testing::random_tensor({6, s.hidden}, 2, 0.5f, 1.0f);
  MoeActivations keep;
  std::vector<KernelCost> costs;
  const MoeCharge charge{[&](const KernelCost& c) { costs.push_back(c); }};
  const Tensor y = moe_forward(s, w, x, keep, charge);
  EXPECT_EQ(keep.routing.counts, (std::vector<int64_t>{0, 6, 0, 0}));
  int grouped = 0;
  for (const auto& c : costs)
    if (c.name == "grouped_gemm") {
      ++grouped;
      EXPECT_EQ(c.shape.m, 6);  // only expert 1's GEMMs are charged
    }
  EXPECT_EQ(grouped, 3);  // gate, up, down
  MoeWeights g = zero_like(w);
  moe_backward(s, w, x, keep, shardsim::testing::random_tensor({6, s.hidden}, 4), 0.0, g, charge);
  for (int e : {0, 2, 3})
    for (int64_t i = 0; i < g.experts[size_t(e)].w_up.numel(); ++i) EXPECT_EQ(g.experts[size_t(e)].w_up.get(i), 0.0f);
  double n1 = 0;
  for (int64_t i = 0; i < g.experts[1].w_up.numel(); ++i) n1 += std::fabs(g.experts[1].w_up.get(i));
  EXPECT_GT(n1, 0);
}

// A NaN token: its own output is NaN, every other token's equals the run without it (dropless: tokens independent).
TEST(MoeSpecial, NanTokenStaysInItsRow) {
  const MoeSpec s = spec(RouterScore::softmax, true, Activation::silu, 0, 1, 2);
  const MoeWeights w = make_moe_weights(s, 3, 0, 4);
  Tensor x = shardsim::testing::random_tensor({5, s.hidden}, 8);
  MoeActivations k1, k2;
  const Tensor y1 = moe_forward(s, w, x, k1, {});
  x.set(2 * s.hidden + 1, std::numeric_limits<float>::quiet_NaN());
  const Tensor y2 = moe_forward(s, w, x, k2, {});
  EXPECT_EQ(k2.routing.expert[4], 0);  // the all-NaN token goes to experts 0, 1
  EXPECT_EQ(k2.routing.expert[5], 1);
  for (int64_t t = 0; t < 5; ++t)
    for (int64_t i = 0; i < s.hidden; ++i) {
      if (t == 2) EXPECT_TRUE(std::isnan(y2.get(t * s.hidden + i)));
      else EXPECT_NEAR(y2.get(t * s.hidden + i), y1.get(t * s.hidden + i), 1e-6);
    }
}

TEST(MoeGroupedGemm, ChargesEachExpertAtItsShape) {
  const Tensor a = shardsim::testing::random_tensor({7, 4}, 1);
  const Tensor b0 = shardsim::testing::random_tensor({4, 3}, 2), b1 = shardsim::testing::random_tensor({4, 5}, 3),
               b2 = shardsim::testing::random_tensor({4, 2}, 4);
  std::vector<Tensor> c{Tensor(DType::fp32, {2, 3}), Tensor(DType::fp32, {0, 5}), Tensor(DType::fp32, {5, 2})};
  const GroupedCost g = grouped_gemm_rows_in(a, {0, 2, 2, 7}, {&b0, &b1, &b2}, c);
  ASSERT_EQ(g.groups.size(), 3u);
  EXPECT_EQ(g.groups[0].shape.m, 2);
  EXPECT_EQ(g.groups[0].shape.n, 3);
  EXPECT_EQ(g.groups[0].shape.k, 4);
  EXPECT_EQ(g.groups[1].flops, 0);
  EXPECT_EQ(g.groups[2].shape.m, 5);
  EXPECT_DOUBLE_EQ(g.total().flops, 2.0 * 4 * (2 * 3 + 5 * 2));
  EXPECT_NEAR(c[2].get(0), [&] {
    double v = 0;
    for (int i = 0; i < 4; ++i) v += a.get(2 * 4 + i) * b2.get(i * 2);
    return v;
  }(), 1e-6);
  EXPECT_THROW(grouped_gemm_rows_in(a, {0, 2, 7}, {&b0, &b1, &b2}, c), std::invalid_argument);
  // One kernel: the non-empty groups' work in its shape, charged as sim::grouped_kernel_time (one launch).
  const KernelCost t = g.total();
  ASSERT_TRUE(t.shape.groups);
  ASSERT_EQ(t.shape.groups->size(), 2u);
  EXPECT_EQ(t.shape.m, 7);
  const sim::DeviceSpec h100 = sim::device_preset("h100");
  const double want = sim::grouped_kernel_time(h100, *t.shape.groups, sim::Precision::fp32).total_ns;
  EXPECT_DOUBLE_EQ(sim::kernel_time_ns(h100, t.flops, t.bytes, sim::Precision::fp32, t.shape), want);
  double loop = 0;  // the per-expert loop it replaced: one launch per expert
  for (const auto& k : g.groups)
    if (k.flops > 0) loop += sim::kernel_time_ns(h100, k.flops, k.bytes, sim::Precision::fp32, k.shape);
  EXPECT_LT(want, loop);
}

// A shape-only forward and backward with the real run's counts as the declared routing charge the same kernels.
TEST(MoeShapeOnly, ChargesWhatTheRealRunCharges) {
  const MoeSpec s = spec(RouterScore::sigmoid, true, Activation::silu, 0.75, 2, 3);
  const MoeWeights w = make_moe_weights(s, 3, 0, 4);
  const Tensor x = shardsim::testing::random_tensor({8, s.hidden}, 8);
  std::vector<KernelCost> real, meta;
  MoeActivations k1, k2;
  moe_forward(s, w, x, k1, {[&](const KernelCost& c) { real.push_back(c); }});
  MoeWeights g1 = zero_like(w);
  moe_backward(s, w, x, k1, x, 1.0, g1, {[&](const KernelCost& c) { real.push_back(c); }});
  const MoeWeights ws = make_moe_weights(s, 3, 0, 4, false);
  const Tensor xs = Tensor::shape_only({8, s.hidden}, DType::fp32);
  const Routing declared = Routing::from_counts(8, 2, k1.routing.counts);
  const Tensor ys = moe_forward(s, ws, xs, k2, {[&](const KernelCost& c) { meta.push_back(c); }}, &declared);
  EXPECT_FALSE(ys.has_storage());
  MoeWeights g2 = zero_like(ws);
  const Tensor dxs = moe_backward(s, ws, xs, k2, xs, 1.0, g2, {[&](const KernelCost& c) { meta.push_back(c); }});
  EXPECT_FALSE(dxs.has_storage());
  ASSERT_EQ(real.size(), meta.size());
  for (size_t i = 0; i < real.size(); ++i) {
    EXPECT_EQ(real[i].name, meta[i].name) << i;
    EXPECT_DOUBLE_EQ(real[i].flops, meta[i].flops) << real[i].name;
    EXPECT_DOUBLE_EQ(real[i].bytes, meta[i].bytes) << real[i].name;
    EXPECT_EQ(real[i].shape.m, meta[i].shape.m) << real[i].name;
  }
}

TEST(MoeDeclared, UniformZipfAndCapacity) {
  MoeSpec s = spec(RouterScore::softmax, true, Activation::silu, 0, 1, 0);
  s.router.experts = 8;
  s.expert_ffn.assign(8, 4);
  const Routing u = declared_routing(s, 64, {0, 1}, 0);
  EXPECT_EQ(u.counts, std::vector<int64_t>(8, 16));  // 64 tokens x top-2 / 8
  const Routing z = declared_routing(s, 64, {1.2, 1}, 0);
  EXPECT_EQ(z.rows(), 128);
  const int64_t mx = *std::max_element(z.counts.begin(), z.counts.end());
  EXPECT_GT(mx, 16);
  EXPECT_LE(mx, 64);  // a token picks an expert once
  EXPECT_EQ(declared_routing(s, 64, {1.2, 1}, 0).counts, z.counts);   // deterministic
  EXPECT_NE(declared_routing(s, 64, {1.2, 1}, 5).counts, z.counts);   // another stream permutes the experts
  s.capacity.factor = 1.0;  // C = 16
  const Routing zc = declared_routing(s, 64, {1.2, 1}, 0);
  EXPECT_EQ(*std::max_element(zc.counts.begin(), zc.counts.end()), 16);
  EXPECT_EQ(zc.dropped, 128 - zc.rows());
  EXPECT_GT(zc.dropped, 0);
}

// Uniform routing of an uneven split (T·k not a multiple of E): every expert gets floor or ceil of T·k/E, and the
// experts taking the extra one differ between streams (ranks, layers) instead of always being the lowest ids.
TEST(MoeDeclared, UniformExtrasSpreadOverStreams) {
  MoeSpec s = spec(RouterScore::softmax, true, Activation::silu, 0, 1, 0);
  s.router.experts = 256;
  s.router.top_k = 8;
  s.expert_ffn.assign(256, 4);
  std::vector<int64_t> total(256, 0);
  for (uint64_t stream = 0; stream < 64; ++stream) {
    const Routing u = declared_routing(s, 4, {0, 1}, stream);  // 32 assignments over 256 experts
    EXPECT_EQ(u.rows(), 32);
    for (int64_t e = 0; e < 256; ++e) {
      EXPECT_LE(u.counts[size_t(e)], 1);
      total[size_t(e)] += u.counts[size_t(e)];
    }
  }
  // 64 streams x 32 = 2,048 = 8 per expert on average: the lowest 32 ids would hold all 2,048 if they took every +1.
  EXPECT_LT(*std::max_element(total.begin(), total.end()), 24);
  EXPECT_GT(std::count_if(total.begin(), total.end(), [](int64_t t) { return t > 0; }), 200);
}

// A declared histogram with weight on two experts only, top-2: every token picks both (experts of weight 0 take
// nothing while a weighted expert has room).
TEST(MoeDeclared, HistogramZeroWeightsTakeNothing) {
  MoeSpec s = spec(RouterScore::softmax, true, Activation::silu, 0, 1, 0);
  s.router.experts = 8;
  s.router.top_k = 2;
  s.expert_ffn.assign(8, 4);
  RoutingDistribution d;
  d.histogram = {{10, 5, 0, 0, 0, 0, 0, 0}};
  EXPECT_EQ(declared_routing(s, 16, d, 0, 0).counts, (std::vector<int64_t>{16, 16, 0, 0, 0, 0, 0, 0}));
  s.router.top_k = 1;
  EXPECT_EQ(declared_routing(s, 15, d, 0, 0).counts, (std::vector<int64_t>{10, 5, 0, 0, 0, 0, 0, 0}));
}

TEST(MoeBias, UpdateMovesTowardsBalance) {
  std::vector<float> bias{0, 0, 0};
  update_expert_bias(bias, {10, 4, 7}, 0.001);
  EXPECT_FLOAT_EQ(bias[0], -0.001f);
  EXPECT_FLOAT_EQ(bias[1], 0.001f);
  EXPECT_FLOAT_EQ(bias[2], 0.0f);
}

}  // namespace

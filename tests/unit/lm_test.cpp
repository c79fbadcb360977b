// The single-device language-model reference (models/lm_*): whole-model gradient check, training makes the loss
// fall, runs are bit-identical, the synthetic data follow their pattern.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <random>
#include <vector>

#include "models/lm_data.h"
#include "models/lm_model.h"
#include "models/lm_train.h"
#include "tests/unit/small_lm.h"

using namespace shardsim;
using namespace shardsim::models;
using runtime::Tensor;

namespace {

ModelSpec tiny() {
  ModelSpec c = test::small_lm();
  c.vocab = 11;
  c.hidden = 8;
  c.layers = 2;
  c.heads = 2;
  c.kv_heads = 1;
  c.head_dim = 4;
  c.ffn = 12;
  c.seq = 5;
  c.batch = 2;
  c.seed = 3;
  return c;
}

}  // namespace

// Directional finite differences, one random direction u per weight tensor (entries ±1):
//   D(ε) = (L(w + εu) − L(w − εu)) / 2ε,   compared with <∇L, u> from lm_backward.
// The model runs in fp32, so D(ε) carries the loss's fp32 rounding divided by 2ε as well as an O(ε²) truncation
// error; Richardson's (4·D(ε/2) − D(ε)) / 3 removes the ε² term, and ε = 1e-2 keeps the rounding part small
// (|L| ~ 2.4, fp32 rounding of the loss ~1e-7 relative, so ~1e-5 absolute in D). Tolerance: 2e-3 relative to
// max(|<∇L, u>|, 1e-2) (measured: at most 1.5e-4 over the 21 weight tensors). A wrong backward term gives O(1)
// relative errors.
namespace {
// The gradient check of one config; returns the worst relative error.
double gradient_check(const ModelSpec& c) {
  const LmWeights w = lm_init(c);
  const LmBatch batch = lm_synthetic_batch(c, 5, 0);
  LmCache cache;
  lm_forward(c, w, batch, &cache);
  LmWeights g = lm_zeros(c, c.dtype);
  lm_backward(c, w, batch, cache, g);
  std::mt19937 gen(99);
  const auto gw = g.named_weights();
  double worst = 0;
  for (size_t k = 0; k < gw.size(); ++k) {
    std::vector<float> u(static_cast<size_t>(gw[k].second->numel()));
    for (auto& x : u) x = (gen() & 1) ? 1.0f : -1.0f;
    double analytic = 0;
    for (size_t i = 0; i < u.size(); ++i) analytic += double(gw[k].second->get(int64_t(i))) * u[i];
    auto loss_at = [&](double eps) {
      LmWeights p = w;
      Tensor* t = p.named_weights()[k].second;
      for (size_t i = 0; i < u.size(); ++i) t->set(int64_t(i), float(double(t->get(int64_t(i))) + eps * u[i]));
      return lm_forward(c, p, batch);
    };
    auto D = [&](double eps) { return (loss_at(eps) - loss_at(-eps)) / (2 * eps); };
    const double eps = 1e-2;
    const double fd = (4 * D(eps / 2) - D(eps)) / 3;
    const double err = std::fabs(fd - analytic) / std::max(std::fabs(analytic), 1e-2);
    worst = std::max(worst, err);
    EXPECT_LT(err, 2e-3) << gw[k].first << ": backward " << analytic << ", finite difference " << fd;
  }
  std::printf("worst relative error over %zu weight tensors: %.3g\n", gw.size(), worst);
  return worst;
}
}  // namespace

TEST(LmModel, GradientMatchesFiniteDifferences) {
  RecordProperty("worst_rel_err", std::to_string(gradient_check(tiny())));
}

// A block stack (vocab 0: no embedding, final norm or head; the mean squared error to a seeded target): the same
// gradient check over its weights, which are the blocks' alone; the loss is the kernel's formula on the output.
TEST(LmModel, BlockStackGradientMatchesFiniteDifferences) {
  for (int v = 0; v < 2; ++v) {
    ModelSpec c = tiny();
    c.vocab = 0;
    if (v == 1) c.norm = sharding::NormKind::layernorm;
    SCOPED_TRACE("variant " + std::to_string(v));
    gradient_check(c);
    const LmWeights w = lm_init(c);
    int64_t n = 0;
    for (const auto& [name, t] : w.named_weights()) {
      n += t->numel();
      EXPECT_EQ(name.rfind("layers.", 0), 0u) << name << ": a block stack holds only its blocks' weights";
    }
    EXPECT_EQ(n, lm_param_count(c));
    // The loss is 1/(N h) sum 1/2 (y - t)^2 of the output: an identity stack (no layers) gives it from the data.
    ModelSpec id = c;
    id.layers = 0;
    const LmBatch b = lm_synthetic_batch(id, 5, 2);
    double want = 0;
    for (int64_t i = 0; i < b.input.numel(); ++i) {
      const double d = double(b.input.get(i)) - double(b.target.get(i));
      want += 0.5 * d * d;
    }
    want /= double(b.input.numel());
    EXPECT_NEAR(lm_forward(id, lm_init(id), b), want, 1e-12 * std::max(1.0, want));
  }
  // Rows of a step's data made alone equal the whole batch's rows (a chip makes only its own).
  ModelSpec c = tiny();
  c.vocab = 0;
  const LmBatch whole = lm_synthetic_batch(c, 7, 3);
  Tensor in(runtime::DType::fp32, {2, c.hidden}), tg(runtime::DType::fp32, {2, c.hidden});
  lm_synthetic_activations(c, 7, 3, 4, in, tg);
  for (int64_t i = 0; i < in.numel(); ++i) {
    EXPECT_EQ(in.get(i), whole.input.get(4 * c.hidden + i));
    EXPECT_EQ(tg.get(i), whole.target.get(4 * c.hidden + i));
  }
  EXPECT_THROW(lm_synthetic_activations(c, 7, 3, c.batch * c.seq - 1, in, tg), std::invalid_argument);
  // A NaN in the output propagates into the loss (never silently dropped).
  LmBatch bad = whole;
  bad.input.set(3, std::numeric_limits<float>::quiet_NaN());
  EXPECT_TRUE(std::isnan(lm_forward(c, lm_init(c), bad)));
}

// The block variants (layernorm with bias, GELU MLP, learned positions, tied embeddings), each alone and together
// (the GPT block), pass the same check; every variant weight appears in named_weights with its gradient.
// model.kind mlp: the block stack with attention off, x + mlp(rmsnorm(x)) per layer; no attention weight exists.
TEST(LmModel, MlpOnlyStackGradientMatchesFiniteDifferences) {
  ModelSpec c = tiny();
  c.vocab = 0;
  c.attention = false;
  c.heads = c.kv_heads = c.head_dim = 0;
  gradient_check(c);
  const LmWeights w = lm_init(c);
  int64_t n = 0;
  std::vector<std::string> names;
  for (const auto& [name, t] : w.named_weights()) {
    n += t->numel();
    names.push_back(name);
  }
  EXPECT_EQ(n, lm_param_count(c));
  EXPECT_EQ(n, c.layers * (c.hidden + 3 * c.hidden * c.ffn));  // mlp_norm, w_gate, w_up, w_down
  for (const char* gone : {"layers.0.wq", "layers.0.wk", "layers.0.wv", "layers.0.wo", "layers.0.attn_norm"})
    EXPECT_EQ(std::count(names.begin(), names.end(), gone), 0) << gone;
  // The attention half off changes the output: the same weights through a block with attention differ.
  ModelSpec with = tiny();
  with.vocab = 0;
  const LmBatch b = lm_synthetic_batch(c, 5, 2);
  EXPECT_NE(lm_forward(c, w, b), lm_forward(with, lm_init(with), b));
}

TEST(LmModel, VariantGradientsMatchFiniteDifferences) {
  using sharding::MlpKind;
  using sharding::NormKind;
  using sharding::PositionKind;
  for (int v = 0; v < 5; ++v) {
    ModelSpec c = tiny();
    if (v == 0 || v == 4) c.norm = NormKind::layernorm;
    if (v == 1 || v == 4) c.mlp = MlpKind::gelu;
    if (v == 2 || v == 4) c.position = PositionKind::learned;
    if (v == 3 || v == 4) c.tied_embeddings = true;
    SCOPED_TRACE("variant " + std::to_string(v));
    gradient_check(c);
    const LmWeights w = lm_init(c);
    int64_t n = 0;
    bool has_bias = false, has_pos = false, has_head = false, has_gate = false;
    for (const auto& [name, t] : w.named_weights()) {
      n += t->numel();
      has_bias |= name == "layers.0.attn_norm_b";
      has_pos |= name == "pos_embed";
      has_head |= name == "head";
      has_gate |= name == "layers.0.w_gate";
    }
    EXPECT_EQ(n, lm_param_count(c));
    EXPECT_EQ(has_bias, c.norm == NormKind::layernorm);
    EXPECT_EQ(has_pos, c.position == PositionKind::learned);
    EXPECT_EQ(has_head, !c.tied_embeddings);
    EXPECT_EQ(has_gate, c.mlp == MlpKind::swiglu);
  }
}

TEST(LmModel, TrainingMakesTheLossFall) {
  const ModelSpec c = test::small_lm();  // vocab 32, hidden 16, 2 layers, 4/2 heads, seq 8, batch 2
  LmTrainConfig t;
  t.steps = 40;
  LmTrainState st = lm_train_init(c);
  const auto r = lm_train(c, t, st);
  ASSERT_EQ(r.size(), 40u);
  const double first = r.front().loss;
  double last5 = 0;
  for (size_t i = r.size() - 5; i < r.size(); ++i) last5 += r[i].loss / 5;
  std::printf("loss: step 1 %.4f, steps 36-40 mean %.4f (log V = %.4f)\n", first, last5, std::log(double(c.vocab)));
  EXPECT_NEAR(first, std::log(double(c.vocab)), 0.5);  // untrained: about uniform over the vocabulary
  EXPECT_LT(last5, 0.25 * first);                        // the pattern is learned
  for (const auto& s : r) EXPECT_GT(s.flops, 0);
}

TEST(LmModel, TwoRunsAreBitIdentical) {
  const ModelSpec c = tiny();
  LmTrainConfig t;
  t.steps = 5;
  LmTrainState a = lm_train_init(c), b = lm_train_init(c);
  const auto ra = lm_train(c, t, a), rb = lm_train(c, t, b);
  for (size_t i = 0; i < ra.size(); ++i) {
    EXPECT_EQ(std::memcmp(&ra[i].loss, &rb[i].loss, sizeof(double)), 0) << "step " << i + 1;
    EXPECT_EQ(std::memcmp(&ra[i].grad_norm, &rb[i].grad_norm, sizeof(double)), 0) << "step " << i + 1;
  }
  auto wa = a.weights.named_weights(), wb = b.weights.named_weights();
  for (size_t k = 0; k < wa.size(); ++k) EXPECT_TRUE(wa[k].second->bit_equal(*wb[k].second)) << wa[k].first;
  EXPECT_NE(ra.front().loss, ra.back().loss);  // the steps did change something
}

TEST(LmData, TokensFollowThePatternAndDependOnStepAndSeed) {
  const ModelSpec c = test::small_lm();
  const LmBatch b0 = lm_synthetic_batch(c, 7, 0);
  ASSERT_EQ(b0.inputs.size(), size_t(c.batch * c.seq));
  for (size_t i = 0; i < b0.inputs.size(); ++i) {
    EXPECT_EQ(b0.targets[i], lm_pattern_next(b0.inputs[i], c.vocab));
    if (i % size_t(c.seq) != 0) {
      EXPECT_EQ(b0.inputs[i], b0.targets[i - 1]);
    }
    EXPECT_GE(b0.inputs[i], 0);
    EXPECT_LT(b0.inputs[i], c.vocab);
  }
  EXPECT_EQ(lm_synthetic_batch(c, 7, 0).inputs, b0.inputs);
  // Other steps and seeds start elsewhere (first tokens of 8 steps: not all equal).
  bool differs = false;
  for (int64_t s = 1; s < 8; ++s) differs = differs || lm_synthetic_batch(c, 7, s).inputs != b0.inputs;
  EXPECT_TRUE(differs);
  EXPECT_THROW(lm_synthetic_batch(c, 7, -1), std::invalid_argument);
}

TEST(LmModel, BadConfigAndBatchAreErrors) {
  ModelSpec c = tiny();
  c.kv_heads = 3;
  EXPECT_THROW(lm_init(c), std::invalid_argument);
  c = tiny();
  c.head_dim = 3;
  EXPECT_THROW(lm_init(c), std::invalid_argument);
  c = tiny();
  LmBatch b = lm_synthetic_batch(c, 1, 0);
  b.inputs[2] = c.vocab;  // outside the vocabulary
  EXPECT_THROW(lm_forward(c, lm_init(c), b), std::invalid_argument);
  b.inputs.pop_back();
  EXPECT_THROW(lm_forward(c, lm_init(c), b), std::invalid_argument);
}

TEST(LmModel, GemmFlopsAreSixNPerToken) {
  // The forward's GEMMs do 2·N FLOPs per token and the backward's 4·N (dX and dW): the 6·N of the MFU formula is
  // exactly what the GEMM kernels report. Attention is the rest: the kernels count the causal half (and the
  // backward's recomputation), the formula the full square.
  const ModelSpec c = tiny();
  const LmWeights w = lm_init(c);
  const LmBatch batch = lm_synthetic_batch(c, 5, 0);
  std::vector<kernels::KernelCost> costs;
  LmCache cache;
  lm_forward(c, w, batch, &cache, &costs);
  LmWeights g = lm_zeros(c, c.dtype);
  lm_backward(c, w, batch, cache, g, &costs);
  double gemm = 0, attn = 0;
  for (const auto& k : costs) {
    if (k.name == "gemm" || k.name == "gemm_backward") gemm += k.flops;
    if (k.name.rfind("attention", 0) == 0) attn += k.flops;
  }
  const double tokens = double(c.batch * c.seq);
  EXPECT_DOUBLE_EQ(gemm, 6.0 * double(lm_matmul_param_count(c)) * tokens);
  // Causal kernels: forward 4·d and backward 10·d per visible pair per head, s(s+1)/2 pairs per sequence.
  EXPECT_DOUBLE_EQ(attn, double(c.layers * c.heads * c.batch) * 14.0 * double(c.head_dim) * (c.seq * (c.seq + 1) / 2));
  // Model FLOPs count the causal pairs the kernels compute, 4·d forward + 8·d backward per pair (the kernels'
  // extra 2·d is the backward's recomputed scores, hardware FLOPs): MFU cannot exceed the kernels' share of peak.
  EXPECT_DOUBLE_EQ(lm_model_flops_per_token(c) * tokens - gemm,
                   double(c.layers * c.heads * c.batch) * 12.0 * double(c.head_dim) * (c.seq * (c.seq + 1) / 2));
  EXPECT_LT(lm_model_flops_per_token(c) * tokens, gemm + attn);
  EXPECT_EQ(lm_param_count(c), lm_matmul_param_count(c) + c.vocab * c.hidden + (2 * c.layers + 1) * c.hidden);
}

TEST(LmModel, NaNWeightStopsTrainingWithAClearError) {
  // A NaN in one weight makes the loss and the gradient norm NaN: the step is refused (not applied) with an error
  // naming the step, instead of writing NaN into every weight through AdamW.
  const ModelSpec c = tiny();
  LmTrainConfig t;
  t.steps = 3;
  LmTrainState st = lm_train_init(c);
  st.weights.layers[1].w_up.set(5, std::numeric_limits<float>::quiet_NaN());
  const Tensor before = st.weights.head;
  try {
    lm_train(c, t, st);
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("gradient norm is nan at step 1"), std::string::npos) << e.what();
  }
  EXPECT_EQ(st.step, 0);
  EXPECT_TRUE(st.weights.head.bit_equal(before));
}

TEST(LmModel, MixedPrecisionTrainsAndHolds16BytesPerParameter) {
  // bf16 compute copies, activations and gradients; fp32 masters and moments.
  ModelSpec c = test::small_lm();
  c.dtype = runtime::DType::bf16;
  LmTrainConfig t;
  t.steps = 40;
  LmTrainState st = lm_train_init(c);
  ASSERT_EQ(st.compute.head.dtype(), runtime::DType::bf16);
  const auto r = lm_train(c, t, st);
  double last5 = 0;
  for (size_t i = r.size() - 5; i < r.size(); ++i) last5 += r[i].loss / 5;
  // The first loss is the fp32 model's up to bf16 rounding of weights and activations (~2^-8 relative each).
  ModelSpec c32 = c;
  c32.dtype = runtime::DType::fp32;
  LmTrainState st32 = lm_train_init(c32);
  LmTrainConfig one = t;
  one.steps = 1;
  const double first32 = lm_train(c32, one, st32).front().loss;
  std::printf("bf16: loss step 1 %.4f (fp32 %.4f), steps 36-40 mean %.4f\n", r.front().loss, first32, last5);
  EXPECT_NEAR(r.front().loss, first32, 0.02 * first32);
  EXPECT_LT(last5, 0.25 * r.front().loss);
  // The copy is the masters rounded once.
  auto w = st.weights.named_weights();
  auto cw = st.compute.named_weights();
  for (size_t k = 0; k < w.size(); ++k)
    for (int64_t i = 0; i < w[k].second->numel(); ++i)
      ASSERT_EQ(cw[k].second->bf16()[i], runtime::float_to_bf16(w[k].second->f32()[i])) << w[k].first;
  // Bytes held per parameter: masters + m + v + copy + gradients = 16 (ZeRO's 16Ψ), and 16 for fp32 too.
  auto bytes = [](const LmWeights& x) {
    double b = 0;
    for (const auto& [n, t] : x.named_weights()) b += double(t->nbytes());
    return b;
  };
  const double psi = double(lm_param_count(c));
  EXPECT_EQ(bytes(st.weights) + bytes(st.m) + bytes(st.v) + bytes(st.compute) + bytes(lm_zeros(c, c.dtype)), 16 * psi);
  EXPECT_EQ(bytes(st32.weights) + bytes(st32.m) + bytes(st32.v) + bytes(st32.compute) + bytes(lm_zeros(c32, c32.dtype)),
            16 * psi);
}

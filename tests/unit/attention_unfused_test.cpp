// kernels::attention_unfused (Megatron's materialised attention core) against the flash-style kernels, which are
// checked against finite differences (attention_backward_test.cpp): the same O and the same dQ, dK, dV in fp32
// (non-causal, causal, GQA, position offsets), P's rows summing to 1 over the visible keys; the kernels charged
// (names, FLOPs, shapes) and their costs identical for shape-only tensors; the activation bytes the trainer's forward
// keeps with the unfused core and dropout against Korthikanti et al. 2022, Table 2.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "kernels/attention.h"
#include "kernels/attention_backward.h"
#include "kernels/attention_unfused.h"
#include "models/lm_activations.h"
#include "models/lm_data.h"
#include "models/lm_model.h"
#include "tests/unit/small_lm.h"

using namespace shardsim;
using kernels::AttentionOptions;
using runtime::DType;
using runtime::Tensor;

namespace {

Tensor random_tensor(runtime::Shape s, uint32_t seed) {
  Tensor t(DType::fp32, std::move(s));
  std::mt19937 g(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, n(g));
  return t;
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  double m = 0;
  for (int64_t i = 0; i < a.numel(); ++i) m = std::max(m, std::fabs(double(a.get(i)) - double(b.get(i))));
  return m;
}

struct Case {
  int64_t sq, sk, hq, hkv, d;
  bool causal;
  int64_t q_offset, k_offset;
};

}  // namespace

TEST(AttentionUnfused, MatchesTheFlashKernelsForwardAndBackward) {
  const Case cases[] = {{7, 7, 4, 4, 8, false, 0, 0}, {9, 9, 4, 2, 4, true, 0, 0}, {6, 10, 6, 1, 4, true, 4, 0},
                        {5, 5, 2, 2, 16, true, 0, 3}};
  uint32_t seed = 1;
  for (const Case& c : cases) {
    AttentionOptions o;
    o.causal = c.causal;
    o.q_offset = c.q_offset;
    o.k_offset = c.k_offset;
    const Tensor q = random_tensor({c.sq, c.hq, c.d}, seed++), k = random_tensor({c.sk, c.hkv, c.d}, seed++),
                 v = random_tensor({c.sk, c.hkv, c.d}, seed++), dout = random_tensor({c.sq, c.hq, c.d}, seed++);
    Tensor of(DType::fp32, {c.sq, c.hq, c.d}), lse(DType::fp32, {c.hq, c.sq});
    kernels::attention(q, k, v, of, lse, o);
    Tensor ou(DType::fp32, {c.sq, c.hq, c.d}), p(DType::fp32, {c.hq, c.sq, c.sk});
    kernels::attention_unfused(q, k, v, ou, p, o);
    EXPECT_LT(max_abs_diff(ou, of), 1e-5) << "O, case sq " << c.sq << " causal " << c.causal;
    for (int64_t h = 0; h < c.hq; ++h)
      for (int64_t i = 0; i < c.sq; ++i) {
        double sum = 0;
        bool any = false;
        for (int64_t j = 0; j < c.sk; ++j) {
          sum += p.get((h * c.sq + i) * c.sk + j);
          any = any || !c.causal || c.q_offset + i >= c.k_offset + j;
        }
        EXPECT_NEAR(sum, any ? 1.0 : 0.0, 1e-5);
      }
    Tensor dqf(DType::fp32, q.shape()), dkf(DType::fp32, k.shape()), dvf(DType::fp32, v.shape());
    kernels::attention_backward(q, k, v, of, lse, dout, dqf, dkf, dvf, o);
    Tensor dqu(DType::fp32, q.shape()), dku(DType::fp32, k.shape()), dvu(DType::fp32, v.shape());
    kernels::attention_unfused_backward(q, k, v, p, dout, dqu, dku, dvu, o);
    EXPECT_LT(max_abs_diff(dqu, dqf), 2e-5) << "dQ";
    EXPECT_LT(max_abs_diff(dku, dkf), 2e-5) << "dK";
    EXPECT_LT(max_abs_diff(dvu, dvf), 2e-5) << "dV";
  }
}

TEST(AttentionUnfused, ChargesMegatronsKernelsAndShapeOnlyCostsAreEqual) {
  const int64_t s = 32, hq = 4, d = 8;
  const Tensor q = random_tensor({s, hq, d}, 1), k = random_tensor({s, hq, d}, 2), v = random_tensor({s, hq, d}, 3);
  Tensor o(DType::fp32, {s, hq, d}), p(DType::fp32, {hq, s, s});
  AttentionOptions opt;
  opt.causal = true;
  const auto real = kernels::attention_unfused(q, k, v, o, p, opt, 0.1);
  ASSERT_EQ(real.size(), 4u);
  EXPECT_EQ(real[0].name, "attention_core.qk");
  EXPECT_EQ(real[1].name, "attention_core.softmax");
  EXPECT_EQ(real[2].name, "attention_core.dropout");
  EXPECT_EQ(real[3].name, "attention_core.pv");
  // Dense GEMMs over the whole score matrix: 2·s·s·d per head each, masked half included.
  EXPECT_DOUBLE_EQ(real[0].flops, 2.0 * hq * s * s * d);
  EXPECT_EQ(real[0].shape.cls, sim::KernelClass::gemm);
  EXPECT_EQ(real[0].shape.batch, hq);
  EXPECT_DOUBLE_EQ(real[1].bytes, 2.0 * 4 * hq * s * s);  // scores read, P written (fp32 here)
  EXPECT_EQ(kernels::attention_unfused(q, k, v, o, p, opt, 0).size(), 3u);  // no dropout kernel without dropout
  const Tensor qs = Tensor::shape_only({s, hq, d}, DType::fp32);
  Tensor os = Tensor::shape_only({s, hq, d}, DType::fp32), ps = Tensor::shape_only({hq, s, s}, DType::fp32);
  const auto shaped = kernels::attention_unfused(qs, k, v, os, ps, opt, 0.1);
  ASSERT_EQ(shaped.size(), real.size());
  for (size_t i = 0; i < real.size(); ++i) {
    EXPECT_EQ(shaped[i].name, real[i].name);
    EXPECT_DOUBLE_EQ(shaped[i].flops, real[i].flops);
    EXPECT_DOUBLE_EQ(shaped[i].bytes, real[i].bytes);
  }
  Tensor dq(DType::fp32, q.shape()), dk(DType::fp32, k.shape()), dv(DType::fp32, v.shape());
  const auto back = kernels::attention_unfused_backward(q, k, v, p, o, dq, dk, dv, opt, 0.1);
  ASSERT_EQ(back.size(), 4u);
  EXPECT_EQ(back[0].name, "attention_core.pv_backward");
  EXPECT_EQ(back[3].name, "attention_core.qk_backward");
  EXPECT_DOUBLE_EQ(back[0].flops + back[3].flops, 2.0 * (real[0].flops + real[3].flops));
}

// The single-device trainer's forward with the unfused core and dropout (bf16, the paper's GPT block, ffn = 4h, MHA):
// one layer keeps sbh(34 + 5as/h) bytes (Korthikanti et al. 2022, Table 2, no parallelism): its tensors, the softmax
// output, and what the charged dropout keeps (the attention dropout's mask and output, the two hidden masks).
TEST(AttentionUnfused, TrainerLayerKeepsKorthikantisActivations) {
  sharding::ModelSpec c = test::small_lm();
  c.vocab = 64;
  c.hidden = 256;
  c.layers = 2;
  c.heads = 4;
  c.kv_heads = 4;
  c.head_dim = 64;
  c.ffn = 1024;
  c.seq = 64;
  c.batch = 2;
  c.norm = sharding::NormKind::layernorm;
  c.mlp = sharding::MlpKind::gelu;
  c.position = sharding::PositionKind::learned;
  c.tied_embeddings = true;
  c.dtype = DType::bf16;
  c.attention_impl = sharding::AttentionImpl::unfused;
  c.dropout = 0.1;
  c.linear_bias = true;
  const models::LmWeights w = models::lm_compute_copy(c, models::lm_init(c));
  models::LmCache cache;
  models::lm_forward(c, w, models::lm_synthetic_batch(c, 7, 0), &cache);
  const auto& L = cache.layers[0];
  double kept = L.charged_bytes;
  for (const Tensor* t : {&L.x_in, &L.a, &L.q, &L.k, &L.v, &L.o, &L.x_mid, &L.m, &L.gate, &L.up, &L.act})
    kept += double(t->nbytes());
  for (const auto& t : L.probs) kept += double(t.nbytes());
  EXPECT_TRUE(L.lse.empty());
  const double s = double(c.seq), b = double(c.batch), h = double(c.hidden), a = double(c.heads);
  const double korthikanti = s * b * h * (34 + 5 * a * s / h);
  EXPECT_NEAR(kept / korthikanti, 1.0, 0.01) << kept << " vs " << korthikanti;
  EXPECT_DOUBLE_EQ(kept, models::lm_layer_activation_bytes(c, c.batch, {}));  // the Megatron inventory
}

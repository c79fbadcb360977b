// Activation memory per layer (models/lm_activations.h) against Korthikanti et al. 2022, Table 2, for the models of
// their Table 3 (22B, 175B, 530B, 1T; s = 2048, micro-batch 1 and 4, t = 8), and the inventory's flash variant
// against the tensors the trainer's forward really keeps (LmCache).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "models/lm_activations.h"
#include "models/lm_data.h"
#include "models/lm_model.h"
#include "tests/unit/small_lm.h"

using namespace shardsim;
using namespace shardsim::models;

namespace {

// The paper's GPT block: layernorm, GELU MLP of 4h, learned positions, tied embeddings, MHA.
ModelSpec gpt(int64_t heads, int64_t hidden, int64_t layers) {
  ModelSpec c = test::small_lm();
  c.vocab = 51200;
  c.hidden = hidden;
  c.layers = layers;
  c.heads = heads;
  c.kv_heads = heads;
  c.head_dim = hidden / heads;
  c.ffn = 4 * hidden;
  c.seq = 2048;
  c.batch = 1;
  c.norm = sharding::NormKind::layernorm;
  c.mlp = sharding::MlpKind::gelu;
  c.position = sharding::PositionKind::learned;
  c.tied_embeddings = true;
  return c;
}

}  // namespace

// Table 2, per layer: no parallelism sbh(34 + 5as/h); tp sbh(10 + 24/t + 5as/(ht)); tp + sp sbh(34/t + 5as/(ht));
// tp + selective sbh(10 + 24/t); tp + sp + selective 34sbh/t; full recomputation 2sbh. The inventory sums its
// tensors one by one; the formulas are the paper's closed forms. Within 1 % (they agree exactly: the closed forms
// are the inventory's sum for ffn = 4h and MHA).
TEST(LmActivations, MegatronInventoryMatchesKorthikantiTable2) {
  const ModelSpec models[] = {gpt(64, 6144, 48), gpt(96, 12288, 96), gpt(128, 20480, 105), gpt(160, 25600, 128)};
  for (const ModelSpec& c : models)
    for (int64_t b : {1, 4})
      for (int t : {1, 8}) {
        const double s = double(c.seq), h = double(c.hidden), a = double(c.heads), sbh = s * double(b) * h;
        auto got = [&](bool sp, Recompute r) {
          return lm_layer_activation_bytes(c, b, {.tp = t, .sp = sp, .recompute = r});
        };
        const struct {
          const char* what;
          double formula, value;
        } rows[] = {
            {"tp", sbh * (10 + 24.0 / t + 5 * a * s / (h * t)), got(false, Recompute::none)},
            {"tp + sp", sbh * (34.0 / t + 5 * a * s / (h * t)), got(true, Recompute::none)},
            {"tp + selective", sbh * (10 + 24.0 / t), got(false, Recompute::selective)},
            {"tp + sp + selective", sbh * 34.0 / t, got(true, Recompute::selective)},
            {"full", 2 * sbh, got(false, Recompute::full)},
            {"full + sp", 2 * sbh / t, got(true, Recompute::full)},
        };
        for (const auto& r : rows)
          EXPECT_NEAR(r.value / r.formula, 1.0, 0.01)
              << r.what << " h " << c.hidden << " b " << b << " t " << t << ": " << r.value << " vs " << r.formula;
        if (t == 1)  // no parallelism: sbh(34 + 5as/h)
          EXPECT_NEAR(got(false, Recompute::none) / (sbh * (34 + 5 * a * s / h)), 1.0, 0.01);
      }
}

// The trainer's own forward (the single-device model, bf16, the GPT block): the tensors one layer keeps (LmCache)
// are the inventory's flash variant (no [s, s] core, fp32 log-sum-exp, no dropout masks), i.e. Korthikanti's
// selective sbh·34 less the two dropout masks (2sbh) plus the log-sum-exp: within 1 % of both.
TEST(LmActivations, TrainerKeepsTheFlashInventory) {
  ModelSpec c = gpt(4, 256, 2);
  c.vocab = 64;
  c.seq = 64;
  c.batch = 2;
  c.dtype = runtime::DType::bf16;
  const LmWeights w = lm_compute_copy(c, lm_init(c));
  LmCache cache;
  lm_forward(c, w, lm_synthetic_batch(c, 7, 0), &cache);
  const auto& L = cache.layers[0];
  double kept = 0;
  for (const runtime::Tensor* t : {&L.x_in, &L.a, &L.q, &L.k, &L.v, &L.o, &L.x_mid, &L.m, &L.gate, &L.up, &L.act})
    kept += double(t->nbytes());
  for (const auto& t : L.lse) kept += double(t.nbytes());
  const double flash = lm_layer_activation_bytes(c, c.batch, {.megatron_core = false});
  const double sbh = double(c.seq) * double(c.batch) * double(c.hidden);
  std::printf("one layer keeps %.0f bytes; flash inventory %.0f; Korthikanti selective 34sbh - 2sbh = %.0f\n", kept,
              flash, 32 * sbh);
  EXPECT_DOUBLE_EQ(kept, flash);
  EXPECT_NEAR(kept / (32 * sbh), 1.0, 0.01);
  // Selective and no recomputation keep the same tensors in the flash trainer; full keeps the layer input.
  EXPECT_DOUBLE_EQ(lm_layer_activation_bytes(c, c.batch, {.recompute = Recompute::selective, .megatron_core = false}),
                   flash);
  EXPECT_DOUBLE_EQ(lm_layer_activation_bytes(c, c.batch, {.recompute = Recompute::full, .megatron_core = false}),
                   double(L.x_in.nbytes()));
}

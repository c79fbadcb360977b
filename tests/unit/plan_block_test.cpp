// The block program on its own (sharding/plans/block.h): block_forward and block_backward of one transformer block
// on the simulated chips of this process, for the registry's example plan of every unit the block composes (the
// units on the tp and cp axes and activation recomputation: sharding/plans/registry.h, PlanDescriptor::example)
// and the compositions tp x cp, Ulysses x tp and tp + sp x cp under full recomputation, against the single-device
// reference (models/lm_model.h: lm_forward and lm_backward of a one-block stack, vocab 0, its MSE loss): each
// chip's output rows equal the reference's at its tokens, and every weight gradient, summed over the chips that
// hold the same shard, equals the reference's shard. A NaN in one input row reaches the same elements. Tp above the
// KV heads: the KV group's replicas of Wk and Wv each hold the head's whole gradient after the tp unit's
// kv_replica_grads_reduce (an all_reduce over the group, charged on the chip's clock).
#include <gtest/gtest.h>

#include <limits>
#include <map>
#include <string>
#include <vector>

#include "kernels/mse_loss.h"
#include "models/lm_model.h"
#include "sharding/plans/block.h"
#include "tests/unit/plan_unit.h"

namespace shardsim::test {
namespace {

using runtime::DType;
using runtime::Tensor;
using sharding::ModelSpec;
using sharding::ParallelPlan;
namespace plans = sharding::plans;

struct BlockCase {
  std::string name;
  std::string yaml;
  sharding::SpecUse use = sharding::SpecUse::train;
  int64_t chips = 1;
};

// The registry's example of every unit the block program runs, and the compositions.
std::vector<BlockCase> cases() {
  std::vector<BlockCase> v;
  for (const auto& d : plans::registered_plans())
    if (d.unit && (d.axis == "tp" || d.axis == "cp" || d.name == "recompute"))
      v.push_back({d.name, d.example.yaml, d.example.use, d.example.chips});
  const std::string m = unit_test_model();
  v.push_back({"tp_x_cp", m + "parallel: {tp: 2, cp: 2}\n", sharding::SpecUse::train, 4});
  v.push_back({"ulysses_x_tp", m + "parallel: {tp: 2, ulysses: 2}\n", sharding::SpecUse::train, 4});
  v.push_back({"tp_sp_x_cp_full_recompute", m + "parallel: {tp: 2, sp: true, cp: 2, recompute: full}\n",
               sharding::SpecUse::train, 4});
  // Tp above the KV heads (2x: 4 KV heads at tp 8; 4x: 2 at tp 8), with sp and with cp.
  std::string kv2 = m;
  kv2.replace(kv2.find("kv_heads: 4"), 11, "kv_heads: 2");
  v.push_back({"tp_2x_kv_heads_sp", m + "parallel: {tp: 8, sp: true}\n", sharding::SpecUse::train, 8});
  v.push_back({"tp_4x_kv_heads_sp", kv2 + "parallel: {tp: 8, sp: true}\n", sharding::SpecUse::train, 8});
  v.push_back({"tp_2x_kv_heads_x_cp", kv2 + "parallel: {tp: 4, cp: 2}\n", sharding::SpecUse::train, 8});
  return v;
}

// The names of a layer's weights (LmLayer::slots) and BlockWeights' / BlockGrads' members.
struct Shards {
  std::map<std::string, Tensor> w, g;
};

// Chip TP of TP's shard of reference weight NAME (column- or row-parallel, or whole; tp above the KV heads: Wk and
// Wv of the KV head of chip T's query heads, replicated over tp / kv_heads chips).
Tensor shard_of(const std::string& name, const Tensor& whole, int tp, int t, const ModelSpec& s) {
  const int64_t qd = s.heads * s.head_dim / tp, f = s.ffn / tp;
  if (name == "wq") return cols(whole, t * qd, qd);
  if ((name == "wk" || name == "wv") && tp > s.kv_heads) return cols(whole, t / (tp / s.kv_heads) * s.head_dim, s.head_dim);
  const int64_t kvd = s.kv_heads * s.head_dim / tp;
  if (name == "wk" || name == "wv") return cols(whole, t * kvd, kvd);
  if (name == "w_gate" || name == "w_up") return cols(whole, t * f, f);
  if (name == "wo") return whole.rows(t * qd, qd);
  if (name == "w_down") return whole.rows(t * f, f);
  return whole;  // norms: replicated
}

void run_case(const BlockCase& c, bool nan_input) {
  const ConfigNode root = ConfigNode::load_string(c.yaml, "block_test.yaml");
  ModelSpec spec = sharding::parse_model_spec(root.child("model"), c.use);
  const ParallelPlan plan = sharding::parse_parallel_plan(root, spec, c.use, c.chips);
  ASSERT_EQ(plan.pp, 1);
  spec.vocab = 0;  // a one-block stack with the MSE loss: the reference of the block alone
  spec.layers = 1;
  spec.tied_embeddings = false;
  if (spec.batch == 0) spec.batch = plan.dp;
  const int64_t B = spec.batch, T = spec.seq, h = spec.hidden, N = B * T;
  // The reference.
  models::LmWeights w = models::lm_init(spec);
  models::LmBatch batch;
  batch.input = seeded({N, h}, 21);
  if (nan_input) batch.input.set(3 * h + 1, std::numeric_limits<float>::quiet_NaN());
  batch.target = seeded({N, h}, 22);
  models::LmCache cache;
  (void)models::lm_forward(spec, w, batch, &cache);
  models::LmWeights grads = models::lm_zeros(spec, DType::fp32);
  models::lm_backward(spec, w, batch, cache, grads);
  const auto ref_w = w.layers[0].slots();
  const auto ref_g = grads.layers[0].slots();
  // Every chip's gradient shards, summed into SUMS (keyed by weight and tp rank) over the chips holding the same
  // shard: the tp-sharded weights over cp / Ulysses / dp; the norms over every chip with sp (each holds its rows'
  // part), else over tp rank 0's (tp ranks hold the same whole gradient).
  std::map<std::string, Tensor> sums;
  const int tp = plan.tp, cp_axis = plan.cp > 1 ? plan.cp : plan.ulysses;
  const bool zigzag = plan.zigzag && plan.ulysses <= 1;
  const std::string at0 = c.name + (nan_input ? " (NaN input)" : "");
  on_chips(plan, [&](ChipEnv& env) {
    const int t = env.mesh["tp"].rank(), ci = env.mesh["cp"].rank(), di = env.mesh["dp"].rank();
    const int64_t Bl = B / plan.dp;
    plans::TokenLayout layout = plans::token_layout(T, Bl, cp_axis, ci, zigzag);
    const int64_t n = Bl * layout.seq_local, nr = plan.sp ? n / tp : n;
    plans::PlanContext ctx{spec, plan, env.mesh["tp"], env.mesh["cp"], env.chip, env.comm, env.fused_ops, n, nr};
    // This replica's sequences, this chip's tokens of them, its sp rows.
    const Tensor x_all = layout_rows(batch.input.rows(di * Bl * T, Bl * T), layout, T);
    const Tensor x = x_all.rows(plan.sp ? t * nr : 0, nr);
    Shards sh;
    plans::BlockWeights bw;
    plans::BlockGrads bg;
    for (const auto& [name, tensor] : ref_w) {
      if (tensor->rank() == 0) continue;
      sh.w[name] = shard_of(name, *tensor, tp, t, spec);
      sh.g[name] = Tensor(DType::fp32, sh.w[name].shape());
    }
    auto bind = [&](const char* name, const Tensor*& wp, Tensor*& gp) {
      if (!sh.w.count(name)) return;
      wp = &sh.w[name];
      gp = &sh.g[name];
    };
    bind("attn_norm", bw.norm1, bg.norm1);
    bind("attn_norm_b", bw.norm1_b, bg.norm1_b);
    bind("wq", bw.wq, bg.wq);
    bind("wk", bw.wk, bg.wk);
    bind("wv", bw.wv, bg.wv);
    bind("wo", bw.wo, bg.wo);
    bind("mlp_norm", bw.norm2, bg.norm2);
    bind("mlp_norm_b", bw.norm2_b, bg.norm2_b);
    bind("w_gate", bw.w_gate, bg.w_gate);
    bind("w_up", bw.w_up, bg.w_up);
    bind("w_down", bw.w_down, bg.w_down);
    plans::BlockActivations keep;
    const Tensor y = plans::block_forward(ctx, layout, bw, x, &keep);
    const std::string at = at0 + ", chip " + std::to_string(env.rank());
    const Tensor y_ref = layout_rows(cache.x_final.rows(di * Bl * T, Bl * T), layout, T).rows(plan.sp ? t * nr : 0, nr);
    expect_close(y, y_ref, 1e-5, at + ": output");
    // Fused without sp runs in the forward mode only (the registry refuses it for training: the trainer's fused
    // ops are the sequence-parallel rings).
    if (plan.fused.enabled && !plan.sp) return;
    if (plan.recompute) {  // the executor keeps only the block's input (full recomputation)
      Tensor in = std::move(keep.x_in);
      keep = plans::BlockActivations{};
      keep.x_in = std::move(in);
    }
    const Tensor target = layout_rows(batch.target.rows(di * Bl * T, Bl * T), layout, T).rows(plan.sp ? t * nr : 0, nr);
    Tensor dx(DType::fp32, y.shape());
    kernels::mse_loss_backward(y, target, N, dx);
    plans::block_backward(ctx, layout, bw, keep, bg, dx);
    if (tp > spec.kv_heads) {  // the KV group's replicas sum their Wk, Wv gradients (the trainer's per-step call)
      auto& group = plans::kv_replica_group(env.mesh["tp"], tp / int(spec.kv_heads));
      const double before = env.chip.t;
      env.chip.t = plans::kv_replica_grads_reduce(group, {bg.wk, bg.wv}, "auto", env.chip.t);
      EXPECT_EQ(group.size(), tp / spec.kv_heads) << at0;
      EXPECT_GT(env.chip.t, before) << at0 << ": the reduction is charged on the chip's clock";
    }
    for (auto& [name, g] : sh.g) {
      const bool norm = name.find("norm") != std::string::npos;
      if (norm && !plan.sp && t != 0) continue;
      const std::string key = norm ? name : name + "@" + std::to_string(t);
      if (!sums.count(key)) sums[key] = Tensor(DType::fp32, g.shape());
      Tensor& s = sums[key];
      for (int64_t i = 0; i < g.numel(); ++i) s.set(i, s.get(i) + g.get(i));
    }
  });
  if (nan_input) EXPECT_TRUE(any_nan(cache.x_final)) << at0 << ": the reference's NaN reaches its output";
  if (plan.fused.enabled && !plan.sp) return;
  for (const auto& [name, tensor] : ref_g) {
    if (tensor->rank() == 0) continue;
    const bool norm = std::string(name).find("norm") != std::string::npos;
    for (int t = 0; t < (norm ? 1 : tp); ++t) {
      const std::string key = norm ? name : std::string(name) + "@" + std::to_string(t);
      ASSERT_TRUE(sums.count(key)) << at0 << ": " << key;
      expect_close(sums[key], shard_of(name, *tensor, tp, t, spec), 1e-4, at0 + ": gradient of " + key);
    }
  }
}

class PlanBlock : public ::testing::TestWithParam<BlockCase> {};

TEST_P(PlanBlock, ForwardAndBackwardMatchOneDevice) { run_case(GetParam(), false); }
TEST_P(PlanBlock, NanInputPropagatesAsOnOneDevice) { run_case(GetParam(), true); }

INSTANTIATE_TEST_SUITE_P(Plans, PlanBlock, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<BlockCase>& i) { return i.param.name; });

}  // namespace
}  // namespace shardsim::test

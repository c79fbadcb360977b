// The tensor-parallel unit on its own (sharding/plans/tensor_parallel.h): a column-parallel GEMM feeding a
// row-parallel one (the MLP's W_up, W_down pair), forward and backward, on 1, 2 and 4 simulated chips of this
// process, against the same two GEMMs and their backward on one device. The variants are the registry's units on
// the tp axis (tp, sp, fused, and their combinations the parser accepts): each one's output rows, input gradient
// and weight-gradient shards equal the single device's; a NaN in the input propagates to the same elements.
#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <vector>

#include "common/error.h"
#include "kernels/backward.h"
#include "kernels/embedding.h"
#include "kernels/gemm.h"
#include "sharding/plans/tensor_parallel.h"
#include "tests/unit/plan_unit.h"

namespace shardsim::test {
namespace {

using runtime::DType;
using runtime::Tensor;
using sharding::ParallelPlan;
namespace plans = sharding::plans;

constexpr int64_t kRows = 64, kHidden = 32, kInner = 64;  // the test model's batch x seq, hidden, ffn

struct Reference {
  Tensor x, w1, w2, dy, y, dx, dw1, dw2;
};

// Y = (X·W1)·W2 and its backward from dY on one device.
Reference reference(bool nan_input) {
  Reference r;
  r.x = seeded({kRows, kHidden}, 1);
  if (nan_input) r.x.set(3 * kHidden + 5, std::numeric_limits<float>::quiet_NaN());
  r.w1 = seeded({kHidden, kInner}, 2);
  r.w2 = seeded({kInner, kHidden}, 3);
  r.dy = seeded({kRows, kHidden}, 4);
  Tensor h(DType::fp32, {kRows, kInner});
  r.y = Tensor(DType::fp32, {kRows, kHidden});
  kernels::gemm(r.x, r.w1, h);
  kernels::gemm(h, r.w2, r.y);
  Tensor dh(DType::fp32, {kRows, kInner});
  r.dw2 = Tensor(DType::fp32, {kInner, kHidden});
  kernels::gemm_backward(h, r.w2, r.dy, &dh, &r.dw2);
  r.dx = Tensor(DType::fp32, {kRows, kHidden});
  r.dw1 = Tensor(DType::fp32, {kHidden, kInner});
  kernels::gemm_backward(r.x, r.w1, dh, &r.dx, &r.dw1);
  return r;
}

// The variants: the registry's flag units on the tp axis (sp, fused), every subset the parser accepts at TP: for
// training (forward and backward run), else for the forward mode only (fused without sp: the trainer's fused ops
// are the sequence-parallel rings).
struct Variant {
  std::string par;
  bool backward = true;
};
std::vector<Variant> variants(int tp) {
  std::vector<std::string> flags;
  for (const auto* d : units_on_axis("tp"))
    if (d->size == nullptr) flags.push_back(d->keys.front().name);
  std::vector<Variant> out;
  for (size_t mask = 0; mask < (size_t{1} << flags.size()); ++mask) {
    std::string par = "tp: " + std::to_string(tp);
    for (size_t i = 0; i < flags.size(); ++i)
      if (mask & (size_t{1} << i)) par += ", " + flags[i] + ": true";
    for (bool forward : {false, true}) {
      try {
        (void)parse_plan(par, tp, nullptr, forward);
        out.push_back({par, !forward});
        break;
      } catch (const ConfigError&) {  // a combination the registry refuses (fused or sp at tp 1)
      }
    }
  }
  return out;
}

void run_case(int tp_size, const Variant& variant, bool nan_input) {
  const std::string& par = variant.par;
  sharding::ModelSpec spec;
  const ParallelPlan plan = parse_plan(par, tp_size, &spec, !variant.backward);
  // A unit named in PAR is active, except the tp size unit at tp 1 (one chip: nothing sharded).
  for (const auto* d : units_on_axis("tp"))
    if (par.find(d->keys.front().name + ":") != std::string::npos)
      EXPECT_EQ(d->is_active(plan), d->size == nullptr || tp_size > 1) << par << " " << d->name;
  const Reference ref = reference(nan_input);
  if (nan_input) ASSERT_TRUE(any_nan(ref.y)) << "the reference's NaN input must reach its output";
  const int T = plan.tp;
  const int64_t Fl = kInner / T, Nr = plan.sp ? kRows / T : kRows;
  on_chips(plan, [&](ChipEnv& env) {
    runtime::Transport& tp = env.mesh["tp"];
    const int i = tp.rank();
    plans::PlanContext ctx{spec, plan, tp, tp, env.chip, env.comm, env.fused_ops, kRows, Nr};
    const Tensor w1 = cols(ref.w1, i * Fl, Fl), w2 = ref.w2.rows(i * Fl, Fl);
    const Tensor in = plan.sp ? ref.x.rows(i * Nr, Nr) : ref.x;
    Tensor used;
    const Tensor h = plans::column_parallel(ctx, in, {&w1}, {"gemm.up"}, "before up", "all_gather_gemm.up",
                                            "all_gather_gemm", &used)[0];
    const Tensor y = plans::row_parallel(ctx, h, w2, "gemm.down", "down");
    const std::string at = par + (nan_input ? " (NaN input)" : "") + ", chip " + std::to_string(i);
    expect_close(y, ref.y.rows(plan.sp ? i * Nr : 0, Nr), 1e-5, at + ": output");
    // The NaN of input row 3 reaches the output rows this chip holds exactly where one device has it (every row 3
    // element; with sp only the chip holding row 3): expect_close compared the positions, this checks there is one.
    if (nan_input) EXPECT_EQ(any_nan(y), any_nan(ref.y.rows(plan.sp ? i * Nr : 0, Nr))) << at;
    // The unit's collectives ran (none at tp 1).
    EXPECT_EQ(!env.comm.stats.empty() || !env.fused_ops.empty(), T > 1) << at;
    if (!variant.backward) return;
    // Backward: dY on this chip's residual rows.
    const Tensor dy = plan.sp ? ref.dy.rows(i * Nr, Nr) : ref.dy;
    Tensor dh(DType::fp32, {kRows, Fl}), dw2(DType::fp32, {Fl, kHidden}), dw1(DType::fp32, {kHidden, Fl});
    plans::row_parallel_backward(ctx, h, w2, dy, dh, dw2, "down");
    const Tensor dx = plans::column_parallel_backward(ctx, used, {&w1}, {&dh}, {&dw1}, "up");
    expect_close(dx, ref.dx.rows(plan.sp ? i * Nr : 0, Nr), 1e-5, at + ": input gradient");
    expect_close(dw1, cols(ref.dw1, i * Fl, Fl), 1e-5, at + ": W_up gradient shard");
    expect_close(dw2, ref.dw2.rows(i * Fl, Fl), 1e-5, at + ": W_down gradient shard");
  });
}

class PlanTp : public ::testing::TestWithParam<int> {};

TEST_P(PlanTp, ForwardAndBackwardMatchOneDevice) {
  const auto v = variants(GetParam());
  ASSERT_FALSE(v.empty());
  // At tp > 1 every subset of the tp axis's flag units runs (in one mode or the other).
  if (GetParam() > 1) EXPECT_EQ(v.size(), size_t{1} << (units_on_axis("tp").size() - 1)) << "every tp-axis variant";
  for (const auto& variant : v) run_case(GetParam(), variant, false);
}

TEST_P(PlanTp, NanInputPropagatesAsOnOneDevice) {
  for (const auto& variant : variants(GetParam())) run_case(GetParam(), variant, true);
}

// The vocab-parallel embedding (vocab_parallel_embedding and its backward): each chip's shard of a 64-row table
// looked up for 64 seeded token ids and summed over tp equals one device's lookup (the chip's rows with sp), and
// the backward's table-shard gradient equals one device's rows of it. Exact: one nonzero addend per element.
TEST_P(PlanTp, VocabParallelEmbeddingMatchesOneDevice) {
  const int tp = GetParam();
  for (const bool sp : {false, true}) {
    if (sp && tp == 1) continue;  // the registry refuses sp at tp 1
    const std::string par = "tp: " + std::to_string(tp) + (sp ? ", sp: true" : "");
    sharding::ModelSpec spec;
    const ParallelPlan plan = parse_plan(par, tp, &spec);
    const int64_t V = spec.vocab, Vl = V / tp, Nr = sp ? kRows / tp : kRows;
    const Tensor table = seeded({V, kHidden}, 31), dy = seeded({kRows, kHidden}, 32);
    std::vector<int64_t> tokens(size_t{kRows});
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int64_t((i * 37 + 5) % size_t(V));
    Tensor y(DType::fp32, {kRows, kHidden}), dtable(DType::fp32, {V, kHidden});
    (void)kernels::embedding_forward(table, tokens, 0, V, y);
    (void)kernels::embedding_backward(dy, tokens, 0, V, dtable);
    on_chips(plan, [&](ChipEnv& env) {
      runtime::Transport& group = env.mesh["tp"];
      const int i = group.rank();
      plans::PlanContext ctx{spec, plan, group, group, env.chip, env.comm, env.fused_ops, kRows, Nr};
      const Tensor out = plans::vocab_parallel_embedding(ctx, table.rows(i * Vl, Vl), tokens, i * Vl, V,
                                                         Tensor(DType::fp32, {kRows, kHidden}));
      const std::string at = par + ", chip " + std::to_string(i);
      expect_close(out, y.rows(sp ? i * Nr : 0, Nr), 1e-12, at + ": embedded rows");
      Tensor dshard(DType::fp32, {Vl, kHidden});
      plans::vocab_parallel_embedding_backward(env.chip, dy, tokens, i * Vl, V, dshard);
      expect_close(dshard, dtable.rows(i * Vl, Vl), 1e-12, at + ": table-shard gradient");
      EXPECT_EQ(env.comm.stats.count(sp ? "sp reduce_scatter" : "tp all_reduce"), size_t(tp > 1)) << at;
    });
  }
}

INSTANTIATE_TEST_SUITE_P(Chips, PlanTp, ::testing::Values(1, 2, 4),
                         [](const ::testing::TestParamInfo<int>& i) { return "tp" + std::to_string(i.param); });

}  // namespace
}  // namespace shardsim::test

// The Ulysses unit on its own (sharding/plans/ulysses.h): the all_to_all attention forward and backward on 1, 2 and
// 4 simulated chips of this process (the registry's ulysses size on the cp axis), causal and not, against the flash
// attention of whole sequences on one device: each chip's output and dQ / dK / dV rows equal the single device's
// rows at the tokens it holds, the four all_to_alls ran, and a NaN key reaches the same elements as on one device.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "sharding/plans/ulysses.h"
#include "tests/unit/plan_unit.h"

namespace shardsim::test {
namespace {

using runtime::DType;
using runtime::Tensor;
using sharding::ParallelPlan;
namespace plans = sharding::plans;

void run_case(int u, bool causal, bool nan_key) {
  sharding::ModelSpec spec;
  const ParallelPlan plan = parse_plan("ulysses: " + std::to_string(u), u, &spec);
  const auto* d = plans::find_plan("ulysses");
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->axis, "cp");
  EXPECT_EQ(d->is_active(plan), u > 1);
  spec.causal = causal;
  const AttentionReference ref = attention_reference(spec, nan_key);
  on_chips(plan, [&](ChipEnv& env) {
    runtime::Transport& group = env.mesh[d->axis];
    const int c = group.rank();
    const plans::TokenLayout layout = plans::token_layout(spec.seq, spec.batch, u, c, false);
    const int64_t n = layout.batch * layout.seq_local;
    plans::PlanContext ctx{spec, plan, env.mesh["tp"], group, env.chip, env.comm, env.fused_ops, n, n};
    Tensor q = layout_rows(ref.q, layout, spec.seq), k = layout_rows(ref.k, layout, spec.seq),
           v = layout_rows(ref.v, layout, spec.seq);
    const Tensor dout = layout_rows(ref.dout, layout, spec.seq);
    std::vector<Tensor> lse;
    Tensor o_heads;
    const Tensor o = plans::ulysses_attention_forward(ctx, layout, q, k, v, lse, &o_heads);
    const std::string at = "ulysses " + std::to_string(u) + (causal ? " causal" : " full") +
                           (nan_key ? " (NaN key)" : "") + ", chip " + std::to_string(c);
    expect_close(o, layout_rows(ref.o, layout, spec.seq), 1e-5, at + ": output");
    Tensor dq(DType::fp32, {n, spec.heads, spec.head_dim}), dk(DType::fp32, {n, spec.kv_heads, spec.head_dim}),
        dv(DType::fp32, {n, spec.kv_heads, spec.head_dim});
    plans::ulysses_attention_backward(ctx, layout, q, k, v, o_heads, lse, dout, dq, dk, dv);
    expect_close(dq, layout_rows(ref.dq, layout, spec.seq), 1e-5, at + ": dQ");
    expect_close(dk, layout_rows(ref.dk, layout, spec.seq), 1e-5, at + ": dK");
    expect_close(dv, layout_rows(ref.dv, layout, spec.seq), 1e-5, at + ": dV");
    if (u > 1) EXPECT_EQ(env.comm.stats["ulysses all_to_all"].calls, 4) << at << ": q, k, v to heads and o back";
  });
  if (nan_key) EXPECT_TRUE(any_nan(ref.o)) << "the reference's NaN key must reach some output";
}

class PlanUlysses : public ::testing::TestWithParam<int> {};

TEST_P(PlanUlysses, ForwardAndBackwardMatchOneDevice) {
  for (bool causal : {true, false}) run_case(GetParam(), causal, false);
}

TEST_P(PlanUlysses, NanKeyPropagatesAsOnOneDevice) { run_case(GetParam(), true, true); }

INSTANTIATE_TEST_SUITE_P(Chips, PlanUlysses, ::testing::Values(1, 2, 4),
                         [](const ::testing::TestParamInfo<int>& i) { return "u" + std::to_string(i.param); });

}  // namespace
}  // namespace shardsim::test

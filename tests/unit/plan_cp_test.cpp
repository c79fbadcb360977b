// The context-parallel unit on its own (sharding/plans/context_parallel.h): ring attention forward and backward on
// 1, 2 and 4 simulated chips of this process, for every split the registry's cp_split key accepts (zigzag,
// contiguous; the causal mask, the only one the registry lets cp run), against the flash attention of whole
// sequences on one device: each chip's output and dQ / dK / dV rows equal the single device's rows at the tokens
// it holds, and a NaN key (at position 0, which every query sees) reaches the same elements as on one device.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "sharding/plans/context_parallel.h"
#include "tests/unit/plan_unit.h"

namespace shardsim::test {
namespace {

using runtime::DType;
using runtime::Tensor;
using sharding::ParallelPlan;
namespace plans = sharding::plans;

// The cp unit's splits, as its registry key lists them ("zigzag | contiguous").
std::vector<std::string> splits() {
  const auto* d = plans::find_plan("cp");
  EXPECT_NE(d, nullptr);
  const auto* k = d ? d->key("cp_split") : nullptr;
  EXPECT_NE(k, nullptr);
  std::vector<std::string> v;
  if (!k) return v;
  for (size_t at = 0; at <= k->values.size();) {
    const size_t bar = k->values.find(" | ", at);
    v.push_back(k->values.substr(at, bar == std::string::npos ? std::string::npos : bar - at));
    if (bar == std::string::npos) break;
    at = bar + 3;
  }
  return v;
}

void run_case(int cp, const std::string& split, bool nan_key) {
  sharding::ModelSpec spec;
  // cp_split at cp 1 is refused (a bad case of the registry's): one chip holds the whole sequence.
  const ParallelPlan plan =
      parse_plan("cp: " + std::to_string(cp) + (cp > 1 ? ", cp_split: " + split : std::string()), cp, &spec);
  if (cp > 1) {
    EXPECT_TRUE(plans::find_plan("cp")->is_active(plan));
    EXPECT_EQ(plan.zigzag, split == "zigzag");
  }
  ASSERT_TRUE(spec.causal);
  // The NaN key at position 0: the ring splits the sequence into other tiles than one device (plan_unit.h).
  const AttentionReference ref = attention_reference(spec, nan_key, 0);
  on_chips(plan, [&](ChipEnv& env) {
    runtime::Transport& group = env.mesh["cp"];
    const int c = group.rank();
    const plans::TokenLayout layout = plans::token_layout(spec.seq, spec.batch, cp, c, plan.zigzag);
    const plans::SeqShard shard{spec.batch, layout.seq_local, spec.heads, spec.kv_heads, spec.head_dim, DType::fp32};
    plans::CpRing ring{group, plan.zigzag, spec.seq, true, &env.comm};
    const Tensor q = layout_rows(ref.q, layout, spec.seq), k = layout_rows(ref.k, layout, spec.seq),
                 v = layout_rows(ref.v, layout, spec.seq), dout = layout_rows(ref.dout, layout, spec.seq);
    std::vector<Tensor> lse;
    const Tensor o = plans::ring_attention_forward(ring, shard, q, k, v, lse, env.chip);
    const std::string at =
        "cp " + std::to_string(cp) + " " + split + (nan_key ? " (NaN key)" : "") + ", chip " + std::to_string(c);
    expect_close(o, layout_rows(ref.o, layout, spec.seq), 1e-5, at + ": output");
    Tensor dq, dk, dv;
    plans::ring_attention_backward(ring, shard, q, k, v, o, lse, dout, dq, dk, dv, env.chip);
    expect_close(dq, layout_rows(ref.dq, layout, spec.seq), 1e-4, at + ": dQ");
    expect_close(dk, layout_rows(ref.dk, layout, spec.seq), 1e-4, at + ": dK");
    expect_close(dv, layout_rows(ref.dv, layout, spec.seq), 1e-4, at + ": dV");
    if (cp > 1) EXPECT_GT(env.comm.stats["cp ring K/V"].bytes, 0) << at << ": the K/V blocks travel the ring";
  });
  if (nan_key) EXPECT_TRUE(any_nan(ref.o)) << "the reference's NaN key must reach some output";
}

class PlanCp : public ::testing::TestWithParam<int> {};

TEST_P(PlanCp, ForwardAndBackwardMatchOneDevice) {
  const auto v = splits();
  ASSERT_EQ(v.size(), 2u);
  for (const auto& split : v) run_case(GetParam(), split, false);
}

TEST_P(PlanCp, NanKeyPropagatesAsOnOneDevice) {
  for (const auto& split : splits()) run_case(GetParam(), split, true);
}

INSTANTIATE_TEST_SUITE_P(Chips, PlanCp, ::testing::Values(1, 2, 4),
                         [](const ::testing::TestParamInfo<int>& i) { return "cp" + std::to_string(i.param); });

}  // namespace
}  // namespace shardsim::test

// The data-parallel unit on its own (sharding/plans/data_parallel.h): one training step of a model of four
// parameters in three units on 1, 2 and 4 simulated replicas of this process, every ZeRO stage the registry's zero
// key accepts (0..3), with one bucket and with several (bucket_bytes 0 and 256), against one device: AdamW on the
// replicas' mean gradient. Each replica's gathered master weights and moments equal the single device's, the
// replicas' norm pieces sum to the mean gradient's squared norm (every element counted once, padding included
// or not), and a NaN in one replica's gradient reaches the same elements as on one device.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "kernels/optimizer.h"
#include "sharding/plans/data_parallel.h"
#include "tests/unit/plan_unit.h"

namespace shardsim::test {
namespace {

using runtime::DType;
using runtime::Tensor;
using sharding::ParallelPlan;
namespace plans = sharding::plans;

// (unit, elements): unit 0 one parameter, unit 1 two, unit 2 one (sizes not multiples of the 64-element alignment).
const std::vector<std::pair<int, int64_t>> kParams = {{0, 100}, {1, 37}, {1, 64}, {2, 50}};
constexpr int kUnits = 3;
const kernels::AdamWConfig kAdam{.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.01f};

Tensor gradient(int replica, size_t param, bool nan) {
  Tensor g = seeded({kParams[param].second}, 100 + 10 * uint32_t(replica) + uint32_t(param));
  if (nan && replica == 0 && param == 2) g.set(7, std::numeric_limits<float>::quiet_NaN());
  return g;
}

// The ZeRO stages of the registry's zero key ("0..3").
std::vector<int> stages() {
  const auto* d = plans::find_plan("dp");
  const auto* k = d ? d->key("zero") : nullptr;
  EXPECT_NE(k, nullptr);
  std::vector<int> v;
  if (k && k->values.size() == 4 && k->values.substr(1, 2) == "..")
    for (int z = k->values[0] - '0'; z <= k->values[3] - '0'; ++z) v.push_back(z);
  EXPECT_EQ(v.size(), 4u) << (k ? k->values : "");
  return v;
}

void run_case(int dp, int zero, int64_t bucket_bytes, bool nan) {
  const ParallelPlan plan = parse_plan("dp: " + std::to_string(dp) + ", zero: " + std::to_string(zero) +
                                           ", bucket_bytes: " + std::to_string(bucket_bytes),
                                       dp);
  ASSERT_EQ(plan.zero, zero);
  // One device: AdamW on the mean gradient from the same master (seeded), zero moments.
  std::vector<Tensor> master, m, v;
  double sq_ref = 0;
  for (size_t i = 0; i < kParams.size(); ++i) {
    master.push_back(seeded({kParams[i].second}, 50 + uint32_t(i)));
    Tensor mean(DType::fp32, {kParams[i].second});
    for (int r = 0; r < dp; ++r) {
      const Tensor g = gradient(r, i, nan);
      for (int64_t e = 0; e < mean.numel(); ++e) mean.set(e, mean.get(e) + g.get(e));
    }
    for (int64_t e = 0; e < mean.numel(); ++e) {
      mean.set(e, mean.get(e) / float(dp));
      sq_ref += double(mean.get(e)) * mean.get(e);
    }
    m.emplace_back(DType::fp32, runtime::Shape{kParams[i].second});
    v.emplace_back(DType::fp32, runtime::Shape{kParams[i].second});
    Tensor p = master.back();
    kernels::adamw_step(p, m.back(), v.back(), mean, 1, kAdam);
    master.back() = p;
  }
  std::vector<double> pieces(size_t(dp), 0.0);
  const std::string at = "dp " + std::to_string(dp) + " zero " + std::to_string(zero) + " bucket_bytes " +
                         std::to_string(bucket_bytes) + (nan ? " (NaN gradient)" : "");
  on_chips(plan, [&](ChipEnv& env) {
    runtime::Transport& replicas = env.mesh["dp"];
    const int r = replicas.rank();
    std::vector<plans::DpParam> params;
    for (const auto& [unit, n] : kParams) params.push_back({unit, size_t(n)});
    plans::ZeroConfig zc{plan.zero, plan.bucket_bytes, "auto", false, false};
    plans::DataParallel data(params, kUnits, zc, replicas, DType::fp32, true);
    std::vector<Tensor> w0, work, grads;
    for (size_t i = 0; i < kParams.size(); ++i) {
      w0.push_back(seeded({kParams[i].second}, 50 + uint32_t(i)));
      work.push_back(w0.back());
      grads.push_back(gradient(r, i, nan));
    }
    auto refs = [](std::vector<Tensor>& ts) {
      plans::TensorRefs out;
      for (auto& t : ts) out.push_back(&t);
      return out;
    };
    const plans::TensorRefs work_refs = refs(work);
    data.load(refs(w0), nullptr, nullptr, work_refs);
    data.begin_step();
    sim::TimeNs t = 0;
    for (int u = 0; u < kUnits; ++u) t = data.begin_forward(u, work_refs, t);
    for (int u = kUnits - 1; u >= 0; --u) {
      t = data.begin_backward(u, work_refs, t);
      data.grads_ready(u, t);
    }
    double sq = 0;
    t = data.reduce_gradients(refs(grads), sq, t);
    pieces[size_t(r)] = sq;
    (void)data.optimizer_step(1, kAdam, 1.0f);
    data.publish(work_refs, t);
    if (bucket_bytes == 0) EXPECT_EQ(data.buckets(), zero == 3 ? kUnits : 1) << at;
    for (auto [field, want] : {std::pair{plans::DataParallel::Field::master, &master},
                               std::pair{plans::DataParallel::Field::m, &m}, std::pair{plans::DataParallel::Field::v, &v}}) {
      std::vector<Tensor> got;
      for (const auto& [unit, n] : kParams) got.emplace_back(DType::fp32, runtime::Shape{n});
      data.gather_state(field, refs(got));
      for (size_t i = 0; i < kParams.size(); ++i)
        expect_close(got[i], (*want)[i], 1e-5, at + ", replica " + std::to_string(r) + ", parameter " + std::to_string(i));
    }
  });
  double sq = 0;
  for (double p : pieces) sq += p;
  if (nan) EXPECT_TRUE(std::isnan(sq)) << at;
  // fp32 gradients averaged in another order (the reduction's): the squares agree to fp32 rounding, 1e-6 relative;
  // an element counted twice or missed moves it by far more (251 squares of ~0.09 on average make the ~21.7).
  else EXPECT_NEAR(sq, sq_ref, 1e-6 * sq_ref) << at << ": each element's square counted once over the replicas";
}

class PlanDp : public ::testing::TestWithParam<int> {};

TEST_P(PlanDp, StepMatchesOneDeviceAtEveryZeroStage) {
  for (int zero : stages())
    for (int64_t bucket_bytes : {0, 256}) run_case(GetParam(), zero, bucket_bytes, false);
}

TEST_P(PlanDp, NanGradientPropagatesAsOnOneDevice) {
  for (int zero : stages()) run_case(GetParam(), zero, 256, true);
}

INSTANTIATE_TEST_SUITE_P(Chips, PlanDp, ::testing::Values(1, 2, 4),
                         [](const ::testing::TestParamInfo<int>& i) { return "dp" + std::to_string(i.param); });

}  // namespace
}  // namespace shardsim::test

// Kernels a training step issues as Megatron-LM and Apex issue them (timing only: the values never change):
//  - FusedAdam steps each parameter group with its own multi_tensor_apply: Megatron's weight-decay group and its
//    no-decay group (1-D tensors: norms, biases; megatron/core/optimizer get_param_groups), so a model with norm
//    weights pays the launches of both (sharding/plans/data_parallel.h, optimizer_step);
//  - the gradient clip is not a kernel of its own: Megatron scales with a multi_tensor_scale only when the norm
//    exceeds the limit (clip_grads.py: `if clip_coeff < 1.0`), a value a shape-only run does not have, so the
//    scaling stays inside AdamW and a clipped step costs what an unclipped one does.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kernels/optimizer.h"
#include "models/lm_tp.h"
#include "mpi_util.h"
#include "runtime/chips.h"
#include "runtime/world.h"
#include "sim/device_spec.h"
#include "tests/unit/small_lm.h"
#include "topology/topology.h"

using namespace shardsim;

namespace {

struct OptimizerKernels {
  int adamw = 0, scale = 0, norm = 0;
  std::vector<double> losses;
  double step_ns = 0;
};

// Two steps of the small Llama model on two chips of the a100 preset (dp 2, fp32, no ZeRO: each chip steps every
// parameter) with MAX_GRAD_NORM: chip 0's optimizer and clip kernels of the last step, and the losses.
OptimizerKernels optimizer_kernels(double max_grad_norm) {
  OptimizerKernels out;
  const int code = runtime::run_chips(2, [&](const runtime::World& w) {
    const sharding::ModelSpec c = test::small_lm();
    auto topo = topology::Topology::ring(2, topology::LinkSpec{100, 1000});
    sharding::DeviceMesh mesh({{"tp", 1}, {"cp", 1}, {"dp", 2}, {"pp", 1}}, topo);
    sim::Timeline tl(mesh.placement()[size_t(w.rank())], topo, sim::device_preset("a100"));
    runtime::Transport t(w, tl, mesh.placement());
    mesh.bind(t);
    models::LmTrainConfig train{.steps = 2};
    train.max_grad_norm = max_grad_norm;
    models::LmTpTrainer tr(c, train, mesh, t, tl, models::LmDpConfig{});
    for (int i = 0; i < 2; ++i) {
      const auto r = tr.step();
      if (w.rank() == 0) out.losses.push_back(r.loss), out.step_ns = r.breakdown.total;
    }
    if (w.rank() != 0) return 0;
    for (const auto& e : tl.events()) {
      out.adamw += e.name == "adamw";
      out.scale += e.name == "multi_tensor_scale";
      out.norm += e.name == "multi_tensor_l2norm";
    }
    return 0;
  });
  EXPECT_EQ(code, 0);
  return out;
}

}  // namespace

// The small model's 2-D weights (16 tensors) fit one Adam launch and its norm weights (5) another: two launches,
// where one list of all 21 would be one; the gradient norm stays one multi_tensor_l2norm over all of them.
TEST(IssueOrder, FusedAdamLaunchesOncePerParameterGroup) {
  if (world_size() != 1) GTEST_SKIP() << "one rank hosting 2 chips";
  const OptimizerKernels k = optimizer_kernels(1e9);
  EXPECT_EQ(k.adamw, 2);
  EXPECT_EQ(k.norm, 1);
  EXPECT_EQ(kernels::multi_tensor_launches(std::vector<int64_t>(21, 256), 4).size(), 1u);
}

// A clipped step (its values scaled) issues the same kernels as an unclipped one: no multi_tensor_scale.
TEST(IssueOrder, GradientClipIssuesNoKernelOfItsOwn) {
  if (world_size() != 1) GTEST_SKIP() << "one rank hosting 2 chips";
  const OptimizerKernels clipped = optimizer_kernels(1e-6), loose = optimizer_kernels(1e9);
  EXPECT_NE(clipped.losses.back(), loose.losses.back());  // the clip changed the update
  EXPECT_EQ(clipped.scale, 0);
  EXPECT_EQ(clipped.adamw, loose.adamw);
  EXPECT_EQ(clipped.step_ns, loose.step_ns);
}

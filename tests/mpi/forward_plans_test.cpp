// The one executor's forward mode (`shardsim run`: models/lm_tp.h's LmTpTrainer::forward_step with the plan units
// of sharding/plans/) on a transformer block under every parallel plan and their compositions on the device mesh,
// on real ranks: each plan's output rows equal the single-device forward's (models/lm_model.h's lm_forward, the
// reference `run` validates against), every collective's bytes equal its formula, and the mesh's sub-groups are the
// ranks its coordinates say. The training mode of the same plans: tests/mpi/train_plans_test.cpp. Plans whose mesh
// does not fit the job's rank count are skipped (the suite runs at 1, 2, 3, 4 and 8 ranks).
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>

#include "common/config.h"
#include "models/lm_data.h"
#include "models/lm_model.h"
#include "models/lm_tp.h"
#include "models/lm_validate.h"
#include "runtime/world.h"
#include "sharding/device_mesh.h"
#include "sharding/engine_config.h"
#include "sharding/model_spec.h"
#include "sim/device_spec.h"

using namespace shardsim;

namespace {

int world_size() {
  int p = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &p);
  return p;
}

// A small GQA block (8 query heads, 4 KV heads, head_dim 8) on TOPOLOGY under PLAN (YAML lines of parallel:),
// through the parsers the executor's loader calls (apps/train_setup.cpp's load, forward mode).
struct Forward {
  topology::Topology topology;
  sharding::ModelSpec spec;
  sharding::ParallelPlan plan;
};
Forward block(const std::string& topology, const std::string& plan, int kv_heads = 4) {
  const std::string text = "name: plans-test\ntopology: " + topology +
                           "\ndevice: generic\n"
                           "model:\n  kind: transformer_block\n  hidden: 64\n  heads: 8\n  kv_heads: " +
                           std::to_string(kv_heads) + "\n  ffn: 88\n  seq: 32\n  seed: 3\nparallel:\n" + plan;
  const ConfigNode root = sharding::workload_config_from_text(text, "plans_test.yaml");
  Forward f;
  f.topology = sharding::load_workload_topology(root);
  f.spec = sharding::parse_model_spec(root.child("workload"), sharding::SpecUse::train);
  f.plan = sharding::parse_parallel_plan(root, f.spec, sharding::SpecUse::train, f.topology.num_chips(), false, true);
  if (f.spec.batch == 0) f.spec.batch = f.plan.dp;  // one sequence per replica (the loader's rule)
  return f;
}

std::string ring(int chips) {
  return "{kind: ring, chips: " + std::to_string(chips) + ", bandwidth_gbps: 100, latency_ns: 500}";
}

struct PlanCase {
  std::string name;
  int chips;
  std::string topology;  // empty: a ring of CHIPS
  std::string plan;
  int kv_heads = 4;
};

class BlockPlans : public ::testing::TestWithParam<PlanCase> {};

TEST_P(BlockPlans, MatchesOneDeviceAndFormulas) {
  const PlanCase& c = GetParam();
  if (world_size() != c.chips) GTEST_SKIP() << "needs " << c.chips << " ranks";
  const runtime::World world;
  const Forward f = block(c.topology.empty() ? ring(c.chips) : c.topology, c.plan, c.kv_heads);
  const sharding::ModelSpec& lm = f.spec;
  sharding::DeviceMesh mesh = sharding::build_mesh(f.plan, f.topology);
  sim::Timeline tl(mesh.placement().at(size_t(world.rank())), f.topology, sim::device_preset("generic"));
  runtime::Transport t(world, tl, mesh.placement());
  t.set_plan_algorithms(true);
  mesh.bind(t);
  models::LmDpConfig dp;
  dp.forward_only = true;
  dp.fused_chunks = f.plan.fused.chunks;
  const bool ulysses = f.plan.ulysses > 1;
  const models::LmTrainConfig train{};
  std::optional<models::LmTpTrainer> tr;
  tr.emplace(lm, train, mesh, t, tl, dp, f.plan.sp, f.plan.zigzag && !ulysses, ulysses, f.plan.fused.enabled);
  const auto step = tr->forward_step();
  double end = step.breakdown.total;
  MPI_Allreduce(MPI_IN_PLACE, &end, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  EXPECT_GT(end, 0) << c.name;
  for (const auto& [k, s] : tr->comm().stats)
    EXPECT_NEAR(s.bytes, s.expected, 1e-9 * std::max(1.0, s.expected)) << c.name << ": " << k;
  int comms = tr->comm().stats.empty() ? 0 : 1;
  MPI_Allreduce(MPI_IN_PLACE, &comms, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (c.chips > 1) EXPECT_EQ(comms, 1) << c.name;
  const auto& out = tr->forward_output();
  const models::GatheredRows rows = models::gather_owner_rows(world, out.owner, out.rows, out.out, lm.hidden);
  int ok = 0;
  if (world.rank() == 0) {
    models::LmCache cache;
    (void)models::lm_forward(lm, models::lm_init(lm), models::lm_synthetic_batch(lm, train.data_seed, 0), &cache);
    const models::RowCheck check = models::check_rows(rows, cache.x_final, 1e-4);
    EXPECT_TRUE(check.passed) << c.name << ": relative error " << check.relative_error;
    ok = check.passed ? 1 : 0;
  }
  MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
  EXPECT_TRUE(ok) << c.name;
  EXPECT_NE(mesh.mapping_text().find(mesh.describe()), std::string::npos) << mesh.mapping_text();
}

const std::string kTorus24 = "{kind: torus, dims: [2, 4], bandwidth_gbps: 100, latency_ns: 500}";

INSTANTIATE_TEST_SUITE_P(
    Plans, BlockPlans,
    ::testing::Values(
        PlanCase{"one_device", 1, "", "  tp: 1\n"}, PlanCase{"tp2", 2, "", "  tp: 2\n"},
        PlanCase{"cp2", 2, "", "  cp: 2\n"}, PlanCase{"ulysses2", 2, "", "  ulysses: 2\n"},
        PlanCase{"tp4", 4, "", "  tp: 4\n"}, PlanCase{"tp4_sp", 4, "", "  tp: 4\n  sp: true\n"},
        PlanCase{"tp4_fused", 4, "", "  tp: 4\n  fused: true\n"},
        PlanCase{"tp4_sp_fused", 4, "", "  tp: 4\n  sp: true\n  fused: true\n"},
        PlanCase{"cp4_zigzag", 4, "", "  cp: 4\n"},
        PlanCase{"cp4_contiguous", 4, "", "  cp: 4\n  cp_split: contiguous\n"},
        PlanCase{"ulysses4", 4, "", "  ulysses: 4\n"}, PlanCase{"tp2_cp2", 4, "", "  tp: 2\n  cp: 2\n"},
        PlanCase{"tp2_sp_cp2", 4, "", "  tp: 2\n  sp: true\n  cp: 2\n"},
        PlanCase{"tp2_ulysses2", 4, "", "  tp: 2\n  ulysses: 2\n"},
        PlanCase{"tp2_ulysses2_fused", 4, "", "  tp: 2\n  ulysses: 2\n  fused: true\n"},
        PlanCase{"tp2_dp2", 4, "", "  tp: 2\n  dp: 2\n"}, PlanCase{"ulysses2_dp2", 4, "", "  ulysses: 2\n  dp: 2\n"},
        PlanCase{"tp4_sp_dp2", 8, "", "  tp: 4\n  sp: true\n  dp: 2\n"},
        PlanCase{"tp2_cp2_dp2_torus", 8, kTorus24, "  tp: 2\n  cp: 2\n  dp: 2\n"},
        PlanCase{"tp8_kv_replicated", 8, "", "  tp: 8\n"},
        PlanCase{"tp2_ulysses4_mha", 8, "", "  tp: 2\n  ulysses: 4\n", 8},
        PlanCase{"tp2_sp_cp4_torus", 8, kTorus24, "  tp: 2\n  sp: true\n  cp: 4\n"},
        PlanCase{"tp2_cp4_torus_mesh_dims", 8, kTorus24, "  tp: 2\n  cp: 4\n  mesh_dims: [1, 0]\n"}),
    [](const auto& info) { return info.param.name; });

// mesh["tp"] and mesh["cp"] are the ranks that share the other coordinate, ordered by their own coordinate.
TEST(DeviceMeshGroups, SubGroupsFollowCoordinates) {
  const int p = world_size();
  if (p != 4 && p != 8) GTEST_SKIP() << "needs 4 or 8 ranks";
  const runtime::World world;
  auto topo = topology::Topology::ring(p, topology::LinkSpec{100, 500});
  sharding::DeviceMesh mesh({{"tp", 2}, {"cp", p / 2}}, topo);
  sim::Timeline tl(world.rank(), topo, sim::device_preset("generic"));
  runtime::Transport t(MPI_COMM_WORLD, tl, mesh.placement());
  mesh.bind(t);
  const int r = world.rank();
  EXPECT_EQ(mesh["tp"].size(), 2);
  EXPECT_EQ(mesh["tp"].rank(), mesh.coordinate("tp", r));
  EXPECT_EQ(mesh["cp"].size(), p / 2);
  EXPECT_EQ(mesh["cp"].rank(), mesh.coordinate("cp", r));
  // The members of my tp group: exchange mesh ranks over it.
  int mine = r, other = -1;
  MPI_Comm tp_comm = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, r - mesh.coordinate("tp", r), r, &tp_comm);
  MPI_Allreduce(&mine, &other, 1, MPI_INT, MPI_SUM, tp_comm);
  EXPECT_EQ(other, 2 * (r - mesh.coordinate("tp", r)) + 1);  // ranks 2k and 2k+1
  MPI_Comm_free(&tp_comm);
}

}  // namespace

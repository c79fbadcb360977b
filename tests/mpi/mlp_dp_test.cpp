// The MLP workload through the one runner (models/runner.h's run_model, the MLP as a layer stack without
// attention) with data parallelism: tp x dp over every rank, validated on rank 0 against one device running the dp
// sequences of tokens one after the other; a checkpoint written under tp x dp resumes bit-identically.
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "common/error.h"
#include "mpi/mpi_util.h"
#include "models/runner.h"
#include "runtime/world.h"
#include "sharding/engine_config.h"

using namespace shardsim;

namespace {

// FFN 200 splits unevenly over 3 and 8 tp shards; tokens 16 per replica.
sharding::ModelConfig mlp_config(int chips, int tp, int dp) {
  const std::string text = "name: mlp-dp-test\ntopology: {kind: ring, chips: " + std::to_string(chips) +
                           ", bandwidth_gbps: 100, latency_ns: 500}\ndevice: generic\n"
                           "model:\n  kind: mlp\n  hidden: 64\n  ffn: 200\n  tokens: 16\n  seed: 11\n"
                           "parallel:\n  tp: " + std::to_string(tp) + "\n  dp: " + std::to_string(dp) +
                           "\n  algorithm: ring\n";  // the byte formula below is the ring's
  return sharding::parse_model_config(sharding::workload_config_from_text(text, "mlp_dp_test.yaml"));
}

bool everywhere(bool mine) {
  int v = mine ? 1 : 0, all = 0;
  MPI_Allreduce(&v, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return all == 1;
}

}  // namespace

TEST(MlpDataParallel, EveryTpDpSplitMatchesOneDevice) {
  const int p = world_size();
  const runtime::World world;
  for (int dp = 1; dp <= p; ++dp) {
    if (p % dp != 0) continue;
    const int tp = p / dp;
    const auto cfg = mlp_config(p, tp, dp);
    ASSERT_EQ(cfg.block.plan.dp, dp);
    ASSERT_FALSE(cfg.block.shape.attention);
    sharding::RunOptions no_ckpt;
    no_ckpt.no_checkpoint = true;
    const auto rep = sharding::run_model(world, cfg, no_ckpt);
    // The verdict reaches every rank (run's exit code).
    EXPECT_TRUE(everywhere(rep.validated && rep.passed)) << "tp=" << tp << " dp=" << dp;
    if (world.rank() != 0) continue;
    EXPECT_LE(rep.relative_error, 1e-5);
    EXPECT_EQ(rep.per_chip.size(), static_cast<size_t>(p));
    EXPECT_EQ(rep.plan.find("dp=") != std::string::npos, dp > 1) << rep.plan;
    // A forward has no dp communication: only the tp all_reduce of each replica, 2(tp-1)/tp of the output.
    if (tp == 1) {
      EXPECT_TRUE(rep.comm.empty());
      EXPECT_EQ(rep.critical.communication, 0.0);
    } else {
      ASSERT_EQ(rep.comm.count("tp all_reduce"), 1u);
      const auto& c = rep.comm.at("tp all_reduce");
      EXPECT_EQ(c.calls, 1);
      EXPECT_DOUBLE_EQ(c.expected, 2.0 * (tp - 1) / tp * 16 * 64 * 4);
      EXPECT_NEAR(c.bytes, c.expected, 64.0 * tp);  // ring chunks round to whole elements
    }
    // dp sequences of 16 tokens in the simulated time of one replica.
    EXPECT_DOUBLE_EQ(rep.tokens_per_s, 16.0 * dp / rep.critical.total * 1e9);
    EXPECT_GT(rep.single_device_ns, 0.0);
  }
}

TEST(MlpDataParallel, CheckpointUnderTpDpResumesBitIdentically) {
  const int p = world_size();
  if (p % 2 != 0) GTEST_SKIP() << "needs an even rank count";
  const runtime::World world;
  int pid = static_cast<int>(::getpid());
  MPI_Bcast(&pid, 1, MPI_INT, 0, MPI_COMM_WORLD);
  const std::string path = "/tmp/shardsim_test_" + std::to_string(pid) + "_mlp_dp.h5";
  const auto cfg = mlp_config(p, p / 2, 2);
  sharding::RunOptions save;
  save.checkpoint_path = path;
  const auto first = sharding::run_model(world, cfg, save);
  EXPECT_TRUE(everywhere(first.passed));
  sharding::RunOptions resume;
  resume.resume_from = path;
  resume.no_checkpoint = true;
  const auto again = sharding::run_model(world, cfg, resume);
  EXPECT_TRUE(everywhere(again.passed && again.resume_compared && again.resume_same_layout && again.resume_bit_exact));
  // The replicas' input rows differ: a tp-only config (dp 1, twice the tokens per replica) cannot read it.
  // One line naming the dataset, exit code 2 (bad input), on every rank.
  try {
    (void)sharding::run_model(world, mlp_config(p, p, 1), resume);
    ADD_FAILURE() << "a dp=2 checkpoint resumed under dp=1";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), 2);
    EXPECT_NE(std::string(e.what()).find("activations/input"), std::string::npos) << e.what();
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (world.rank() == 0) std::remove(path.c_str());
}

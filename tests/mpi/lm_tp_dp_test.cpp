// The reference LM's trainer (models/lm_tp.h) on real ranks against the single-device training loop
// (models/lm_train.h), computed on every rank. Data parallelism with ZeRO (sharding/plans/data_parallel.h) on a
// dp-only mesh: dp = 1, 2, 4 (other rank counts skip), its gradient buckets, a non-finite gradient norm,
// training-state checkpoints and activation recomputation. (tp, sp, cp, Ulysses, fused: tests/mpi/lm_tp_test.cpp.)
#include "mpi/lm_tp_cases.h"

class LmDp : public ::testing::TestWithParam<int> {};

// 5 fp32 steps, several buckets: per-step losses and final weights equal the single-device run within tolerance.
// Not bit for bit: each replica's kernels sum over its own B/dp sequences (the loss mean, the weight-gradient
// GEMMs' reduction over tokens) and the all_reduce(avg) then adds the dp partial means, a different fp32 summation
// order than one sum over B. Those differences are a few fp32 ulps of each gradient (~1e-7 relative). AdamW
// normalises the update (m / sqrt(v)), so a relative error e of a gradient moves its weight by about lr·e per
// step, except for gradients near 0 (|g| ~ eps) where the update can change by up to lr = 1e-2. Measured over 5
// steps: |loss − ref| <= 3.7e-8 and |w − ref| <= 2.7e-6 (dp = 4); the limits 1e-5 (loss, ~40 ulps of 3.4) and
// 1e-4 (weights, 1% of one step's largest move lr) leave room for other rank counts while still failing on any
// real error (a wrong averaging factor, a missed bucket or a stale shard moves weights by ~lr and losses by >1e-3).
TEST_P(LmDp, MatchesSingleDeviceAndRepeats) {
  if (!dp_size_tested()) GTEST_SKIP() << "dp = 1, 2, 4 only";
  const int zero = GetParam();
  const ModelSpec c = small_config();
  models::LmTrainState ref = models::lm_train_init(c);
  const auto ref_steps = models::lm_train(c, train_config(), ref);
  const DpRun a = run_dp(c, zero, 512, 5);
  const DpRun b = run_dp(c, zero, 512, 5);
  double loss_err = 0;
  for (size_t i = 0; i < 5; ++i) loss_err = std::max(loss_err, std::fabs(a.losses[i] - ref_steps[i].loss));
  const double w_err = max_abs_diff(a.weights, ref.weights);
  if (world_rank() == 0)
    std::printf("[lm_dp] dp=%d zero=%d: max |loss - ref| = %.3g, max |w - ref| = %.3g\n", world_size(), zero,
                loss_err, w_err);
  EXPECT_LT(loss_err, 1e-5);
  EXPECT_LT(w_err, 1e-4);
  if (world_size() == 1) {  // one replica: the same sums in the same order, so bit for bit
    EXPECT_EQ(loss_err, 0.0);
    EXPECT_TRUE(bit_equal(a.weights, ref.weights));
  }
  EXPECT_LT(a.losses.back(), 0.9 * a.losses.front()) << "the loss falls";
  EXPECT_EQ(a.losses, b.losses) << "two runs are bit-identical";
  EXPECT_TRUE(bit_equal(a.weights, b.weights));
}

// Per-chip memory of the training state matches ZeRO's formulas (P·Ψ + P·Ψ + K·Ψ with the stage's divisions)
// within 1%, for fp32 (K = 8) and bf16 mixed precision (K = 12, 16Ψ at stage 0).
TEST_P(LmDp, MemoryMatchesZeroFormulas) {
  if (!dp_size_tested()) GTEST_SKIP() << "dp = 1, 2, 4 only";
  const int zero = GetParam();
  for (auto dtype : {runtime::DType::fp32, runtime::DType::bf16}) {
    ModelSpec c = small_config();
    c.dtype = dtype;
    const DpRun r = run_dp(c, zero, 512, 1);
    const auto& m = r.memory;
    // Stages 1-3 pad each bucket as Megatron's distributed optimizer does (data_parallel.h): every row is the
    // formula times (Ψ + padding) / Ψ, exactly up to the uneven split of stage 0 (not padded).
    EXPECT_EQ(m.padding > 0, zero >= 1) << "zero " << zero;
    const double k = m.padded_ratio();
    EXPECT_NEAR(m.params, k * m.formula_params, 0.01 * m.formula_params) << "zero " << zero;
    EXPECT_NEAR(m.grads, k * m.formula_grads, 0.01 * m.formula_grads) << "zero " << zero;
    EXPECT_NEAR(m.optimizer, k * m.formula_optimizer, 0.01 * m.formula_optimizer) << "zero " << zero;
    EXPECT_GT(m.activations, 0);
    if (zero == 0 && dtype == runtime::DType::bf16) {
      const double psi = double(models::lm_param_count(c));
      EXPECT_NEAR(m.total(), 16.0 * psi, 0.01 * 16.0 * psi) << "16 bytes per parameter";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Zero, LmDp, ::testing::Values(0, 1, 2, 3));

// Buckets issued during backward hide part of the reduction: the simulated exposed communication is below the
// unbucketed run's (one all_reduce after backward) on the same config. Simulated and deterministic. The links are
// slow (10 GB/s, 1 us per hop) so that the reduction is bandwidth-bound: with this tiny model on fast links every
// bucket costs mostly its 2(p-1) hop latencies, and the last block's buckets (ready only when the embedding's short
// backward remains) would cost more than one reduction of everything (measured at dp = 4, 100 GB/s: 22.0 vs 17.1 us).
TEST(LmDpBuckets, BucketingLowersExposedCommunication) {
  if (!dp_size_tested() || world_size() < 2) GTEST_SKIP() << "dp = 2, 4 only";
  ModelSpec c = small_config();
  c.hidden = 64;
  c.ffn = 128;
  c.heads = 4;
  c.kv_heads = 4;
  c.head_dim = 16;
  c.layers = 4;
  for (int zero : {0, 2}) {
    const auto bucketed = run_dp(c, zero, 128 * 1024, 1, 10).results[0].breakdown;
    const auto unbucketed = run_dp(c, zero, 0, 1, 10).results[0].breakdown;
    if (world_rank() == 0)
      std::printf("[lm_dp] dp=%d zero=%d exposed comm: bucketed %.3f us, unbucketed %.3f us; step %.3f vs %.3f us\n",
                  world_size(), zero, bucketed.exposed_comm / 1e3, unbucketed.exposed_comm / 1e3, bucketed.total / 1e3,
                  unbucketed.total / 1e3);
    EXPECT_LT(bucketed.exposed_comm, unbucketed.exposed_comm) << "zero " << zero;
    EXPECT_LT(bucketed.total, unbucketed.total) << "zero " << zero;
  }
}

// A diverging run (lr 1e30 makes the weights infinite after step 1) stops at step 2 on every rank with an error
// naming the step, and does not apply that step.
TEST(LmDpFaults, NonFiniteGradientNormStopsEveryRank) {
  if (!dp_size_tested()) GTEST_SKIP() << "dp = 1, 2, 4 only";
  auto t = train_config();
  t.adamw.lr = 1e30f;
  t.max_grad_norm = 0;  // no clipping
  DpTrainer d(MPI_COMM_WORLD, world_size(), world_rank(), small_config(), t, {2, 512, "auto"});
  models::LmTpTrainer& tr = *d.tr;
  tr.step();
  try {
    tr.step();
    ADD_FAILURE() << "step 2 should fail";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("at step 2"), std::string::npos) << e.what();
  }
  EXPECT_EQ(tr.steps_done(), 1);
}

// ---- Training-state checkpoints (models/lm_checkpoint.h) ----
namespace {

struct Trained {
  std::vector<double> losses;  // of the steps run here
  models::LmWeights weights;
};

// DP training on COMM (its size = dp) for steps FROM+1 .. TO, from SNAPSHOT when given; saves the state after
// step SAVE_AT (> 0) to PATH.
Trained train_dp(MPI_Comm comm, const ModelSpec& c, int zero, const models::LmTrainSnapshot* from, int to,
                 int save_at = 0, const std::string& path = "") {
  int p = 0, rank = 0;
  MPI_Comm_size(comm, &p);
  MPI_Comm_rank(comm, &rank);
  DpTrainer d(comm, p, rank, c, train_config(), {zero, 512, "auto"});
  models::LmTpTrainer& tr = *d.tr;
  if (from) tr.restore(*from);
  Trained out;
  while (tr.steps_done() < to) {
    out.losses.push_back(tr.step().loss);
    if (tr.steps_done() == save_at)
      models::save_lm_train_state(comm, path, c, train_config(), tr.gather_state(), "test", "");
  }
  out.weights = tr.gather_master();
  return out;
}

}  // namespace

// Resume at step 3 of 6 under the same mesh (every ZeRO stage in fp32, stages 1 and 3 in bf16 mixed precision):
// the losses of steps 4-6 and the final master weights are bit-identical to the uninterrupted run's, the state
// having gone through the HDF5 file (the masters and moments are stored as fp32 exactly; the bf16 copy is rebuilt
// by the same rounding AdamW's refresh applies; the data generator is counter-based, step 3's batch is recomputed).
TEST(LmResume, SameMeshIsBitIdentical) {
  if (!dp_size_tested()) GTEST_SKIP() << "dp = 1, 2, 4 only";
  const std::string path = resume_temp_path("lm_resume_same");
  for (auto dtype : {runtime::DType::fp32, runtime::DType::bf16})
    for (int zero : {0, 1, 2, 3}) {
      if (dtype == runtime::DType::bf16 && (zero == 0 || zero == 2)) continue;  // test time: bf16 at 1 and 3
      ModelSpec c = small_config();
      c.dtype = dtype;
      const Trained full = train_dp(MPI_COMM_WORLD, c, zero, nullptr, 6, 3, path);
      const auto snap = models::load_lm_train_state(MPI_COMM_WORLD, path, c, train_config());
      EXPECT_EQ(snap.step, 3);
      const Trained rest = train_dp(MPI_COMM_WORLD, c, zero, &snap, 6);
      ASSERT_EQ(rest.losses.size(), 3u);
      EXPECT_EQ(rest.losses, std::vector<double>(full.losses.begin() + 3, full.losses.end()))
          << "zero " << zero << " " << runtime::dtype_name(dtype);
      EXPECT_TRUE(bit_equal(rest.weights, full.weights)) << "zero " << zero << " " << runtime::dtype_name(dtype);
    }
  if (world_rank() == 0) std::remove(path.c_str());
}

// Resume under a different mesh: a checkpoint of dp = world, ZeRO-2 continues on one chip (the single-device
// reference loop, and dp = 1 ZeRO-3), and the reference's step-3 checkpoint continues on dp = world at ZeRO-3 and
// ZeRO-1. Steps 4-6 equal the uninterrupted run's within the dp tolerance of LmDp.MatchesSingleDeviceAndRepeats
// (1e-5 loss, 1e-4 weights: only the fp32 summation order over the replicas differs), and exactly with one rank.
TEST(LmResume, DifferentMeshWithinDpTolerance) {
  if (!dp_size_tested()) GTEST_SKIP() << "dp = 1, 2, 4 only";
  const std::string path = resume_temp_path("lm_resume_reshard");
  const ModelSpec c = small_config();
  MPI_Comm self;
  MPI_Comm_split(MPI_COMM_WORLD, world_rank(), 0, &self);
  // Uninterrupted references: 6 steps on one chip, and on dp = world ZeRO-2 with a save at step 3.
  models::LmTrainState ref = models::lm_train_init(c);
  auto t6 = train_config();
  t6.steps = 6;
  const auto ref_steps = models::lm_train(c, t6, ref);
  const Trained dp_full = train_dp(MPI_COMM_WORLD, c, 2, nullptr, 6, 3, path);
  auto check = [&](const std::vector<double>& losses, const models::LmWeights& w, const char* what) {
    ASSERT_EQ(losses.size(), 3u) << what;
    double le = 0;
    for (size_t i = 0; i < 3; ++i) le = std::max(le, std::fabs(losses[i] - ref_steps[3 + i].loss));
    const double we = max_abs_diff(w, ref.weights);
    if (world_rank() == 0) std::printf("[lm_resume] %s: max |loss - ref| = %.3g, max |w - ref| = %.3g\n", what, le, we);
    EXPECT_LT(le, 1e-5) << what;
    EXPECT_LT(we, 1e-4) << what;
    if (world_size() == 1) {
      EXPECT_EQ(le, 0.0) << what;
      EXPECT_TRUE(bit_equal(w, ref.weights)) << what;
    }
  };
  {
    // dp = world ZeRO-2 -> the single-device loop, and -> dp = 1 ZeRO-3 (each rank alone).
    const auto snap = models::load_lm_train_state(MPI_COMM_WORLD, path, c, train_config());
    models::LmTrainState st = models::lm_train_state_from(c, snap);
    auto t3 = train_config();
    t3.steps = 3;
    std::vector<double> losses;
    for (const auto& r : models::lm_train(c, t3, st)) losses.push_back(r.loss);
    check(losses, st.weights, "dp=world ZeRO-2 -> one chip");
    const Trained z3 = train_dp(self, c, 3, &snap, 6);
    check(z3.losses, z3.weights, "dp=world ZeRO-2 -> dp=1 ZeRO-3");
  }
  MPI_Barrier(MPI_COMM_WORLD);
  {
    // The single-device reference's step-3 state (saved by rank 0 alone) -> dp = world at ZeRO-3 and ZeRO-1.
    models::LmTrainState st = models::lm_train_init(c);
    auto t3 = train_config();
    t3.steps = 3;
    models::lm_train(c, t3, st);
    if (world_rank() == 0)
      models::save_lm_train_state(self, path, c, train_config(), {st.weights, st.m, st.v, st.step, {}}, "one chip", "");
    MPI_Barrier(MPI_COMM_WORLD);
    const auto snap = models::load_lm_train_state(MPI_COMM_WORLD, path, c, train_config());
    for (int zero : {3, 1}) {
      const Trained r = train_dp(MPI_COMM_WORLD, c, zero, &snap, 6);
      check(r.losses, r.weights, zero == 3 ? "one chip -> dp=world ZeRO-3" : "one chip -> dp=world ZeRO-1");
    }
  }
  (void)dp_full;
  MPI_Comm_free(&self);
  if (world_rank() == 0) std::remove(path.c_str());
}

// A checkpoint that does not fit the config is refused with a ConfigError naming the file: another model shape,
// another data seed, another global batch (the data position would not continue).
TEST(LmResume, RefusesAMismatchedCheckpoint) {
  if (!dp_size_tested()) GTEST_SKIP() << "dp = 1, 2, 4 only";
  const std::string path = resume_temp_path("lm_resume_bad");
  const ModelSpec c = small_config();
  train_dp(MPI_COMM_WORLD, c, 1, nullptr, 1, 1, path);
  auto expect_refused = [&](const ModelSpec& cc, const models::LmTrainConfig& tt, const char* needle) {
    try {
      models::load_lm_train_state(MPI_COMM_WORLD, path, cc, tt);
      ADD_FAILURE() << "accepted: " << needle;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  ModelSpec wider = c;
  wider.hidden = 32;
  expect_refused(wider, train_config(), "but the config's model is");
  auto seed = train_config();
  seed.data_seed = 8;
  expect_refused(c, seed, "data_seed");
  ModelSpec batch = c;
  batch.batch = 8;
  expect_refused(batch, train_config(), "global batch");
  if (world_rank() == 0) std::remove(path.c_str());
}

// Activation recomputation per block: the same losses and weights bit for bit (the recomputed blocks are the
// same deterministic kernels), activations drop to the block inputs + one block + the head's tensors, and the
// simulated compute time rises by exactly one forward of every block (their kernels' roofline times, recomputed
// here from lm_forward's own cost list). ZeRO 0 and 3 (3: the recompute follows the unit's gather).
TEST(LmDpRecompute, SameNumbersLessMemoryOneMoreForward) {
  if (!dp_size_tested()) GTEST_SKIP() << "dp = 1, 2, 4 only";
  const ModelSpec c = small_config();
  // One forward of the blocks on this replica's micro-batch, on the device the trainer uses.
  ModelSpec local = c;
  local.batch = c.batch / world_size();
  std::vector<kernels::KernelCost> costs;
  std::vector<size_t> marks;
  LmCache cache;
  const models::LmWeights w = models::lm_init(local);
  models::lm_forward(local, w, models::lm_synthetic_batch(local, 7, 0), &cache, &costs, &marks);
  const auto dev = sim::device_preset("trainium1");
  double blocks_ns = 0;
  for (size_t i = marks[1]; i < marks[size_t(c.layers) + 1]; ++i)
    blocks_ns += sim::kernel_time_ns(dev, costs[i].flops, costs[i].bytes, runtime::precision_of(costs[i].dtype),
                                     costs[i].shape);
  for (int zero : {0, 3}) {
    const DpRun plain = run_dp(c, zero, 512, 3);
    const DpRun rc = run_dp(c, zero, 512, 3, 100, true);
    EXPECT_EQ(rc.losses, plain.losses) << "zero " << zero;
    EXPECT_TRUE(bit_equal(rc.weights, plain.weights)) << "zero " << zero;
    EXPECT_LT(rc.memory.activations, plain.memory.activations) << "zero " << zero;
    const double extra = rc.results.back().breakdown.compute - plain.results.back().breakdown.compute;
    EXPECT_NEAR(extra, blocks_ns, 1e-6 * blocks_ns) << "zero " << zero;
    EXPECT_GT(rc.results.back().breakdown.total, plain.results.back().breakdown.total) << "zero " << zero;
    if (world_rank() == 0)
      std::printf("[lm_recompute] dp=%d zero=%d: activations %.0f -> %.0f bytes, compute %.3f -> %.3f us "
                  "(+%.3f = one forward of the blocks), step %.3f -> %.3f us\n",
                  world_size(), zero, plain.memory.activations, rc.memory.activations,
                  plain.results.back().breakdown.compute / 1e3, rc.results.back().breakdown.compute / 1e3,
                  blocks_ns / 1e3, plain.results.back().breakdown.total / 1e3, rc.results.back().breakdown.total / 1e3);
  }
}

// The reference LM's trainer (models/lm_tp.h) on real ranks against the single-device training loop
// (models/lm_train.h), computed on every rank: tensor parallelism, sequence parallelism, context parallelism (both
// splits), Ulysses, the fused collectives and their compositions with dp and ZeRO; shape-only runs against real ones.
// (Data parallelism, ZeRO, checkpoints and recomputation on a dp-only mesh: tests/mpi/lm_tp_dp_test.cpp.)
#include "mpi/lm_tp_cases.h"

namespace {

struct TpRun {
  std::vector<models::LmDpStepResult> steps;
  models::LmWeights weights;
  models::LmDpMemory memory;
  double psi_tp = 0;
  int buckets = 0;
};

TpRun run_tp(const ModelSpec& c, int tp, int steps, bool sp = false, models::LmDpConfig dp = {0, 0, "auto", false},
             bool shape_only = false, int cp = 1, bool zigzag = true, bool ulysses = false, bool fused = false) {
  const int p = world_size(), rank = world_rank();
  auto topo = topology::Topology::ring(p, topology::LinkSpec{100, 1000});
  sim::Timeline tl(rank, topo, sim::device_preset("trainium1"));
  runtime::Transport world(MPI_COMM_WORLD, tl, identity_chips(p));
  sharding::DeviceMesh mesh({{"tp", tp}, {"cp", cp}, {"dp", p / (tp * cp)}}, topo);
  world.set_shape_only(shape_only);
  mesh.bind(world);
  models::LmTpTrainer tr(c, train_config(), mesh, world, tl, dp, sp, zigzag, ulysses, fused);
  TpRun run;
  for (int i = 0; i < steps; ++i) run.steps.push_back(tr.step());
  if (!shape_only) run.weights = tr.gather_master();
  run.memory = tr.memory();
  run.psi_tp = tr.local_param_count();
  run.buckets = tr.buckets();
  return run;
}

// A run's largest differences from the single-device reference over its first five steps: |loss - ref|, relative
// |grad norm - ref|, and max |w - ref| of the weights after them.
struct RefError {
  double loss = 0, norm = 0, weights = 0;
};
RefError ref_error(const TpRun& run, const std::vector<models::LmStepResult>& ref_steps, const models::LmWeights& ref_w) {
  RefError e;
  for (size_t i = 0; i < 5; ++i) {
    e.loss = std::max(e.loss, std::fabs(run.steps[i].loss - ref_steps[i].loss));
    e.norm = std::max(e.norm, std::fabs(run.steps[i].grad_norm - ref_steps[i].grad_norm) / ref_steps[i].grad_norm);
  }
  e.weights = max_abs_diff(run.weights, ref_w);
  return e;
}
// LmTp's tolerance (1e-5 loss, 1e-5 relative grad norm, 1e-4 weights: only fp32 summation orders differ), with one
// line per case on rank 0 tagged [tag].
void expect_within_tolerance(const char* tag, const std::string& what, const RefError& e) {
  if (world_rank() == 0)
    std::printf("[%s] %s: max |loss - ref| = %.3g, max rel |norm - ref| = %.3g, max |w - ref| = %.3g\n", tag,
                what.c_str(), e.loss, e.norm, e.weights);
  EXPECT_LT(e.loss, 1e-5) << what;
  EXPECT_LT(e.norm, 1e-5) << what;
  EXPECT_LT(e.weights, 1e-4) << what;
}
// Shape-only equals the real run: the simulated step's fields and the memory, exactly.
void expect_shape_equals_real(const TpRun& real, const TpRun& shape, const std::string& what) {
  const auto& a = real.steps[0].breakdown;
  const auto& b = shape.steps[0].breakdown;
  EXPECT_EQ(a.total, b.total) << what;
  EXPECT_EQ(a.compute, b.compute) << what;
  EXPECT_EQ(a.communication, b.communication) << what;
  EXPECT_EQ(a.exposed_comm, b.exposed_comm) << what;
  EXPECT_EQ(real.memory.total(), shape.memory.total()) << what;
  EXPECT_EQ(real.memory.activations, shape.memory.activations) << what;
}

}  // namespace

// 5 fp32 steps on tp = world (tp2, tp4, tp8 skipped: kv_heads 4) and dp2 x tp(world/2), each without and with
// sequence parallelism (reduce_scatter / all_gather around the norms, norm-weight gradients all_reduced), equal the single-device
// reference within the dp tolerance of LmDp (1e-5 loss, 1e-4 weights): only fp32 summation orders differ (the
// all_reduce(sum) of the row-parallel partial products and of the column-parallel input gradients, the split
// softmax sums). The gradient norm agrees to 1e-5 relative, which it would not if the replicated RMSNorm weights
// were counted tp times (their gradients are a sizeable share of the norm here: checked below).
TEST(LmTp, MatchesSingleDevice) {
  const int p = world_size();
  if (p != 2 && p != 4 && p != 8) GTEST_SKIP() << "2, 4 or 8 ranks";
  ModelSpec c = small_config();
  c.heads = 8;
  c.kv_heads = 4;  // GQA groups of 2; tp up to 4
  models::LmTrainState ref = models::lm_train_init(c);
  const auto ref_steps = models::lm_train(c, train_config(), ref);
  std::vector<int> tps;
  if (p <= 4) tps.push_back(p);          // tp2, tp4
  if (p >= 4) tps.push_back(p / 2);      // dp2 x tp2, dp2 x tp4
  for (int tp : tps)
   for (bool sp : {false, true}) {
    const TpRun run = run_tp(c, tp, 5, sp);
    const RefError e = ref_error(run, ref_steps, ref.weights);
    if (world_rank() == 0 && e.weights > 1e-4) {
      const auto na = run.weights.named_weights();
      const auto nb = ref.weights.named_weights();
      for (size_t k = 0; k < na.size(); ++k) {
        double d = 0;
        for (int64_t i = 0; i < na[k].second->numel(); ++i) d = std::max(d, std::fabs(double(na[k].second->get(i)) - nb[k].second->get(i)));
        std::printf("  %s %.3g\n", na[k].first.c_str(), d);
      }
    }
    expect_within_tolerance("lm_tp", "dp=" + std::to_string(p / tp) + " x tp=" + std::to_string(tp) + (sp ? " sp" : ""), e);
    EXPECT_GT(run.steps.back().breakdown.communication, 0) << "tp all_reduces on the timeline";
  }
  // The norm weights' share of the gradient norm: counting them tp times would move the norm by more than 1e-5.
  {
    LmTrainConfig t1 = train_config();
    t1.steps = 1;
    models::LmTrainState st = models::lm_train_init(c);
    LmCache cache;
    models::LmWeights g = models::lm_zeros(c, c.dtype);
    const auto b = models::lm_synthetic_batch(c, t1.data_seed, 0);
    models::lm_forward(c, st.weights, b, &cache);
    models::lm_backward(c, st.weights, b, cache, g);
    double norms = 0, all = 0;
    for (auto& [name, x] : g.named_weights())
      for (int64_t i = 0; i < x->numel(); ++i) {
        const double v = double(x->get(i)) * x->get(i);
        all += v;
        if (name.find("norm") != std::string::npos) norms += v;
      }
    EXPECT_GT(norms / all, 1e-4) << "the double-count would be visible";
  }
}


// A tp (and dp x tp with sp) run resumed from its own step-3 checkpoint continues bit-identically: the file holds
// the whole tensors (all_gather over tp at save) and each rank slices its shards back (exact copies).
// ZeRO 0 and 3 (3: the state is all_gathered over dp, then over tp, and each rank keeps its dp chunk of its shards).
TEST(LmTpResume, SameMeshIsBitIdentical) {
  const int p = world_size();
  if (p != 2 && p != 4) GTEST_SKIP() << "2 or 4 ranks";
  for (int zero : {0, 3}) {
  const std::string path = resume_temp_path("lm_tp_resume");
  ModelSpec c = small_config();
  c.heads = 8;
  c.kv_heads = 4;
  const int rank = world_rank(), tp = 2;
  const bool sp = p == 4;
  auto topo = topology::Topology::ring(p, topology::LinkSpec{100, 1000});
  auto make = [&](sim::Timeline& tl, runtime::Transport& world, sharding::DeviceMesh& mesh) {
    mesh.bind(world);
    return std::make_unique<models::LmTpTrainer>(c, train_config(), mesh, world, tl,
                                                 models::LmDpConfig{zero, 512, "auto", false}, sp);
  };
  std::vector<double> full_losses, rest_losses;
  models::LmWeights full_w, rest_w;
  {
    sim::Timeline tl(rank, topo, sim::device_preset("trainium1"));
    runtime::Transport world(MPI_COMM_WORLD, tl, identity_chips(p));
    sharding::DeviceMesh mesh({{"tp", tp}, {"dp", p / tp}}, topo);
    auto tr = make(tl, world, mesh);
    for (int i = 0; i < 6; ++i) {
      full_losses.push_back(tr->step().loss);
      if (i == 2) models::save_lm_train_state(MPI_COMM_WORLD, path, c, train_config(), tr->gather_state(), "test", "");
    }
    full_w = tr->gather_master();
  }
  {
    const auto snap = models::load_lm_train_state(MPI_COMM_WORLD, path, c, train_config());
    sim::Timeline tl(rank, topo, sim::device_preset("trainium1"));
    runtime::Transport world(MPI_COMM_WORLD, tl, identity_chips(p));
    sharding::DeviceMesh mesh({{"tp", tp}, {"dp", p / tp}}, topo);
    auto tr = make(tl, world, mesh);
    tr->restore(snap);
    EXPECT_EQ(tr->steps_done(), 3);
    for (int i = 3; i < 6; ++i) rest_losses.push_back(tr->step().loss);
    rest_w = tr->gather_master();
  }
  EXPECT_EQ(rest_losses, std::vector<double>(full_losses.begin() + 3, full_losses.end())) << "zero " << zero;
  EXPECT_TRUE(bit_equal(rest_w, full_w)) << "zero " << zero;
  if (world_rank() == 0) std::remove(path.c_str());
  }
}

// ZeRO 1-3 on dp x tp meshes (dp2 x tp2 on 4 ranks, dp2 x tp4 on 8): each tp shard's gradients, optimizer state
// and (stage 3) parameters are partitioned over its dp group. 5 fp32 steps with 512-byte buckets (several
// buckets) equal the single-device reference within LmTp's tolerance (1e-5 loss, 1e-5 relative grad norm, 1e-4
// weights: only fp32 summation orders differ, as for LmDp and LmTp); the gradient norm checks that the chunks are
// counted once over dp and the replicated norm weights once over tp. Per-chip memory matches ZeRO's formulas with
// Ψ = Ψ_tp (the chip's tp shards) within 1% for fp32 and bf16 (16 Ψ_tp / chip at stage 0 in bf16).
TEST(LmTpZero, MatchesSingleDeviceAndZeroFormulas) {
  const int p = world_size();
  if (p != 4 && p != 8) GTEST_SKIP() << "4 or 8 ranks (dp2 x tp2, dp2 x tp4)";
  ModelSpec c = small_config();
  c.heads = 8;
  c.kv_heads = 4;
  const int tp = p / 2;
  models::LmTrainState ref = models::lm_train_init(c);
  const auto ref_steps = models::lm_train(c, train_config(), ref);
  for (int zero : {0, 1, 2, 3})
    for (bool sp : {false, true}) {
      if (sp && zero != 3 && zero != 1) continue;  // sp with the per-unit (3) and the sharded-optimizer (1) paths
      const TpRun run = run_tp(c, tp, 5, sp, {zero, 512, "auto", false});
      expect_within_tolerance("lm_tp_zero",
                              "dp=2 x tp=" + std::to_string(tp) + (sp ? " sp" : "") + " zero=" + std::to_string(zero) +
                                  ", " + std::to_string(run.buckets) + " buckets",
                              ref_error(run, ref_steps, ref.weights));
      EXPECT_GT(run.buckets, 1) << "512-byte buckets";
      const auto& m = run.memory;
      const double psi = run.psi_tp, nd = 2, k = m.padded_ratio();
      EXPECT_NEAR(m.params, k * 4 * psi / (zero >= 3 ? nd : 1), 0.01 * m.formula_params) << "zero " << zero;
      EXPECT_NEAR(m.grads, k * 4 * psi / (zero >= 2 ? nd : 1), 0.01 * m.formula_grads) << "zero " << zero;
      EXPECT_NEAR(m.optimizer, k * 8 * psi / (zero >= 1 ? nd : 1), 0.01 * m.formula_optimizer) << "zero " << zero;
    }
  // bf16: 2 + 2 + 12 bytes per parameter of the chip's shards, with the stage's divisions.
  ModelSpec b = c;
  b.dtype = runtime::DType::bf16;
  for (int zero : {0, 1, 2, 3}) {
    const TpRun run = run_tp(b, tp, 1, false, {zero, 512, "auto", false});
    const auto& m = run.memory;
    const double psi = run.psi_tp, nd = 2, k = m.padded_ratio();
    EXPECT_NEAR(m.params, k * 2 * psi / (zero >= 3 ? nd : 1), 0.01 * m.formula_params) << "bf16 zero " << zero;
    EXPECT_NEAR(m.grads, k * 2 * psi / (zero >= 2 ? nd : 1), 0.01 * m.formula_grads) << "bf16 zero " << zero;
    EXPECT_NEAR(m.optimizer, k * 12 * psi / (zero >= 1 ? nd : 1), 0.01 * m.formula_optimizer) << "bf16 zero " << zero;
    if (zero == 0) {
      EXPECT_NEAR(m.total(), 16 * psi, 0.01 * 16 * psi);
    }
    EXPECT_TRUE(std::isfinite(run.steps[0].loss));
    if (world_rank() == 0)
      std::printf("[lm_tp_zero] bf16 dp=2 x tp=%d zero=%d: params %.0f grads %.0f optimizer %.0f bytes (Psi_tp %.0f)\n",
                  tp, zero, m.params, m.grads, m.optimizer, psi);
  }
  // A sharded chip holds fewer parameters than the model: Ψ_tp is the shards, not Ψ.
  EXPECT_LT(run_tp(c, tp, 1).psi_tp, double(models::lm_param_count(c)) / tp * 1.1);
}

// Recompute on a tp mesh (tp2, dp = ranks / 2; ZeRO 0 and 3, without and with sp): losses and weights are
// bit-identical to the run without it; the activations drop; the compute time rises by exactly one forward of
// the blocks (their kernels' roofline times on this rank's shards, from lm_forward of the local config, which
// runs the same block kernels), and the communication by the blocks' tp collectives, replayed with the forward.
TEST(LmTpRecompute, SameNumbersLessMemoryOneMoreForward) {
  const int p = world_size();
  if (p != 2 && p != 4) GTEST_SKIP() << "2 or 4 ranks";
  ModelSpec c = small_config();
  c.heads = 8;
  c.kv_heads = 4;
  const int tp = 2;
  ModelSpec local = c;
  local.heads /= tp;
  local.kv_heads /= tp;
  local.ffn /= tp;
  local.vocab /= tp;
  local.batch = c.batch / (p / tp);
  std::vector<kernels::KernelCost> costs;
  std::vector<size_t> marks;
  LmCache cache;
  models::lm_forward(local, models::lm_init(local), models::lm_synthetic_batch(local, 7, 0), &cache, &costs, &marks);
  const auto dev = sim::device_preset("trainium1");
  double blocks_ns = 0;
  for (size_t i = marks[1]; i < marks[size_t(c.layers) + 1]; ++i)
    blocks_ns += sim::kernel_time_ns(dev, costs[i].flops, costs[i].bytes, runtime::precision_of(costs[i].dtype),
                                     costs[i].shape);
  for (int zero : {0, 3})
    for (bool sp : {false, true}) {
      const TpRun plain = run_tp(c, tp, 3, sp, {zero, 512, "auto", false});
      const TpRun rc = run_tp(c, tp, 3, sp, {zero, 512, "auto", true});
      for (size_t i = 0; i < 3; ++i) EXPECT_EQ(rc.steps[i].loss, plain.steps[i].loss) << "zero " << zero << " sp " << sp;
      EXPECT_TRUE(bit_equal(rc.weights, plain.weights)) << "zero " << zero << " sp " << sp;
      EXPECT_LT(rc.memory.activations, plain.memory.activations) << "zero " << zero;
      const auto& a = plain.steps.back().breakdown;
      const auto& r = rc.steps.back().breakdown;
      if (!sp) EXPECT_NEAR(r.compute - a.compute, blocks_ns, 1e-6 * blocks_ns) << "zero " << zero;
      else EXPECT_GT(r.compute, a.compute);  // sp: the norms and adds run on N/tp rows, not lm_forward's
      EXPECT_GT(r.communication, a.communication) << "the blocks' tp collectives run again";
      EXPECT_GT(r.total, a.total);
      if (world_rank() == 0)
        std::printf("[lm_tp_recompute] dp=%d x tp=%d%s zero=%d: activations %.0f -> %.0f bytes, compute %.3f -> %.3f us "
                    "(one forward of the blocks %.3f), communication %.3f -> %.3f us, step %.3f -> %.3f us\n",
                    p / tp, tp, sp ? " sp" : "", zero, plain.memory.activations, rc.memory.activations,
                    a.compute / 1e3, r.compute / 1e3, blocks_ns / 1e3, a.communication / 1e3, r.communication / 1e3,
                    a.total / 1e3, r.total / 1e3);
    }
}

// Shape-only (storage-less tensors, cost-only kernels, header-only collectives) gives the real run's simulated
// step exactly: total, compute, communication and exposed communication, and the same per-chip memory, for every
// ZeRO stage, with and without sp and recompute (dp x tp2 on 2 or 4 ranks, bf16, 512-byte buckets). No loss.
TEST(LmTpShapeOnly, SimulatedFieldsEqualTheRealRun) {
  const int p = world_size();
  if (p != 2 && p != 4) GTEST_SKIP() << "2 or 4 ranks";
  ModelSpec c = small_config();
  c.heads = 8;
  c.kv_heads = 4;
  c.dtype = runtime::DType::bf16;
  for (int zero : {0, 1, 2, 3})
    for (bool sp : {false, true}) {
      const bool rc = zero % 2 == 1;
      const TpRun real = run_tp(c, 2, 1, sp, {zero, 512, "auto", rc});
      const TpRun shape = run_tp(c, 2, 1, sp, {zero, 512, "auto", rc}, true);
      expect_shape_equals_real(real, shape, "zero " + std::to_string(zero) + " sp " + std::to_string(sp));
      EXPECT_TRUE(std::isfinite(real.steps[0].loss));
      EXPECT_TRUE(std::isnan(shape.steps[0].loss)) << "no data, no loss";
    }
}

// Context parallelism, ring attention forward and backward (models/lm_tp.h): 5 fp32 steps on cp = world (8: cp8,
// 4: cp4), tp2 x cp(world/2) and dp2 x cp2 x tp2 (8 ranks; 4 ranks: dp2 x cp2), zigzag and contiguous splits, with
// ZeRO-1 / sp / 512-byte buckets in some, equal the single-device reference within LmTp's tolerance (1e-5 loss,
// 1e-5 relative grad norm, 1e-4 weights). Only fp32 summation orders differ: the attention softmax is merged from
// per-block partials by log-sum-exp, dQ sums the blocks' contributions and dK/dV are accumulated in a different
// order as they travel round the ring, each a few ulps; a wrong causal offset, a missing block, a dK/dV left at
// the wrong chip or RoPE at local positions moves the loss by > 1e-3. The K/V ring is on the timeline.
TEST(LmCp, RingAttentionMatchesSingleDevice) {
  const int p = world_size();
  if (p != 4 && p != 8) GTEST_SKIP() << "4 or 8 ranks";
  ModelSpec c = small_config();
  c.heads = 8;
  c.kv_heads = 4;
  c.seq = 16;  // zigzag cp8: 16 chunks of 1 token
  models::LmTrainState ref = models::lm_train_init(c);
  const auto ref_steps = models::lm_train(c, train_config(), ref);
  struct Case {
    int tp, cp;
    bool zigzag, sp;
    int zero;
  };
  std::vector<Case> cases = {{1, p, true, false, 0}, {2, p / 2, false, true, 0}, {2, p / 2, true, false, 1}};
  if (p == 8) cases.push_back({2, 2, true, false, 1});   // dp2 x cp2 x tp2
  else cases.push_back({1, 2, true, false, 2});          // dp2 x cp2
  for (const Case& k : cases) {
    const TpRun run = run_tp(c, k.tp, 5, k.sp, {k.zero, 512, "auto", false}, false, k.cp, k.zigzag);
    const std::string what = "dp" + std::to_string(p / (k.tp * k.cp)) + " x cp" + std::to_string(k.cp) + " x tp" +
                             std::to_string(k.tp) + (k.zigzag ? " zigzag" : " contiguous") + (k.sp ? " sp" : "") +
                             " zero" + std::to_string(k.zero);
    expect_within_tolerance("lm_cp", what, ref_error(run, ref_steps, ref.weights));
    EXPECT_LT(run.steps.back().loss, run.steps.front().loss) << what;
    EXPECT_GT(run.steps.back().breakdown.communication, 0) << what;
  }
}

// Shape-only with cp (tp2 x cp2 on 4 ranks, cp2 on 2; bf16, ZeRO 1, sp off and on): the simulated step and the
// memory equal the real run's exactly, as LmTpShapeOnly for dp x tp.
TEST(LmCpShapeOnly, SimulatedFieldsEqualTheRealRun) {
  const int p = world_size();
  if (p != 2 && p != 4) GTEST_SKIP() << "2 or 4 ranks";
  ModelSpec c = small_config();
  c.heads = 8;
  c.kv_heads = 4;
  c.seq = 16;
  c.dtype = runtime::DType::bf16;
  const int tp = p / 2;
  for (bool sp : {false, true}) {
    if (sp && tp == 1) continue;
    const TpRun real = run_tp(c, tp, 1, sp, {1, 512, "auto", false}, false, 2, true);
    const TpRun shape = run_tp(c, tp, 1, sp, {1, 512, "auto", false}, true, 2, true);
    expect_shape_equals_real(real, shape, "sp " + std::to_string(sp));
    EXPECT_TRUE(std::isfinite(real.steps[0].loss));
  }
}

// Ulysses on the cp axis (models/lm_tp.h): all_to_all tokens -> heads around attention, forward and backward.
// 5 fp32 steps on ulysses = world (8 or 4), tp2 x ulysses(world/2) (with sp, and with ZeRO-1) and dp2 x
// ulysses2 x tp2 (8 ranks; 4 ranks: dp2 x ulysses2, ZeRO-2) equal the single-device reference within LmTp's
// tolerance (1e-5 loss, 1e-5 relative grad norm, 1e-4 weights): attention itself runs on whole sequences, so only
// the reductions' fp32 order differs. heads 16 / kv_heads 8 so that every mesh splits whole GQA groups.
TEST(LmUlysses, MatchesSingleDevice) {
  const int p = world_size();
  if (p != 4 && p != 8) GTEST_SKIP() << "4 or 8 ranks";
  ModelSpec c = small_config();
  c.heads = 16;
  c.kv_heads = 8;
  c.seq = 16;
  models::LmTrainState ref = models::lm_train_init(c);
  const auto ref_steps = models::lm_train(c, train_config(), ref);
  struct Case {
    int tp, u;
    bool sp;
    int zero;
  };
  std::vector<Case> cases = {{1, p, false, 0}, {2, p / 2, true, 0}, {2, p / 2, false, 1}};
  if (p == 8) cases.push_back({2, 2, false, 1});  // dp2 x ulysses2 x tp2
  else cases.push_back({1, 2, false, 2});         // dp2 x ulysses2
  for (const Case& k : cases) {
    const TpRun run = run_tp(c, k.tp, 5, k.sp, {k.zero, 512, "auto", false}, false, k.u, false, true);
    const std::string what = "dp" + std::to_string(p / (k.tp * k.u)) + " x ulysses" + std::to_string(k.u) + " x tp" +
                             std::to_string(k.tp) + (k.sp ? " sp" : "") + " zero" + std::to_string(k.zero);
    expect_within_tolerance("lm_ulysses", what, ref_error(run, ref_steps, ref.weights));
    EXPECT_LT(run.steps.back().loss, run.steps.front().loss) << what;
  }
  // Shape-only equals the real run's simulated fields and memory (bf16, ulysses over the whole world).
  ModelSpec b = c;
  b.dtype = runtime::DType::bf16;
  const TpRun real = run_tp(b, 1, 1, false, {1, 512, "auto", false}, false, p, false, true);
  const TpRun shape = run_tp(b, 1, 1, false, {1, 512, "auto", false}, true, p, false, true);
  expect_shape_equals_real(real, shape, "ulysses" + std::to_string(p) + " bf16");
}

// Fused collectives in the trainer (parallel.fused with sp; sharding/fused.h's all_gather_gemm, gemm_reduce_scatter
// and their backward counterparts): 5 fp32 steps on tp = world (2, 4) and dp2 x tp(world/2) (4, 8 ranks; once
// with ZeRO-1 and recompute) equal the single-device reference within LmTp's limits (1e-5 loss, 1e-5 relative grad
// norm, 1e-4 weights) and the unfused sp run within the same limits: the fused reduce_scatters add the tp partial
// sums in ring order, the only other fp32 order; the GEMM row chunks and the dW GEMMs compute what the unfused
// path computes. The simulated step exposes less communication than the unfused sp run (the transfers overlap the
// GEMMs' row chunks), and the forward keeps only its rows of the norm outputs (re-gathered in backward), so
// activations shrink. Shape-only equals the real run's simulated fields and memory (bf16). An unfused trainer
// asked for fused without sp is refused naming parallel.fused.
TEST(LmTpFused, MatchesUnfusedAndSingleDeviceLessExposed) {
  const int p = world_size();
  if (p != 2 && p != 4 && p != 8) GTEST_SKIP() << "2, 4 or 8 ranks";
  ModelSpec c = small_config();
  c.heads = 8;
  c.kv_heads = 4;
  models::LmTrainState ref = models::lm_train_init(c);
  const auto ref_steps = models::lm_train(c, train_config(), ref);
  struct Case {
    int tp, cp;
    models::LmDpConfig dp;
  };
  std::vector<Case> cases;
  if (p <= 4) cases.push_back({p, 1, {0, 0, "auto", false}});
  if (p >= 4) cases.push_back({p / 2, 1, {0, 512, "auto", false}});
  if (p >= 4) cases.push_back({p / 2, 1, {1, 512, "auto", true}});
  if (p >= 4) cases.push_back({2, 2, {1, 512, "auto", false}});  // (dp2 x) cp2 x tp2, ring attention (zigzag)
  for (const Case& k : cases) {
    const TpRun fused = run_tp(c, k.tp, 5, true, k.dp, false, k.cp, true, false, true);
    const TpRun plain = run_tp(c, k.tp, 5, true, k.dp, false, k.cp);
    double le = 0, ne = 0, lu = 0;
    for (size_t i = 0; i < 5; ++i) {
      le = std::max(le, std::fabs(fused.steps[i].loss - ref_steps[i].loss));
      ne = std::max(ne, std::fabs(fused.steps[i].grad_norm - ref_steps[i].grad_norm) / ref_steps[i].grad_norm);
      lu = std::max(lu, std::fabs(fused.steps[i].loss - plain.steps[i].loss));
    }
    const double we = max_abs_diff(fused.weights, ref.weights), wu = max_abs_diff(fused.weights, plain.weights);
    const auto& f = fused.steps.back().breakdown;
    const auto& u = plain.steps.back().breakdown;
    const std::string what = "dp" + std::to_string(p / (k.tp * k.cp)) + (k.cp > 1 ? " x cp2" : "") + " x tp" +
                             std::to_string(k.tp) + " sp fused zero" +
                             std::to_string(k.dp.zero) + (k.dp.recompute ? " recompute" : "");
    if (world_rank() == 0)
      std::printf("[lm_tp_fused] %s: max |loss - ref| = %.3g, max rel |norm - ref| = %.3g, max |w - ref| = %.3g; "
                  "vs unfused: loss %.3g, w %.3g; exposed %.3f -> %.3f us, step %.3f -> %.3f us, activations "
                  "%.0f -> %.0f B\n",
                  what.c_str(), le, ne, we, lu, wu, u.exposed_comm / 1e3, f.exposed_comm / 1e3, u.total / 1e3,
                  f.total / 1e3, plain.memory.activations, fused.memory.activations);
    EXPECT_LT(le, 1e-5) << what;
    EXPECT_LT(ne, 1e-5) << what;
    EXPECT_LT(we, 1e-4) << what;
    EXPECT_LT(lu, 1e-5) << what;
    EXPECT_LT(wu, 1e-4) << what;
    EXPECT_LT(fused.steps.back().loss, fused.steps.front().loss) << what;
    EXPECT_LT(f.exposed_comm, u.exposed_comm) << what;
    if (!k.dp.recompute) {
      EXPECT_LT(fused.memory.activations, plain.memory.activations) << what;
    }
    EXPECT_EQ(fused.memory.params, plain.memory.params) << what;
  }
  if (p <= 4) {  // shape-only = real (bf16, tp2, ZeRO 1 and 3 with recompute)
    ModelSpec b = c;
    b.dtype = runtime::DType::bf16;
    for (int zero : {1, 3}) {
      const models::LmDpConfig dp{zero, 512, "auto", zero == 3};
      const TpRun real = run_tp(b, 2, 1, true, dp, false, 1, true, false, true);
      const TpRun shape = run_tp(b, 2, 1, true, dp, true, 1, true, false, true);
      const auto& x = real.steps[0].breakdown;
      const auto& y = shape.steps[0].breakdown;
      EXPECT_EQ(x.total, y.total) << "zero " << zero;
      EXPECT_EQ(x.compute, y.compute) << "zero " << zero;
      EXPECT_EQ(x.communication, y.communication) << "zero " << zero;
      EXPECT_EQ(x.exposed_comm, y.exposed_comm) << "zero " << zero;
      EXPECT_EQ(real.memory.total(), shape.memory.total());
      EXPECT_EQ(real.memory.activations, shape.memory.activations);
      EXPECT_TRUE(std::isfinite(real.steps[0].loss));
    }
  }
  try {
    run_tp(c, p <= 4 ? p : p / 2, 1, false, {0, 0, "auto", false}, false, 1, true, false, true);
    ADD_FAILURE() << "fused without sp must be refused";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.fused"), std::string::npos) << e.what();
  }
}

// Ulysses with fewer kv heads per tp rank than Ulysses ranks (models/lm_tp.h): each kv head is replicated to the
// Ulysses ranks whose query heads form its GQA group and their partial dK/dV are summed on the way back. heads 8,
// kv_heads 2: tp2 x ulysses2 (one kv head per tp rank, replicated twice) and ulysses4 (two kv heads, each twice)
// on 4 ranks; tp2 x ulysses4 (each kv head 4 times, with sp) and ulysses8 on 8 ranks. 5 fp32 steps equal the
// single-device reference within LmTp's limits (1e-5 loss, 1e-5 relative grad norm, 1e-4 weights): attention runs
// on whole sequences as before, the summed dK/dV add the ranks' partials in another fp32 order than one kernel;
// a wrong GQA mapping (a rank attending with another group's kv head) or a dropped partial moves the loss by
// > 1e-3. Shape-only equals the real run's simulated fields (bf16, tp2 x ulysses2).
TEST(LmUlysses, ReplicatedKvHeadsMatchSingleDevice) {
  const int p = world_size();
  if (p != 4 && p != 8) GTEST_SKIP() << "4 or 8 ranks";
  ModelSpec c = small_config();
  c.heads = 8;
  c.kv_heads = 2;
  c.seq = 16;
  models::LmTrainState ref = models::lm_train_init(c);
  const auto ref_steps = models::lm_train(c, train_config(), ref);
  struct Case {
    int tp, u;
    bool sp;
  };
  const std::vector<Case> cases = p == 4 ? std::vector<Case>{{2, 2, false}, {1, 4, false}}
                                         : std::vector<Case>{{2, 4, true}, {1, 8, false}};
  for (const Case& k : cases) {
    const TpRun run = run_tp(c, k.tp, 5, k.sp, {1, 512, "auto", false}, false, k.u, false, true);
    const std::string what = "ulysses" + std::to_string(k.u) + " x tp" + std::to_string(k.tp) + (k.sp ? " sp" : "") +
                             " kv_heads 2";
    expect_within_tolerance("lm_ulysses_kv", what, ref_error(run, ref_steps, ref.weights));
    EXPECT_LT(run.steps.back().loss, run.steps.front().loss) << what;
  }
  if (p == 4) {
    ModelSpec b = c;
    b.dtype = runtime::DType::bf16;
    const TpRun real = run_tp(b, 2, 1, false, {1, 512, "auto", false}, false, 2, false, true);
    const TpRun shape = run_tp(b, 2, 1, false, {1, 512, "auto", false}, true, 2, false, true);
    expect_shape_equals_real(real, shape, "ulysses2 x tp2 kv_heads 2");
  }
  // kv_heads 6 with ulysses 4 (neither a multiple nor a divisor) is refused by the plan registry when the config is
  // parsed (tests/unit/plan_registry_test.cpp, TrainerRefusalsAreTheRegistrys), not by the trainer.
}

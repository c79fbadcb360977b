// Every parallel plan and composition of the trainer (models/lm_tp.h with the plan units of sharding/plans/)
// validates against one device (the Llama block and the GPT block variants): 5 fp32 training steps equal the single-device loop (models/lm_train.h) within the
// trainer's tolerances (|loss - ref| < 1e-5, relative |grad norm - ref| < 1e-5, |w - ref| < 1e-4: only fp32
// summation orders differ; tests/mpi/lm_tp_dp_test.cpp explains the limits). One parametrised case per plan: data
// parallelism with ZeRO 0-3, recompute, tp, tp+sp, tp above the KV heads (replicated KV heads), cp (zigzag and
// contiguous), Ulysses (also with replicated kv heads), Ulysses x tp, tp x cp, fused collectives; the data-parallel axis takes the remaining chips, so at 8
// ranks tp2 x cp2 is dp2 x cp2 x tp2. Gradient accumulation: micro-batches of 1 or 3 sequences per replica
// against the reference's one pass over the whole batch. Each case runs at one chip per rank on the MPI world (when tp·cp divides it
// and dp divides the batch), and, on one rank, with 8 chips on that rank (runtime/chips.h).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <algorithm>
#include <cstdio>
#include <functional>
#include <utility>
#include <map>
#include <tuple>
#include <string>

#include "models/lm_tp.h"
#include "models/lm_train.h"
#include "mpi_util.h"
#include "runtime/chips.h"
#include "runtime/world.h"
#include "sim/device_spec.h"
#include "topology/topology.h"
#include "tests/unit/small_lm.h"

using namespace shardsim;

namespace {

struct PlanCase {
  const char* name;
  int tp = 1, cp = 1;
  bool ulysses = false, sp = false, zigzag = true, fused = false;
  int zero = 0;
  bool recompute = false;
  int64_t kv_heads = 8;
  int64_t micro_batch = 0;  // sequences per micro-batch and replica (gradient accumulation); 0 = none
  int pp = 1;               // pipeline stages (outermost mesh axis), with SCHEDULE and V virtual stages
  sharding::plans::ScheduleKind schedule = sharding::plans::ScheduleKind::one_f_one_b;
  int v = 1;
  // The block variant: 0 = Llama (rmsnorm, swiglu, rope, untied); 1 = GPT (layernorm, gelu MLP, learned positions,
  // tied embeddings); 2 = layernorm alone; 3 = gelu MLP alone; 4 = learned positions alone; 5 = tied alone;
  // 6 = GPT untied; 7 = GPT with Megatron's unfused attention core, dropout 0.1 and linear biases (charged; the
  // values are those of dropout 0 without biases); 8 = 7 untied.
  int variant = 0;
  bool selective = false;  // parallel.recompute: selective
};

// Case K with the unfused core (variant 7, or 8 under pipelines), selective recomputation when SELECTIVE.
PlanCase unfused(PlanCase k, bool selective) {
  k.variant = k.pp > 1 ? 8 : 7;
  k.selective = selective;
  return k;
}

// Case K with KV_HEADS KV heads (of 16 query heads).
PlanCase kv(PlanCase k, int64_t kv_heads) {
  k.kv_heads = kv_heads;
  return k;
}

// Case K with block variant V.
PlanCase variant(PlanCase k, int v) {
  k.variant = v;
  return k;
}

using sharding::plans::ScheduleKind;
// A pipeline case: PP stages x TP (x CP), micro-batches of MB sequences, the model 4 layers deep.
PlanCase pipe(const char* name, int pp, ScheduleKind s, int v, int tp, int cp, int64_t mb, bool sp = false,
              int zero = 0) {
  PlanCase k{name, tp, cp, false, sp};
  k.zero = zero;
  k.micro_batch = mb;
  k.pp = pp;
  k.schedule = s;
  k.v = v;
  return k;
}

std::ostream& operator<<(std::ostream& os, const PlanCase& c) { return os << c.name; }

const PlanCase kCases[] = {
    {"dp_zero0", 1, 1, false, false, true, false, 0},
    {"dp_zero1", 1, 1, false, false, true, false, 1},
    {"dp_zero2", 1, 1, false, false, true, false, 2},
    {"dp_zero3_recompute", 1, 1, false, false, true, false, 3, true},
    {"tp2", 2, 1},
    {"tp4_zero2", 4, 1, false, false, true, false, 2},
    {"tp8", 8, 1},
    {"tp2_sp_zero3", 2, 1, false, true, true, false, 3},
    {"tp4_sp", 4, 1, false, true},
    {"tp2_recompute_zero1", 2, 1, false, false, true, false, 1, true},
    {"cp2_zigzag", 1, 2},
    {"cp4_zigzag_zero1", 1, 4, false, false, true, false, 1},
    {"cp2_contiguous", 1, 2, false, false, false},
    {"cp8_contiguous", 1, 8, false, false, false},
    {"ulysses2", 1, 2, true, false, false},
    {"ulysses8", 1, 8, true, false, false},
    {"ulysses4_kv_replicated", 1, 4, true, false, false, false, 0, false, 2},
    {"ulysses2_x_tp2_sp", 2, 2, true, true, false},
    {"tp2_x_cp2", 2, 2},
    {"tp2_sp_x_cp2_contiguous_zero1", 2, 2, false, true, false, false, 1},
    {"tp2_sp_fused", 2, 1, false, true, true, true},
    {"tp4_sp_fused_zero1_recompute", 4, 1, false, true, true, true, 1, true},
    {"tp2_sp_fused_x_cp2", 2, 2, false, true, true, true},
    // Tp above the KV heads (2x and 4x): each tp chip holds its query heads' KV head, the KV group's Wk / Wv
    // gradients summed over it (tensor_parallel.h, kv_replica_grads_reduce); with sp, fused, ZeRO, micro-batches.
    {"tp2_sp_kv1_replicated", 2, 1, false, true, true, false, 0, false, 1},
    {"tp4_sp_kv1_replicated_zero1", 4, 1, false, true, true, false, 1, false, 1},
    {"tp4_sp_kv2_replicated", 4, 1, false, true, true, false, 0, false, 2},
    {"tp8_sp_kv2_replicated_zero3", 8, 1, false, true, true, false, 3, false, 2},
    {"tp4_kv2_replicated_micro3_recompute", 4, 1, false, false, true, false, 0, true, 2, 3},
    {"tp4_sp_fused_kv1_replicated", 4, 1, false, true, true, true, 0, false, 1},
    {"tp2_sp_kv1_x_cp2", 2, 2, false, true, true, false, 0, false, 1},
    // Gradient accumulation: the replica's batch in micro-batches of 1 or 3 sequences equals one pass (fp32).
    {"dp_micro1", 1, 1, false, false, true, false, 0, false, 8, 1},
    {"dp_micro3_zero3", 1, 1, false, false, true, false, 3, false, 8, 3},
    {"tp2_sp_micro1_zero1_recompute", 2, 1, false, true, true, false, 1, true, 8, 1},
    {"tp2_x_cp2_micro1", 2, 2, false, false, true, false, 0, false, 8, 1},
    // Pipeline parallelism: each schedule the trainer runs, alone and composed (dp takes the remaining chips).
    pipe("pp2_gpipe", 2, ScheduleKind::gpipe, 1, 1, 1, 1),
    pipe("pp2_1f1b_zero1", 2, ScheduleKind::one_f_one_b, 1, 1, 1, 1, false, 1),
    pipe("pp4_1f1b", 4, ScheduleKind::one_f_one_b, 1, 1, 1, 3),
    pipe("pp4_gpipe_zero3", 4, ScheduleKind::gpipe, 1, 1, 1, 3, false, 3),
    pipe("pp2_interleaved_v2", 2, ScheduleKind::interleaved, 2, 1, 1, 1),
    pipe("pp2_x_tp2_1f1b", 2, ScheduleKind::one_f_one_b, 1, 2, 1, 3),
    pipe("pp2_x_tp2_sp_interleaved_v2", 2, ScheduleKind::interleaved, 2, 2, 1, 3, true),
    pipe("pp4_x_tp2_gpipe", 4, ScheduleKind::gpipe, 1, 2, 1, 3),
    pipe("pp2_x_cp2_x_tp2_1f1b", 2, ScheduleKind::one_f_one_b, 1, 2, 2, 3),
    // ZB-H1: the backward split into input gradients (BI) and the deferred weight gradients (BW), alone and as
    // pp x tp, pp x dp x tp (dp takes the rest), pp x cp x tp, with sp, ZeRO and recompute.
    pipe("pp2_zb_h1", 2, ScheduleKind::zb_h1, 1, 1, 1, 1),
    pipe("pp4_zb_h1_zero2", 4, ScheduleKind::zb_h1, 1, 1, 1, 1, false, 2),
    pipe("pp2_x_tp2_zb_h1", 2, ScheduleKind::zb_h1, 1, 2, 1, 3),
    pipe("pp2_x_tp2_sp_zb_h1_zero3", 2, ScheduleKind::zb_h1, 1, 2, 1, 1, true, 3),
    pipe("pp4_x_tp2_zb_h1", 4, ScheduleKind::zb_h1, 1, 2, 1, 3),
    pipe("pp2_x_cp2_x_tp2_zb_h1", 2, ScheduleKind::zb_h1, 1, 2, 2, 3),
    kv(pipe("pp2_x_tp4_sp_kv2_zb_h1", 2, ScheduleKind::zb_h1, 1, 4, 1, 1, true), 2),
    // The GPT block (layernorm, gelu MLP, learned positions, tied embeddings) under every plan family, and each
    // variant alone under tp + sp.
    variant({"gpt_dp_zero1", 1, 1, false, false, true, false, 1}, 1),
    variant({"gpt_tp2", 2, 1}, 1),
    variant({"gpt_tp8", 8, 1}, 1),
    variant({"gpt_tp4_sp_zero3", 4, 1, false, true, true, false, 3}, 1),
    variant({"gpt_tp2_sp_fused_recompute", 2, 1, false, true, true, true, 0, true}, 1),
    variant({"gpt_cp2_zigzag", 1, 2}, 1),
    variant({"gpt_ulysses2_x_tp2_sp", 2, 2, true, true, false}, 1),
    variant({"gpt_tp2_x_cp2_micro1", 2, 2, false, false, true, false, 0, false, 8, 1}, 1),
    variant(pipe("gpt_untied_pp2_x_tp2_1f1b", 2, ScheduleKind::one_f_one_b, 1, 2, 1, 3), 6),
    variant(pipe("gpt_untied_pp2_x_tp2_sp_zb_h1", 2, ScheduleKind::zb_h1, 1, 2, 1, 1, true), 6),
    variant({"layernorm_tp2_sp", 2, 1, false, true}, 2),
    variant({"gelu_tp2_sp", 2, 1, false, true}, 3),
    variant({"learned_tp2_sp", 2, 1, false, true}, 4),
    variant({"tied_tp2_sp", 2, 1, false, true}, 5),
    // Megatron's unfused attention core: kept softmax output (none), recomputed (selective), the whole block again
    // (full), with tp, sp, dp and pipelines.
    unfused({"unfused_dp_zero1", 1, 1, false, false, true, false, 1}, false),
    unfused({"unfused_tp2_selective", 2, 1}, true),
    unfused({"unfused_tp4_sp_selective", 4, 1, false, true}, true),
    unfused({"unfused_tp8", 8, 1}, false),
    unfused({"unfused_tp2_sp_fused_recompute", 2, 1, false, true, true, true, 0, true}, false),
    unfused(pipe("unfused_pp2_x_tp2_sp_1f1b", 2, ScheduleKind::one_f_one_b, 1, 2, 1, 3, true), true),
    unfused(pipe("unfused_pp2_x_tp2_sp_zb_h1", 2, ScheduleKind::zb_h1, 1, 2, 1, 1, true), false),
};

sharding::ModelSpec config_of(const PlanCase& k) {
  sharding::ModelSpec c = test::small_lm();  // vocab 32, hidden 16, 2 layers (pipelines: 4), head_dim 4, ffn 32
  if (k.pp > 1) c.layers = 4;
  c.heads = 16;
  c.kv_heads = k.kv_heads;
  c.seq = 16;   // zigzag over 8 chips: 16 chunks of one token
  c.batch = 24;  // dp 1, 2, 3, 4, 6, 8 divide it
  const int v = k.variant;
  const bool gpt = v == 1 || v == 6 || v == 7 || v == 8;
  if (gpt || v == 2) c.norm = sharding::NormKind::layernorm;
  if (gpt || v == 3) c.mlp = sharding::MlpKind::gelu;
  if (gpt || v == 4) c.position = sharding::PositionKind::learned;
  if (v == 1 || v == 5 || v == 7) c.tied_embeddings = true;  // 6, 8: the GPT block untied (pipelines refuse tied)
  if (v == 7 || v == 8) {
    c.attention_impl = sharding::AttentionImpl::unfused;
    c.dropout = 0.1;
    c.linear_bias = true;
  }
  return c;
}

// 5 steps, the trainer's defaults otherwise.
const models::LmTrainConfig kFiveSteps{.steps = 5};

struct Reference {
  std::vector<models::LmStepResult> steps;
  models::LmWeights weights;
};

const Reference& reference(int64_t kv_heads, int pp = 1, int variant = 0) {
  static std::map<std::tuple<int64_t, bool, int>, Reference> refs;
  auto it = refs.find({kv_heads, pp > 1, variant});
  if (it != refs.end()) return it->second;
  PlanCase k{"ref"};
  k.kv_heads = kv_heads;
  k.pp = pp;
  k.variant = variant;
  const sharding::ModelSpec c = config_of(k);
  models::LmTrainState st = models::lm_train_init(c);
  Reference r;
  r.steps = models::lm_train(c, kFiveSteps, st);
  r.weights = st.weights;
  return refs.emplace(std::make_tuple(kv_heads, pp > 1, variant), std::move(r)).first->second;
}

// Whether the case fits N chips: tp·cp divides N and the remaining dp divides the batch.
bool fits(const PlanCase& k, int n) {
  const int inner = k.tp * k.cp * k.pp;
  if (n % inner != 0 || config_of(k).batch % (n / inner) != 0) return false;
  const int64_t replica = config_of(k).batch / (n / inner);
  if (k.micro_batch != 0 && replica % k.micro_batch != 0) return false;
  const int m = int(k.micro_batch ? replica / k.micro_batch : 1);
  return k.schedule != ScheduleKind::interleaved || m % k.pp == 0;
}

// 5 steps of case K on N chips (this chip = RANK of WORLD): the worst deviations from the reference. Collective.
struct Deviation {
  double loss = 0, norm = 0, weights = 0;
};
template <class World>
Deviation train_case(const PlanCase& k, const World& world, int n, int rank) {
  const sharding::ModelSpec c = config_of(k);
  auto topo = topology::Topology::ring(n, topology::LinkSpec{100, 1000});
  sharding::DeviceMesh mesh({{"tp", k.tp}, {"cp", k.cp}, {"dp", n / (k.tp * k.cp * k.pp)}, {"pp", k.pp}}, topo);
  sim::Timeline tl(mesh.placement()[size_t(rank)], topo, sim::device_preset("trainium1"));
  runtime::Transport t(world, tl, mesh.placement());
  mesh.bind(t);
  models::LmTpTrainer tr(c, kFiveSteps, mesh, t, tl, {k.zero, 512, "auto", k.recompute, k.micro_batch, k.schedule, k.v, {}, k.selective}, k.sp, k.zigzag,
                         k.ulysses, k.fused);
  const Reference& ref = reference(k.kv_heads, k.pp, k.variant);
  Deviation d;
  for (size_t i = 0; i < 5; ++i) {
    const auto r = tr.step();
    d.loss = std::max(d.loss, std::fabs(r.loss - ref.steps[i].loss));
    d.norm = std::max(d.norm, std::fabs(r.grad_norm - ref.steps[i].grad_norm) / ref.steps[i].grad_norm);
  }
  const models::LmWeights w = tr.gather_master();
  const auto na = w.named_weights(), nb = ref.weights.named_weights();
  for (size_t j = 0; j < na.size(); ++j)
    for (int64_t i = 0; i < na[j].second->numel(); ++i)
      d.weights = std::max(d.weights, std::fabs(double(na[j].second->get(i)) - nb[j].second->get(i)));
  return d;
}

bool within(const Deviation& d) { return d.loss < 1e-5 && d.norm < 1e-5 && d.weights < 1e-4; }

}  // namespace

class TrainPlans : public ::testing::TestWithParam<PlanCase> {};

// One chip per rank on the MPI world.
TEST_P(TrainPlans, MatchSingleDeviceOneChipPerRank) {
  const PlanCase& k = GetParam();
  const int p = world_size();
  if (!fits(k, p)) GTEST_SKIP() << k.name << " does not fit " << p << " ranks";
  (void)reference(k.kv_heads, k.pp, k.variant);  // outside any collective: every rank computes it
  const Deviation d = train_case(k, MPI_COMM_WORLD, p, world_rank());
  if (world_rank() == 0)
    std::printf("[train_plans] %s on %d ranks: max |loss - ref| = %.3g, max rel |norm - ref| = %.3g, max |w - ref| = "
                "%.3g\n", k.name, p, d.loss, d.norm, d.weights);
  EXPECT_LT(d.loss, 1e-5);
  EXPECT_LT(d.norm, 1e-5);
  EXPECT_LT(d.weights, 1e-4);
}

// 8 chips on one rank (one MPI rank only: the other rank counts run the case above).
TEST_P(TrainPlans, MatchSingleDeviceEightChipsOnOneRank) {
  const PlanCase& k = GetParam();
  if (world_size() != 1) GTEST_SKIP() << "one rank hosting 8 chips";
  if (!fits(k, 8)) GTEST_SKIP() << k.name << " does not fit 8 chips";
  (void)reference(k.kv_heads, k.pp, k.variant);
  std::vector<Deviation> devs(8);
  const int code = runtime::run_chips(8, [&](const runtime::World& w) {
    devs[size_t(w.rank())] = train_case(k, w, w.size(), w.rank());
    return 0;
  });
  ASSERT_EQ(code, 0);
  std::printf("[train_plans] %s on 8 chips of one rank: max |loss - ref| = %.3g, max rel |norm - ref| = %.3g, max "
              "|w - ref| = %.3g\n", k.name, devs[0].loss, devs[0].norm, devs[0].weights);
  for (int i = 0; i < 8; ++i) EXPECT_TRUE(within(devs[size_t(i)])) << "chip " << i;
}

INSTANTIATE_TEST_SUITE_P(Plans, TrainPlans, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<PlanCase>& i) { return std::string(i.param.name); });

// Chip 0's stage summaries of one step of a pp4 pipeline (4 chips of one rank, a 4-chip ring, trainium1), 8
// micro-batches of one sequence under KIND, with RECOMPUTE (full) or not. Empty if the run failed.
std::vector<models::LmStageSummary> pp4_stage_summary(ScheduleKind kind, bool recompute) {
  std::vector<models::LmStageSummary> summary;
  const int code = runtime::run_chips(4, [&](const runtime::World& w) {
    PlanCase k = pipe("pp4", 4, kind, 1, 1, 1, 1);
    sharding::ModelSpec c = config_of(k);
    c.batch = 8;
    auto topo = topology::Topology::ring(4, topology::LinkSpec{100, 1000});
    sharding::DeviceMesh mesh({{"pp", 4}}, topo);
    sim::Timeline tl(mesh.placement()[size_t(w.rank())], topo, sim::device_preset("trainium1"));
    runtime::Transport t(w, tl, mesh.placement());
    mesh.bind(t);
    models::LmTpTrainer tr(c, kFiveSteps, mesh, t, tl, {0, 512, "auto", recompute, 1, kind, 1, {}});
    tr.step();
    auto s = tr.pipeline_summary();
    if (w.rank() == 0) summary = s;
    return 0;
  });
  return code == 0 ? summary : std::vector<models::LmStageSummary>{};
}

// What the pipeline report shows, from the trainer's own step on 4 chips of one rank (pp 4, 8 micro-batches of one
// sequence): the first stage holds p = 4 micro-batches of activations at once under 1F1B, m = 8 under GPipe
// (Narayanan et al. 2021 §2.2.1), the last stage one; every stage but the last sends m activations of [seq, hidden]
// fp32 forward, every stage but the first m gradients backward; the bubble is positive and the busy time the same
// under both schedules (the same actions in another order).
TEST(TrainPipeline, FirstStageHoldsPMicroBatchesUnder1F1BAndMUnderGPipe) {
  if (world_size() != 1) GTEST_SKIP() << "one rank hosting 4 chips";
  std::map<ScheduleKind, std::vector<models::LmStageSummary>> got;
  for (ScheduleKind kind : {ScheduleKind::one_f_one_b, ScheduleKind::gpipe}) {
    const auto summary = pp4_stage_summary(kind, false);
    ASSERT_EQ(summary.size(), 4u);
    got[kind] = summary;
  }
  const auto& a = got[ScheduleKind::one_f_one_b];
  const auto& g = got[ScheduleKind::gpipe];
  const double act = 8.0 * 16 * 16 * 4;  // m x [seq 16, hidden 16] fp32
  for (int s = 0; s < 4; ++s) {
    EXPECT_DOUBLE_EQ(a[size_t(s)].peak_microbatches, 4 - s) << "1f1b stage " << s;
    EXPECT_DOUBLE_EQ(g[size_t(s)].peak_microbatches, 8) << "gpipe stage " << s;
    EXPECT_DOUBLE_EQ(a[size_t(s)].bytes_forward, s < 3 ? act : 0);
    EXPECT_DOUBLE_EQ(a[size_t(s)].bytes_backward, s > 0 ? act : 0);
    EXPECT_GT(a[size_t(s)].bubble_ns, 0);
    EXPECT_NEAR(a[size_t(s)].busy_ns, g[size_t(s)].busy_ns, 1e-6 * g[size_t(s)].busy_ns);
  }
  EXPECT_GT(g[0].peak_activation_bytes, a[0].peak_activation_bytes);
}

// Full recomputation under 1F1B (pp 4, 8 micro-batches of one sequence, one layer per stage): a stage holds each
// in-flight micro-batch's block input, and the one block a recomputing backward rebuilds at a time once (Korthikanti
// et al. 2022, section 5), not once per held micro-batch: stages 0 and 1 (4 and 3 held, neither holds the head)
// differ by one block input, [seq 16, hidden 16] fp32. Counting the rebuilt block per micro-batch (the 530B TP8 x
// PP35 row at 144.7 GiB per chip) made the difference one whole block's activations.
TEST(TrainPipeline, FullRecomputeHoldsBlockInputsPerMicroBatchAndOneRebuiltBlock) {
  if (world_size() != 1) GTEST_SKIP() << "one rank hosting 4 chips";
  const auto summary = pp4_stage_summary(ScheduleKind::one_f_one_b, true);
  ASSERT_EQ(summary.size(), 4u);
  EXPECT_DOUBLE_EQ(summary[0].peak_microbatches, 4);
  EXPECT_DOUBLE_EQ(summary[1].peak_microbatches, 3);
  const double input = 16.0 * 16 * 4;  // one layer's input, [seq 16, hidden 16] fp32
  EXPECT_DOUBLE_EQ(summary[0].peak_activation_bytes - summary[1].peak_activation_bytes, input);
  EXPECT_GT(summary[0].peak_activation_bytes, 4 * input);  // plus the rebuilt block's working set
}

// Selective recomputation with the unfused core (tp 2 + sp on 2 chips of one rank): the forward keeps no softmax
// output and no attention dropout mask or output, (1 + 2e)·(a/t)·s²·b bytes less per layer (e = 4, fp32); the
// backward runs the core's forward again, so the step computes longer; the timeline carries the core's kernels.
TEST(TrainUnfused, SelectiveKeepsNoCoreAndRecomputesIt) {
  if (world_size() != 1) GTEST_SKIP() << "one rank hosting 2 chips";
  std::map<bool, std::pair<double, double>> got;  // selective -> (activation bytes, compute ns) of chip 0
  bool softmax_on_trace = false;
  for (bool selective : {false, true}) {
    const int code = runtime::run_chips(2, [&](const runtime::World& w) {
      const PlanCase k = unfused({"unfused_tp2_sp", 2, 1, false, true}, selective);
      const sharding::ModelSpec c = config_of(k);
      auto topo = topology::Topology::ring(2, topology::LinkSpec{100, 1000});
      sharding::DeviceMesh mesh({{"tp", 2}}, topo);
      sim::Timeline tl(mesh.placement()[size_t(w.rank())], topo, sim::device_preset("trainium1"));
      runtime::Transport t(w, tl, mesh.placement());
      mesh.bind(t);
      models::LmTpTrainer tr(c, kFiveSteps, mesh, t, tl, {0, 512, "auto", false, 0, k.schedule, 1, {}, selective}, true);
      const auto r = tr.step();
      if (w.rank() == 0) {
        got[selective] = {tr.memory().activations, r.breakdown.compute};
        for (const auto& e : tl.events()) softmax_on_trace = softmax_on_trace || e.name == "attention_core.softmax";
      }
      return 0;
    });
    ASSERT_EQ(code, 0);
  }
  const sharding::ModelSpec c = config_of(unfused({"u", 2, 1}, false));
  const double per_layer = (1 + 2 * 4.0) * double(c.heads / 2) * double(c.seq) * double(c.seq) * double(c.batch);
  EXPECT_DOUBLE_EQ(got[false].first - got[true].first, double(c.layers) * per_layer);
  EXPECT_GT(got[true].second, got[false].second);
  EXPECT_TRUE(softmax_on_trace);
}

// The data-parallel overlap keys on tp 2 (+ sp) x dp 2, 4 chips of one rank, 3 steps: the losses are bit-identical with
// each key on and off; on the last step's trace (chip 0), with overlap_grad_reduce the first gradient bucket's
// reduction starts before the backward ends (the sp norm weights' tp all_reduce), without it after; with
// overlap_param_gather (ZeRO-1) the parameter all_gather runs before the step's optimizer (overlapping the forward),
// without it after; exposed communication falls when either is on.
struct OverlapRun {
  std::vector<double> losses;
  double exposed = 0;
  double grads_start = -1, norm_grads_start = -1, norm_grads_end = -1;  // first dp gradient collective; sp norm all_reduce
  double gather_start = -1, adamw_start = -1, adamw_end = -1;
};

OverlapRun overlap_run(bool overlap_grad, bool overlap_param) {
  OverlapRun out;
  const int code = runtime::run_chips(4, [&](const runtime::World& w) {
    const PlanCase k{"overlap", 2, 1, false, true};
    const sharding::ModelSpec c = config_of(k);
    auto topo = topology::Topology::ring(4, topology::LinkSpec{100, 1000});
    sharding::DeviceMesh mesh({{"tp", 2}, {"cp", 1}, {"dp", 2}, {"pp", 1}}, topo);
    sim::Timeline tl(mesh.placement()[size_t(w.rank())], topo, sim::device_preset("trainium1"));
    runtime::Transport t(w, tl, mesh.placement());
    mesh.bind(t);
    models::LmDpConfig dp{1, 512, "auto", false, 0, k.schedule, 1, {}, false};
    dp.overlap_grad_reduce = overlap_grad;
    dp.overlap_param_gather = overlap_param;
    models::LmTpTrainer tr(c, kFiveSteps, mesh, t, tl, dp, true);
    models::LmDpStepResult r;
    for (int i = 0; i < 3; ++i) {
      r = tr.step();
      if (w.rank() == 0) out.losses.push_back(r.loss);
    }
    if (w.rank() != 0) return 0;
    out.exposed = r.breakdown.exposed_comm;
    auto first = [](double& at, double v) { at = at < 0 ? v : std::min(at, v); };
    for (const auto& e : tl.events()) {
      if (e.name.rfind("all_reduce.grads", 0) == 0 || e.name.rfind("reduce_scatter.grads", 0) == 0)
        first(out.grads_start, e.span.start);
      if (e.name.rfind("all_reduce.norm_grads", 0) == 0) {
        first(out.norm_grads_start, e.span.start);
        out.norm_grads_end = std::max(out.norm_grads_end, e.span.end);
      }
      if (e.name.rfind("all_gather.params", 0) == 0) first(out.gather_start, e.span.start);
      if (e.name == "adamw") {
        out.adamw_start = e.span.start;
        out.adamw_end = e.span.end;
      }
    }
    return 0;
  });
  EXPECT_EQ(code, 0);
  return out;
}

TEST(TrainOverlap, GradReduceAndParamGatherOverlapOnTheTrace) {
  if (world_size() != 1) GTEST_SKIP() << "one rank hosting 4 chips";
  const OverlapRun off = overlap_run(false, false), grad = overlap_run(true, false), param = overlap_run(false, true);
  EXPECT_EQ(grad.losses, off.losses);
  EXPECT_EQ(param.losses, off.losses);
  ASSERT_GE(off.grads_start, 0);
  ASSERT_GE(off.norm_grads_start, 0);
  EXPECT_GE(off.grads_start, off.norm_grads_end);      // buckets wait for the end of backward
  EXPECT_LT(grad.grads_start, grad.norm_grads_start);  // the first bucket goes during the backward
  EXPECT_LT(grad.exposed, off.exposed);
  ASSERT_GE(off.gather_start, 0);
  ASSERT_GE(param.gather_start, 0);
  EXPECT_GE(off.gather_start, off.adamw_end);          // after the optimizer
  EXPECT_LT(param.gather_start, param.adamw_start);    // during the step's forward
  EXPECT_LT(param.exposed, off.exposed);
  std::printf("[overlap] exposed communication: off %.0f ns, overlap_grad_reduce %.0f ns, overlap_param_gather %.0f ns\n",
              off.exposed, grad.exposed, param.exposed);
}

// Checkpoints reshard across pp like every other axis (issue 35, item 5). Chains of meshes on 4 chips of one rank:
// pp 4 -> pp 2 -> pp 1 and pp 2 x tp 2 -> tp 2 (dp 2). Each hop gathers the whole training state (masters, Adam's m
// and v, the step), restores it on the next mesh, which gathers it back bit-identical, and runs one step whose loss
// and gradient norm equal the uninterrupted run's same step on the first mesh (the trainer's tolerance).
TEST(TrainPipeline, StateReshardsAcrossPp) {
  if (world_size() != 1) GTEST_SKIP() << "one rank hosting 4 chips";
  struct Mesh {
    int pp, tp;
  };
  // RUN's body on a trainer of MESH (4 chips, dp the rest), chip 0's results kept by the body.
  auto on_mesh = [](Mesh mesh_of, std::function<void(models::LmTpTrainer&, int rank)> body) {
    return runtime::run_chips(4, [&](const runtime::World& w) {
      PlanCase k = pipe("pp", 4, ScheduleKind::one_f_one_b, 1, 1, 1, 1);
      sharding::ModelSpec c = config_of(k);
      c.batch = 8;
      auto topo = topology::Topology::ring(4, topology::LinkSpec{100, 1000});
      const int pp = mesh_of.pp, tp = mesh_of.tp;
      sharding::DeviceMesh mesh({{"tp", tp}, {"dp", 4 / (tp * pp)}, {"pp", pp}}, topo);
      sim::Timeline tl(mesh.placement()[size_t(w.rank())], topo, sim::device_preset("trainium1"));
      runtime::Transport t(w, tl, mesh.placement());
      mesh.bind(t);
      models::LmTpTrainer tr(c, kFiveSteps, mesh, t, tl, {0, 512, "auto", false, 1, ScheduleKind::one_f_one_b, 1, {}});
      body(tr, w.rank());
      return 0;
    });
  };
  auto max_diff = [](const models::LmTrainSnapshot& a, const models::LmTrainSnapshot& b) {
    double d = a.step == b.step ? 0 : 1;
    for (auto [x, y] : {std::pair{&a.master, &b.master}, std::pair{&a.m, &b.m}, std::pair{&a.v, &b.v}}) {
      const auto na = std::as_const(*x).named_weights(), nb = std::as_const(*y).named_weights();
      for (size_t j = 0; j < na.size(); ++j)
        for (int64_t i = 0; i < na[j].second->numel(); ++i)
          d = std::max(d, std::fabs(double(na[j].second->get(i)) - nb[j].second->get(i)));
    }
    return d;
  };
  for (const std::vector<Mesh>& chain : {std::vector<Mesh>{{4, 1}, {2, 1}, {1, 1}}, std::vector<Mesh>{{2, 2}, {1, 2}}}) {
    const std::string name = "pp" + std::to_string(chain[0].pp) + "xtp" + std::to_string(chain[0].tp);
    // The uninterrupted run on the first mesh: steps 1 .. 2 + hops.
    std::vector<models::LmDpStepResult> want;
    ASSERT_EQ(on_mesh(chain[0], [&](models::LmTpTrainer& tr, int rank) {
                std::vector<models::LmDpStepResult> r;
                for (size_t i = 0; i < chain.size() + 1; ++i) r.push_back(tr.step());
                if (rank == 0) want = r;
              }), 0);
    models::LmTrainSnapshot saved;
    ASSERT_EQ(on_mesh(chain[0], [&](models::LmTpTrainer& tr, int rank) {
                tr.step();
                tr.step();
                auto s = tr.gather_state();
                if (rank == 0) saved = std::move(s);
              }), 0);
    for (size_t hop = 1; hop < chain.size(); ++hop) {
      const std::string what = name + " -> pp" + std::to_string(chain[hop].pp) + "xtp" + std::to_string(chain[hop].tp);
      double diff = -1;
      models::LmDpStepResult got;
      models::LmTrainSnapshot next;
      ASSERT_EQ(on_mesh(chain[hop], [&](models::LmTpTrainer& tr, int rank) {
                  tr.restore(saved);
                  const models::LmTrainSnapshot back = tr.gather_state();
                  const models::LmDpStepResult r = tr.step();
                  auto after = tr.gather_state();
                  if (rank == 0) diff = max_diff(back, saved), got = r, next = std::move(after);
                }), 0);
      EXPECT_EQ(diff, 0.0) << what << ": the restored state differs";
      const models::LmDpStepResult& ref = want[hop + 1];  // the uninterrupted run's same step
      EXPECT_EQ(got.step, ref.step) << what;
      EXPECT_NEAR(got.loss, ref.loss, 1e-5) << what;
      EXPECT_NEAR(got.grad_norm, ref.grad_norm, 1e-5 * ref.grad_norm) << what;
      saved = std::move(next);
    }
  }
}

// ZB-H1 in the trainer against its closed form (Qi et al., ICLR 2024, Table 2): with uniform stages (a model whose
// embedding and head are negligible next to its 8 layers per stage: vocab 32 against hidden 1024, seq 4096) and
// free communication (1e6 GB/s, no latency), shape-only, pp 4 with 8 micro-batches, the step's bubble (mean over stages) is within 1 % of
// (p-1)(F+B-W) / ((p-1)(F+B-W) + m(F+B+W)), F, B and W the stages' mean forward, input-gradient and
// weight-gradient spans, and 1F1B's within 1 % of (p-1)/(m+p-1). The pending weight gradients count in each stage's
// activation peak: stage s holds up to s + 1 micro-batches' operands (stage 2 half as much again as stage 1).
TEST(TrainPipeline, ZeroBubbleH1BubbleMatchesItsClosedForm) {
  if (world_size() != 1) GTEST_SKIP() << "one rank hosting 4 chips";
  using namespace sharding::plans;
  const int p = 4, m = 8;
  for (ScheduleKind kind : {ScheduleKind::zb_h1, ScheduleKind::one_f_one_b}) {
    std::vector<models::LmStageSummary> summary;
    const int code = runtime::run_chips(p, [&](const runtime::World& w) {
      sharding::ModelSpec c = test::small_lm();
      c.layers = 32;
      c.hidden = 1024;
      c.heads = 16;
      c.kv_heads = 16;
      c.head_dim = 64;
      c.ffn = 4096;
      c.seq = 4096;
      c.batch = m;
      auto topo = topology::Topology::ring(p, topology::LinkSpec{1e6, 0});
      sharding::DeviceMesh mesh({{"pp", p}}, topo);
      sim::Timeline tl(mesh.placement()[size_t(w.rank())], topo, sim::device_preset("trainium1"));
      runtime::Transport t(w, tl, mesh.placement());
      t.set_shape_only(true);
      mesh.bind(t);
      models::LmTpTrainer tr(c, kFiveSteps, mesh, t, tl, {0, 0, "auto", false, 1, kind, 1, {}});
      tr.step();
      auto s = tr.pipeline_summary();
      if (w.rank() == 0) summary = s;
      return 0;
    });
    ASSERT_EQ(code, 0);
    ASSERT_EQ(summary.size(), size_t(p));
    double bubble = 0;
    for (const auto& st : summary) bubble += st.bubble_fraction() / p;
    const PipeCosts costs = models::lm_stage_costs(summary);  // what the report's closed form uses
    const double want = closed_form_bubble(kind, p, m, 1, costs);
    std::printf("[train_pipeline] %s p %d m %d: bubble %.4f, closed form %.4f (F %.0f ns, B %.0f ns, W %.0f ns)\n",
                schedule_name(kind), p, m, bubble, want, costs.f, costs.b, costs.w);
    EXPECT_NEAR(bubble, want, 0.01 * want) << schedule_name(kind);
    if (kind == ScheduleKind::zb_h1) {
      // The paper's regime, where its (p-1)(T_F+T_B-T_W) holds: T_W <= min(T_F, T_B) (seq 4096: attention makes F
      // longer than the weight-gradient GEMMs).
      EXPECT_GT(costs.w, 0);
      EXPECT_LE(costs.w, std::min(costs.f, costs.b - costs.w));
      EXPECT_GT(summary[1].peak_pending_w_bytes, 0);
      EXPECT_DOUBLE_EQ(summary[2].peak_pending_w_bytes, 1.5 * summary[1].peak_pending_w_bytes);
      for (const auto& st : summary) EXPECT_GE(st.peak_activation_bytes, st.peak_pending_w_bytes);
    } else {
      EXPECT_DOUBLE_EQ(want, double(p - 1) / (m + p - 1));
      for (const auto& st : summary) EXPECT_EQ(st.peak_pending_w_bytes, 0);
    }
  }
}

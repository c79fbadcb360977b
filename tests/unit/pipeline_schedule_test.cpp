// Pipeline schedules as data (sharding/plans/pipeline_schedule.h): every schedule is a valid order (each F and B,
// or BI and BW, once per model stage and micro-batch; dependencies respected; no deadlock when the stages run their
// lists in order), its simulated bubble with uniform stages and free communication equals the closed form within
// 1 %, the first stage's peak in-flight activations are p for 1F1B and ZB-H1 against m for GPipe (interleaved: the
// factor 1 + (p-1)/(p·v) of Korthikanti et al.), and the illegal combinations name their key.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "sharding/plans/pipeline_schedule.h"

using namespace shardsim::sharding::plans;

namespace {

struct Shape {
  int p, m, v;
};

const ScheduleKind kKinds[] = {ScheduleKind::gpipe, ScheduleKind::one_f_one_b, ScheduleKind::interleaved,
                               ScheduleKind::zb_h1};

}  // namespace

TEST(PipelineSchedule, EveryScheduleIsAValidOrderWithItsClosedFormBubble) {
  const Shape shapes[] = {{2, 2, 1}, {2, 8, 2}, {4, 4, 1}, {4, 8, 2}, {4, 16, 4}, {8, 24, 2}, {8, 8, 1}, {16, 64, 2}};
  // T_B + T_W = 2 T_F in the zero-bubble paper's model; also the paper's Figure 3 case T_F = T_B = T_W.
  // Also T_W above T_F or T_Bi, outside the paper's regime (zb_h1's bubble is then (p-1)·max(T_F, T_Bi)).
  const PipeCosts costs[] = {{1, 2, 1, 0}, {1, 2, 0.8, 0}, {1.3, 2.1, 0.5, 0}, {1, 2.3, 1.2, 0}, {1, 1.8, 1, 0},
                             {0.96, 2.31, 1.21, 0}, {1, 3.6, 1.6, 0}};
  for (ScheduleKind k : kKinds)
    for (const Shape& s : shapes)
      for (const PipeCosts& c : costs) {
        const int v = k == ScheduleKind::interleaved ? s.v : 1;
        if (k == ScheduleKind::interleaved && s.m % s.p != 0) continue;
        const PipelineSchedule sch = make_schedule(k, s.p, s.m, v);
        const PipeSimulation r = simulate_schedule(sch, c);
        const std::string what = std::string(schedule_name(k)) + " p=" + std::to_string(s.p) + " m=" +
                                 std::to_string(s.m) + " v=" + std::to_string(v) + " w=" + std::to_string(c.w);
        ASSERT_FALSE(r.deadlock) << what << ": " << r.error;
        ASSERT_TRUE(r.error.empty()) << what << ": " << r.error;
        size_t actions = 0;
        for (const auto& l : sch.stages) actions += l.size();
        EXPECT_EQ(actions, size_t(s.p * v * s.m * (k == ScheduleKind::zb_h1 ? 3 : 2))) << what;
        const double want = closed_form_bubble(k, s.p, s.m, v, c);
        for (int st = 0; st < s.p; ++st)
          EXPECT_NEAR(r.bubble[size_t(st)], want, 0.01 * want + 1e-12) << what << " stage " << st;
        // The step: the ideal m·v·(F + B) per chip plus the bubble.
        EXPECT_NEAR(r.makespan * (1 - want), double(s.m) * v * (c.f + c.b), 1e-9 * r.makespan) << what;
      }
}

TEST(PipelineSchedule, ZeroBubbleH1BeatsOneFOneBAsThePaperStates) {
  // Qi et al. Table 2: 1F1B (p-1)(T_F+T_B+T_W), ZB-H1 (p-1)(T_F+T_B-T_W), their T_B the input gradient only.
  const PipeCosts c{1, 2, 1, 0};  // T_F = T_Bi = T_W = 1
  const int p = 8, m = 24;
  const PipeSimulation a = simulate_schedule(make_schedule(ScheduleKind::one_f_one_b, p, m), c);
  const PipeSimulation z = simulate_schedule(make_schedule(ScheduleKind::zb_h1, p, m), c);
  const double ideal = m * (c.f + c.b);
  EXPECT_NEAR(a.makespan - ideal, (p - 1) * 3.0, 1e-9);
  EXPECT_NEAR(z.makespan - ideal, (p - 1) * 1.0, 1e-9);
  // Outside the paper's regime (T_W > T_F): the bubble is (p-1)·max(T_F, T_Bi), not the paper's (p-1)(T_F+T_Bi-T_W).
  const PipeCosts slow_w{1, 2.5, 1.5, 0};  // T_F = T_Bi = 1, T_W = 1.5
  const PipeSimulation zw = simulate_schedule(make_schedule(ScheduleKind::zb_h1, p, m), slow_w);
  EXPECT_NEAR(zw.makespan - m * (slow_w.f + slow_w.b), (p - 1) * 1.0, 1e-9);
  // Memory: stage i (0-based) holds p - i micro-batches of activations and at most i pending weight gradients.
  for (int st = 0; st < p; ++st) {
    EXPECT_EQ(z.peak_in_flight[size_t(st)], p - st);
    EXPECT_LE(z.peak_pending_w[size_t(st)], st + 1);
  }
}

TEST(PipelineSchedule, PeakActivationsOnTheFirstStage) {
  const PipeCosts c{1, 2, 1, 0};
  for (const Shape& s : {Shape{4, 16, 2}, Shape{8, 24, 2}, Shape{4, 8, 4}}) {
    const auto g = simulate_schedule(make_schedule(ScheduleKind::gpipe, s.p, s.m), c);
    const auto o = simulate_schedule(make_schedule(ScheduleKind::one_f_one_b, s.p, s.m), c);
    const auto i = simulate_schedule(make_schedule(ScheduleKind::interleaved, s.p, s.m, s.v), c);
    EXPECT_EQ(g.peak_in_flight[0], s.m);
    EXPECT_EQ(o.peak_in_flight[0], s.p);
    for (int st = 0; st < s.p; ++st) EXPECT_EQ(o.peak_in_flight[size_t(st)], s.p - st);
    // Interleaved: chunks of 1/v stage each; p·v + p - 1 chunks = p(1 + (p-1)/(p·v)) stages' worth.
    EXPECT_DOUBLE_EQ(double(i.peak_in_flight[0]) / s.v,
                     closed_form_peak_microbatches(ScheduleKind::interleaved, s.p, s.m, s.v));
    EXPECT_DOUBLE_EQ(closed_form_peak_microbatches(ScheduleKind::interleaved, s.p, s.m, s.v),
                     s.p * (1.0 + double(s.p - 1) / (s.p * s.v)));
    EXPECT_DOUBLE_EQ(closed_form_peak_microbatches(ScheduleKind::gpipe, s.p, s.m, 1), s.m);
  }
}

TEST(PipelineSchedule, CommunicationLatencyOnlyAddsToTheStep) {
  const PipeCosts free_comm{1, 2, 1, 0}, slow{1, 2, 1, 0.25};
  for (ScheduleKind k : kKinds) {
    const auto sch = make_schedule(k, 4, 8, k == ScheduleKind::interleaved ? 2 : 1);
    const auto a = simulate_schedule(sch, free_comm), b = simulate_schedule(sch, slow);
    ASSERT_TRUE(b.error.empty()) << b.error;
    EXPECT_GT(b.makespan, a.makespan) << schedule_name(k);
  }
}

TEST(PipelineSchedule, ABrokenOrderIsCaught) {
  PipelineSchedule s = make_schedule(ScheduleKind::one_f_one_b, 2, 2);
  std::swap(s.stages[1][0], s.stages[1][1]);  // the last stage's B0 before its F0
  const auto r = simulate_schedule(s, {});
  EXPECT_TRUE(r.deadlock);
  EXPECT_NE(r.error.find("deadlock"), std::string::npos) << r.error;
  PipelineSchedule d = make_schedule(ScheduleKind::gpipe, 2, 2);
  d.stages[0].pop_back();  // stage 0 never runs B1
  const auto rd = simulate_schedule(d, {});
  EXPECT_NE(rd.error.find("never runs"), std::string::npos) << rd.error;
}

TEST(PipelineSchedule, IllegalCombinationsNameTheirKey) {
  auto err = [](ScheduleKind k, int p, int m, int v, int64_t layers, std::vector<int64_t> per = {}) {
    return pipeline_obstacle(k, p, m, v, layers, per);
  };
  EXPECT_EQ(err(ScheduleKind::one_f_one_b, 4, 8, 1, 8), "");
  EXPECT_NE(err(ScheduleKind::one_f_one_b, 4, 8, 1, 2).find("parallel.pp:"), std::string::npos);
  EXPECT_NE(err(ScheduleKind::interleaved, 4, 6, 2, 16).find("model.micro_batch:"), std::string::npos);
  EXPECT_NE(err(ScheduleKind::interleaved, 2, 4, 3, 8).find("parallel.virtual_stages:"), std::string::npos);
  EXPECT_NE(err(ScheduleKind::one_f_one_b, 2, 4, 2, 8).find("parallel.virtual_stages:"), std::string::npos);
  EXPECT_EQ(err(ScheduleKind::interleaved, 2, 4, 2, 8), "");
  EXPECT_NE(err(ScheduleKind::gpipe, 2, 4, 1, 8, {3, 4}).find("parallel.pp_layers:"), std::string::npos);
  EXPECT_NE(err(ScheduleKind::gpipe, 2, 4, 1, 8, {8}).find("parallel.pp_layers:"), std::string::npos);
  EXPECT_NE(err(ScheduleKind::gpipe, 2, 4, 1, 8, {0, 8}).find("parallel.pp_layers:"), std::string::npos);
  EXPECT_EQ(err(ScheduleKind::gpipe, 2, 4, 1, 8, {3, 5}), "");
  EXPECT_THROW(make_schedule(ScheduleKind::interleaved, 4, 6, 2), std::invalid_argument);
  EXPECT_EQ(stage_layers(10, 4), (std::vector<int64_t>{3, 3, 2, 2}));
  EXPECT_EQ(stage_layers(10, 2, {4, 6}), (std::vector<int64_t>{4, 6}));
  for (ScheduleKind k : kKinds) EXPECT_EQ(schedule_from_name(schedule_name(k)), k);
  EXPECT_FALSE(schedule_from_name("pipedream"));
}

// Pipeline schedules as data: for each pipeline stage (a chip's position on the pp axis), the ordered list of the
// actions it runs in one training step. One executor (the trainer's step, models/lm_tp.h) runs any schedule; the
// timing simulation below runs the same lists with given per-action costs, for the tests of the closed forms and
// the report's "closed form" line.
//
// Notation (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using
// Megatron-LM", arXiv:2104.04473, §2.2): p = pipeline stages (parallel.pp), m = micro-batches per step and
// pipeline (global batch / dp / micro_batch), v = virtual stages (model chunks) per chip (parallel.virtual_stages,
// interleaved only). The model's layers are cut into p·v model stages; chunk c of chip (stage) s is model stage
// c·p + s (Megatron's interleaved assignment), so with v = 1 model stage = stage.
//
// Actions: F (forward of one micro-batch through one chunk), B (its whole backward), and for ZB-H1 the backward
// split into BI (input gradient: what the previous stage waits for) and BW (weight gradient: nobody waits for it).
// Dependencies: F(ms, i) after F(ms-1, i); B / BI (ms, i) after F(ms, i) and after B / BI (ms+1, i); BW (ms, i)
// after BI(ms, i). Activations of micro-batch i are held on a chip from its F until its B / BI ("in flight").
//
// The schedules:
//   gpipe        all m forwards, then all m backwards (Huang et al. 2019, arXiv:1811.06965).
//   1f1b         PipeDream-Flush (Narayanan et al. 2021 §2.2.1): stage s runs min(p-1-s, m) warm-up forwards,
//                then alternates one forward and one backward, then drains the backwards.
//   interleaved  Megatron's interleaved 1F1B (§2.2.2) over m·v (chunk, micro-batch) pairs: the k-th forward is
//                chunk (k / p) mod v of micro-batch (k / (p·v))·p + k mod p, backwards the chunks in reverse;
//                warm-up min((p-1-s)·2 + (v-1)·p, m·v). Needs m a multiple of p.
//   zb_h1        Zero Bubble H1 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, arXiv:2401.10241 §3):
//                1F1B with B split into BI and BW; stage s keeps up to s weight-gradient passes pending and runs
//                the oldest one whenever more are pending, the rest after its last BI, so the later stages fill
//                the drain with BW.
//
// Closed forms with uniform stages (each model stage costs T_F forward, T_B backward, of which T_W is the weight
// gradient; communication free), bubble = idle fraction of a stage over the step:
//   gpipe, 1f1b   (p-1) / (m + p-1)                                        (Narayanan §2.2.1: t_pb/t_id = (p-1)/m)
//   interleaved   (p-1) / (v·m + p-1)                                      (§2.2.2: (1/v)·(p-1)/m)
//   zb_h1         (p-1)(T_F + T_Bi - T_W) / ((p-1)(T_F + T_Bi - T_W) + m(T_F + T_Bi + T_W)), T_Bi = T_B - T_W
//                 (Qi et al. Table 2: bubble (p-1)(T_F+T_B-T_W) with their T_B the input gradient only), in the
//                 paper's regime T_W <= min(T_F, T_Bi) ("T_W < T_F < T_B", §2.1). A longer W no longer fits the
//                 gaps it fills: the bubble is then (p-1)·max(T_F, T_Bi), so in general (p-1)(T_F + T_Bi -
//                 min(T_W, T_F, T_Bi)) (this schedule's simulation over the unit test's grid; not in the paper)
// Peak activations held by the first stage, in micro-batches of one stage's layers: gpipe m; 1f1b and zb_h1
// min(p, m) (Narayanan §2.2.1; Qi et al. Table 2: p·M_B); interleaved p·(1 + (p-1)/(p·v)) (Korthikanti et al.
// 2022, arXiv:2205.05198, §4.2.3), when m ≥ p.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace shardsim::sharding::plans {

enum class ScheduleKind { gpipe, one_f_one_b, interleaved, zb_h1 };
const char* schedule_name(ScheduleKind k);  // "gpipe" | "1f1b" | "interleaved" | "zb_h1"
std::optional<ScheduleKind> schedule_from_name(std::string_view name);
inline constexpr const char* kScheduleNames = "gpipe, 1f1b, interleaved, zb_h1";

enum class PipeOp { F, B, BI, BW };  // forward, whole backward, input-gradient backward, weight-gradient backward
const char* pipe_op_name(PipeOp op);  // "F" | "B" | "BI" | "BW"

struct PipeAction {
  PipeOp op = PipeOp::F;
  int chunk = 0;  // virtual stage on this chip, 0 .. v-1
  int micro = 0;  // micro-batch, 0 .. m-1
};

struct PipelineSchedule {
  ScheduleKind kind = ScheduleKind::one_f_one_b;
  int p = 1, m = 1, v = 1;
  std::vector<std::vector<PipeAction>> stages;  // [p]: each stage's actions in order
  int model_stage(int stage, int chunk) const { return chunk * p + stage; }
};

// Why (KIND, P, M, V) on a model of LAYERS layers cannot run, or "" when it can; names the key:
// parallel.pp (P < 1, or more model stages P·V than LAYERS), parallel.virtual_stages (V < 1; V > 1 with a
// schedule other than interleaved; V not dividing the layers per stage when LAYERS_PER_STAGE is empty),
// model.micro_batch (M < 1; interleaved with M not a multiple of P), parallel.pp_layers (its length is not P·V,
// an entry < 1, or the sum is not LAYERS).
std::string pipeline_obstacle(ScheduleKind kind, int p, int m, int v, int64_t layers,
                              const std::vector<int64_t>& layers_per_stage = {});

// The schedule's per-stage action lists. std::invalid_argument with pipeline_obstacle's message (LAYERS unknown:
// layer checks skipped) for illegal P, M, V.
PipelineSchedule make_schedule(ScheduleKind kind, int p, int m, int v = 1);

// Layers of each model stage (P·V entries): LAYERS_PER_STAGE when given, else LAYERS split evenly with the first
// LAYERS mod (P·V) stages one layer longer. First layer of model stage k = the sum of the entries before it.
std::vector<int64_t> stage_layers(int64_t layers, int stages, const std::vector<int64_t>& layers_per_stage = {});

// Costs of one action on one model stage (ns): F forward, B whole backward, W the weight-gradient part of B (a BI
// costs B - W, a BW costs W). COMM: the time between a stage's send and the next stage's start (latency).
struct PipeCosts {
  double f = 1, b = 2, w = 1, comm = 0;
};

struct PipeSimulation {
  bool deadlock = false;            // some stage waits for an action that never runs (not a valid order)
  std::string error;                // what is wrong: an action twice or missing, or the deadlocked heads
  double makespan = 0;              // the step: the last action's end, every stage starting at 0
  std::vector<double> busy;         // [p] time each stage computes
  std::vector<double> bubble;       // [p] (makespan - busy) / makespan
  std::vector<int> peak_in_flight;  // [p] most (chunk, micro-batch) activations held at once
  std::vector<int> peak_pending_w;  // [p] most weight-gradient passes pending at once (zb_h1)
};

// Runs SCHEDULE with COSTS per model stage (each action on a chunk costs its cost, uniform over model stages):
// every stage takes its next action as soon as its dependencies have ended (+ COMM when they ran on another
// stage). Also the validity check: every F and every B (or BI and BW) of each (model stage, micro-batch) exactly
// once, and no deadlock.
PipeSimulation simulate_schedule(const PipelineSchedule& schedule, const PipeCosts& costs);

// The closed forms above (COSTS.comm ignored): the bubble fraction of the step, and the first stage's peak
// activations in micro-batches of one stage's layers.
double closed_form_bubble(ScheduleKind kind, int p, int m, int v, const PipeCosts& costs);
double closed_form_peak_microbatches(ScheduleKind kind, int p, int m, int v);

// The plan registry's descriptors of the units in this file (sharding/plans/registry.h; listed once by
// make_registry() in registry.cpp).
struct PlanDescriptor;
PlanDescriptor pp_plan_descriptor();

}  // namespace shardsim::sharding::plans

// The result of a run: what the modelled hardware would do (simulated) and what the host paid (wall).
// Simulated and wall numbers are kept in separate fields and never mixed.
#pragma once

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "reporting/profile.h"
#include "runtime/world.h"
#include "sharding/fused.h"
#include "sharding/plans/block_ops.h"
#include "sim/timeline.h"

namespace shardsim::reporting {

// Where one chip's simulated time went, per kernel and per collective (docs/MODEL.md, "Report breakdown").
// Built from the chip's sim::Timeline events: a kernel is a "compute" event, a collective a "collective" region;
// events whose names differ only in numbers (ring steps, chunks, the chip whose K/V block is attended) are one
// row, the numbers written as N. time_ns sums the events' durations (ns of simulated time; collective regions of
// one row may overlap each other and compute, so rows do not add up to the total); flops and bytes sum the events'
// FLOPs and bytes (bytes: a region's recorded bytes, 0 when the collective records none).
struct OpStat {
  std::string name;
  std::string kind;  // "kernel" | "collective"
  int calls = 0;
  double time_ns = 0;
  double flops = 0;
  double bytes = 0;
};
std::vector<OpStat> op_breakdown(const sim::Timeline& tl);
// The op rows of world rank CRITICAL_RANK on every rank (collective over WORLD: every rank calls it).
std::vector<OpStat> ops_of_rank(const runtime::World& world, const std::vector<OpStat>& mine, int critical_rank);
// The rank whose chip finishes last (lowest rank among ties), on every rank (collective).
int critical_rank(const runtime::World& world, double my_total_ns);

// The pipeline bubble of a chip: the time its timeline waited on a neighbouring pipeline stage (its pp receive
// regions, pp.recv_activation and pp.recv_gradient, the transfer included), at most its exposed communication;
// 0 without a pipeline. The report counts it as the bubble, not as exposed communication.
double pipeline_bubble_ns(const sim::Timeline& tl);
// B with BUBBLE taken out of its communication and exposed communication.
sim::Breakdown without_bubble(sim::Breakdown b, double bubble_ns);
// One rule for run and train: a step's (or the forward's) row and summary are the critical chip's, the one whose
// step ends last (the lowest rank among equals; Megatron-LM reports the last pipeline stage's). Every chip's MINE
// (its step) and its timeline's bubble, gathered host-side (collective over WORLD): the critical chip's step
// without its bubble, the bubble, and its world rank.
struct CriticalStep {
  sim::Breakdown breakdown;
  double bubble_ns = 0;
  int rank = 0;
};
CriticalStep critical_step(const runtime::World& world, const sim::Breakdown& mine, const sim::Timeline& tl);
// Rows sorted by time, kernels first: calls, time, % of TOTAL_NS, and for kernels TFLOP/s and % of
// PEAK_TFLOPS_PER_CHIP (the device's peak at the workload's precision).
std::string ops_text(const std::vector<OpStat>& ops, double total_ns, double peak_tflops_per_chip);
nlohmann::json ops_json(const std::vector<OpStat>& ops, double total_ns, double peak_tflops_per_chip);

struct ChipReport {
  int chip = 0;
  sim::Breakdown breakdown;
  double peak_memory_bytes = 0;  // simulated HBM in use at the chip's peak: sim::Memory::peak() of its run
};

// sharding::CommStat (one collective's figures on the critical chip) is the plan units' record: sharding/plans/block_ops.h.

// Training mode (`shardsim train`): one row per step, as the step ends.
struct TrainStep {
  int64_t step = 0;          // 1-based
  double loss = 0;           // global mean loss before the update (not computed in shape-only mode)
  double grad_norm = 0;      // global gradient norm before clipping (idem)
  sim::Breakdown breakdown;  // the critical chip's simulated step (reporting::critical_step), without its bubble
  double bubble_ns = 0;      // that chip's pipeline bubble (pipeline_bubble_ns)
  double idle_ns() const {
    return std::max(0.0, breakdown.total - breakdown.compute - breakdown.exposed_comm - bubble_ns);
  }
};

// Per-chip memory of the training state between steps (bytes), measured from the buffers the chip holds, beside
// ZeRO's formulas (Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models",
// SC 2020, section 5: parameters P*Psi, gradients P*Psi, optimizer state K*Psi, each divided by N_d from its
// stage on; P = 4, K = 8 in fp32; P = 2, K = 12 with bf16 compute and fp32 masters).
struct TrainMemoryRow {
  std::string what;     // "parameters" | "gradients" | "optimizer state"
  double bytes = 0;
  double formula = 0;
  std::string rule;     // "4*Psi_tp/N_d", ...
};
struct TrainMemory {
  std::string basis;    // what Psi and N_d are on this chip, one line
  std::vector<TrainMemoryRow> rows;
  double activations = 0;       // the forward's saved tensors (not in the formula)
  std::string activations_note;
  double total() const;         // rows' bytes
  double formula_total() const; // rows' formulas
  double chip_bytes() const { return total() + activations; }
};

// Pipeline parallelism (train with pp > 1): the last step's stages (models/lm_tp.h, LmStageSummary) and the
// schedule's closed-form bubble (sharding/plans/pipeline_schedule.h, docs/model/training.md "Pipeline schedules").
struct TrainPipelineStage {
  double busy_ns = 0, bubble_ns = 0, bubble_fraction = 0;
  double peak_activation_bytes = 0, peak_microbatches = 0;
  double bytes_forward = 0, bytes_backward = 0;  // activations to the next stage, gradients to the previous one
  double peak_pending_w_bytes = 0;  // zb_h1: of the peak, the pending weight gradients' operands at most
};
struct TrainPipeline {
  std::string schedule;            // "1f1b", ...
  int p = 1, m = 1, v = 1;
  double pipeline_ns = 0;          // the schedule's part of the step: 0 .. the last action's end
  double bubble_fraction = 0;      // mean of the stages' bubble fractions
  double closed_form = 0;          // the schedule's closed form (uniform stages, free communication)
  std::string closed_form_rule;    // "(p-1)/(m+p-1)", ...
  std::vector<TrainPipelineStage> stages;
};

// A mixture-of-experts model (docs/MOE.md): every MoE layer of the model in the last step, each from the ep group
// of its pipeline stage's chips at tp, cp and dp coordinate 0 (their routing of their last micro-batch;
// LmTpTrainer::moe_layer_table), the parameter counts and the experts' training state on chip 0.
struct TrainMoeLayer {
  int64_t layer = 0;
  double max_tokens = 0, mean_tokens = 0;  // tokens per expert, the ep group's routing summed (kept assignments)
  double received_rows = 0;                // rows the busiest chip's experts received (their grouped GEMMs' M)
  double aux = 0;                          // the group's mean aux loss of the layer (coefficient included; 0 shape-only)
  double dispatch_bytes = 0;               // bytes the busiest chip sent in the dispatch all_to_allv
  double dispatch_closed_form = 0;         // T·k·h·bytes·(ep−1)/ep: uniform routing's expectation
  double dispatch_ns = 0;                  // the slowest chip's dispatch (simulated)
  double buffer_bytes = 0;                 // the largest dispatch buffers kept for the backward (activations)
  double expert_ns = 0;                    // the slowest chip's experts (grouped GEMMs, forward)
  double balanced_expert_ns = 0;           // the same with the group's rows spread evenly over the experts
  // The link the group's dispatch flows keep busy longest ("chip 3 -> switch 1"; "" when no row left its chip), the bytes
  // of every dispatch flow routed through it, and those bytes at its bandwidth (a lower bound it sets).
  std::string busiest_link;
  double link_bytes = 0, link_bound_ns = 0;
  // Node-limited routing: the expert groups (nodes) other than its chip's own a token reaches, the ep group's mean
  // (real data: measured; shape-only: kernels::declared_node_tokens); -1 without a node limit.
  double remote_nodes_per_token = -1;
  double imbalance_ns() const { return expert_ns - balanced_expert_ns; }  // what imbalance costs (forward)
};
struct TrainMoe {
  std::string spec;                        // "moe 8 experts top-2 (...)"
  double total_params = 0, active_params = 0;
  double expert_params_chip = 0;           // expert weights on chip 0 (elements)
  double expert_state_bytes = 0;           // their parameters, gradients and optimizer state under ZeRO
  std::string expert_state_rule;
  std::vector<TrainMoeLayer> layers;
};

// What the executor adds to RunReport for a language model: mode "train" (`train`), or mode "forward" with
// FORWARD true (`run` on a model with a vocabulary: one forward, its loss; no update). Empty otherwise.
struct TrainReport {
  bool forward = false;               // the forward mode: one row (the forward), no gradients or optimizer
  double reference_loss = 0;          // forward mode, validated: the single-device forward's loss
  std::string model;                  // "vocab 32, hidden 16, 2 layers, ...; N parameters (M in GEMMs); fp32"
  std::string data;                   // global batch, tokens per step, the optimizer's settings
  std::string resumed_from;           // training-state checkpoint continued from ("" none)
  int64_t resumed_step = 0;
  std::string resumed_mesh;
  bool step_split = true;             // the rows carry the critical chip's compute / exposed / idle
  bool pipelined = false;             // a pipeline plan (pp > 1): the rows carry the bubble too
  std::vector<TrainStep> steps;       // every step run, in order
  std::vector<std::pair<int64_t, std::string>> saved;  // (step, path) of every training-state checkpoint written
  double log_vocab = 0;               // the loss of a uniform guess, for scale
  double step_ns = 0;                 // the simulated step: the last step's (every step has the same shapes), or
                                      // the mean over the steps on one chip without a plan
  double tokens_per_step = 0;
  double model_flops_per_step = 0;    // 6N + 6*L*H*d*(s+1) per token, causal (docs/model/training.md, "Model FLOPs and MFU")
  double mfu = 0;                     // model_flops_per_step / (step_ns * chips * peak)
  double kernel_flops_per_step = 0;   // what the kernels report (one chip without a plan; 0 otherwise)
  double hfu = 0;                     // kernel_flops_per_step / (step_ns * peak)
  bool has_memory = false;
  TrainMemory memory;
  bool has_pipeline = false;
  TrainPipeline pipeline;
  bool has_moe = false;
  TrainMoe moe;
  // --validate: the per-step losses against the single-device reference (models/lm_train.h).
  double max_loss_error = 0;          // absolute in fp32, relative in bf16
  bool loss_error_relative = false;
  double loss_limit = 0;
  std::string loss_limit_rule;        // how the limit follows from the dtype and the step count
  int64_t validated_steps = 0;
  // The forward mode of a block stack: its output rows were compared with the reference's (RunReport's
  // max_abs_error, max_abs_reference, relative_error and tolerance then hold the rows' figures).
  bool rows_validated = false;
};


// The one report of `shardsim run` for every model (MLP, transformer block) and plan: text (to_text) and JSON
// (to_json). Complete on rank 0.
struct RunReport {
  std::string run_mode = "forward";  // "forward" (run, sweep) | "train" (`train`: the train section below)
  std::string name;
  std::string model;  // the config's model label ("" none)
  std::string config_file;
  std::string topology;  // one-line description
  std::string device;    // one-line description
  std::string plan;      // one-line description
  std::string mesh;      // DeviceMesh::mapping_text(): the axes and where they lie on the topology
  int chips = 0;
  std::string dtype;

  // Simulated (ns; FLOPs; bytes). The headline is the critical chip (the one that finishes last).
  sim::Breakdown critical;  // without its pipeline bubble (bubble_ns)
  int critical_chip = 0;
  double bubble_ns = 0;     // the critical chip's pipeline bubble (pipeline_bubble_ns)
  double total_flops = 0;            // over all chips
  double sim_tflops = 0;             // total_flops / critical.total
  double peak_tflops = 0;            // chips x per-chip peak at the workload's precision
  double peak_fraction = 0;
  double peak_tflops_per_chip = 0;   // the device's peak at the workload's precision
  double tokens_per_s = 0;           // tokens / critical.total (simulated)
  std::vector<OpStat> ops;           // the critical chip's time per kernel and per collective
  double attention_ns = 0;           // of the critical chip: attention kernels + ring (0 without attention)
  std::map<std::string, sharding::CommStat> comm;  // per collective of the plan ("tp all_reduce", ...), the critical chip's
  double all_reduce_ns = 0;
  std::string all_reduce_algorithm;
  double all_reduce_bytes_per_chip = 0;   // bytes each chip injects in the all_reduce
  double all_reduce_expected_bytes = 0;   // 2(p-1)/p * M
  double single_device_ns = 0;             // the same workload on one modelled chip (0 if not validated)
  std::vector<ChipReport> per_chip;
  std::vector<sharding::FusedOp> fused;              // fused collective+GEMM ops of the critical chip (parallel.fused)
  double hbm_capacity_bytes = 0;
  double hbm_reserve_bytes = 0;            // of the capacity, kept back (DeviceSpec::hbm_reserve_gib); see fits_hbm

  // Layers run in sequence (workload.layers; 1 for the MLP): the critical chip's simulated time per layer, whose
  // sum is critical.total up to the time before the first layer starts.
  int layers = 1;
  std::vector<double> layer_ns;

  // Shape-only mode (mode: shape_only / --shape-only): every simulated figure as in real-data mode, nothing
  // validated (validated false; the text says "not validated (shape-only)").
  bool shape_only = false;

  // Validation.
  bool validated = false;
  bool passed = true;
  double max_abs_error = 0;
  double max_abs_reference = 0;
  double relative_error = 0;  // max_abs_error / max_abs_reference
  double tolerance = 0;
  std::string resumed_from;
  bool resume_compared = false;   // the checkpoint held an output the resumed run was compared with
  bool resume_bit_exact = true;   // same layout: output bit-identical to the stored one; resharded: within tolerance
  bool resume_same_layout = true; // the checkpoint was written with the same tp
  int resume_saved_tp = 0;        // tp recorded in the checkpoint (0 if unknown)
  double resume_relative_error = 0;
  std::string checkpoint;         // path written ("" if none)
  std::string trace;              // Chrome trace written ("" if none)
  std::string trace_note;         // its events, chips, estimated size and filter, or why it was not written

  // Wall clock of this host (seconds).
  double wall_total_s = 0;
  double wall_init_s = 0;        // generating (or loading) inputs and this chip's weights
  double wall_forward_s = 0;
  double wall_reference_s = 0;
  double wall_checkpoint_s = 0;
  // Host side (set by train): peak resident memory of this process (MiB, getrusage), the chip scheduler's events
  // (messages delivered, chips finished: runtime/chips.h), and the chips that ran of all the run's chips (fewer in
  // a folded run: docs/performance/fold.md). 0: not recorded.
  double host_peak_rss_mib = 0;
  double host_events = 0;
  int chips_simulated = 0;
  int chips_total = 0;

  TrainReport train;  // mode "train"

  // Profile section (docs/PROFILE.md; reporting/profile.h): --profile's critical path across chips (rank 0; null
  // without --profile) and --what-if's re-simulations, largest speedup first (against critical.total).
  std::shared_ptr<const sim::Profile> profile;
  std::vector<WhatIf> what_if;
  // --plots (reporting/profile_plots.h): the PNGs drawn (rank 0), or why they were not (data and scripts written).
  std::vector<std::string> plots;
  std::string plots_warning;

  bool ok() const { return passed && resume_bit_exact; }
};

// This chip's figures for the report's per-chip and per-collective tables: the plan units' per-collective record
// (sharding/plans/block_ops.h's Comm), its fused ops, its attention time, its peak simulated memory (bytes) and its
// simulated time at the end of each layer (may be empty).
struct ChipFigures {
  const std::map<std::string, sharding::CommStat>* comm = nullptr;
  const std::vector<sharding::FusedOp>* fused = nullptr;
  double attention_ns = 0;
  double peak_memory_bytes = 0;
  std::vector<double> layer_end;
};
// Collective over WORLD (every rank calls it; one chip per world rank, PLACEMENT[rank] its chip id): every chip's
// breakdown (TL's) and figures MINE gathered into R's per_chip, total_flops, and the critical chip's (the
// one that finishes last, lowest rank among ties) critical, critical_chip, attention_ns, comm (the plan's collectives
// that ran), fused, layer_ns and the tp all_reduce's all_reduce_* fields, and its op rows (R.ops), on every rank.
// The one report path of both executor modes and of the forward runner.
void gather_chip_figures(const runtime::World& world, const sim::Timeline& tl, const ChipFigures& mine,
                         const std::vector<int>& placement, RunReport& r);

// Progress lines on stderr for runs longer than a few seconds (`train` steps, sweep points): the first once
// kFirstS seconds of wall time have passed, then at most one every kEveryS seconds, each
// "shardsim: WHAT: DONE of TOTAL UNIT done, E s elapsed, about L s left (wall)". Wall time only decides when to
// print, never enters a simulated figure; nothing goes to stdout or a --json file. Disabled (ENABLED false) on
// every rank but the one that prints.
class Progress {
 public:
  static constexpr double kFirstS = 3, kEveryS = 10;
  Progress(std::string what, bool enabled);
  void update(int64_t done, int64_t total, const char* unit);
  double elapsed_s() const;  // wall seconds since construction

 private:
  std::string what_;
  bool enabled_;
  double start_s_;
  double last_print_s_ = -1;
};

// "12.345 MiB" (bytes / 2^20, three decimals): the byte figures of the text reports.
std::string format_mib(double bytes);

// A training run's per-chip memory fits: state + activations <= HBM capacity - reserve (train's "fits", the sweep's
// fits_hbm column).
bool fits_hbm(const RunReport& r);
nlohmann::json to_json(const RunReport& r);
std::string to_text(const RunReport& r);
// The profile and what-if lines of to_text ("" without --profile / --what-if).
std::string profile_section_text(const RunReport& r);
// to_text of a training report in three pieces, so `train` can print the rows as the steps end (flushed, so a run
// that ends early keeps them): to_text(r) == train_head_text(r) + every train_step_text + train_tail_text(r).
std::string train_head_text(const RunReport& r);
std::string train_step_text(const RunReport& r, const TrainStep& s);
std::string train_saved_text(int64_t step, const std::string& path);
std::string train_tail_text(const RunReport& r);

}  // namespace shardsim::reporting

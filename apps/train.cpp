// `shardsim train [CONFIG] [--steps N]`: k training steps of the reference language model (models/lm_*), with the
// losses, the simulated step time on the config's device, tokens/s and MFU.
//
// Every run is the executor (models/lm_tp.h); one chip without a parallel: section is its dp = 1 plan, and the
// single-device reference (models/lm_train.h) only answers --validate. On N chips: data parallelism, dp = N replicas with ZeRO
// (sharding/plans/data_parallel.h): parallel: {dp: N (default: the ranks; must equal them), tp: 1, zero: 0..3, bucket_bytes: B
// (default auto: Megatron-LM's rule; 0 = one reduction after backward)}, over the topology: section (default: a ring of the ranks,
// 100 GB/s per direction and 1 us per hop, the assumed NeuronLink figures of configs/workloads). The report adds
// the critical chip's step (the one that ends last) split into compute / exposed communication / pipeline bubble /
// idle (sim::Timeline::breakdown, reporting::critical_step) and the per-chip
// memory of the training state next to ZeRO's formulas. parallel: {tp: T} (T > 1) trains Megatron tensor
// parallelism on a dp x tp mesh (models/lm_tp.h; dp = ranks / T), with the same ZeRO stages, buckets and
// recompute over the dp axis of each tp shard. parallel: {cp: C, cp_split: zigzag | contiguous} adds context
// parallelism by ring attention, forward and backward (models/lm_tp.h; mesh tp-cp-dp, dp = ranks / (tp·cp)).
// parallel: {sp: true, fused: true} runs the sequence-parallel collectives as the fused ops of sharding/fused.h
// (all_gather_gemm, gemm_reduce_scatter and their backward counterparts), overlapped with the GEMMs.
// --shape-only (or mode: shape_only): the dp x tp trainer on storage-less tensors (runtime/tensor.h), cost-only
// kernels and header-only collectives (Transport::set_shape_only): the simulated fields of a real run without its
// data, for full-size models; no losses, nothing validated, no checkpoints. --validate (real data): the losses
// against the single-device reference on chip 0, PASS or FAIL (exit 1).
// Checkpoints: --checkpoint PATH [--save-every K] writes the training state (models/lm_checkpoint.h) after every
// K-th and the last step; --resume PATH continues from one saved under any mesh (train.steps / --steps is the step
// to stop at).
//
// The simulated time of a step is its chips' timelines (sim::Timeline: kernels at their kernel-model times, host
// launches, collectives on the modelled links). MFU = model FLOPs (6·N + 12·L·H·d·s per token, docs/model/training.md "Model FLOPs and MFU") / (step time · peak
// of the model's dtype); HFU uses the FLOPs the kernels report instead.
#include <algorithm>
#include <cfloat>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>

#include <sys/resource.h>

#include "apps/cli_common.h"
#include "apps/commands.h"
#include "apps/profile.h"
#include "apps/train_report.h"
#include "apps/train_setup.h"
#include "sharding/plans/expert_parallel_config.h"
#include "sharding/plans/registry.h"
#include "common/config.h"
#include "common/dir_lock.h"
#include "common/error.h"
#include "common/output_file.h"
#include "common/text.h"
#include "models/lm_checkpoint.h"
#include "models/lm_data.h"
#include "reporting/profile_plots.h"
#include "reporting/report.h"
#include "reporting/trace.h"
#include "models/lm_model.h"
#include "models/lm_tp.h"
#include "sharding/device_mesh.h"
#include "models/lm_train.h"
#include "models/lm_validate.h"
#include "runtime/dtype.h"
#include "sharding/engine_config.h"
#include "sharding/model_spec.h"
#include "runtime/chips.h"
#include "runtime/transport.h"
#include "runtime/world.h"
#include "sim/cost.h"
#include "sim/kernel_model.h"
#include "topology/topology.h"

namespace shardsim::apps {

namespace {

using namespace train_detail;



// Before allocating, what the run keeps on this host (in double: sizes whose counts overflow int64 are refused at
// parse), refused with exit 3 when it exceeds 90% of the host's available memory (the kernel would kill the job
// instead, with no line from shardsim).
// Real data: a lower bound per rank of 16 bytes per parameter (weights or fp32 masters, gradients, AdamW m and v;
// every rank holds them whole while building its replica; the forward mode: 4, the weights alone) and the fp32
// activations the backward keeps per token
// (per layer the norms' inputs, q, k, v, attention output and the three FFN vectors; the logits and their
// gradient).
// Shape-only: no parameter or activation is stored, but the trainer keeps per-token bookkeeping (token ids,
// targets, the cp token layout): each chip's T = batch/dp x seq/cp tokens cost about 8 bytes each for the whole
// step, and the chip that runs (a rank's chips run one at a time) about 64 bytes each more. Measured on
// configs/lm_train.yaml (peak RSS, GB = 1e9 B): 1 chip at batch 1M 0.49 GB (this estimate: 0.58), 4 chips of one
// rank at batch 4M 0.69 GB (0.77), 1 chip at seq 4M 0.15 GB (0.29).
void check_host_memory(const TrainSetup& s, int ranks, int ranks_on_host, int chips_on_host) {
  const auto& c = s.model;
  double need = 0;
  std::string what;
  char b[256];
  if (s.shape_only) {
    const int dp = std::max(1, ranks / std::max(1, s.tp * s.cp * s.pp));
    const double tokens = double(c.batch) / dp * (double(c.seq) / s.cp);
    need = double(ranks_on_host) * 64 * tokens + double(chips_on_host) * 8 * tokens;
    std::snprintf(b, sizeof b, "about %.3g GiB of host memory for the shape-only step's bookkeeping (%.3g tokens "
                  "per chip: 8 bytes each on the %d chip(s) of this host, 64 more on the running chip of each of "
                  "its %d rank(s))", need / 1073741824.0, tokens, chips_on_host, ranks_on_host);
    what = b;
  } else {
    const double h = double(c.hidden), qd = double(c.heads) * double(c.head_dim),
                 kvd = double(c.kv_heads) * double(c.head_dim), ffn = double(c.ffn), v = double(c.vocab);
    const double params = 2 * v * h + double(c.layers) * (2 * h + 2 * h * qd + 2 * h * kvd + 3 * h * ffn) + h;
    const double tokens = double(c.batch) * double(c.seq);
    const double acts = tokens * (double(c.layers) * (4 * h + 2 * qd + 2 * kvd + 3 * ffn) + 2 * v);
    // The forward mode holds no gradients or moments: 4 bytes per parameter (the whole seeded weights each rank
    // builds its shards from, and the reference's).
    const int per_param = s.dp.forward_only ? 4 : 16;
    const double per_rank = per_param * params + 4 * acts;
    need = per_rank * chips_on_host;
    std::snprintf(b, sizeof b, "at least %.3g GiB of host memory per rank (%.3g parameters x %d bytes + "
                  "activations) x %d ranks on this host", per_rank / 1073741824.0, params, per_param, chips_on_host);
    what = b;
  }
  const double avail = available_host_bytes();
  if (avail > 0 && need > 0.9 * avail) {
    std::snprintf(b, sizeof b, ", but only %.3g GiB is available; use smaller sizes", avail / 1073741824.0);
    throw RuntimeFault(s.config_name + ": model: needs " + what + b);
  }
}

// Training-state checkpoints (models/lm_checkpoint.h): --checkpoint PATH saves after every --save-every K steps
// (step numbers that are multiples of K) and after the last step; --resume PATH continues from a checkpoint
// (steps = the step to stop at, so `--steps 6 --resume <step-3 file>` runs steps 4-6).
bool save_due(const TrainFlags& f, int64_t step, int64_t last) {
  return !f.checkpoint.empty() && (step == last || (f.save_every > 0 && step % f.save_every == 0));
}

// The run's one report (reporting/report.h, run_mode "train"). Its head is printed before the first step, each step's
// row and each checkpoint line as it happens, flushed, so a run that ends early (a signal, a diverging loss) keeps
// every row it printed; the tail at the end; --json writes the same report. Rank 0 prints; progress lines go to
// stderr (reporting/report.h's Progress), never into stdout or the JSON.
class TrainLog {
 public:
  TrainLog(const runtime::World& world, const TrainFlags& f, reporting::RunReport r)
      : world_(world), f_(f), r_(std::move(r)), progress_("train", world.rank() == 0) {}
  reporting::RunReport& report() { return r_; }
  void head() { print(reporting::train_head_text(r_)); }
  void step(const reporting::TrainStep& st, int64_t last_step) {
    r_.train.steps.push_back(st);
    print(reporting::train_step_text(r_, st));
    progress_.update(st.step, last_step, "steps");
  }
  void saved(int64_t step) {
    r_.train.saved.emplace_back(step, f_.checkpoint);
    print(reporting::train_saved_text(step, f_.checkpoint));
  }
  // The tail, then the JSON (agreed: a failed write is one line and exit 3 on every rank).
  int finish() {
    r_.wall_total_s = progress_.elapsed_s();
    struct rusage ru {};
    getrusage(RUSAGE_SELF, &ru);
    r_.host_peak_rss_mib = double(ru.ru_maxrss) / 1024.0;
    r_.host_events = double(runtime::chips::events());
    r_.chips_total = world_.size();
    r_.chips_simulated = runtime::chips::folded() ? runtime::chips_per_rank() : world_.size();
    print(reporting::train_tail_text(r_));
    // A plan that does not fit the HBM writes nothing (no --json, and no checkpoint: run_train_dp), only the report.
    const bool fits = !r_.train.has_memory || reporting::fits_hbm(r_);
    world_.agree([&] {
      if (world_.rank() == 0 && !f_.json_path.empty() && fits)
        write_file_atomic(f_.json_path, reporting::to_json(r_).dump(2) + "\n");
    });
    // One rule with `run` (docs/CONFIG.md, device.hbm_gib): a plan whose state and activations exceed the usable
    // HBM (hbm_gib less hbm_reserve_gib) is bad input, exit 2, after the report that shows the memory rows.
    if (r_.train.has_memory && !reporting::fits_hbm(r_)) {
      if (world_.rank() == 0) {
        char b[512];
        std::snprintf(b, sizeof b, "shardsim: error: %s: simulated out of memory: %.4g GiB per chip (state + "
                      "activations) does not fit the %.4g GiB usable of the device's %.4g GiB HBM (%.4g GiB kept in "
                      "reserve, device.hbm_reserve_gib); use more chips, ZeRO, recompute or smaller micro-batches\n",
                      escape_control(r_.config_file).c_str(), r_.train.memory.chip_bytes() / 1073741824.0,
                      (r_.hbm_capacity_bytes - r_.hbm_reserve_bytes) / 1073741824.0,
                      r_.hbm_capacity_bytes / 1073741824.0, r_.hbm_reserve_bytes / 1073741824.0);
        std::fputs(b, stderr);
      }
      return kExitBadInput;
    }
    return r_.ok() ? kExitOk : kExitValidationFailed;
  }

 private:
  void print(const std::string& text) const {
    if (world_.rank() != 0 || f_.quiet) return;
    std::fputs(text.c_str(), stdout);
    std::fflush(stdout);
  }
  const runtime::World& world_;
  const TrainFlags& f_;
  reporting::RunReport r_;
  reporting::Progress progress_;
};

// A diverging run: the trainers throw std::runtime_error (never a shardsim::Error) only for a non-finite gradient
// norm, which is all-reduced, so every chip meets it at the same step. Agreed into one line naming the chip, the
// step and the value, and exit 1 (the run's numbers are not usable: as a failed validation), with no MPI_Abort.
[[noreturn]] void throw_diverged(const runtime::World& world, const std::string& what) {
  std::string msg = what;
  const std::string prefix = "lm training: ";
  if (msg.rfind(prefix, 0) == 0) msg = msg.substr(prefix.size());
  throw AgreedError("training diverged on chip " + std::to_string(world.rank()) + ": " + msg, kExitValidationFailed);
}
template <class Step>
auto agreed_step(const runtime::World& world, Step&& step) {
  decltype(step()) r{};
  std::string diverged;
  try {
    r = step();
  } catch (const Error&) {
    throw;
  } catch (const std::runtime_error& e) {
    diverged = e.what();
  }
  world.agree([&] {
    if (!diverged.empty()) throw_diverged(world, diverged);
  });
  return r;
}

void save_state(const runtime::World& world, const TrainFlags& f, const TrainSetup& s,
                const models::LmStateShard& shard, const std::string& mesh, TrainLog& log) {
  world.agree([&] { models::save_lm_train_state(world, f.checkpoint, s.model, s.train, shard, mesh, s.config_text); });
  log.saved(shard.step);
}

// --resume: each chip reads its own blocks of the file's state (no chip holds a tensor it does not own) into
// TRAINER; with REFERENCE (the single-device reference validates the run) chip 0 alone also reads the whole state
// the reference starts from. The returned snapshot holds the step, weights_only and mesh on every chip, and the
// tensors only there.
std::optional<models::LmTrainSnapshot> load_resume(const runtime::World& world, const TrainFlags& f,
                                                   const TrainSetup& s, models::LmTpTrainer& trainer, bool reference) {
  if (f.resume.empty()) return std::nullopt;
  std::optional<models::LmTrainSnapshot> snap(std::in_place);
  {
    models::LmStateShard shard = trainer.state_layout(!f.forward);
    world.agree([&] {
      models::load_lm_train_state(world, f.resume, s.model, s.train, shard);
      if (!f.forward && shard.step >= s.train.steps)
        throw UsageError("--resume: " + f.resume + " is at step " + std::to_string(shard.step) +
                         " and the run stops at step " + std::to_string(s.train.steps) +
                         " (train.steps or --steps is the last step, not a count): nothing to run");
    });
    trainer.restore(shard);
    snap->step = shard.step;
    snap->weights_only = shard.weights_only;
    snap->mesh = shard.mesh;
  }
  if (reference) world.agree([&] { snap = models::load_lm_train_state(world, f.resume, s.model, s.train, 0); });
  return snap;
}

// Rank 0's VERDICT (JSON: [passed, error, limit, relative, rule, extra]) on every chip, its fields into R; returns it.
nlohmann::json apply_loss_verdict(const runtime::World& world, const std::string& verdict, reporting::RunReport& r) {
  const nlohmann::json v = nlohmann::json::parse(world.broadcast(verdict, 0));
  auto& t = r.train;
  r.validated = true;
  r.passed = v[0].get<bool>();
  t.max_loss_error = v[1].is_number() ? v[1].get<double>() : NAN;
  t.loss_limit = r.tolerance = v[2].get<double>();
  t.loss_error_relative = v[3].get<bool>();
  t.loss_limit_rule = v[4].get<std::string>();
  (t.loss_error_relative ? r.relative_error : r.max_abs_error) = t.max_loss_error;
  return v;
}

// --validate: the per-step losses against the single-device reference (models/lm_train.h, the global model and
// batch on one chip, computed on chip 0), each within models/lm_validate.h's limit for the dtype and the step.
// A resumed run's reference resumes from the same checkpoint (models::reference_losses).
void validate_losses(const runtime::World& world, const TrainSetup& s, reporting::RunReport& r,
                     const std::optional<models::LmTrainSnapshot>& resumed) {
  const auto& c = s.model;
  auto& t = r.train;
  std::string verdict;
  if (world.rank() == 0) {
    const std::vector<double> reference = models::reference_losses(c, s.train, resumed ? &*resumed : nullptr);
    std::vector<std::pair<int64_t, double>> losses;
    for (const auto& st : t.steps) losses.emplace_back(st.step, st.loss);
    const models::LossCheck check = models::check_losses(c.dtype, losses, reference, c.fp8);
    nlohmann::json j = {check.passed, check.error, check.tolerance.limit, check.tolerance.relative,
                        check.tolerance.rule, check.step};
    verdict = j.dump();
  }
  const nlohmann::json v = apply_loss_verdict(world, verdict, r);
  t.loss_limit_rule += " (the limit at step " + std::to_string(v[5].get<int64_t>()) + ", the step closest to its limit)";
  t.validated_steps = static_cast<int64_t>(t.steps.size());
}

// The forward mode's validation: the sharded forward's loss against the single-device forward (lm_forward) of the
// same weights (the seeded ones, or RESUMED's masters) and batch, computed on chip 0, within models/lm_validate.h's
// limit for one step of the dtype; for a block stack (vocab 0) also every output row (ROWS, gathered on rank 0)
// against the reference's, max|y - y_ref| / max|y_ref| within validate.tolerance. The reference's kernels, timed
// on the device, give the single-device time.
void validate_forward(const runtime::World& world, const TrainSetup& s, reporting::RunReport& r,
                      const std::optional<models::LmTrainSnapshot>& resumed, const models::GatheredRows* rows) {
  const auto& c = s.model;
  auto& t = r.train;
  std::string verdict;
  if (world.rank() == 0) {
    // The weights alone (a forward needs no moments): the resumed masters, or the seeded ones; bf16 computes on
    // their compute copy.
    std::optional<models::LmWeights> seeded, copy;
    const models::LmWeights& master = resumed ? resumed->master : seeded.emplace(models::lm_init(c));
    if (c.dtype != runtime::DType::fp32) copy = models::lm_compute_copy(c, master);
    models::LmCache cache;
    std::vector<kernels::KernelCost> costs;
    const double reference = models::lm_forward(c, copy ? *copy : master,
                                                models::lm_synthetic_batch(c, s.train.data_seed, resumed ? resumed->step : 0),
                                                &cache, &costs);
    if (c.vocab == 0 && !costs.empty()) costs.pop_back();  // a block stack's loss: not charged in the forward mode
    double single_ns = 0;
    for (const auto& k : costs)
      single_ns += sim::kernel_time_ns(s.device, k.flops, k.bytes, runtime::precision_of(k.dtype), k.shape);
    const models::LossCheck check = models::check_losses(c.dtype, {{1, t.steps.back().loss}}, {reference}, c.fp8);
    nlohmann::json j = {check.passed, check.error, check.tolerance.limit, check.tolerance.relative,
                        check.tolerance.rule, reference, single_ns};
    if (rows) {
      const models::RowCheck rc = models::check_rows(*rows, cache.x_final, s.row_tolerance > 0 ? s.row_tolerance
                                                     : c.dtype == runtime::DType::bf16 ? 3e-2 : 1e-4);
      j.push_back({rc.passed, rc.max_abs_error, rc.max_abs_reference, rc.relative_error, rc.tolerance});
    }
    verdict = j.dump();
  }
  const nlohmann::json v = apply_loss_verdict(world, verdict, r);
  t.loss_limit_rule += " (one forward: the limit of step 1)";
  t.reference_loss = v[5].is_number() ? v[5].get<double>() : NAN;
  t.validated_steps = 1;
  r.single_device_ns = v[6].get<double>();
  if (v.size() > 7) {  // the output rows
    const auto& w = v[7];
    t.rows_validated = true;
    r.passed = r.passed && w[0].get<bool>();
    r.max_abs_error = w[1].is_number() ? w[1].get<double>() : INFINITY;
    r.max_abs_reference = w[2].get<double>();
    r.relative_error = w[3].is_number() ? w[3].get<double>() : INFINITY;
    r.tolerance = w[4].get<double>();
  }
}

std::vector<reporting::WhatIf> what_if_rows(const runtime::World& world, const TrainFlags& f, double baseline_ns);

// Wall seconds of a run's phases (this host; never a simulated figure): Timer adds its scope's duration to one.
struct WallSplit {
  double init_s = 0, forward_s = 0, reference_s = 0, checkpoint_s = 0;
  class Timer {
   public:
    explicit Timer(double& into) : into_(into) {}
    ~Timer() { into_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count(); }
    Timer(const Timer&) = delete;
    Timer& operator=(const Timer&) = delete;

   private:
    double& into_;
    std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now();
  };
};

int run_train_dp(const runtime::World& world, const TrainFlags& f, const TrainSetup& s) {
  const auto& c = s.model;
  const int n = world.size();
  const topology::Topology& topo = *s.topology;
  // The plan's mesh (load() checked it); one trainer for every mesh (tp = cp = 1: data parallelism alone).
  std::optional<sharding::DeviceMesh> mesh(run_mesh(world, s));
  world.agree([&] {  // the trace's chips and axis on this mesh, before any step (exit 2)
    if (!f.trace_path.empty()) (void)reporting::resolve_trace_filter(f.trace, topo, &*mesh);
  });
  const std::vector<int>& chips = mesh->placement();
  sim::Timeline tl(chips.at(size_t(world.rank())), topo, s.device);
  tl.set_record_dependencies(f.profile || !f.trace_path.empty() || !f.plots_dir.empty());  // bookkeeping only: no simulated time changes
  tl.set_keep_events(false);  // the report reads the summary; the trace and the profile keep them (dependencies)
  runtime::Transport tp(world, tl, chips);
  tp.set_shape_only(s.shape_only);  // shared with the mesh's sub-groups
  tp.set_plan_algorithms(true);     // parallel.algorithm's rule (collectives::plan_algorithm), for the sub-groups too
  mesh->bind(tp);
  // The forward mode's wall split (the report's wall line and JSON: init, sharded forward, reference, checkpoint).
  WallSplit wall;
  std::optional<models::LmTpTrainer> trainer;
  world.agree([&] {
    try {
      const WallSplit::Timer t(wall.init_s);
      trainer.emplace(c, s.train, *mesh, tp, tl, s.dp, s.sp, s.cp_zigzag, s.ulysses, s.fused);
    } catch (const std::invalid_argument& e) {
      throw UsageError(e.what());
    } catch (const ConfigKeyError& e) {  // a key the mesh's groups refuse: its FILE:LINE in the config as run
      train_config(f).fail_at(e.key(), e.what());
    }
  });
  auto step = [&] { return trainer->step(); };
  // The single-device reference validates the run (real data).
  const bool reference =
      ((f.validate && !(f.forward && s.validate_off)) || s.validate_config) && !(f.forward && s.shape_only);
  const auto resumed = load_resume(world, f, s, *trainer, reference);
  // The forward mode saves the weights part of the state (the masters; no moments exist to save), at the step it
  // started from.
  auto state_shard = [&] { return trainer->state_shard(!f.forward); };
  // --trace-step: the step whose trace is written (default the last; the profile and plots are the last step's).
  const int64_t trace_step = f.trace.step > 0 ? f.trace.step : s.train.steps;
  world.agree([&] {
    const int64_t first = f.forward ? s.train.steps : (resumed ? resumed->step : 0) + 1;
    if (f.trace.step > 0 && (f.trace.step < first || f.trace.step > s.train.steps))
      throw UsageError("--trace-step: this run's steps are " + std::to_string(first) + " .. " +
                       std::to_string(s.train.steps) + " (got " + std::to_string(f.trace.step) + ")");
  });
  const double peak_tflops = s.device.peak_flops_per_ns(runtime::precision_of(c.dtype)) / 1e3;
  const int dp_size = n / (s.tp * s.cp * s.pp);
  const std::string mesh_text = mesh_text_of(s, dp_size);
  TrainLog log(world, f, report_head(f, s, n, dp_size, *mesh, trainer->buckets(), resumed));
  log.head();
  models::LmDpStepResult last;
  // A step's row (and the forward's): the critical chip's, the summary's rule (reporting::critical_step; collective).
  const auto step_row = [&](const models::LmDpStepResult& r, double grad_norm) {
    const reporting::CriticalStep cs = reporting::critical_step(world, r.breakdown, tl);
    return reporting::TrainStep{r.step, s.shape_only ? NAN : r.loss, grad_norm, cs.breakdown, cs.bubble_ns};
  };
  // The last step's per-chip and per-collective tables, fused ops and time per op (reporting/report.h, the one report
  // path of both modes), collected before a checkpoint's gathers add to the timeline. A folded run fills them too:
  // a mirrored chip's row is its mirror's (the control plane's rule, runtime/chips.h), as its timeline would be.
  reporting::RunReport figs;
  auto collect_figures = [&] {
    const double chip_bytes = memory_of(trainer->memory(), s, "", "", dp_size, f.forward).chip_bytes();
    const reporting::ChipFigures mine{&trainer->comm().stats, &trainer->fused_ops(), trainer->attention_ns(), chip_bytes, {}};
    reporting::gather_chip_figures(world, tl, mine, chips, figs);
  };
  // Whether the plan's state and activations (the report's memory rows) fit the usable HBM: known after the first
  // step; a plan that does not fit writes no checkpoint (exit 2 after the report, TrainLog::finish).
  std::optional<bool> fits;
  auto fits_hbm_now = [&] {
    if (!fits) {
      reporting::TrainMemory m = memory_of(trainer->memory(), s, "", "", dp_size, f.forward);
      if (s.pp > 1) {  // the largest stage's peak, as pipeline_report puts it in the report
        m.activations = 0;
        for (const auto& st : trainer->pipeline_summary()) m.activations = std::max(m.activations, st.peak_activation_bytes);
      }
      fits = m.chip_bytes() <= s.device.usable_hbm_bytes();
    }
    return *fits;
  };
  if (f.forward) {  // the forward mode: one forward of the next step's batch, no update
    {
      const WallSplit::Timer t(wall.forward_s);
      last = agreed_step(world, [&] { return trainer->forward_step(); });
    }
    log.step(step_row(last, NAN), last.step);
    collect_figures();
    if (!f.checkpoint.empty() && fits_hbm_now()) {
      const WallSplit::Timer t(wall.checkpoint_s);
      save_state(world, f, s, state_shard(), mesh_text, log);
    }
  }
  for (int64_t i = resumed ? resumed->step : 0; !f.forward && i < s.train.steps; ++i) {
    // A long step says it is alive (runtime::chips::set_progress): every 30 s, or SHARDSIM_PROGRESS_S seconds.
    if (world.rank() == 0 && !f.quiet)
      runtime::chips::set_progress([i, steps = s.train.steps](uint64_t events, double elapsed) {
        std::fprintf(stderr, "shardsim: train: step %lld of %lld in progress, %.3g scheduler events, %.0f s elapsed (wall)\n",
                     (long long)(i + 1), (long long)steps, double(events), elapsed);
        std::fflush(stderr);
      }, std::getenv("SHARDSIM_PROGRESS_S") ? std::max(0.1, std::atof(std::getenv("SHARDSIM_PROGRESS_S"))) : 30.0);
    last = agreed_step(world, step);
    if (world.rank() == 0) runtime::chips::set_progress({}, 0);
    if (!f.trace_path.empty() && last.step == trace_step && trace_step != s.train.steps)
      reporting::profile_and_trace(world, tl, {f.trace_path, false, "", peak_tflops, f.trace, &*mesh}, log.report());
    log.step(step_row(last, s.shape_only ? NAN : last.grad_norm), s.train.steps);
    if (i + 1 == s.train.steps) collect_figures();
    if (save_due(f, last.step, s.train.steps) && fits_hbm_now())
      save_state(world, f, s, state_shard(), mesh_text, log);
  }
  runtime::chips::fold_verify("train");  // every chip is past the last step's agreement
  auto& rep = log.report();
  finish_simulated(rep, rep.train.steps.empty() ? last.breakdown : rep.train.steps.back().breakdown);
  report_figures(*trainer, s, f, figs, n, dp_size, rep);
  reporting::profile_and_trace(world, tl,
                              {trace_step == s.train.steps ? f.trace_path : std::string(), f.profile, f.plots_dir,
                               rep.peak_tflops_per_chip, f.trace, &*mesh},
                              rep);  // the last step's
  if (reference) {
    if (f.forward) {
      // A block stack's output rows, gathered on rank 0 (collective), against the reference's.
      std::optional<models::GatheredRows> rows;
      const auto& out = trainer->forward_output();
      if (c.vocab == 0) rows = models::gather_owner_rows(world, out.owner, out.rows, out.out, c.hidden);
      // The reference holds the whole model: every chip's shards go first (then one agreement, so no chip's
      // reference starts before they are gone), and the run's peak host memory is the larger of the two.
      trainer.reset();
      world.agree([] {});
      const WallSplit::Timer t(wall.reference_s);
      validate_forward(world, s, rep, resumed, rows ? &*rows : nullptr);
    } else {
      validate_losses(world, s, rep, resumed);
    }
  }
  if (f.forward) {
    rep.wall_init_s = wall.init_s;
    rep.wall_forward_s = wall.forward_s;
    rep.wall_reference_s = wall.reference_s;
    rep.wall_checkpoint_s = wall.checkpoint_s;
  }
  if (!f.what_if.empty()) rep.what_if = what_if_rows(world, f, rep.critical.total);
  if (f.step_ns_out) *f.step_ns_out = rep.critical.total;
  if (f.report_out) *f.report_out = rep;
  if (f.quiet) return kExitOk;
  return log.finish();
}

int run_train(const runtime::World& world, const TrainFlags& f);

// --what-if: each change re-simulated by the same trainer in shape-only mode, quiet, with BASELINE_NS the step.
std::vector<reporting::WhatIf> what_if_rows(const runtime::World& world, const TrainFlags& f, double baseline_ns) {
  std::vector<WhatIfPlan> plans;
  world.agree([&] { plans = plan_what_if(f.what_if, train_config(f)); });
  double step_ns = 0;
  return run_what_if(
      plans, baseline_ns,
      [&](const sharding::ConfigOverrides& ov) {
        TrainFlags v;
        v.config = f.config;
        v.config_text = f.config_text;
        v.steps = f.steps;
        v.shape_only = v.quiet = true;
        v.forward = f.forward;
        v.overrides = ov;
        v.step_ns_out = &step_ns;
        run_train(world, v);
        return step_ns;
      },
      f.overrides);
}

int run_train(const runtime::World& world, const TrainFlags& f) {
  TrainSetup s;
  const int chips_on_host = runtime::node_ranks() * runtime::chips_per_rank();
  std::unique_ptr<FileLock> checkpoint_lock;  // rank 0: the checkpoint file is this run's until it returns
  world.agree([&] {  // config errors: one clean message and exit 2 (a run too large for this host: exit 3)
    // One command surface: run and train take --checkpoint and --no-checkpoint alike.
    if (f.no_checkpoint && !f.checkpoint.empty())
      throw UsageError("--checkpoint and --no-checkpoint contradict each other");
    if (f.save_every > 0 && f.checkpoint.empty()) throw UsageError("--save-every: needs --checkpoint PATH");
    std::vector<std::pair<std::string, std::string>> outputs;
    if (!f.checkpoint.empty()) {
      (void)resolve_file_output(f.checkpoint, "--checkpoint");  // HDF5 seeks: never a stream
      outputs.emplace_back("--checkpoint", f.checkpoint);
    }
    if (!f.json_path.empty()) outputs.emplace_back("--json", f.json_path);
    if (!f.trace_path.empty()) outputs.emplace_back("--trace", f.trace_path);
    for (auto& o : reporting::check_plots_dir(f.plots_dir)) outputs.push_back(std::move(o));
    if (!outputs.empty()) check_outputs_distinct(outputs, {{"the config file", f.config}});
    if (!f.resume.empty()) {  // saved in place (--checkpoint = --resume) is fine; no other output replaces it
      std::erase_if(outputs, [](const auto& o) { return o.first == "--checkpoint"; });
      if (!outputs.empty()) check_outputs_distinct(outputs, {{"the --resume checkpoint", f.resume}});
    }
    s = load(f, world.size());
    if (s.shape_only && (!f.checkpoint.empty() || !f.resume.empty()))
      throw UsageError(std::string(!f.checkpoint.empty() ? "--checkpoint" : "--resume") +
                       ": a shape-only run has no training state (no data); drop the flag or mode: shape_only");
    if (s.shape_only && f.validate && !f.forward)
      throw UsageError("--validate: a shape-only run computes no values to compare; validate the same config at a "
                       "reduced size with real data");
    if (!f.what_if.empty())  // every change must load as a config before any step runs (exit 2 naming it)
      for (const auto& plan : plan_what_if(f.what_if, train_config(f))) {
        TrainFlags v;
        v.config = f.config;
        v.config_text = f.config_text;
        v.overrides = f.overrides;
        v.overrides.set.insert(v.overrides.set.end(), plan.sets.begin(), plan.sets.end());
        v.shape_only = true;
        v.forward = f.forward;  // checked in the run's own mode (the forward mode takes plans training refuses)
        try {
          (void)load(v, world.size());
        } catch (const ConfigError& e) {
          throw UsageError("--what-if " + plan.change + ": " + e.what());
        } catch (const UsageError& e) {
          throw UsageError("--what-if " + plan.change + ": " + e.what());
        }
      }
    check_host_memory(s, world.size(), runtime::node_ranks(), chips_on_host);
    // Two runs saving to one checkpoint would each rename their saves over it: the second is refused here.
    if (!f.checkpoint.empty() && world.rank() == 0)
      checkpoint_lock = std::make_unique<FileLock>(f.checkpoint, "--checkpoint", "train " + f.config);
  });
  return run_train_dp(world, f, s);
}

}  // namespace

reporting::RunReport run_executor_point(const runtime::World& world, const experiments::ExecutorRun& run) {
  TrainFlags f;
  f.forward = !run.train;
  f.config = run.where;
  f.config_text = run.config_yaml;
  f.validate = run.validate;
  f.shape_only = run.shape_only;
  f.what_if = run.what_if;
  f.quiet = true;
  reporting::RunReport r;
  f.report_out = &r;
  run_train(world, f);
  return r;
}

int run_forward(const runtime::World& world, const std::string& config, const std::string& json_path,
                const apps::RunOptions& opt, const sharding::ConfigOverrides& overrides,
                const std::string& what_if) {
  TrainFlags f;
  f.forward = true;
  f.config = config;
  f.json_path = json_path;
  f.resume = opt.resume_from;
  if (opt.checkpoint_path) f.checkpoint = *opt.checkpoint_path;
  f.no_checkpoint = opt.no_checkpoint;  // both: refused by run_train, as in train
  f.trace_path = opt.trace_path;
  f.trace = opt.trace;  // --trace-chips / --trace-axis / --trace-window / --trace-max-mb
  f.profile = opt.profile;
  f.plots_dir = opt.plots_dir;
  f.shape_only = opt.shape_only;
  f.validate = true;  // unless shape-only (run_train_dp)
  f.what_if = what_if;
  f.overrides = overrides;
  // The config's checkpoint: section (an MLP config's; train_setup.cpp's load checks its keys) is run's default
  // target: path (default NAME.h5, shardsim_run.h5 without a name) unless enabled: false, --no-checkpoint or a
  // shape-only run (no data).
  world.agree([&] {
    if (opt.checkpoint_path || opt.no_checkpoint || opt.shape_only) return;
    const ConfigNode root = train_config(f);
    if (!root.has("checkpoint") || sharding::load_workload_shape_only(root)) return;
    const ConfigNode ck = root.child("checkpoint");
    ck.expect_keys({"path", "enabled"});
    if (!ck.get_bool("enabled", true)) return;
    const std::string name = root.get_string("name", "");
    f.checkpoint = ck.get_string("path", (name.empty() ? std::string("shardsim_run") : name) + ".h5");
  });
  return run_train(world, f);
}

Command add_train(CLI::App& app, const runtime::World& world) {
  auto* sub = app.add_subcommand("train", "train the reference language model for k steps, on one chip or data-parallel "
                                          "with ZeRO over the ranks (losses, simulated step time, tokens/s, MFU, memory)");
  auto flags = std::make_shared<TrainFlags>();
  train_options(sub, flags);
  return {sub, [&world, flags] { return run_train(world, *flags); }};
}

}  // namespace shardsim::apps

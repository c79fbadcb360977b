// `shardsim train [CONFIG] [--steps N]`: k training steps of the reference language model (models/lm_*), with the
// losses, the simulated step time on the config's device, tokens/s and MFU.
//
// Every run is the executor (models/lm_tp.h); one chip without a parallel: section is its dp = 1 plan, and the
// single-device reference (models/lm_train.h) only answers --validate. On N chips: data parallelism, dp = N replicas with ZeRO
// (sharding/plans/data_parallel.h): parallel: {dp: N (default: the ranks; must equal them), tp: 1, zero: 0..3, bucket_bytes: B
// (default auto: Megatron-LM's rule; 0 = one reduction after backward)}, over the topology: section (default: a ring of the ranks,
// 100 GB/s per direction and 1 us per hop, the assumed NeuronLink figures of configs/workloads). The report adds
// chip 0's step split into compute / exposed communication / idle (sim::Timeline::breakdown) and the per-chip
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
                const models::LmTrainSnapshot& snap, const std::string& mesh, TrainLog& log) {
  world.agree([&] { models::save_lm_train_state(world, f.checkpoint, s.model, s.train, snap, mesh, s.config_text); });
  log.saved(snap.step);
}

std::optional<models::LmTrainSnapshot> load_resume(const runtime::World& world, const TrainFlags& f,
                                                   const TrainSetup& s) {
  if (f.resume.empty()) return std::nullopt;
  std::optional<models::LmTrainSnapshot> snap;
  world.agree([&] {
    snap = models::load_lm_train_state(world, f.resume, s.model, s.train);
    if (!f.forward && snap->step >= s.train.steps)
      throw UsageError("--resume: " + f.resume + " is at step " + std::to_string(snap->step) +
                       " and the run stops at step " + std::to_string(s.train.steps) +
                       " (train.steps or --steps is the last step, not a count): nothing to run");
  });
  return snap;
}

// The report's fields every training run has (reporting/report.h).
reporting::RunReport train_report(const TrainFlags& f, const TrainSetup& s, int chips) {
  const auto& c = s.model;
  reporting::RunReport r;
  r.run_mode = f.forward ? "forward" : "train";
  r.train.forward = f.forward;
  r.name = s.name.empty() ? std::filesystem::path(f.config).stem().string() : s.name;
  r.config_file = s.config_name;
  r.device = sim::describe(s.device);
  r.dtype = runtime::dtype_name(c.dtype);
  r.chips = chips;
  r.layers = static_cast<int>(c.layers);  // the JSON's "layers" (the model's; it said 1 for every training run)
  r.shape_only = s.shape_only;
  r.peak_tflops_per_chip = s.device.peak_flops_per_ns(runtime::precision_of(c.dtype)) / 1e3;
  r.peak_tflops = r.peak_tflops_per_chip * chips;
  r.hbm_capacity_bytes = s.device.hbm_bytes();
  r.hbm_reserve_bytes = s.device.hbm_reserve_bytes();
  r.trace = f.trace_path;
  char b[512];
  std::snprintf(b, sizeof b, "vocab %lld, hidden %lld, %lld layers, %lld/%lld heads of %lld, ffn %lld; %lld parameters "
                "(%lld in GEMMs); %s", (long long)c.vocab, (long long)c.hidden, (long long)c.layers,
                (long long)c.heads, (long long)c.kv_heads, (long long)c.head_dim, (long long)c.ffn,
                (long long)models::lm_param_count(c), (long long)models::lm_matmul_param_count(c),
                c.dtype == runtime::DType::fp32 ? "fp32" : "bf16 compute, fp32 master weights and AdamW state");
  r.train.model = b;
  if (c.vocab == 0) {  // a stack of blocks: no embedding or head
    std::snprintf(b, sizeof b, "a stack of %lld transformer blocks (no embedding or head), hidden %lld, %lld/%lld heads "
                  "of %lld, ffn %lld; %lld parameters; loss: mean squared error to a seeded target (kernels/mse_loss.h); %s",
                  (long long)c.layers, (long long)c.hidden, (long long)c.heads, (long long)c.kv_heads,
                  (long long)c.head_dim, (long long)c.ffn, (long long)models::lm_param_count(c),
                  c.dtype == runtime::DType::fp32 ? "fp32" : "bf16 compute, fp32 master weights and AdamW state");
    r.train.model = b;
  }
  if (c.vocab == 0 && !c.attention) {  // model.kind mlp: the block without its attention half
    std::snprintf(b, sizeof b, "a stack of %lld MLP blocks x + mlp(rmsnorm(x)) (no attention, no embedding or head), "
                  "hidden %lld, ffn %lld; %lld parameters; loss: mean squared error to a seeded target "
                  "(kernels/mse_loss.h); %s", (long long)c.layers, (long long)c.hidden, (long long)c.ffn,
                  (long long)models::lm_param_count(c),
                  c.dtype == runtime::DType::fp32 ? "fp32" : "bf16 compute, fp32 master weights and AdamW state");
    r.train.model = b;
  }
  if (!c.gated() || c.layernorm() || c.position != sharding::PositionKind::rope || c.tied_embeddings)
    r.train.model += std::string("; ") + sharding::norm_name(c.norm) + ", " + sharding::mlp_name(c.mlp) + " MLP, " +
                     sharding::position_name(c.position) + " positions" + (c.tied_embeddings ? ", tied embeddings" : "");
  if (c.unfused_attention()) r.train.model += "; unfused attention core";
  if (c.dropout > 0 || c.linear_bias) {
    char x[160];
    std::snprintf(x, sizeof x, "; charged, not computed: %s%s", c.dropout > 0 ? "dropout" : "",
                  c.linear_bias ? (c.dropout > 0 ? ", linear biases" : "linear biases") : "");
    r.train.model += x;
    if (c.dropout > 0) {
      std::snprintf(x, sizeof x, " (dropout %g)", c.dropout);
      r.train.model += x;
    }
  }
  r.train.log_vocab = c.vocab > 0 ? std::log(double(c.vocab)) : NAN;  // none for a block stack
  r.train.tokens_per_step = double(c.batch) * double(c.seq);
  // A forward is a third of a training step's model FLOPs (the backward's two GEMMs per forward GEMM).
  r.train.model_flops_per_step =
      models::lm_model_flops_per_token(c) * r.train.tokens_per_step / (f.forward ? 3.0 : 1.0);
  return r;
}

// The summary of the last step (or the mean step on one chip): step time, tokens/s, MFU.
void finish_simulated(reporting::RunReport& r, const sim::Breakdown& b) {
  auto& t = r.train;
  r.critical = b;
  r.critical_chip = 0;
  t.step_ns = b.total;
  r.tokens_per_s = b.total > 0 ? t.tokens_per_step / b.total * 1e9 : 0;
  r.total_flops = t.model_flops_per_step;
  r.sim_tflops = b.total > 0 ? t.model_flops_per_step / b.total / 1e3 : 0;
  t.mfu = r.peak_tflops > 0 ? r.sim_tflops / r.peak_tflops : 0;
  r.peak_fraction = t.mfu;
}

void resumed_into(reporting::RunReport& r, const TrainFlags& f, const std::optional<models::LmTrainSnapshot>& snap) {
  if (!snap) return;
  r.resumed_from = r.train.resumed_from = f.resume;
  r.train.resumed_step = snap->step;
  r.train.resumed_mesh = snap->mesh + (snap->weights_only && !f.forward ? "; weights only (a forward's checkpoint): "
                                                                          "AdamW's moments start at zero" : "");
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
    const models::LossCheck check = models::check_losses(c.dtype, losses, reference);
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
    const models::LossCheck check = models::check_losses(c.dtype, {{1, t.steps.back().loss}}, {reference});
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

std::string zero_rule(const char* what, int zero, bool mixed, const char* psi) {
  const std::string w = what;
  const int per = w == "optimizer state" ? (mixed ? 12 : 8) : (mixed ? 2 : 4);
  const int from = w == "parameters" ? 3 : w == "gradients" ? 2 : 1;
  return std::to_string(per) + "*" + psi + (zero >= from ? "/N_d" : "");
}

// FORWARD (the forward mode): the parameters alone (no gradients or optimizer state are needed for a forward) and
// the tensors one micro-batch's forward produces (held only until the next layer has read them: an upper bound).
reporting::TrainMemory memory_of(const models::LmDpMemory& mem, const TrainSetup& s, const std::string& basis,
                                const char* psi, int dp_size, bool forward) {
  reporting::TrainMemory m;
  const bool mixed = s.model.dtype != runtime::DType::fp32;
  m.basis = basis;
  if (mem.padding > 0)  // sharding/plans/data_parallel.h, "Padding"
    m.basis += "; measured bytes include " + std::to_string(static_cast<long long>(mem.padding)) +
               " elements of padding per flat buffer (Megatron's distributed-optimizer alignment)";
  m.rows = {{"parameters", mem.params, mem.formula_params, zero_rule("parameters", s.dp.zero, mixed, psi)}};
  if (!forward)
    m.rows.insert(m.rows.end(),
                  {{"gradients", mem.grads, mem.formula_grads, zero_rule("gradients", s.dp.zero, mixed, psi)},
                   {"optimizer state", mem.optimizer, mem.formula_optimizer,
                    zero_rule("optimizer state", s.dp.zero, mixed, psi)}});
  m.activations = mem.activations;
  m.activations_note = std::string(forward ? "one micro-batch's forward tensors (an upper bound: nothing is kept for "
                                             "a backward)"
                                   : s.dp.recompute ? "recompute per block: the block inputs, one block's and the "
                                                      "head's saved tensors"
                                                    : "the forward's saved tensors") +
                       " for " + std::to_string(s.model.batch / dp_size) + " sequences" +
                       (s.cp > 1 ? " (this chip's 1/cp of each)" : "");
  return m;
}

// The report's pipeline section (collective: every chip's stage summary) and chip 0's activations: its peak over
// the micro-batches it holds at once (models/lm_tp.h, LmStageSummary).
// A MoE model's section (reporting/report.h, TrainMoe): every MoE layer of the last step (collective: gathered
// from the stages that hold them) and chip 0's expert state.
void moe_report(models::LmTpTrainer& trainer, const TrainSetup& s, const sharding::ModelSpec& c,
                reporting::RunReport& rep) {
  reporting::TrainMoe m;
  const kernels::MoeSpec& spec = c.moe->spec;
  m.spec = sharding::plans::moe_text(*c.moe);
  m.total_params = double(models::lm_param_count(c));
  const kernels::MoeParams one = kernels::moe_params(spec);
  int64_t moe_layers = 0;
  for (int64_t l = 0; l < c.layers; ++l) moe_layers += c.moe_layer(l) ? 1 : 0;
  m.active_params = m.total_params - double(moe_layers) * (one.total - one.active);
  m.expert_params_chip = trainer.expert_param_count();
  // ZeRO over the experts' data-parallel group (dp): parameters P, gradients P, optimizer state K per weight, the
  // stage's parts divided by dp.
  const double P = double(runtime::dtype_size(c.dtype)), K = c.dtype == runtime::DType::fp32 ? 8 : 12;
  const double nd = s.plan.dp;
  const int z = s.dp.zero;
  m.expert_state_bytes = m.expert_params_chip * (P / (z >= 3 ? nd : 1) + P / (z >= 2 ? nd : 1) + K / (z >= 1 ? nd : 1));
  char b[200];
  std::snprintf(b, sizeof b, "ZeRO stage %d over the experts' dp = %.0f replicas: %g + %g + %g bytes per weight", z, nd,
                P / (z >= 3 ? nd : 1), P / (z >= 2 ? nd : 1), K / (z >= 1 ? nd : 1));
  m.expert_state_rule = b;
  // The memory section's formulas take each bucket over its own group: say which N_d the experts have.
  if (rep.train.has_memory && s.plan.ep > 1) {
    std::snprintf(b, sizeof b, "; of them %.0f expert weights (%lld of %lld experts per MoE layer) on N_d = dp = %d, "
                  "the rest on N_d = dp x ep x cp = %d", m.expert_params_chip,
                  (long long)(spec.experts() / s.plan.ep), (long long)spec.experts(), s.plan.dp,
                  s.plan.dp * s.plan.ep * s.cp);
    rep.train.memory.basis += b;
  }
  const sharding::ModelSpec& local = trainer.local_config();
  const double T = double(local.batch * local.seq), ep = s.plan.ep;
  for (const auto& st : trainer.moe_layer_table()) {
    reporting::TrainMoeLayer l;
    l.layer = st.layer;
    l.max_tokens = st.max_tokens;
    l.mean_tokens = st.mean_tokens;
    l.received_rows = double(st.received);
    l.aux = st.aux;
    l.dispatch_bytes = st.dispatch_bytes;
    l.dispatch_closed_form = T * double(spec.router.top_k) * double(c.hidden) * P * (ep - 1) / ep;
    l.dispatch_ns = st.dispatch_ns;
    l.buffer_bytes = st.buffer_bytes;
    l.expert_ns = st.expert_ns;
    l.balanced_expert_ns = st.balanced_expert_ns;
    m.layers.push_back(l);
  }
  rep.train.has_moe = true;
  rep.train.moe = std::move(m);
}

void pipeline_report(models::LmTpTrainer& trainer, reporting::RunReport& rep) {
  using namespace sharding::plans;
  const PipelineSchedule& sch = trainer.schedule();
  const std::vector<models::LmStageSummary> stages = trainer.pipeline_summary();
  reporting::TrainPipeline& p = rep.train.pipeline;
  rep.train.has_pipeline = true;
  p.schedule = schedule_name(sch.kind);
  p.p = sch.p;
  p.m = sch.m;
  p.v = sch.v;
  // ZB-H1's closed form needs the actions' costs: the stages' mean F, BI and W spans (uniform stages assumed).
  p.closed_form = closed_form_bubble(sch.kind, sch.p, sch.m, sch.v, models::lm_stage_costs(stages));
  p.closed_form_rule = sch.kind == ScheduleKind::interleaved ? "(p-1)/(v*m+p-1)"
                       : sch.kind == ScheduleKind::zb_h1
                           ? "(p-1)(F+B-W)/((p-1)(F+B-W)+m(F+B+W)), F B W the mean F, BI, W spans"
                           : "(p-1)/(m+p-1)";
  for (const auto& st : stages) {
    p.pipeline_ns = st.pipeline_ns;
    p.bubble_fraction += st.bubble_fraction() / double(stages.size());
    p.stages.push_back({st.busy_ns, st.bubble_ns, st.bubble_fraction(), st.peak_activation_bytes,
                        st.peak_microbatches, st.bytes_forward, st.bytes_backward, st.peak_pending_w_bytes});
  }
  // The largest stage's peak (the first under 1F1B and interleaving; the last can be larger under GPipe, which
  // holds m micro-batches everywhere and the head's logits there, and under ZB-H1, whose last stage keeps up to p
  // pending weight gradients), so the HBM check holds for every stage.
  size_t top = 0;
  for (size_t i = 1; i < stages.size(); ++i)
    if (stages[i].peak_activation_bytes > stages[top].peak_activation_bytes) top = i;
  rep.train.memory.activations = stages[top].peak_activation_bytes;
  char note[200];
  std::snprintf(note, sizeof note, "the largest stage's peak, stage %zu: %.2f micro-batches of its layers held at once "
                "under %s%s", top, stages[top].peak_microbatches, p.schedule.c_str(),
                stages[top].peak_pending_w_bytes > 0 ? " with its pending weight gradients" : "");
  rep.train.memory.activations_note = note;
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

// The report's mesh attribute of a checkpoint: "pp=2 x dp=2 x tp=2 (sequence parallel), ZeRO stage 1".
std::string mesh_text_of(const TrainSetup& s, int n, int dp_size) {
  if (!(s.tp > 1 || s.cp > 1 || s.pp > 1)) return "dp=" + std::to_string(n) + ", ZeRO stage " + std::to_string(s.dp.zero);
  return (s.pp > 1 ? "pp=" + std::to_string(s.pp) + " x " : std::string()) + "dp=" + std::to_string(dp_size) +
         (s.cp > 1 ? (s.ulysses ? " x ulysses=" : " x cp=") + std::to_string(s.cp) : std::string()) +
         " x tp=" + std::to_string(s.tp) +
         (s.sp ? (s.fused ? " (sequence parallel, fused)" : " (sequence parallel)") : "") +
         (s.dp.zero > 0 ? ", ZeRO stage " + std::to_string(s.dp.zero) : "");
}

// The report's head, printed before the first step: the model, topology, mesh, the plan line (the plan registry's
// one text for both modes, and in training the trainer's BUCKETS), the data line and the resumed state.
reporting::RunReport report_head(const TrainFlags& f, const TrainSetup& s, int n, int dp_size,
                              const sharding::DeviceMesh& mesh, int buckets,
                              const std::optional<models::LmTrainSnapshot>& resumed) {
  const auto& c = s.model;
  const topology::Topology& topo = *s.topology;
  reporting::RunReport r = train_report(f, s, n);
  r.topology = s.default_topology ? topo.describe() + " (default: 100 GB/s, 1 us per hop)" : topo.describe();
  r.mesh = mesh.mapping_text();
  r.plan = sharding::plans::plan_text(s.spec, s.plan, !f.forward);
  if (!f.forward && dp_size * s.cp > 1 && s.dp.zero < 3)
    r.plan += "; " + std::to_string(buckets) + " gradient bucket" + (buckets == 1 ? "" : "s");
  char b[1024];
  const long long per_replica = (long long)(c.batch / dp_size);
  const std::string micro = s.dp.micro_batch > 0 ? ", " + std::to_string(per_replica / s.dp.micro_batch) +
                                                       " micro-batches of " + std::to_string(s.dp.micro_batch) +
                                                       (f.forward ? "" : ", gradients accumulated")
                                                 : std::string();
  if (f.forward)  // run reads no optimizer setting: a training config's train: section is accepted and unused
    std::snprintf(b, sizeof b, "global batch %lld x seq %lld = %.0f tokens in the forward (%lld sequences per "
                  "replica%s)%s", (long long)c.batch, (long long)c.seq, r.train.tokens_per_step, per_replica,
                  micro.c_str(), s.has_train_section ? "; the config's train: section is ignored by run (one "
                  "forward, no optimizer step)" : "");
  else
    std::snprintf(b, sizeof b, "global batch %lld x seq %lld = %.0f tokens per step (%lld sequences per replica%s); "
                  "AdamW lr %g, weight decay %g, clip %g", (long long)c.batch, (long long)c.seq,
                  r.train.tokens_per_step, per_replica, micro.c_str(), double(s.train.adamw.lr),
                  double(s.train.adamw.weight_decay), s.train.max_grad_norm);
  r.train.data = b;
  resumed_into(r, f, resumed);
  return r;
}

// The report's tail figures after the last step: the memory rows (ZeRO's formula beside the measured state), the
// pipeline's stages, the collected per-chip / per-collective / fused / per-op tables FIGS (the forward's headline is
// the chip that finishes last, run's rule; a training step's stays chip 0's step) and the MoE rows.
void report_figures(models::LmTpTrainer& trainer, const TrainSetup& s, const TrainFlags& f,
                    const reporting::RunReport& figs, int n, int dp_size, reporting::RunReport& rep) {
  const auto& c = s.model;
  const bool tp_mesh = s.tp > 1 || s.cp > 1 || s.pp > 1;  // the tp-mesh wording whenever a tp, cp or pp axis exists
  const auto mem = trainer.memory();
  const double psi = double(models::lm_param_count(c));
  char b[1024];
  if (tp_mesh)
    std::snprintf(b, sizeof b, "Psi_tp = %.0f of Psi = %.0f parameters on this chip: its tp shards and the "
                  "replicated norms; ZeRO formula, N_d = %d, stage %d", trainer.local_param_count(), psi,
                  dp_size * s.cp, s.dp.zero);
  else
    std::snprintf(b, sizeof b, "ZeRO formula for Psi = %.0f, N_d = %d, stage %d", psi, n, s.dp.zero);
  rep.train.has_memory = true;
  rep.train.memory = memory_of(mem, s, b, tp_mesh ? "Psi_tp" : "Psi", dp_size, f.forward);
  if (s.pp > 1) pipeline_report(trainer, rep);
  if (!figs.per_chip.empty()) {
    rep.per_chip = figs.per_chip;
    rep.ops = figs.ops;
    rep.comm = figs.comm;
    rep.fused = figs.fused;
    rep.all_reduce_ns = figs.all_reduce_ns;
    rep.all_reduce_bytes_per_chip = figs.all_reduce_bytes_per_chip;
    rep.all_reduce_expected_bytes = figs.all_reduce_expected_bytes;
    rep.attention_ns = figs.attention_ns;  // the critical chip's (gather_chip_figures)
    if (f.forward) {
      finish_simulated(rep, figs.critical);
      rep.critical_chip = figs.critical_chip;
    }
  }
  if (c.moe) moe_report(trainer, s, c, rep);
}

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
  const auto resumed = load_resume(world, f, s);
  // The forward mode saves the weights part of the state (the masters; no moments exist to save), at the step it
  // started from.
  auto gather_state = [&] {
    if (!f.forward) return trainer->gather_state();
    models::LmTrainSnapshot w;
    w.master = trainer->gather_master();
    w.step = resumed ? resumed->step : 0;
    w.weights_only = true;
    return w;
  };
  if (resumed) trainer->restore(*resumed);
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
  const std::string mesh_text = mesh_text_of(s, n, dp_size);
  TrainLog log(world, f, report_head(f, s, n, dp_size, *mesh, trainer->buckets(), resumed));
  log.head();
  models::LmDpStepResult last;
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
    log.step({last.step, s.shape_only ? NAN : last.loss, NAN, last.breakdown}, last.step);
    collect_figures();
    if (!f.checkpoint.empty() && fits_hbm_now()) {
      const WallSplit::Timer t(wall.checkpoint_s);
      save_state(world, f, s, gather_state(), mesh_text, log);
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
    log.step({last.step, s.shape_only ? NAN : last.loss, s.shape_only ? NAN : last.grad_norm, last.breakdown},
             s.train.steps);
    if (i + 1 == s.train.steps) collect_figures();
    if (save_due(f, last.step, s.train.steps) && fits_hbm_now())
      save_state(world, f, s, gather_state(), mesh_text, log);
  }
  runtime::chips::fold_verify("train");  // every chip is past the last step's agreement
  auto& rep = log.report();
  finish_simulated(rep, last.breakdown);
  report_figures(*trainer, s, f, figs, n, dp_size, rep);
  reporting::profile_and_trace(world, tl,
                              {trace_step == s.train.steps ? f.trace_path : std::string(), f.profile, f.plots_dir,
                               rep.peak_tflops_per_chip, f.trace, &*mesh},
                              rep);  // the last step's
  if (((f.validate && !(f.forward && s.validate_off)) || s.validate_config) && !(f.forward && s.shape_only)) {
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
  if (opt.checkpoint_path && !opt.no_checkpoint) f.checkpoint = *opt.checkpoint_path;
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
    if (opt.no_checkpoint && opt.checkpoint_path)
      throw UsageError("--checkpoint and --no-checkpoint contradict each other");
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

// run_block (models/transformer.h): one transformer block (or MLP) stack run on the device mesh, validated against
// the single-device reference, checkpointed and resumed.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <sstream>
#include <thread>

#include "checkpoint/checkpoint.h"
#include "common/error.h"
#include "kernels/gemm.h"
#include "models/block_weights.h"
#include "models/mlp.h"
#include "models/profile.h"
#include "models/report.h"
#include "models/lm_validate.h"
#include "models/transformer.h"
#include "models/workload.h"
#include "sharding/placement.h"
#include "sharding/plans/block.h"
#include "sharding/plans/registry.h"
#include "sharding/plans/block_ops.h"
#include "sharding/plans/tensor_parallel.h"
#include "sim/memory.h"
#include "sim/timeline.h"

namespace shardsim::sharding {

using namespace checkpoint;  // save_checkpoint, CheckpointReader, CheckpointEntry, SaveOptions
using namespace block_detail;
using plans::Chip;
using plans::Comm;
using runtime::Tensor;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

namespace {

// One run of run_block on this chip: the state its phases share, each phase a method (in the order run() calls
// them). Every rank constructs one and calls run(); the collective phases run on every rank.
class BlockRun {
 public:
  BlockRun(const runtime::World& world, const BlockConfig& cfg, const BlockRunOptions& opt)
      : world_(world), cfg_(cfg), opt_(opt), s_(cfg.shape), p_(cfg.plan), rank_(world.rank()),
        chips_(world.size()), chip_id_(cfg.topology.placement().at(static_cast<size_t>(rank_))), T_(s_.seq),
        mesh_(cfg.mesh), t_idx_(mesh_.coordinate("tp", rank_)), u_idx_(mesh_.coordinate("cp", rank_)),
        d_idx_(mesh_.coordinate("dp", rank_)), shape_only_(cfg.shape_only || opt.shape_only), real_(!shape_only_),
        tl_(chip_id_, cfg.topology, cfg.device), world_tp_(world, tl_, cfg.topology.placement()),
        memory_(chip_id_, cfg.device.usable_hbm_bytes()),
        // This chip's tokens (its cp or Ulysses chunk of the sequence: the rows its GEMMs see).
        layout_(plans::token_layout(T_, 1, p_.cp * p_.ulysses, u_idx_, p_.zigzag && p_.ulysses == 1)),
        activations_(!s_.attention), act_global_{int64_t{p_.dp} * T_, s_.hidden}, act_offset_{int64_t{d_idx_} * T_, 0},
        act_writer_(t_idx_ == 0 && u_idx_ == 0), kind_(s_.attention ? "transformer_block" : "mlp") {
    tl_.set_record_dependencies(opt.profile || !opt.trace_path.empty() || !opt.plots_dir.empty());  // no time changes
    tl_.set_keep_events(false);  // the report reads the summary; the trace and the profile keep them (dependencies)
    world_tp_.set_shape_only(shape_only_);  // shared with the mesh's sub-groups split from it
    mesh_.bind(world_tp_);                   // mesh rank r on chip placement[r]
    // The residual rows this chip holds (with sp a Shard(0) over tp of its tokens).
    n_attn_ = layout_.seq_local;
    resid_rows_ = layout_.pos;
    if (p_.sp) {
      const int64_t n = n_attn_ / p_.tp;
      resid_rows_.assign(layout_.pos.begin() + t_idx_ * n, layout_.pos.begin() + (t_idx_ + 1) * n);
    }
    for (int64_t l = 0; l < s_.layers; ++l) layer_w_.push_back(make_weights(s_, p_.tp, t_idx_, l, real_));
  }

  RunReport run() {
    const auto t_start = std::chrono::steady_clock::now();
    if (!opt_.resume_from.empty()) resume();
    if (!(reader_ && activations_)) x_ = init_x(s_, batch_rows(resid_rows_), real_);
    mem_plan_ = block_memory(s_, p_, t_idx_);
    memory_.allocate("weights", mem_plan_.weights);
    memory_.allocate("x", mem_plan_.x);
    world_.sleepy_barrier();
    rep_.wall_init_s = seconds_since(t_start);
    const auto t_fwd = std::chrono::steady_clock::now();
    check_memory_plan();
    forward();
    world_.sleepy_barrier();
    rep_.wall_forward_s = seconds_since(t_fwd);
    describe();
    // Validation: the distinct residual rows gathered on rank 0 (real data only); without sp the tp shards hold
    // the same rows.
    if (cfg_.validate && real_)
      gathered_ = models::gather_owner_rows(world_, p_.sp || t_idx_ == 0, batch_rows(resid_rows_), out_, s_.hidden);
    gather_stats();
    profile_and_trace(world_, tl_,
                      {opt_.trace_path, opt_.profile, opt_.plots_dir,
                       cfg_.device.peak_tflops(runtime::precision_of(s_.dtype)), opt_.trace, &mesh_},
                      rep_);
    if (reader_ && activations_ && reader_->has("activations/output")) compare_resumed_output();
    if (!opt_.checkpoint_path.empty()) save();
    if (reader_ && cfg_.validate) read_reference_weights();
    reader_.reset();
    const auto t_ref = std::chrono::steady_clock::now();
    if (rank_ == 0) {
      chip_reports();
      if (cfg_.validate && !real_) rep_.single_device_ns = reference_ns_shape_only();
      else if (cfg_.validate) validate();
    }
    if (cfg_.validate && real_) {  // the verdict on every rank (the exit code)
      rep_.validated = true;
      rep_.passed = world_.broadcast(rep_.passed ? "1" : "0", 0) == "1";
      rep_.wall_reference_s = seconds_since(t_ref);
    }
    rep_.shape_only = shape_only_;
    rep_.layers = static_cast<int>(s_.layers);
    rep_.checkpoint = opt_.checkpoint_path;
    rep_.resumed_from = opt_.resume_from;
    rep_.trace = opt_.trace_path;
    rep_.wall_total_s = seconds_since(t_start);
    return std::move(rep_);
  }

 private:
  // Rows of the seeded [dp·seq, hidden] input: sequence d's token i is row d·seq + i.
  std::vector<int64_t> batch_rows(std::vector<int64_t> rows) const {
    for (auto& r : rows) r += int64_t{d_idx_} * s_.seq;
    return rows;
  }
  // Who writes each weight's block in a checkpoint (and counts it when a resumed run verifies the checksums): each
  // shard once. cp / ulysses ranks and dp replicas hold replicas; replicated tensors come from tp rank 0; a KV head
  // repeated over tp/kv_heads chips from the first of them.
  bool writes(const WeightSlot& slot) const {
    bool writer = u_idx_ == 0 && d_idx_ == 0;
    if (std::holds_alternative<Replicate>(slot.on_tp)) writer = writer && t_idx_ == 0;
    if (slot.kv && p_.tp > s_.kv_heads) writer = writer && t_idx_ % (p_.tp / s_.kv_heads) == 0;
    return writer;
  }
  void expect_dataset(const std::string& path, const std::string& ds, const runtime::Shape& want) const {
    const std::string needs = s_.attention ? "block" : "workload";
    if (reader_->global_shape(ds) != want)
      throw ConfigError("checkpoint " + path + ": dataset '" + ds + "' has shape " +
                        runtime::shape_str(reader_->global_shape(ds)) + " but the config's " + needs + " needs " +
                        runtime::shape_str(want));
    if (reader_->dtype(ds) != s_.dtype)
      throw ConfigError("checkpoint " + path + ": dataset '" + ds + "' is " + runtime::dtype_name(reader_->dtype(ds)) +
                        " but the config's workload.dtype is " + runtime::dtype_name(s_.dtype));
  }

  // This chip's shards (and, without attention, its input rows) from a checkpoint of any plan. Every rank checks
  // the file; a bad checkpoint fails the job once, with one message (World::agree). Without attention every chip of
  // replica d holds the stack's input and output rows d·seq.. whole; the checkpoint stores both ([dp·seq,
  // hidden], Shard(0) over dp, written by tp rank 0): a resumed run reads its input from there and must reproduce
  // the output. Checkpoints hold one layer (check_run refuses them with layers > 1).
  void resume() {
    const std::string& path = opt_.resume_from;
    Weights& w = layer_w_[0];
    world_.agree([&] {
      reader_ = std::make_unique<CheckpointReader>(world_, path);
      const std::string saved = reader_->root_attribute("workload");
      if (saved != kind_ && !(saved.empty() && !s_.attention))
        throw ConfigError("checkpoint " + path + ": written by a '" + (saved.empty() ? "?" : saved) +
                          "' workload, not a " + kind_);
      if (s_.attention)
        for (const char* key : {"heads", "kv_heads"}) {
          const std::string v = reader_->root_attribute(key);
          const int64_t want = std::string(key) == "heads" ? s_.heads : s_.kv_heads;
          if (v != std::to_string(want))
            throw ConfigError("checkpoint " + path + ": written with " + key + " " + v + " but the config has " +
                              std::to_string(want));
        }
      const std::string act = reader_->root_attribute("activation");
      const std::string mine = kernels::activation_name(s_.glu_activation());
      if (!act.empty() && act != mine)
        throw ConfigError("checkpoint " + path + ": written with activation '" + act +
                          "' but the config's workload.activation is '" + mine + "'");
      if (activations_) expect_dataset(path, "activations/input", act_global_);
      for (const auto& slot : weight_slots(s_, w)) expect_dataset(path, slot.name, slot.global);
      // The file is read once: each rank reads its own blocks, and every tensor's checksum is verified from the
      // blocks of its writers (which partition it). A corrupted tensor fails here, on every rank, before use.
      for (auto& slot : weight_slots(s_, w)) reader_->read_block_verified(slot.name, slot.offset, *slot.t, writes(slot));
      if (activations_) {
        x_ = Tensor(s_.dtype, {T_, s_.hidden});
        reader_->read_block_verified("activations/input", act_offset_, x_, act_writer_);
      }
    });
  }

  // The memory plan (block_memory, also checked at parse time) must be what this run holds.
  void check_memory_plan() const {
    const auto plan_mismatch = [&](const char* what, uint64_t planned, uint64_t actual) {
      if (planned != actual)
        throw RuntimeFault("chip " + std::to_string(chip_id_) + ": internal: memory plan '" + what + "' " +
                           std::to_string(planned) + " B differs from the run's " + std::to_string(actual) + " B");
    };
    const Weights& w = layer_w_[0];
    const size_t es = runtime::dtype_size(s_.dtype);
    const int64_t d = s_.head_dim, n_resid = static_cast<int64_t>(resid_rows_.size());
    uint64_t all_weight_bytes = 0;
    for (const auto& lw : layer_w_) all_weight_bytes += weight_bytes(lw);
    plan_mismatch("weights", mem_plan_.weights, all_weight_bytes);
    plan_mismatch("x", mem_plan_.x, x_.nbytes());
    const int64_t rows = p_.sp ? n_attn_ : n_resid;  // q/k/v and the MLP see the gathered rows with sp
    plan_mismatch("q/k/v", mem_plan_.qkv, static_cast<uint64_t>(rows * (w.nq + 2 * w.nkv) * d) * es);
    if (p_.cp > 1) plan_mismatch("ring", mem_plan_.ring, 2 * static_cast<uint64_t>(rows * w.nkv * d) * es);
    plan_mismatch("mlp", mem_plan_.mlp, static_cast<uint64_t>(rows * 2 * w.nf) * es);
  }

  // The layers, each the same code on its own weights; layer_end_ gets this chip's simulated time after each.
  void forward() {
    plans::PlanContext ctx{s_,        p_,   mesh_["tp"], mesh_["cp"], chip_, comm_, fused_ops_, n_attn_,
                           static_cast<int64_t>(resid_rows_.size())};
    const auto run_layer = [&](const Tensor& xin, const Weights& w) {
      if (!s_.attention) {
        // The MLP alone (models/mlp.h's HBM accounting): y held through the layer; gate and up during the local
        // part, then one ring chunk of y during the all_reduce (the same peak as holding them in that order).
        auto out_mem = memory_.scoped("output", mem_plan_.out);
        memory_.scoped("activations mlp", mem_plan_.mlp).release();
        auto ring_mem = memory_.scoped("all_reduce ring buffer", mem_plan_.ring);
        return plans::mlp_layer(chip_, &ctx, xin, block_weights(w), s_.glu_activation());
      }
      return plans::block_forward(ctx, layout_, block_weights(w), xin, nullptr,  // sharding/plans/block.h
                                  {&memory_, mem_plan_.qkv, mem_plan_.ring, mem_plan_.mlp});
    };
    out_ = run_layer(x_, layer_w_[0]);
    layer_end_.push_back(chip_.t);
    for (int64_t l = 1; l < s_.layers; ++l) {
      out_ = run_layer(out_, layer_w_[static_cast<size_t>(l)]);
      layer_end_.push_back(chip_.t);
    }
  }

  void describe() {
    rep_.name = cfg_.name;
    rep_.model = cfg_.model;
    rep_.config_file = cfg_.file;
    rep_.dtype = runtime::dtype_name(s_.dtype);
    rep_.tolerance = cfg_.tolerance;
    rep_.hbm_capacity_bytes = cfg_.device.hbm_bytes();
    rep_.topology = cfg_.topology.describe();
    rep_.device = sim::describe(cfg_.device);
    rep_.plan = plans::plan_text(s_, p_, false);  // the plan registry's one plan line (run and train)
    rep_.mesh = cfg_.mesh.mapping_text();
    rep_.chips = chips_;
  }

  // Every chip's simulated figures on rank 0, the critical chip's op breakdown (models/report.h, the executor's
  // report path too).
  void gather_stats() {
    ChipFigures mine{&comm_.stats, &fused_ops_, chip_.attention_ns, static_cast<double>(memory_.peak()), layer_end_};
    gather_chip_figures(world_, tl_, mine, cfg_.topology.placement(), rep_);
  }

  // Resumed without attention: the output must reproduce the stored one.
  void compare_resumed_output() {
    Tensor stored(s_.dtype, {T_, s_.hidden});
    world_.agree([&] {
      expect_dataset(opt_.resume_from, "activations/output", act_global_);
      reader_->read_block_verified("activations/output", act_offset_, stored, act_writer_);
    });
    rep_.resume_saved_tp = std::atoi(reader_->root_attribute("tp").c_str());  // 0 when missing: treated as resharded
    rep_.resume_same_layout = rep_.resume_saved_tp == p_.tp;
    rep_.resume_compared = true;
    if (rep_.resume_same_layout) {
      // Same sharding, same kernels, same reduction order: the output must be bit-identical.
      rep_.resume_bit_exact = !world_.any(!stored.bit_equal(out_));
    } else {
      // Resharded: the all_reduce sums the partials in another order, so only the tolerance applies.
      rep_.resume_relative_error = relative_error(out_, stored);
      rep_.resume_bit_exact = !world_.any(!(rep_.resume_relative_error <= cfg_.tolerance));
    }
  }

  // Every weight with its global shape, each shard written once (and the activations).
  void save() {
    const auto t_ck = std::chrono::steady_clock::now();
    std::vector<CheckpointEntry> entries;
    for (const auto& slot : weight_slots(s_, layer_w_[0])) {
      std::string sharding = TensorSpec{slot.name, slot.global, {{"tp", slot.on_tp}}}.describe(cfg_.mesh);
      if (slot.kv && p_.tp > s_.kv_heads) sharding += " (each KV head repeated on tp/kv_heads chips)";
      entries.push_back({slot.name, slot.t, slot.global, slot.offset, sharding, writes(slot)});
    }
    if (activations_) {
      const std::string sharding = TensorSpec{"", act_global_, {{"dp", Shard{0}}}}.describe(cfg_.mesh);
      entries.push_back({"activations/input", &x_, act_global_, act_offset_, sharding, act_writer_});
      entries.push_back({"activations/output", &out_, act_global_, act_offset_, sharding, act_writer_});
    }
    std::map<std::string, std::string> attrs = {
        {"shardsim_version", "0.1.0"}, {"workload", kind_},  {"model", cfg_.model},
        {"config", cfg_.text},          {"config_file", cfg_.file},  {"parallel_plan", rep_.plan},
        {"tp", std::to_string(p_.tp)},  {"activation", kernels::activation_name(s_.glu_activation())},
        {"seed", std::to_string(s_.seed)}, {"topology", rep_.topology},
    };
    if (s_.attention) {
      attrs["heads"] = std::to_string(s_.heads);
      attrs["kv_heads"] = std::to_string(s_.kv_heads);
    }
    SaveOptions so;
    std::ostringstream mesh_attr;
    mesh_attr << cfg_.mesh.describe() << " (ranks on chips";
    for (int c : cfg_.topology.placement()) mesh_attr << ' ' << c;
    mesh_attr << ") of " << rep_.topology << "; " << rep_.mesh;
    so.mesh = mesh_attr.str();
    // save_checkpoint's errors are the same on every rank (it agrees them): one line from rank 0, not an abort.
    world_.agree([&] { save_checkpoint(world_, opt_.checkpoint_path, entries, attrs, so); });
    rep_.wall_checkpoint_s = seconds_since(t_ck);
  }

  // The reference's weights (and input, without attention) when resumed: the checkpoint's (read collectively;
  // whole tensors on rank 0).
  void read_reference_weights() {
    const auto read_full = [&](const std::string& name, const runtime::Shape& global) {
      Tensor block(s_.dtype, rank_ == 0 ? global : runtime::Shape(global.size(), 0));
      reader_->read_block(name, runtime::Shape(global.size(), 0), block);
      return block;
    };
    ckpt_full_ = std::make_unique<Weights>(rank_ == 0 ? make_weights(s_, 1, 0) : Weights{});
    for (auto& slot : weight_slots(s_, *ckpt_full_)) {
      Tensor block = read_full(slot.name, slot.global);
      if (rank_ == 0) *slot.t = std::move(block);
    }
    if (activations_) ckpt_x_ = std::make_unique<Tensor>(read_full("activations/input", act_global_));
  }

  // Rank 0: the MLP's all_reduce algorithm, the throughput.
  void chip_reports() {
    if (const auto it = rep_.comm.find("tp all_reduce"); it != rep_.comm.end() && !s_.attention) {
      // The MLP's one all_reduce: the algorithm that ran ("auto" decides the same on every chip).
      it->second.algorithm = comm_.stats.at("tp all_reduce").algorithm;
      rep_.all_reduce_algorithm = it->second.algorithm;
    }
    rep_.sim_tflops = rep_.critical.total > 0 ? rep_.total_flops / rep_.critical.total / 1e3 : 0;
    rep_.peak_tflops_per_chip = cfg_.device.peak_tflops(runtime::precision_of(s_.dtype));
    rep_.peak_tflops = chips_ * rep_.peak_tflops_per_chip;
    rep_.peak_fraction = rep_.peak_tflops > 0 ? rep_.sim_tflops / rep_.peak_tflops : 0;
    rep_.tokens_per_s = rep_.critical.total > 0 ? double(s_.seq) * p_.dp / rep_.critical.total * 1e9 : 0;
  }

  // Shape-only: no reference values, but the reference's schedule costs nothing to charge, so the single-device
  // time (and the speedup) are the real-data run's.
  double reference_ns_shape_only() const {
    sim::Timeline ref_tl(chip_id_, cfg_.topology, cfg_.device);
    Chip ref{&ref_tl, 0.0, 0.0};
    for (int64_t b = 0; b < p_.dp; ++b) {
      Tensor y = init_x(s_, std::vector<int64_t>(static_cast<size_t>(T_)), false);
      for (int64_t l = 0; l < s_.layers; ++l) y = block_single(ref, s_, y, make_weights(s_, 1, 0, l, false));
    }
    return ref_tl.end_time();
  }

  // Rank 0, real data: the single-device reference of the dp sequences, compared with every gathered row.
  void validate() {
    rep_.validated = true;
    rep_.tolerance = cfg_.tolerance;
    // The MLP's reference has always run its GEMMs on every core of rank 0 (its published errors come from
    // that); the block's on one thread. Multi-threaded OpenBLAS sums in another order, so each keeps its own.
    if (!s_.attention) kernels::set_blas_threads(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
    const Weights full = ckpt_full_ ? std::move(*ckpt_full_) : make_weights(s_, 1, 0);
    sim::Timeline ref_tl(chip_id_, cfg_.topology, cfg_.device);
    Chip ref{&ref_tl, 0.0, 0.0};
    std::vector<float> wf;  // [dp·seq, hidden]: the dp sequences one after the other on one device
    for (int64_t b = 0; b < p_.dp; ++b) {
      std::vector<int64_t> rows(static_cast<size_t>(T_));
      for (int64_t i = 0; i < T_; ++i) rows[static_cast<size_t>(i)] = b * T_ + i;
      Tensor y = block_single(ref, s_, ckpt_x_ ? ckpt_x_->rows(b * T_, T_) : init_x(s_, rows), full);
      for (int64_t l = 1; l < s_.layers; ++l) y = block_single(ref, s_, y, make_weights(s_, 1, 0, l));
      const auto want = y.to_float();
      wf.insert(wf.end(), want.begin(), want.end());
    }
    kernels::set_blas_threads(1);
    rep_.single_device_ns = ref_tl.end_time();
    const int h = static_cast<int>(s_.hidden);
    std::vector<int> seen(static_cast<size_t>(T_ * p_.dp), 0);
    for (int i = 0; i < gathered_.total; ++i) {
      const auto row = static_cast<int64_t>(gathered_.rows[static_cast<size_t>(i)]);
      ++seen[static_cast<size_t>(row)];
      for (int c = 0; c < h; ++c) {
        const double got = gathered_.vals[static_cast<size_t>(i) * static_cast<size_t>(h) + static_cast<size_t>(c)];
        const double ref_v = wf[static_cast<size_t>(row * h + c)];
        const double err = std::isfinite(got) ? std::fabs(got - ref_v) : std::numeric_limits<double>::infinity();
        rep_.max_abs_error = std::max(rep_.max_abs_error, err);
        rep_.max_abs_reference = std::max(rep_.max_abs_reference, std::fabs(ref_v));
      }
    }
    const bool every_row_once = std::all_of(seen.begin(), seen.end(), [](int c) { return c == 1; });
    const double rel = rep_.max_abs_reference > 0 ? rep_.max_abs_error / rep_.max_abs_reference : rep_.max_abs_error;
    rep_.passed = every_row_once && rel <= cfg_.tolerance;
    if (!every_row_once) rep_.max_abs_error = std::numeric_limits<double>::infinity();
    rep_.relative_error = every_row_once ? rel : std::numeric_limits<double>::infinity();
  }

  const runtime::World& world_;
  const BlockConfig& cfg_;
  const BlockRunOptions& opt_;
  const ModelSpec& s_;
  const ParallelPlan& p_;
  const int rank_, chips_, chip_id_;
  const int64_t T_;
  DeviceMesh mesh_;  // tp innermost (sharding/device_mesh.h); ulysses shards the sequence on the cp axis
  const int t_idx_, u_idx_, d_idx_;  // d_idx_: the replica, sequence d_idx_ of the batch
  const bool shape_only_, real_;     // shape-only: no storage anywhere (runtime/tensor.h), header-only messages
  sim::Timeline tl_;
  runtime::Transport world_tp_;
  sim::Memory memory_;
  const plans::TokenLayout layout_;
  int64_t n_attn_ = 0;
  std::vector<int64_t> resid_rows_;
  std::vector<Weights> layer_w_;
  const bool activations_;  // without attention (the MLP) the checkpoint holds the input and output rows
  const runtime::Shape act_global_, act_offset_;
  const bool act_writer_;
  const std::string kind_;
  std::unique_ptr<CheckpointReader> reader_;
  Tensor x_, out_;
  BlockMemory mem_plan_;
  Chip chip_{&tl_, 0.0, 0.0};
  Comm comm_;
  std::vector<FusedOp> fused_ops_;
  std::vector<double> layer_end_;  // this chip's simulated time at the end of each layer
  models::GatheredRows gathered_;
  std::unique_ptr<Weights> ckpt_full_;
  std::unique_ptr<Tensor> ckpt_x_;
  RunReport rep_;
};

}  // namespace

RunReport run_block(const runtime::World& world, const BlockConfig& cfg, const std::string& trace_path) {
  BlockRunOptions o;
  o.trace_path = trace_path;
  return run_block(world, cfg, o);
}

RunReport run_block(const runtime::World& world, const BlockConfig& cfg, const BlockRunOptions& opt) {
  BlockRun run(world, cfg, opt);
  return run.run();
}

}  // namespace shardsim::sharding

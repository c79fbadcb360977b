#include "models/transformer.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>
#include <cstdlib>

#include "collectives/collectives.h"
#include "common/error.h"
#include "kernels/attention.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "kernels/norm.h"
#include "runtime/transport.h"
#include "checkpoint/checkpoint.h"
#include "sharding/engine_config.h"
#include "sharding/model_spec.h"
#include "models/init.h"
#include "models/mlp.h"
#include "models/workload.h"
#include "sharding/placement.h"
#include "sharding/plans/block.h"
#include "sharding/plans/block_ops.h"
#include "sharding/plans/context_parallel.h"
#include "sharding/plans/tensor_parallel.h"
#include "sharding/plans/ulysses.h"
#include "models/report.h"
#include "models/profile.h"
#include "models/row_gather.h"
#include "models/trace.h"
#include "sim/memory.h"
#include "sim/timeline.h"
#include "topology/topology_yaml.h"

namespace shardsim::sharding {

using runtime::DType;
using runtime::Tensor;

// ------------------------------------------------------------------------------------------------ memory

BlockMemory block_memory(const ModelSpec& s, const ParallelPlan& p, int t) {
  const uint64_t es = runtime::dtype_size(s.dtype);
  const int64_t d = s.head_dim, T = s.seq;
  if (!s.attention) {  // the MLP workload (models/mlp.h's accounting): no sequence sharding, tp and dp only
    const collectives::Partition fp{static_cast<size_t>(s.ffn), static_cast<size_t>(p.tp)};
    const auto nf = static_cast<uint64_t>(fp.size(static_cast<size_t>(t)));
    const auto rows = static_cast<uint64_t>(T), h = static_cast<uint64_t>(s.hidden);
    BlockMemory m;
    m.weights = es * static_cast<uint64_t>(s.layers) * 3 * h * nf;
    m.x = m.out = es * rows * h;
    m.mlp = es * 2 * rows * nf;
    if (p.tp > 1) m.ring = es * collectives::Partition{rows * h, static_cast<size_t>(p.tp)}.max_size();
    return m;
  }
  const int64_t nq = s.heads / p.tp, nkv = p.tp <= s.kv_heads ? s.kv_heads / p.tp : 1;
  const collectives::Partition fp{static_cast<size_t>(s.ffn), static_cast<size_t>(p.tp)};
  const auto nf = static_cast<int64_t>(fp.size(static_cast<size_t>(t)));
  const int64_t n_attn = p.ulysses > 1 ? T : T / p.cp;                               // q rows of attention
  const int64_t n_resid = p.sp ? n_attn / p.tp : p.ulysses > 1 ? T / p.ulysses : n_attn;  // residual rows
  const int64_t qkv_rows = p.sp ? n_attn : n_resid, mlp_rows = p.sp ? n_attn : n_resid;
  BlockMemory m;
  m.weights = es * static_cast<uint64_t>(s.layers) *
              static_cast<uint64_t>(2 * s.hidden + s.hidden * (nq + 2 * nkv) * d + nq * d * s.hidden + 3 * s.hidden * nf);
  m.x = es * static_cast<uint64_t>(n_resid * s.hidden);
  m.qkv = es * static_cast<uint64_t>(qkv_rows * (nq + 2 * nkv) * d);
  m.ring = p.cp > 1 ? 2 * es * static_cast<uint64_t>(qkv_rows * nkv * d) : 0;
  m.mlp = es * static_cast<uint64_t>(mlp_rows * 2 * nf);
  return m;
}

namespace {
// Replays one chip's allocations in MEMORY (throws sim::OutOfMemory at the first that does not fit).
void replay(sim::Memory& memory, const BlockMemory& m) {
  memory.allocate("weights", m.weights);
  memory.allocate("x", m.x);
  auto out = memory.scoped("output", m.out);
  {
    auto qkv = memory.scoped("activations q/k/v", m.qkv);
    auto ring = memory.scoped("ring K/V receive buffers", m.ring);
  }
  auto mlp = memory.scoped("activations mlp", m.mlp);
}
}  // namespace

double block_host_bytes(const BlockConfig& c) {
  double total = 0;
  const int chips = c.plan.tp * c.plan.cp * c.plan.ulysses * c.plan.dp;
  for (int r = 0; r < chips; ++r)
    total += static_cast<double>(block_memory(c.shape, c.plan, c.mesh.coordinate("tp", r)).peak());
  if (c.validate) total += static_cast<double>(block_memory(c.shape, ParallelPlan{}, 0).peak());
  return total;
}

void check_host_memory(const BlockConfig& c) {
  std::ifstream in("/proc/meminfo");
  std::string key;
  double kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit)
    if (key == "MemAvailable:") {
      const double need = block_host_bytes(c), have = kib * 1024.0;
      if (need > have) {
        char b[256];
        std::snprintf(b, sizeof b, "needs about %.2f GiB of host memory (the %d ranks' shards%s) but this host has "
                      "%.2f GiB available", need / 1073741824.0, c.plan.tp * c.plan.cp * c.plan.ulysses * c.plan.dp,
                      c.validate ? " and the single-device reference on rank 0" : "", have / 1073741824.0);
        throw ConfigError(c.file + ": " + b + "; lower workload.seq/hidden/ffn" +
                          (c.validate ? std::string(" or set validate.enabled: false") : std::string()));
      }
      return;
    }
}

// ------------------------------------------------------------------------------------------------ config

std::string block_plan_text(const ParallelPlan& p) {
  if (p.dp > 1) {
    ParallelPlan one = p;
    one.dp = 1;
    return block_plan_text(one) + " x dp=" + std::to_string(p.dp) + " (data parallel replicas)";
  }
  const int tp = p.tp, ulysses = p.ulysses, cp = p.cp;
  const bool sp = p.sp, zigzag = p.zigzag;
  const FusedPlan& fused = p.fused;
  std::ostringstream os;
  if (ulysses > 1) {
    if (tp > 1) os << "tp=" << tp << " x ";
    os << "ulysses=" << ulysses << " (all_to_all sequence <-> heads)";
    if (tp == 1) return os.str();
    if (fused.enabled) os << "; fused tp collectives (gemm_all_reduce, " << fused.describe() << ")";
    return os.str();
  }
  os << "tp=" << tp << (sp ? " + sequence parallel" : "");
  if (cp > 1) os << " x cp=" << cp << " ring attention, " << (zigzag ? "zig-zag" : "contiguous") << " split";
  if (fused.enabled)
    os << "; fused tp collectives (" << (sp ? "all_gather_gemm, gemm_reduce_scatter" : "gemm_all_reduce, ")
       << (sp ? "" : fused.describe()) << ")";
  return os.str();
}

bool is_block_config(const ConfigNode& root) {
  return root.is_map() && root.has("workload") && root.child("workload").is_map() &&
         root.child("workload").has("kind") && root.child("workload").get_string("kind") == "transformer_block";
}

BlockConfig parse_block_config(const ConfigNode& root, const std::string& file) {
  root.expect_keys(kBlockRootKeys);
  BlockConfig c;
  c.file = file;
  c.text = root.text();
  c.name = root.get_string("name", "transformer-block");
  c.topology = load_workload_topology(root);
  c.device = load_workload_device(root);
  c.shape_only = load_workload_shape_only(root);
  // The model and the plan through the one parser (sharding/model_spec.h).
  const auto w = root.child("workload");
  const ModelSpec spec = parse_model_spec(w, SpecUse::block);
  c.model = spec.label;
  c.shape = spec;
  const auto& s = c.shape;
  const int chips = c.topology.num_chips();
  c.plan = parse_parallel_plan(root, spec, SpecUse::block, chips);
  const auto& p = c.plan;
  if (root.has("validate")) {
    const auto v = root.child("validate");
    v.expect_keys(kValidateKeys);
    c.validate = v.get_bool("enabled", true);
    c.tolerance = v.has("tolerance") ? v.get_positive_double("tolerance") : 0;
  }
  if (c.tolerance == 0) c.tolerance = s.dtype == DType::bf16 ? 3e-2 : 1e-4;
  // The device mesh (ulysses shards the sequence on the cp axis) and its placement on the topology.
  c.mesh = mesh_from_config(root, {{"tp", p.tp}, {"cp", p.cp * p.ulysses}, {"dp", p.dp}}, c.topology);
  // Simulated HBM of every chip, before anything is allocated (the same replay run_block makes).
  for (int r = 0; r < chips && r < p.tp * p.cp * p.ulysses * p.dp; ++r) {
    sim::Memory m(c.topology.placement().at(static_cast<size_t>(r)), c.device.hbm_bytes());
    try {
      replay(m, block_memory(s, p, c.mesh.coordinate("tp", r)));
    } catch (const sim::OutOfMemory& e) {
      root.child("workload").fail(root.child("workload").path() + ": " + e.what() + " (device " + c.device.name + ")");
    }
  }
  return c;
}

// ------------------------------------------------------------------------------------------------ pieces

namespace {

// The shared pieces and the plan units (sharding/plans/).
using plans::Chip;
using plans::Chunk;
using plans::Comm;
using plans::gemm;
using plans::rmsnorm;

constexpr uint32_t kIdX = 1, kIdNorm1 = 2, kIdWq = 3, kIdWk = 4, kIdWv = 5, kIdWo = 6, kIdNorm2 = 7, kIdWg = 8,
                   kIdWu = 9, kIdWd = 10;

// The block of the global [*, global_cols] tensor ID at (row0, col0), scaled for a fan-in of FAN_IN.
Tensor init_block(const ModelSpec& s, uint32_t id, int64_t rows, int64_t cols, int64_t global_cols, int64_t row0,
                  int64_t col0, double fan_in, bool storage) {
  if (!storage) return Tensor::shape_only({rows, cols}, s.dtype);
  Tensor t(s.dtype, {rows, cols});
  const float a = static_cast<float>(1.0 / std::sqrt(fan_in));
  fill_uniform_block(t, InitSpec{s.seed, id, -a, a}, global_cols, row0, col0);
  return t;
}
Tensor init_norm(const ModelSpec& s, uint32_t id, bool storage) {
  if (!storage) return Tensor::shape_only({s.hidden}, s.dtype);
  Tensor t(s.dtype, {1, s.hidden});
  fill_uniform_block(t, InitSpec{s.seed, id, 0.9f, 1.1f}, s.hidden, 0, 0);
  return Tensor::from_float(t.to_float(), s.dtype, {s.hidden});
}

// The rows ROWS (global token ids) of the input x.
Tensor init_x(const ModelSpec& s, const std::vector<int64_t>& rows, bool storage = true) {
  if (!storage) return Tensor::shape_only({static_cast<int64_t>(rows.size()), s.hidden}, s.dtype);
  Tensor x(s.dtype, {static_cast<int64_t>(rows.size()), s.hidden});
  for (size_t i = 0; i < rows.size();) {  // contiguous runs
    size_t j = i + 1;
    while (j < rows.size() && rows[j] == rows[j - 1] + 1) ++j;
    Tensor run(s.dtype, {static_cast<int64_t>(j - i), s.hidden});
    fill_uniform_block(run, InitSpec{s.seed, kIdX, -1.0f, 1.0f}, s.hidden, rows[i], 0);
    x.set_rows(static_cast<int64_t>(i), run);
    i = j;
  }
  return x;
}

// This chip's weights: q heads [q0, q0+nq), kv heads [g0, g0+nkv), ffn columns [f0, f0+nf).
struct Weights {
  int64_t q0 = 0, nq = 0, g0 = 0, nkv = 0, f0 = 0, nf = 0;
  Tensor norm1, wq, wk, wv, wo, norm2, wg, wu, wd;
};

// Layer L's weights (layer 0: the tensor ids above; layer l adds 16·l, so every layer has its own seeded values).
// Shape-only (STORAGE false): the same shapes without storage.
Weights make_weights(const ModelSpec& s, int tp, int t, int64_t layer = 0, bool storage = true) {
  Weights w;
  const collectives::Partition fp{static_cast<size_t>(s.ffn), static_cast<size_t>(tp)};
  w.f0 = static_cast<int64_t>(fp.offset(static_cast<size_t>(t)));
  w.nf = static_cast<int64_t>(fp.size(static_cast<size_t>(t)));
  if (!s.attention) {  // the MLP workload: models/mlp.h's seeded weights (one layer)
    MlpWeights m = make_mlp_weights(mlp_shape_of(s), w.f0, w.nf, storage);
    w.wg = std::move(m.w_gate);
    w.wu = std::move(m.w_up);
    w.wd = std::move(m.w_down);
    return w;
  }
  const auto id = [layer](uint32_t base) { return base + 16u * static_cast<uint32_t>(layer); };
  const int64_t d = s.head_dim;
  w.nq = s.heads / tp;
  w.q0 = t * w.nq;
  if (tp <= s.kv_heads) {
    w.nkv = s.kv_heads / tp;
    w.g0 = t * w.nkv;
  } else {
    w.nkv = 1;  // replicated: the KV head this chip's q heads use
    w.g0 = w.q0 / (s.heads / s.kv_heads);
  }
  const double h = static_cast<double>(s.hidden);
  w.norm1 = init_norm(s, id(kIdNorm1), storage);
  w.norm2 = init_norm(s, id(kIdNorm2), storage);
  w.wq = init_block(s, id(kIdWq), s.hidden, w.nq * d, s.heads * d, 0, w.q0 * d, h, storage);
  w.wk = init_block(s, id(kIdWk), s.hidden, w.nkv * d, s.kv_heads * d, 0, w.g0 * d, h, storage);
  w.wv = init_block(s, id(kIdWv), s.hidden, w.nkv * d, s.kv_heads * d, 0, w.g0 * d, h, storage);
  w.wo = init_block(s, id(kIdWo), w.nq * d, s.hidden, s.hidden, w.q0 * d, 0, static_cast<double>(s.heads * d), storage);
  w.wg = init_block(s, id(kIdWg), s.hidden, w.nf, s.ffn, 0, w.f0, h, storage);
  w.wu = init_block(s, id(kIdWu), s.hidden, w.nf, s.ffn, 0, w.f0, h, storage);
  w.wd = init_block(s, id(kIdWd), w.nf, s.hidden, s.hidden, w.f0, 0, static_cast<double>(s.ffn), storage);
  return w;
}

uint64_t weight_bytes(const Weights& w) {
  uint64_t b = 0;
  for (const Tensor* t : {&w.norm1, &w.wq, &w.wk, &w.wv, &w.wo, &w.norm2, &w.wg, &w.wu, &w.wd}) b += t->nbytes();
  return b;
}

plans::BlockWeights block_weights(const Weights& w) {
  return {&w.norm1, &w.wq, &w.wk, &w.wv, &w.wo, &w.norm2, &w.wg, &w.wu, &w.wd};
}

// The single-device block (the reference), charged to CHIP.
Tensor block_single(Chip& chip, const ModelSpec& s, const Tensor& x, const Weights& w) {
  if (!s.attention) return plans::mlp_layer(chip, nullptr, x, block_weights(w), s.glu_activation());
  const int64_t T = s.seq, d = s.head_dim;
  Tensor a = rmsnorm(chip, x, w.norm1, "rmsnorm.attn", s.norm_eps);
  Tensor q = gemm(chip, a, w.wq, "gemm.q").reshaped({a.dim(0), s.heads, d});
  Tensor k = gemm(chip, a, w.wk, "gemm.k").reshaped({a.dim(0), s.kv_heads, d});
  Tensor v = gemm(chip, a, w.wv, "gemm.v").reshaped({a.dim(0), s.kv_heads, d});
  if (s.has_rope()) {
    const auto pos = plans::token_layout(T, 1, 1, 0, false).pos;
    chip.charge(kernels::rope_inplace(q, pos, static_cast<float>(s.rope_theta)), "rope.q");
    chip.charge(kernels::rope_inplace(k, pos, static_cast<float>(s.rope_theta)), "rope.k");
  }
  std::vector<Tensor> lse;
  Tensor o = plans::local_attention(chip, s, q, k, v, 1, T, lse).reshaped({T, s.heads * d});
  Tensor x1 = gemm(chip, o, w.wo, "gemm.o");
  chip.charge(kernels::add_inplace(x1, x), "residual");
  Tensor out = plans::mlp_layer(chip, nullptr, rmsnorm(chip, x1, w.norm2, "rmsnorm.mlp", s.norm_eps), block_weights(w),
                                s.glu_activation());
  chip.charge(kernels::add_inplace(out, x1), "residual");
  return out;
}

const std::vector<std::string> kCommKeys = {"tp all_reduce", "sp all_gather", "sp reduce_scatter", "cp ring K/V",
                                            "ulysses all_to_all"};

}  // namespace

// ------------------------------------------------------------------------------------------------ run

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// max |y - reference| / max |reference| over all elements (max |y - reference| when the reference is all zero); a
// non-finite y counts as an infinite error.
double relative_error(const Tensor& y, const Tensor& ref) {
  double err = 0, mag = 0;
  for (int64_t i = 0; i < y.numel(); ++i) {
    const double a = y.get(i), b = ref.get(i);
    err = std::isfinite(a) ? std::max(err, std::fabs(a - b)) : INFINITY;
    mag = std::max(mag, std::fabs(b));
  }
  return mag > 0 ? err / mag : err;
}

// One weight of the block for the checkpoint: this chip's tensor, where it sits in the global one, its placement.
struct WeightSlot {
  std::string name;
  Tensor* t;
  runtime::Shape global, offset;
  Placement on_tp;
  bool kv = false;  // Wk/Wv: whole KV heads repeated over tp/kv_heads chips when tp > kv_heads
};

std::vector<WeightSlot> weight_slots(const ModelSpec& s, Weights& w) {
  const int64_t d = s.head_dim, H = s.hidden;
  if (!s.attention)
    return {
        {"weights/w_gate", &w.wg, {H, s.ffn}, {0, w.f0}, Shard{1}},
        {"weights/w_up", &w.wu, {H, s.ffn}, {0, w.f0}, Shard{1}},
        {"weights/w_down", &w.wd, {s.ffn, H}, {w.f0, 0}, Shard{0}},
    };
  return {
      {"weights/norm1", &w.norm1, {H}, {0}, Replicate{}},
      {"weights/wq", &w.wq, {H, s.heads * d}, {0, w.q0 * d}, Shard{1}},
      {"weights/wk", &w.wk, {H, s.kv_heads * d}, {0, w.g0 * d}, Shard{1}, true},
      {"weights/wv", &w.wv, {H, s.kv_heads * d}, {0, w.g0 * d}, Shard{1}, true},
      {"weights/wo", &w.wo, {s.heads * d, H}, {w.q0 * d, 0}, Shard{0}},
      {"weights/norm2", &w.norm2, {H}, {0}, Replicate{}},
      {"weights/w_gate", &w.wg, {H, s.ffn}, {0, w.f0}, Shard{1}},
      {"weights/w_up", &w.wu, {H, s.ffn}, {0, w.f0}, Shard{1}},
      {"weights/w_down", &w.wd, {s.ffn, H}, {w.f0, 0}, Shard{0}},
  };
}

}  // namespace

RunReport run_block(const runtime::World& world, const BlockConfig& cfg, const std::string& trace_path) {
  BlockRunOptions o;
  o.trace_path = trace_path;
  return run_block(world, cfg, o);
}

RunReport run_block(const runtime::World& world, const BlockConfig& cfg, const BlockRunOptions& opt) {
  const std::string& trace_path = opt.trace_path;
  const auto t_start = std::chrono::steady_clock::now();
  const ModelSpec& s = cfg.shape;
  const ParallelPlan& p = cfg.plan;
  const int rank = world.rank(), chips = world.size();
  const int chip_id = cfg.topology.placement().at(static_cast<size_t>(rank));
  const int64_t d = s.head_dim, T = s.seq;
  const size_t es = runtime::dtype_size(s.dtype);
  // Mesh coordinates (sharding/device_mesh.h: tp innermost); ulysses shards the sequence on the cp axis.
  DeviceMesh mesh = cfg.mesh;
  const int t_idx = mesh.coordinate("tp", rank), u_idx = mesh.coordinate("cp", rank);
  const int d_idx = mesh.coordinate("dp", rank);  // the replica: sequence d_idx of the batch
  // Rows of the seeded [dp·seq, hidden] input: sequence d's token i is row d·seq + i.
  const auto batch_rows = [&](std::vector<int64_t> rows) {
    for (auto& r : rows) r += int64_t{d_idx} * s.seq;
    return rows;
  };
  const bool shape_only = cfg.shape_only || opt.shape_only;
  const bool real = !shape_only;  // shape-only: no storage anywhere (runtime/tensor.h), header-only messages
  sim::Timeline tl(chip_id, cfg.topology, cfg.device);
  tl.set_record_dependencies(opt.profile || !trace_path.empty() || !opt.plots_dir.empty());  // bookkeeping only: no simulated time changes
  tl.set_keep_events(false);  // the report reads the summary; the trace and the profile keep them (dependencies)
  runtime::Transport world_tp(world, tl, cfg.topology.placement());  // mesh rank r on chip placement[r]
  world_tp.set_shape_only(shape_only);  // shared with the mesh's sub-groups split from it
  mesh.bind(world_tp);
  runtime::Transport& tp_group = mesh["tp"];
  runtime::Transport& cp_group = mesh["cp"];  // the cp ring, or the ulysses all_to_all group
  sim::Memory memory(chip_id, cfg.device.hbm_bytes());

  // This chip's tokens (its cp or Ulysses chunk of the sequence: the rows its GEMMs see), and the residual rows
  // it holds (with sp a Shard(0) over tp of them).
  const plans::TokenLayout layout = plans::token_layout(T, 1, p.cp * p.ulysses, u_idx, p.zigzag && p.ulysses == 1);
  const int64_t n_attn = layout.seq_local;
  std::vector<int64_t> resid_rows = layout.pos;
  if (p.sp) {
    const int64_t n = n_attn / p.tp;
    resid_rows.assign(layout.pos.begin() + t_idx * n, layout.pos.begin() + (t_idx + 1) * n);
  }
  const int64_t n_resid = static_cast<int64_t>(resid_rows.size());

  std::vector<Weights> layer_w;
  for (int64_t l = 0; l < s.layers; ++l) layer_w.push_back(make_weights(s, p.tp, t_idx, l, real));
  Weights& w = layer_w[0];  // checkpoints and --resume: one layer (check_run refuses them with layers > 1)
  // Who writes each weight's block in a checkpoint (and counts it when a resumed run verifies the checksums): each
  // shard once. cp / ulysses ranks and dp replicas hold replicas; replicated tensors come from tp rank 0; a KV head
  // repeated over tp/kv_heads chips from the first of them.
  const auto writes = [&](const WeightSlot& slot) {
    bool writer = u_idx == 0 && d_idx == 0;
    if (std::holds_alternative<Replicate>(slot.on_tp)) writer = writer && t_idx == 0;
    if (slot.kv && p.tp > s.kv_heads) writer = writer && t_idx % (p.tp / s.kv_heads) == 0;
    return writer;
  };
  // Without attention (the MLP) every chip of replica d holds the stack's input and output rows d·seq.. whole; the
  // checkpoint stores both ([dp·seq, hidden], Shard(0) over dp, written by tp rank 0): a resumed run reads its input
  // from there and must reproduce the output.
  const bool activations = !s.attention;
  const runtime::Shape act_global{int64_t{p.dp} * T, s.hidden}, act_offset{int64_t{d_idx} * T, 0};
  const bool act_writer = t_idx == 0 && u_idx == 0;
  const std::string kind = s.attention ? "transformer_block" : "mlp";
  const std::string needs = s.attention ? "block" : "workload";
  const auto expect_dataset = [&](const CheckpointReader& rd, const std::string& path, const std::string& ds,
                                  const runtime::Shape& want) {
    if (rd.global_shape(ds) != want)
      throw ConfigError("checkpoint " + path + ": dataset '" + ds + "' has shape " +
                        runtime::shape_str(rd.global_shape(ds)) + " but the config's " + needs + " needs " +
                        runtime::shape_str(want));
    if (rd.dtype(ds) != s.dtype)
      throw ConfigError("checkpoint " + path + ": dataset '" + ds + "' is " + runtime::dtype_name(rd.dtype(ds)) +
                        " but the config's workload.dtype is " + runtime::dtype_name(s.dtype));
  };
  // ---- resume: this chip's shards (and, without attention, its input rows) from a checkpoint of any plan ----
  std::unique_ptr<CheckpointReader> reader;
  Tensor x;
  if (!opt.resume_from.empty()) {
    const std::string& path = opt.resume_from;
    // Every rank checks the file; a bad checkpoint fails the job once, with one message (World::agree).
    world.agree([&] {
      reader = std::make_unique<CheckpointReader>(world, path);
      const std::string saved = reader->root_attribute("workload");
      if (saved != kind && !(saved.empty() && !s.attention))
        throw ConfigError("checkpoint " + path + ": written by a '" + (saved.empty() ? "?" : saved) +
                          "' workload, not a " + kind);
      if (s.attention)
        for (const char* key : {"heads", "kv_heads"}) {
          const std::string v = reader->root_attribute(key);
          const int64_t want = std::string(key) == "heads" ? s.heads : s.kv_heads;
          if (v != std::to_string(want))
            throw ConfigError("checkpoint " + path + ": written with " + key + " " + v + " but the config has " +
                              std::to_string(want));
        }
      const std::string act = reader->root_attribute("activation");
      if (!act.empty() && act != kernels::activation_name(s.glu_activation()))
        throw ConfigError("checkpoint " + path + ": written with activation '" + act +
                          "' but the config's workload.activation is '" + kernels::activation_name(s.glu_activation()) + "'");
      if (activations) expect_dataset(*reader, path, "activations/input", act_global);
      for (const auto& slot : weight_slots(s, w)) expect_dataset(*reader, path, slot.name, slot.global);
      // The file is read once: each rank reads its own blocks, and every tensor's checksum is verified from the
      // blocks of its writers (which partition it). A corrupted tensor fails here, on every rank, before use.
      for (auto& slot : weight_slots(s, w)) reader->read_block_verified(slot.name, slot.offset, *slot.t, writes(slot));
      if (activations) {
        x = Tensor(s.dtype, {T, s.hidden});
        reader->read_block_verified("activations/input", act_offset, x, act_writer);
      }
    });
  }
  if (!(reader && activations)) x = init_x(s, batch_rows(resid_rows), real);
  const BlockMemory mem_plan = block_memory(s, p, t_idx);
  memory.allocate("weights", mem_plan.weights);
  memory.allocate("x", mem_plan.x);
  world.sleepy_barrier();
  RunReport rep;
  rep.wall_init_s = seconds_since(t_start);
  const auto t_fwd = std::chrono::steady_clock::now();

  Chip chip{&tl, 0.0, 0.0};
  Comm comm;
  std::vector<FusedOp> fused_ops;
  plans::PlanContext ctx{s, p, tp_group, cp_group, chip, comm, fused_ops, n_attn, n_resid};

  // The memory plan (block_memory, also checked at parse time) must be what this run holds.
  const auto plan_mismatch = [&](const char* what, uint64_t planned, uint64_t actual) {
    if (planned != actual)
      throw RuntimeFault("chip " + std::to_string(chip_id) + ": internal: memory plan '" + what + "' " +
                         std::to_string(planned) + " B differs from the run's " + std::to_string(actual) + " B");
  };
  uint64_t all_weight_bytes = 0;
  for (const auto& lw : layer_w) all_weight_bytes += weight_bytes(lw);
  plan_mismatch("weights", mem_plan.weights, all_weight_bytes);
  plan_mismatch("x", mem_plan.x, x.nbytes());
  const int64_t qkv_rows = p.sp ? n_attn : n_resid;
  plan_mismatch("q/k/v", mem_plan.qkv, static_cast<uint64_t>(qkv_rows * (w.nq + 2 * w.nkv) * d) * es);
  if (p.cp > 1) plan_mismatch("ring", mem_plan.ring, 2 * static_cast<uint64_t>(qkv_rows * w.nkv * d) * es);

  // One layer of the stack, on input XIN with weights W (the same code for every layer).
  const auto run_layer = [&](const Tensor& xin, const Weights& w) {
    if (!s.attention) {
      // The MLP alone (models/mlp.h's HBM accounting): y held through the layer; gate and up during the local
      // part, then one ring chunk of y during the all_reduce (the same peak as holding them in that order).
      auto out_mem = memory.scoped("output", mem_plan.out);
      memory.scoped("activations mlp", mem_plan.mlp).release();
      auto ring_mem = memory.scoped("all_reduce ring buffer", mem_plan.ring);
      return plans::mlp_layer(chip, &ctx, xin, block_weights(w), s.glu_activation());
    }
    return plans::block_forward(ctx, layout, block_weights(w), xin, nullptr,  // sharding/plans/block.h
                                {&memory, mem_plan.qkv, mem_plan.ring, mem_plan.mlp});
  };
  const int64_t mlp_rows = p.sp ? n_attn : n_resid;
  plan_mismatch("mlp", mem_plan.mlp, static_cast<uint64_t>(mlp_rows * 2 * w.nf) * es);
  std::vector<double> layer_end;  // this chip's simulated time at the end of each layer
  Tensor out = run_layer(x, layer_w[0]);
  layer_end.push_back(chip.t);
  for (int64_t l = 1; l < s.layers; ++l) {
    out = run_layer(out, layer_w[static_cast<size_t>(l)]);
    layer_end.push_back(chip.t);
  }
  world.sleepy_barrier();
  rep.wall_forward_s = seconds_since(t_fwd);

  rep.name = cfg.name;
  rep.model = cfg.model;
  rep.config_file = cfg.file;
  rep.dtype = runtime::dtype_name(s.dtype);
  rep.tolerance = cfg.tolerance;
  rep.hbm_capacity_bytes = cfg.device.hbm_bytes();
  rep.topology = cfg.topology.describe();
  rep.device = sim::describe(cfg.device);
  rep.plan = s.attention ? block_plan_text(p) : mlp_plan_text(mlp_shape_of(s), p);
  rep.mesh = cfg.mesh.mapping_text();
  rep.chips = chips;

  // ---- validation: gather the distinct residual rows on rank 0 (real data only) ----
  const bool owner = p.sp || t_idx == 0;  // without sp the tp shards hold the same rows
  const int h = static_cast<int>(s.hidden);
  GatheredRows gathered;
  if (cfg.validate && real) gathered = gather_owner_rows(world, owner, batch_rows(resid_rows), out, s.hidden);
  const int total = gathered.total;
  const std::vector<double>& all_rows = gathered.rows;
  const std::vector<float>& all_vals = gathered.vals;

  // ---- per-chip simulated figures ----
  const sim::Breakdown bd = tl.breakdown();
  std::vector<double> stats = {bd.total, bd.compute, bd.communication, bd.exposed_comm, chip.attention_ns,
                               static_cast<double>(memory.peak()), bd.flops, bd.bytes_sent};
  constexpr size_t kComm0 = 8;  // the per-collective figures start here, 4 per key
  for (const auto& key : kCommKeys) {
    const auto it = comm.stats.find(key);
    stats.push_back(it == comm.stats.end() ? 0 : it->second.bytes);
    stats.push_back(it == comm.stats.end() ? 0 : it->second.expected);
    stats.push_back(it == comm.stats.end() ? 0 : it->second.calls);
    stats.push_back(it == comm.stats.end() ? 0 : it->second.ns);
  }
  const size_t n_plain = stats.size();
  for (double f : pack(fused_ops)) stats.push_back(f);
  const size_t n_layers0 = stats.size();
  for (double t : layer_end) stats.push_back(t);
  const size_t nf = stats.size();
  // Every chip's figures (the same count on every chip), through the chip router in chip mode; rank 0 keeps them.
  std::vector<double> all_stats(rank == 0 ? nf * static_cast<size_t>(chips) : 0);
  {
    const auto bytes = world.allgather(stats.data(), nf * sizeof(double), "block report");
    if (rank == 0) std::memcpy(all_stats.data(), bytes.data(), all_stats.size() * sizeof(double));
  }
  double flops_sum = 0;  // integer-valued FLOP counts: the sum is exact in any order
  if (rank == 0)
    for (int r = 0; r < chips; ++r) flops_sum += all_stats[nf * static_cast<size_t>(r) + 6];
  rep.ops = ops_of_rank(world, op_breakdown(tl), critical_rank(world, bd.total));
  profile_and_trace(world, tl,
                    {trace_path, opt.profile, opt.plots_dir, cfg.device.peak_tflops(runtime::precision_of(s.dtype))},
                    rep);

  // ---- resumed without attention: the output must reproduce the stored one ----
  if (reader && activations && reader->has("activations/output")) {
    Tensor stored(s.dtype, {T, s.hidden});
    world.agree([&] {
      expect_dataset(*reader, opt.resume_from, "activations/output", act_global);
      reader->read_block_verified("activations/output", act_offset, stored, act_writer);
    });
    rep.resume_saved_tp = std::atoi(reader->root_attribute("tp").c_str());  // 0 when missing: treated as resharded
    rep.resume_same_layout = rep.resume_saved_tp == p.tp;
    rep.resume_compared = true;
    if (rep.resume_same_layout) {
      // Same sharding, same kernels, same reduction order: the output must be bit-identical.
      rep.resume_bit_exact = !world.any(!stored.bit_equal(out));
    } else {
      // Resharded: the all_reduce sums the partials in another order, so only the tolerance applies.
      rep.resume_relative_error = relative_error(out, stored);
      rep.resume_bit_exact = !world.any(!(rep.resume_relative_error <= cfg.tolerance));
    }
  }

  // ---- checkpoint: every weight with its global shape, each shard written once (and the activations) ----
  if (!opt.checkpoint_path.empty()) {
    const auto t_ck = std::chrono::steady_clock::now();
    std::vector<CheckpointEntry> entries;
    for (const auto& slot : weight_slots(s, w)) {
      std::string sharding = TensorSpec{slot.name, slot.global, {{"tp", slot.on_tp}}}.describe(cfg.mesh);
      if (slot.kv && p.tp > s.kv_heads) sharding += " (each KV head repeated on tp/kv_heads chips)";
      entries.push_back({slot.name, slot.t, slot.global, slot.offset, sharding, writes(slot)});
    }
    if (activations) {
      const std::string sharding = TensorSpec{"", act_global, {{"dp", Shard{0}}}}.describe(cfg.mesh);
      entries.push_back({"activations/input", &x, act_global, act_offset, sharding, act_writer});
      entries.push_back({"activations/output", &out, act_global, act_offset, sharding, act_writer});
    }
    std::map<std::string, std::string> attrs = {
        {"shardsim_version", "0.1.0"}, {"workload", kind},  {"model", cfg.model},
        {"config", cfg.text},          {"config_file", cfg.file},  {"parallel_plan", rep.plan},
        {"tp", std::to_string(p.tp)},  {"activation", kernels::activation_name(s.glu_activation())},
        {"seed", std::to_string(s.seed)}, {"topology", rep.topology},
    };
    if (s.attention) {
      attrs["heads"] = std::to_string(s.heads);
      attrs["kv_heads"] = std::to_string(s.kv_heads);
    }
    SaveOptions so;
    std::ostringstream mesh_attr;
    mesh_attr << cfg.mesh.describe() << " (ranks on chips";
    for (int c : cfg.topology.placement()) mesh_attr << ' ' << c;
    mesh_attr << ") of " << rep.topology << "; " << rep.mesh;
    so.mesh = mesh_attr.str();
    // save_checkpoint's errors are the same on every rank (it agrees them): one line from rank 0, not an abort.
    world.agree([&] { save_checkpoint(world, opt.checkpoint_path, entries, attrs, so); });
    rep.wall_checkpoint_s = seconds_since(t_ck);
  }
  // The reference's weights (and input, without attention): the checkpoint's when resumed (read collectively;
  // whole tensors on rank 0).
  std::unique_ptr<Weights> ckpt_full;
  std::unique_ptr<Tensor> ckpt_x;
  if (reader && cfg.validate) {
    const auto read_full = [&](const std::string& name, const runtime::Shape& global) {
      Tensor block(s.dtype, rank == 0 ? global : runtime::Shape(global.size(), 0));
      reader->read_block(name, runtime::Shape(global.size(), 0), block);
      return block;
    };
    ckpt_full = std::make_unique<Weights>(rank == 0 ? make_weights(s, 1, 0) : Weights{});
    for (auto& slot : weight_slots(s, *ckpt_full)) {
      Tensor block = read_full(slot.name, slot.global);
      if (rank == 0) *slot.t = std::move(block);
    }
    if (activations) ckpt_x = std::make_unique<Tensor>(read_full("activations/input", act_global));
  }
  reader.reset();

  const auto t_ref = std::chrono::steady_clock::now();
  if (rank == 0) {
    for (int r = 0; r < chips; ++r) {
      const double* v = &all_stats[nf * static_cast<size_t>(r)];
      ChipReport cr;
      cr.chip = cfg.topology.placement()[static_cast<size_t>(r)];
      cr.breakdown = sim::Breakdown{v[0], v[1], v[2], v[3], v[6], v[7]};
      cr.peak_memory_bytes = v[5];
      rep.per_chip.push_back(cr);
      if (r == 0 || v[0] > rep.critical.total) {
        rep.critical = cr.breakdown;
        rep.critical_chip = cr.chip;
        rep.attention_ns = v[4];
        rep.comm.clear();
        for (size_t k2 = 0; k2 < kCommKeys.size(); ++k2) {
          const double* c = v + kComm0 + 4 * k2;
          if (c[2] > 0) rep.comm[kCommKeys[k2]] = CommStat{c[0], c[1], static_cast<int>(c[2]), c[3], {}};
        }
        rep.fused = unpack(v + n_plain, fused_ops);
        rep.layer_ns.clear();
        for (size_t l = 0; l < layer_end.size(); ++l)
          rep.layer_ns.push_back(v[n_layers0 + l] - (l == 0 ? 0.0 : v[n_layers0 + l - 1]));
      }
    }
    if (const auto it = rep.comm.find("tp all_reduce"); it != rep.comm.end()) {
      rep.all_reduce_ns = it->second.ns;
      rep.all_reduce_bytes_per_chip = it->second.bytes;
      rep.all_reduce_expected_bytes = it->second.expected;
      if (!s.attention) {
        // The MLP's one all_reduce: the algorithm that ran ("auto" decides the same on every chip).
        it->second.algorithm = comm.stats.at("tp all_reduce").algorithm;
        rep.all_reduce_algorithm = it->second.algorithm;
      }
    }
    rep.total_flops = flops_sum;
    rep.sim_tflops = rep.critical.total > 0 ? flops_sum / rep.critical.total / 1e3 : 0;
    rep.peak_tflops_per_chip = cfg.device.peak_tflops(runtime::precision_of(s.dtype));
    rep.peak_tflops = chips * rep.peak_tflops_per_chip;
    rep.peak_fraction = rep.peak_tflops > 0 ? rep.sim_tflops / rep.peak_tflops : 0;
    rep.tokens_per_s = rep.critical.total > 0 ? double(s.seq) * p.dp / rep.critical.total * 1e9 : 0;
    if (cfg.validate && !real) {
      // Shape-only: no reference values, but the reference's schedule costs nothing to charge, so the
      // single-device time (and the speedup) are the real-data run's.
      sim::Timeline ref_tl(chip_id, cfg.topology, cfg.device);
      Chip ref{&ref_tl, 0.0, 0.0};
      for (int64_t b = 0; b < p.dp; ++b) {
        Tensor y = init_x(s, std::vector<int64_t>(static_cast<size_t>(T)), false);
        for (int64_t l = 0; l < s.layers; ++l) y = block_single(ref, s, y, make_weights(s, 1, 0, l, false));
      }
      rep.single_device_ns = ref_tl.end_time();
    } else if (cfg.validate) {
      rep.validated = true;
      rep.tolerance = cfg.tolerance;
      // The MLP's reference has always run its GEMMs on every core of rank 0 (its published errors come from
      // that); the block's on one thread. Multi-threaded OpenBLAS sums in another order, so each keeps its own.
      if (!s.attention)
        kernels::set_blas_threads(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
      const Weights full = ckpt_full ? std::move(*ckpt_full) : make_weights(s, 1, 0);
      sim::Timeline ref_tl(chip_id, cfg.topology, cfg.device);
      Chip ref{&ref_tl, 0.0, 0.0};
      std::vector<float> wf;  // [dp·seq, hidden]: the dp sequences one after the other on one device
      for (int64_t b = 0; b < p.dp; ++b) {
        std::vector<int64_t> rows(static_cast<size_t>(T));
        for (int64_t i = 0; i < T; ++i) rows[static_cast<size_t>(i)] = b * T + i;
        Tensor y = block_single(ref, s, ckpt_x ? ckpt_x->rows(b * T, T) : init_x(s, rows), full);
        for (int64_t l = 1; l < s.layers; ++l) y = block_single(ref, s, y, make_weights(s, 1, 0, l));
        const auto want = y.to_float();
        wf.insert(wf.end(), want.begin(), want.end());
      }
      kernels::set_blas_threads(1);
      rep.single_device_ns = ref_tl.end_time();
      std::vector<int> seen(static_cast<size_t>(T * p.dp), 0);
      for (int i = 0; i < total; ++i) {
        const auto row = static_cast<int64_t>(all_rows[static_cast<size_t>(i)]);
        ++seen[static_cast<size_t>(row)];
        for (int c = 0; c < h; ++c) {
          const double got = all_vals[static_cast<size_t>(i) * static_cast<size_t>(h) + static_cast<size_t>(c)];
          const double ref_v = wf[static_cast<size_t>(row * h + c)];
          const double err = std::isfinite(got) ? std::fabs(got - ref_v) : std::numeric_limits<double>::infinity();
          rep.max_abs_error = std::max(rep.max_abs_error, err);
          rep.max_abs_reference = std::max(rep.max_abs_reference, std::fabs(ref_v));
        }
      }
      const bool every_row_once = std::all_of(seen.begin(), seen.end(), [](int c) { return c == 1; });
      const double rel = rep.max_abs_reference > 0 ? rep.max_abs_error / rep.max_abs_reference : rep.max_abs_error;
      rep.passed = every_row_once && rel <= cfg.tolerance;
      if (!every_row_once) rep.max_abs_error = std::numeric_limits<double>::infinity();
      rep.relative_error = every_row_once ? rel : std::numeric_limits<double>::infinity();
    }
  }
  if (cfg.validate && real) {  // the verdict on every rank (the exit code)
    rep.validated = true;
    rep.passed = world.broadcast(rep.passed ? "1" : "0", 0) == "1";
    rep.wall_reference_s = seconds_since(t_ref);
  }
  rep.shape_only = shape_only;
  rep.layers = static_cast<int>(s.layers);
  rep.checkpoint = opt.checkpoint_path;
  rep.resumed_from = opt.resume_from;
  rep.trace = trace_path;
  rep.wall_total_s = seconds_since(t_start);
  return rep;
}

}  // namespace shardsim::sharding

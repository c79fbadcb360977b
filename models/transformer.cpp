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

#include "collectives/collectives.h"
#include "common/error.h"
#include "kernels/attention.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "kernels/norm.h"
#include "runtime/transport.h"
#include "checkpoint/checkpoint.h"
#include "sharding/engine_config.h"
#include "models/init.h"
#include "models/layers.h"
#include "sharding/placement.h"
#include "sharding/plans/block_ops.h"
#include "sharding/plans/context_parallel.h"
#include "sharding/plans/tensor_parallel.h"
#include "sharding/plans/ulysses.h"
#include "models/report.h"
#include "models/trace.h"
#include "sim/memory.h"
#include "sim/timeline.h"
#include "topology/topology_yaml.h"

namespace shardsim::sharding {

using runtime::DType;
using runtime::Tensor;

// ------------------------------------------------------------------------------------------------ memory

BlockMemory block_memory(const BlockShape& s, const BlockPlan& p, int t) {
  const uint64_t es = runtime::dtype_size(s.dtype);
  const int64_t d = s.head_dim(), T = s.seq;
  const int64_t nq = s.heads / p.tp, nkv = p.tp <= s.kv_heads ? s.kv_heads / p.tp : 1;
  const collectives::Partition fp{static_cast<size_t>(s.ffn), static_cast<size_t>(p.tp)};
  const auto nf = static_cast<int64_t>(fp.size(static_cast<size_t>(t)));
  const int64_t n_attn = p.ulysses > 1 ? T : T / p.cp;                               // q rows of attention
  const int64_t n_resid = p.sp ? n_attn / p.tp : p.ulysses > 1 ? T / p.ulysses : n_attn;  // residual rows
  const int64_t qkv_rows = p.sp ? n_attn : n_resid, mlp_rows = p.sp ? n_attn : n_resid;
  BlockMemory m;
  m.weights = es * static_cast<uint64_t>(2 * s.hidden + s.hidden * (nq + 2 * nkv) * d + nq * d * s.hidden +
                                          3 * s.hidden * nf);
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
  if (c.validate) total += static_cast<double>(block_memory(c.shape, BlockPlan{}, 0).peak());
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

std::string BlockPlan::describe() const {
  if (dp > 1) {
    BlockPlan one = *this;
    one.dp = 1;
    return one.describe() + " x dp=" + std::to_string(dp) + " (data parallel replicas)";
  }
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
  const auto w = root.child("workload");
  w.expect_keys(kBlockModelKeys);
  c.model = w.get_string("model", "");
  auto& s = c.shape;
  s.hidden = w.get_positive_int("hidden");
  s.heads = w.get_positive_int("heads");
  s.kv_heads = w.get_positive_int("kv_heads", s.heads);
  s.ffn = w.get_positive_int("ffn");
  s.seq = w.get_positive_int("seq");
  s.causal = w.get_bool("causal", true);
  s.rope = w.get_bool("rope", true);
  s.seed = static_cast<uint64_t>(w.get_int("seed", 1));
  const std::string dt = w.get_string("dtype", "fp32");
  if (dt == "fp32") s.dtype = DType::fp32;
  else if (dt == "bf16") s.dtype = DType::bf16;
  else w.child("dtype").fail(w.path() + ".dtype: '" + dt + "' (transformer_block supports fp32, bf16)");
  if (s.hidden % s.heads != 0)
    w.child("heads").fail(w.path() + ".heads: hidden " + std::to_string(s.hidden) + " is not a multiple of " +
                          std::to_string(s.heads) + " heads");
  if (s.heads % s.kv_heads != 0)
    w.child("kv_heads").fail(w.path() + ".kv_heads: " + std::to_string(s.heads) + " query heads are not a multiple of " +
                             std::to_string(s.kv_heads) + " KV heads");
  if (s.rope && s.head_dim() % 2 != 0) w.child("rope").fail(w.path() + ".rope: needs an even head_dim");

  auto& p = c.plan;
  const int chips = c.topology.num_chips();
  if (root.has("parallel")) {
    const auto par = root.child("parallel");
    par.expect_keys(kBlockParallelKeys);
    p.tp = static_cast<int>(par.get_positive_int("tp", 1));
    p.sp = par.get_bool("sp", false);
    p.cp = static_cast<int>(par.get_positive_int("cp", 1));
    p.ulysses = static_cast<int>(par.get_positive_int("ulysses", 1));
    p.dp = static_cast<int>(par.get_positive_int("dp", 1));
    const std::string split = par.get_string("cp_split", "zigzag");
    if (split != "zigzag" && split != "contiguous")
      par.child("cp_split").fail("parallel.cp_split: '" + split + "' (zigzag | contiguous)");
    p.zigzag = split == "zigzag";
    if (par.has("cp_split") && p.cp == 1)
      par.child("cp_split").fail("parallel.cp_split: only used with context parallelism (cp > 1)");
    if (p.sp && p.tp == 1) par.child("sp").fail("parallel.sp: sequence parallelism needs tp > 1");
    const int64_t product = int64_t{p.tp} * p.cp * p.ulysses * p.dp;
    if (product != chips)
      par.fail("parallel: tp " + std::to_string(p.tp) + " x cp " + std::to_string(p.cp) + " x ulysses " +
               std::to_string(p.ulysses) + (p.dp > 1 ? " x dp " + std::to_string(p.dp) : std::string()) + " = " + std::to_string(product) + " does not match the topology's " +
               std::to_string(chips) + " chips (the device mesh must cover every chip once)");
    if (p.ulysses > 1 && p.cp > 1)
      par.child("ulysses").fail("parallel.ulysses: ulysses and cp both shard the sequence on the mesh's cp axis; "
                                "use one of them");
    if (p.ulysses > 1 && p.sp)
      par.child("sp").fail("parallel.sp: not with ulysses (ulysses already shards the sequence outside attention)");
    // outputs [this chip's tokens, hidden]
    p.fused = parse_fused_plan(par, p.tp, s.seq / (int64_t{p.cp} * p.ulysses), s.hidden);
    if (p.fused.enabled && p.sp && par.has("chunks"))
      par.child("chunks").fail("parallel.chunks: with sp the fused ops are rings over the tp shards (tp pieces); "
                               "chunks applies to the all_reduce form (sp: false)");
    if (s.heads % p.tp != 0)
      par.child("tp").fail("parallel.tp: " + std::to_string(s.heads) + " query heads are not divisible by tp " +
                           std::to_string(p.tp) + " (uneven head splits are not supported)");
    if (s.kv_heads % p.tp != 0 && p.tp % s.kv_heads != 0)
      par.child("tp").fail("parallel.tp: " + std::to_string(s.kv_heads) + " KV heads and tp " + std::to_string(p.tp) +
                           ": one must divide the other (KV heads are split or replicated whole)");
    if (p.sp && (s.seq / p.cp) % p.tp != 0)
      par.child("sp").fail("parallel.sp: the " + std::to_string(s.seq / p.cp) +
                           " tokens per context shard are not divisible by tp " + std::to_string(p.tp));
    if (p.cp > 1 && s.seq % (p.zigzag ? 2 * p.cp : p.cp) != 0)
      par.child("cp").fail("parallel.cp: seq " + std::to_string(s.seq) + " is not divisible by " +
                           (p.zigzag ? "2*cp = " + std::to_string(2 * p.cp) + " (zig-zag split)"
                                     : "cp = " + std::to_string(p.cp)));
    if (p.ulysses > 1) {
      // Each tp shard's heads are split over the ulysses ranks (KV heads replicated across tp shards cannot be).
      const int64_t hq = s.heads / p.tp, hkv = p.tp <= s.kv_heads ? s.kv_heads / p.tp : 0;
      if (hq % p.ulysses != 0 || hkv % p.ulysses != 0 || hkv == 0)
        par.child("ulysses").fail("parallel.ulysses: " + std::to_string(hq) + " query / " +
                                  std::to_string(hkv) + " KV heads" + (p.tp > 1 ? " per tp shard" : "") +
                                  " are not both divisible by " + std::to_string(p.ulysses));
      if (s.seq % p.ulysses != 0)
        par.child("ulysses").fail("parallel.ulysses: seq " + std::to_string(s.seq) + " is not divisible by " +
                                  std::to_string(p.ulysses));
    }
  } else if (chips != 1) {
    root.fail("parallel: missing (a " + std::to_string(chips) + "-chip topology needs a plan: tp, cp or ulysses)");
  }
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
using plans::attend;
using plans::finish_acc;
using plans::gemm;
using plans::init_acc;
using plans::positions_of;
using plans::rmsnorm;

constexpr uint32_t kIdX = 1, kIdNorm1 = 2, kIdWq = 3, kIdWk = 4, kIdWv = 5, kIdWo = 6, kIdNorm2 = 7, kIdWg = 8,
                   kIdWu = 9, kIdWd = 10;

// The block of the global [*, global_cols] tensor ID at (row0, col0), scaled for a fan-in of FAN_IN.
Tensor init_block(const BlockShape& s, uint32_t id, int64_t rows, int64_t cols, int64_t global_cols, int64_t row0,
                  int64_t col0, double fan_in) {
  Tensor t(s.dtype, {rows, cols});
  const float a = static_cast<float>(1.0 / std::sqrt(fan_in));
  fill_uniform_block(t, InitSpec{s.seed, id, -a, a}, global_cols, row0, col0);
  return t;
}
Tensor init_norm(const BlockShape& s, uint32_t id) {
  Tensor t(s.dtype, {1, s.hidden});
  fill_uniform_block(t, InitSpec{s.seed, id, 0.9f, 1.1f}, s.hidden, 0, 0);
  return Tensor::from_float(t.to_float(), s.dtype, {s.hidden});
}

// The rows ROWS (global token ids) of the input x.
Tensor init_x(const BlockShape& s, const std::vector<int64_t>& rows) {
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

Weights make_weights(const BlockShape& s, int tp, int t) {
  Weights w;
  const int64_t d = s.head_dim();
  w.nq = s.heads / tp;
  w.q0 = t * w.nq;
  if (tp <= s.kv_heads) {
    w.nkv = s.kv_heads / tp;
    w.g0 = t * w.nkv;
  } else {
    w.nkv = 1;  // replicated: the KV head this chip's q heads use
    w.g0 = w.q0 / (s.heads / s.kv_heads);
  }
  const collectives::Partition fp{static_cast<size_t>(s.ffn), static_cast<size_t>(tp)};
  w.f0 = static_cast<int64_t>(fp.offset(static_cast<size_t>(t)));
  w.nf = static_cast<int64_t>(fp.size(static_cast<size_t>(t)));
  const double h = static_cast<double>(s.hidden);
  w.norm1 = init_norm(s, kIdNorm1);
  w.norm2 = init_norm(s, kIdNorm2);
  w.wq = init_block(s, kIdWq, s.hidden, w.nq * d, s.heads * d, 0, w.q0 * d, h);
  w.wk = init_block(s, kIdWk, s.hidden, w.nkv * d, s.kv_heads * d, 0, w.g0 * d, h);
  w.wv = init_block(s, kIdWv, s.hidden, w.nkv * d, s.kv_heads * d, 0, w.g0 * d, h);
  w.wo = init_block(s, kIdWo, w.nq * d, s.hidden, s.hidden, w.q0 * d, 0, static_cast<double>(s.heads * d));
  w.wg = init_block(s, kIdWg, s.hidden, w.nf, s.ffn, 0, w.f0, h);
  w.wu = init_block(s, kIdWu, s.hidden, w.nf, s.ffn, 0, w.f0, h);
  w.wd = init_block(s, kIdWd, w.nf, s.hidden, s.hidden, w.f0, 0, static_cast<double>(s.ffn));
  return w;
}

uint64_t weight_bytes(const Weights& w) {
  uint64_t b = 0;
  for (const Tensor* t : {&w.norm1, &w.wq, &w.wk, &w.wv, &w.wo, &w.norm2, &w.wg, &w.wu, &w.wd}) b += t->nbytes();
  return b;
}

// The single-device block (the reference), charged to CHIP.
Tensor block_single(Chip& chip, const BlockShape& s, const Tensor& x, const Weights& w) {
  const int64_t T = s.seq, d = s.head_dim();
  Tensor a = rmsnorm(chip, x, w.norm1, "rmsnorm.attn");
  Tensor q = gemm(chip, a, w.wq, "gemm.q").reshaped({a.dim(0), s.heads, d});
  Tensor k = gemm(chip, a, w.wk, "gemm.k").reshaped({a.dim(0), s.kv_heads, d});
  Tensor v = gemm(chip, a, w.wv, "gemm.v").reshaped({a.dim(0), s.kv_heads, d});
  std::vector<Chunk> all{{0, 0, T}};
  if (s.rope) {
    chip.charge(kernels::rope_inplace(q, positions_of(all)), "rope.q");
    chip.charge(kernels::rope_inplace(k, positions_of(all)), "rope.k");
  }
  std::vector<Tensor> acc, lse;
  init_acc(all, s.heads, d, acc, lse);
  attend(chip, s, q, all, k, v, all, acc, lse, "attention");
  Tensor o = finish_acc(all, acc, s.dtype, T).reshaped({T, s.heads * d});
  Tensor x1 = gemm(chip, o, w.wo, "gemm.o");
  chip.charge(kernels::add_inplace(x1, x), "residual");
  Tensor out = mlp_layer(chip, nullptr, rmsnorm(chip, x1, w.norm2, "rmsnorm.mlp"), {&w.wg, &w.wu, &w.wd}, s.activation);
  chip.charge(kernels::add_inplace(out, x1), "residual");
  return out;
}

const std::vector<std::string> kCommKeys = {"tp all_reduce", "sp all_gather", "sp reduce_scatter", "cp ring K/V",
                                            "ulysses all_to_all"};

}  // namespace

// ------------------------------------------------------------------------------------------------ run

namespace {

// One weight of the block for the checkpoint: this chip's tensor, where it sits in the global one, its placement.
struct WeightSlot {
  std::string name;
  Tensor* t;
  runtime::Shape global, offset;
  Placement on_tp;
  bool kv = false;  // Wk/Wv: whole KV heads repeated over tp/kv_heads chips when tp > kv_heads
};

std::vector<WeightSlot> weight_slots(const BlockShape& s, Weights& w) {
  const int64_t d = s.head_dim(), H = s.hidden;
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
  const BlockShape& s = cfg.shape;
  const BlockPlan& p = cfg.plan;
  const int rank = world.rank(), chips = world.size();
  const int chip_id = cfg.topology.placement().at(static_cast<size_t>(rank));
  const int64_t d = s.head_dim(), T = s.seq;
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
  const int c_idx = p.ulysses > 1 ? 0 : u_idx;

  sim::Timeline tl(chip_id, cfg.topology, cfg.device);
  runtime::Transport world_tp(world.comm(), tl, cfg.topology.placement());  // mesh rank r on chip placement[r]
  mesh.bind(world_tp);
  runtime::Transport& tp_group = mesh["tp"];
  runtime::Transport& cp_group = mesh["cp"];  // the cp ring, or the ulysses all_to_all group
  sim::Memory memory(chip_id, cfg.device.hbm_bytes());

  // Which tokens this chip's attention covers (q rows: the cp unit's chunks), and which residual rows it holds.
  const std::vector<Chunk> attn_chunks = plans::cp_chunks(T, p.cp, c_idx, p.zigzag);
  int64_t n_attn = 0;
  for (const auto& c : attn_chunks) n_attn += c.len;
  const auto attn_rows = positions_of(attn_chunks);
  std::vector<int64_t> resid_rows = attn_rows;
  if (p.sp) {  // sequence parallel: a Shard(0) over tp of the attention rows
    const int64_t n = n_attn / p.tp;
    resid_rows.assign(attn_rows.begin() + t_idx * n, attn_rows.begin() + (t_idx + 1) * n);
  } else if (p.ulysses > 1) {  // ulysses: a Shard(0) of the sequence over the cp axis
    const int64_t n = T / p.ulysses;
    resid_rows.clear();
    for (int64_t i = 0; i < n; ++i) resid_rows.push_back(u_idx * n + i);
  }
  const int64_t n_resid = static_cast<int64_t>(resid_rows.size());

  Weights w = make_weights(s, p.tp, t_idx);
  // ---- resume: this chip's shards from a checkpoint of any plan ----
  std::unique_ptr<CheckpointReader> reader;
  if (!opt.resume_from.empty()) {
    const std::string& path = opt.resume_from;
    world.agree([&] {
      reader = std::make_unique<CheckpointReader>(world.comm(), path);
      const std::string kind = reader->root_attribute("workload");
      if (kind != "transformer_block")
        throw ConfigError("checkpoint " + path + ": written by a '" + (kind.empty() ? "?" : kind) +
                          "' workload, not a transformer_block");
      for (const char* key : {"heads", "kv_heads"}) {
        const std::string saved = reader->root_attribute(key);
        const int64_t want = std::string(key) == "heads" ? s.heads : s.kv_heads;
        if (saved != std::to_string(want))
          throw ConfigError("checkpoint " + path + ": written with " + key + " " + saved + " but the config has " +
                            std::to_string(want));
      }
      for (const auto& slot : weight_slots(s, w)) {
        if (reader->global_shape(slot.name) != slot.global)
          throw ConfigError("checkpoint " + path + ": dataset '" + slot.name + "' has shape " +
                            runtime::shape_str(reader->global_shape(slot.name)) + " but the config's block needs " +
                            runtime::shape_str(slot.global));
        if (reader->dtype(slot.name) != s.dtype)
          throw ConfigError("checkpoint " + path + ": dataset '" + slot.name + "' is " +
                            runtime::dtype_name(reader->dtype(slot.name)) + " but the config's dtype is " +
                            runtime::dtype_name(s.dtype));
      }
    });
    for (auto& slot : weight_slots(s, w)) reader->read_block(slot.name, slot.offset, *slot.t);
  }
  const Tensor x = init_x(s, batch_rows(resid_rows));
  const BlockMemory mem_plan = block_memory(s, p, t_idx);
  memory.allocate("weights", mem_plan.weights);
  memory.allocate("x", mem_plan.x);
  world.sleepy_barrier();

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
  plan_mismatch("weights", mem_plan.weights, weight_bytes(w));
  plan_mismatch("x", mem_plan.x, x.nbytes());
  const int64_t qkv_rows = p.sp ? n_attn : n_resid;
  plan_mismatch("q/k/v", mem_plan.qkv, static_cast<uint64_t>(qkv_rows * (w.nq + 2 * w.nkv) * d) * es);
  if (p.cp > 1) plan_mismatch("ring", mem_plan.ring, 2 * static_cast<uint64_t>(qkv_rows * w.nkv * d) * es);

  // ---- attention sublayer: norm, column-parallel Q/K/V (tp, sp, fused units), the attention of the cp axis's
  // unit (ring attention or ulysses), row-parallel Wo and its reduction, residual ----
  Tensor a_loc = rmsnorm(chip, x, w.norm1, "rmsnorm.attn");
  auto act_mem = memory.scoped("activations q/k/v", mem_plan.qkv);
  auto qkv = plans::column_parallel(ctx, a_loc, {&w.wq, &w.wk, &w.wv}, {"gemm.q", "gemm.k", "gemm.v"}, "before QKV",
                                    "sp all_gather + gemm.qkv", "sp all_gather + gemm.q/k/v");
  Tensor q = std::move(qkv[0]).reshaped({qkv_rows, w.nq, d});
  Tensor k = std::move(qkv[1]).reshaped({qkv_rows, w.nkv, d});
  Tensor v = std::move(qkv[2]).reshaped({qkv_rows, w.nkv, d});
  if (s.rope) {
    const auto pos = p.ulysses > 1 ? resid_rows : attn_rows;
    chip.charge(kernels::rope_inplace(q, pos), "rope.q");
    chip.charge(kernels::rope_inplace(k, pos), "rope.k");
  }
  const Tensor o = p.ulysses > 1 ? plans::ulysses_attention(ctx, q, k, v)
                                 : plans::ring_attention(ctx, q, k, v, attn_chunks, c_idx, memory, mem_plan.ring);
  Tensor x1 = plans::row_parallel(ctx, o, w.wo, "gemm.o", "attention output");
  chip.charge(kernels::add_inplace(x1, x), "residual");
  act_mem.release();

  // ---- MLP sublayer: norm, column-parallel gate/up, SwiGLU, row-parallel down and its reduction, residual ----
  Tensor b_loc = rmsnorm(chip, x1, w.norm2, "rmsnorm.mlp");
  const int64_t mlp_rows = p.sp ? n_attn : n_resid;
  plan_mismatch("mlp", mem_plan.mlp, static_cast<uint64_t>(mlp_rows * 2 * w.nf) * es);
  auto mlp_mem = memory.scoped("activations mlp", mem_plan.mlp);
  Tensor out = mlp_layer(chip, &ctx, b_loc, {&w.wg, &w.wu, &w.wd}, s.activation);  // models/layers.h
  chip.charge(kernels::add_inplace(out, x1), "residual");
  mlp_mem.release();
  world.sleepy_barrier();

  RunReport rep;
  rep.name = cfg.name;
  rep.model = cfg.model;
  rep.config_file = cfg.file;
  rep.dtype = runtime::dtype_name(s.dtype);
  rep.tolerance = cfg.tolerance;
  rep.hbm_capacity_bytes = cfg.device.hbm_bytes();
  rep.topology = cfg.topology.describe();
  rep.device = sim::describe(cfg.device);
  rep.plan = p.describe();
  rep.mesh = cfg.mesh.mapping_text();
  rep.chips = chips;

  // ---- validation: gather the distinct residual rows on rank 0 ----
  const bool owner = p.sp || t_idx == 0;  // without sp the tp shards hold the same rows
  std::vector<float> mine;
  std::vector<double> mine_rows;
  if (owner) {
    mine = out.to_float();
    const auto rows = batch_rows(resid_rows);
    mine_rows.assign(rows.begin(), rows.end());
  }
  int nrows = static_cast<int>(mine_rows.size());
  std::vector<int> counts(static_cast<size_t>(chips)), displs(static_cast<size_t>(chips));
  runtime::check_mpi(MPI_Gather(&nrows, 1, MPI_INT, counts.data(), 1, MPI_INT, 0, world.comm()), rank, "block gather");
  int total = 0;
  for (int r = 0; r < chips; ++r) {
    displs[static_cast<size_t>(r)] = total;
    total += counts[static_cast<size_t>(r)];
  }
  std::vector<double> all_rows(rank == 0 ? static_cast<size_t>(total) : 0);
  runtime::check_mpi(MPI_Gatherv(mine_rows.data(), nrows, MPI_DOUBLE, all_rows.data(), counts.data(), displs.data(),
                                 MPI_DOUBLE, 0, world.comm()), rank, "block gather");
  const int h = static_cast<int>(s.hidden);
  std::vector<int> vcounts(counts), vdispls(displs);
  for (int r = 0; r < chips; ++r) {
    vcounts[static_cast<size_t>(r)] *= h;
    vdispls[static_cast<size_t>(r)] *= h;
  }
  std::vector<float> all_vals(rank == 0 ? static_cast<size_t>(total) * static_cast<size_t>(h) : 0);
  runtime::check_mpi(MPI_Gatherv(mine.data(), nrows * h, MPI_FLOAT, all_vals.data(), vcounts.data(), vdispls.data(),
                                 MPI_FLOAT, 0, world.comm()), rank, "block gather");

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
  const size_t nf = stats.size();
  std::vector<double> all_stats(rank == 0 ? nf * static_cast<size_t>(chips) : 0);
  runtime::check_mpi(MPI_Gather(stats.data(), static_cast<int>(nf), MPI_DOUBLE, all_stats.data(), static_cast<int>(nf),
                                MPI_DOUBLE, 0, world.comm()), rank, "block report");
  double flops_sum = 0;
  runtime::check_mpi(MPI_Reduce(&bd.flops, &flops_sum, 1, MPI_DOUBLE, MPI_SUM, 0, world.comm()), rank, "block report");
  rep.ops = ops_of_rank(world, op_breakdown(tl), critical_rank(world, bd.total));
  if (!trace_path.empty()) write_trace(world, tl, trace_path);

  // ---- checkpoint: every weight with its global shape; each shard written once ----
  if (!opt.checkpoint_path.empty()) {
    std::vector<CheckpointEntry> entries;
    for (const auto& slot : weight_slots(s, w)) {
      const bool repeated_kv = slot.kv && p.tp > s.kv_heads;
      bool writer = u_idx == 0 && d_idx == 0;  // cp / ulysses ranks and dp replicas hold replicas
      if (std::holds_alternative<Replicate>(slot.on_tp)) writer = writer && t_idx == 0;
      if (repeated_kv) writer = writer && t_idx % (p.tp / s.kv_heads) == 0;
      std::string sharding = TensorSpec{slot.name, slot.global, {{"tp", p.tp > 1 ? slot.on_tp : Placement{Replicate{}}}}}
                                 .describe(cfg.mesh);
      if (repeated_kv) sharding += " (each KV head repeated on tp/kv_heads chips)";
      entries.push_back({slot.name, slot.t, slot.global, slot.offset, sharding, writer});
    }
    const std::map<std::string, std::string> attrs = {
        {"shardsim_version", "0.1.0"}, {"workload", "transformer_block"}, {"model", cfg.model},
        {"config", cfg.text},          {"config_file", cfg.file},         {"parallel_plan", p.describe()},
        {"heads", std::to_string(s.heads)}, {"kv_heads", std::to_string(s.kv_heads)},
        {"seed", std::to_string(s.seed)},   {"topology", cfg.topology.describe()},
    };
    SaveOptions so;
    so.mesh = cfg.mesh.mapping_text();
    save_checkpoint(world.comm(), opt.checkpoint_path, entries, attrs, so);
  }
  // The reference's weights: the checkpoint's when resumed (read collectively; whole tensors on rank 0).
  std::unique_ptr<Weights> ckpt_full;
  if (reader && cfg.validate) {
    ckpt_full = std::make_unique<Weights>(rank == 0 ? make_weights(s, 1, 0) : Weights{});
    Weights& f = *ckpt_full;
    for (auto& slot : weight_slots(s, f)) {
      Tensor block(s.dtype, rank == 0 ? slot.global : runtime::Shape(slot.global.size(), 0));
      reader->read_block(slot.name, runtime::Shape(slot.global.size(), 0), block);
      if (rank == 0) *slot.t = std::move(block);
    }
  }
  reader.reset();

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
      }
    }
    if (const auto it = rep.comm.find("tp all_reduce"); it != rep.comm.end()) {
      rep.all_reduce_ns = it->second.ns;
      rep.all_reduce_bytes_per_chip = it->second.bytes;
      rep.all_reduce_expected_bytes = it->second.expected;
    }
    rep.total_flops = flops_sum;
    rep.sim_tflops = rep.critical.total > 0 ? flops_sum / rep.critical.total / 1e3 : 0;
    rep.peak_tflops_per_chip = cfg.device.peak_tflops(runtime::precision_of(s.dtype));
    rep.peak_tflops = chips * rep.peak_tflops_per_chip;
    rep.peak_fraction = rep.peak_tflops > 0 ? rep.sim_tflops / rep.peak_tflops : 0;
    rep.tokens_per_s = rep.critical.total > 0 ? double(s.seq) * p.dp / rep.critical.total * 1e9 : 0;
    if (cfg.validate) {
      rep.validated = true;
      rep.tolerance = cfg.tolerance;
      const Weights full = ckpt_full ? std::move(*ckpt_full) : make_weights(s, 1, 0);
      sim::Timeline ref_tl(chip_id, cfg.topology, cfg.device);
      Chip ref{&ref_tl, 0.0, 0.0};
      std::vector<float> wf;  // [dp·seq, hidden]: the dp sequences one after the other on one device
      for (int64_t b = 0; b < p.dp; ++b) {
        std::vector<int64_t> rows(static_cast<size_t>(T));
        for (int64_t i = 0; i < T; ++i) rows[static_cast<size_t>(i)] = b * T + i;
        const auto want = block_single(ref, s, init_x(s, rows), full).to_float();
        wf.insert(wf.end(), want.begin(), want.end());
      }
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
  rep.checkpoint = opt.checkpoint_path;
  rep.resumed_from = opt.resume_from;
  rep.trace = trace_path;
  rep.wall_total_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  return rep;
}

}  // namespace shardsim::sharding

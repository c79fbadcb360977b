#include "sharding/transformer.h"

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
#include "sharding/init.h"
#include "sharding/report.h"
#include "sharding/trace.h"
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
  const int chips = c.plan.tp * c.plan.cp * c.plan.ulysses;
  for (int r = 0; r < chips; ++r)
    total += static_cast<double>(block_memory(c.shape, c.plan, c.plan.ulysses > 1 ? 0 : r / c.plan.cp).peak());
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
                      "%.2f GiB available", need / 1073741824.0, c.plan.tp * c.plan.cp * c.plan.ulysses,
                      c.validate ? " and the single-device reference on rank 0" : "", have / 1073741824.0);
        throw ConfigError(c.file + ": " + b + "; lower workload.seq/hidden/ffn" +
                          (c.validate ? std::string(" or set validate.enabled: false") : std::string()));
      }
      return;
    }
}

// ------------------------------------------------------------------------------------------------ config

std::string BlockPlan::describe() const {
  std::ostringstream os;
  if (ulysses > 1) return "ulysses=" + std::to_string(ulysses) + " (all_to_all sequence <-> heads)";
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
  root.expect_keys({"name", "topology", "device", "workload", "parallel", "validate"});
  BlockConfig c;
  c.file = file;
  c.name = root.get_string("name", "transformer-block");
  c.topology = topology::load_topology(root.child("topology"));
  c.device = root.has("device") ? sim::load_device(root.child("device")) : sim::device_preset("generic");
  const auto w = root.child("workload");
  w.expect_keys({"kind", "model", "hidden", "heads", "kv_heads", "ffn", "seq", "causal", "rope", "dtype", "seed"});
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
  else w.child("dtype").fail("workload.dtype: '" + dt + "' (transformer_block supports fp32, bf16)");
  if (s.hidden % s.heads != 0)
    w.child("heads").fail("workload.heads: hidden " + std::to_string(s.hidden) + " is not a multiple of " +
                          std::to_string(s.heads) + " heads");
  if (s.heads % s.kv_heads != 0)
    w.child("kv_heads").fail("workload.kv_heads: " + std::to_string(s.heads) + " query heads are not a multiple of " +
                             std::to_string(s.kv_heads) + " KV heads");
  if (s.rope && s.head_dim() % 2 != 0) w.child("rope").fail("workload.rope: needs an even head_dim");

  auto& p = c.plan;
  const int chips = c.topology.num_chips();
  if (root.has("parallel")) {
    const auto par = root.child("parallel");
    par.expect_keys({"tp", "sp", "cp", "cp_split", "ulysses", "fused", "chunks"});
    p.tp = static_cast<int>(par.get_positive_int("tp", 1));
    p.sp = par.get_bool("sp", false);
    p.cp = static_cast<int>(par.get_positive_int("cp", 1));
    p.ulysses = static_cast<int>(par.get_positive_int("ulysses", 1));
    const std::string split = par.get_string("cp_split", "zigzag");
    if (split != "zigzag" && split != "contiguous")
      par.child("cp_split").fail("parallel.cp_split: '" + split + "' (zigzag | contiguous)");
    p.zigzag = split == "zigzag";
    if (par.has("cp_split") && p.cp == 1)
      par.child("cp_split").fail("parallel.cp_split: only used with context parallelism (cp > 1)");
    if (p.sp && p.tp == 1) par.child("sp").fail("parallel.sp: sequence parallelism needs tp > 1");
    const int64_t product = int64_t{p.tp} * p.cp * p.ulysses;
    if (product != chips)
      par.fail("parallel: tp " + std::to_string(p.tp) + " x cp " + std::to_string(p.cp) + " x ulysses " +
               std::to_string(p.ulysses) + " = " + std::to_string(product) + " does not match the topology's " +
               std::to_string(chips) + " chips (the device mesh must cover every chip once)");
    if (p.ulysses > 1 && (p.tp > 1 || p.cp > 1))
      par.child("ulysses").fail("parallel.ulysses: combine with tp or cp is not supported; use ulysses alone");
    p.fused = parse_fused_plan(par, p.tp, s.seq / p.cp, s.hidden);  // outputs [this chip's tokens, hidden]
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
      if (s.heads % p.ulysses != 0 || s.kv_heads % p.ulysses != 0)
        par.child("ulysses").fail("parallel.ulysses: " + std::to_string(s.heads) + " query / " +
                                  std::to_string(s.kv_heads) + " KV heads are not both divisible by " +
                                  std::to_string(p.ulysses));
      if (s.seq % p.ulysses != 0)
        par.child("ulysses").fail("parallel.ulysses: seq " + std::to_string(s.seq) + " is not divisible by " +
                                  std::to_string(p.ulysses));
    }
  } else if (chips != 1) {
    root.fail("parallel: missing (a " + std::to_string(chips) + "-chip topology needs a plan: tp, cp or ulysses)");
  }
  if (root.has("validate")) {
    const auto v = root.child("validate");
    v.expect_keys({"enabled", "tolerance"});
    c.validate = v.get_bool("enabled", true);
    c.tolerance = v.has("tolerance") ? v.get_positive_double("tolerance") : 0;
  }
  if (c.tolerance == 0) c.tolerance = s.dtype == DType::bf16 ? 3e-2 : 1e-4;
  // Simulated HBM of every chip, before anything is allocated (the same replay run_block makes).
  for (int r = 0; r < chips && r < p.tp * p.cp * p.ulysses; ++r) {
    sim::Memory m(c.topology.placement().at(static_cast<size_t>(r)), c.device.hbm_bytes());
    try {
      replay(m, block_memory(s, p, p.ulysses > 1 ? 0 : r / p.cp));
    } catch (const sim::OutOfMemory& e) {
      root.child("workload").fail(std::string("workload: ") + e.what() + " (device " + c.device.name + ")");
    }
  }
  return c;
}

// ------------------------------------------------------------------------------------------------ pieces

namespace {

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

// Charges kernels to a chip's compute engine, in order.
struct Chip {
  sim::Timeline* tl = nullptr;
  sim::TimeNs t = 0;
  double attention_ns = 0;
  void charge(const kernels::KernelCost& c, const std::string& name, bool attention = false) {
    if (!tl) return;
    const auto span = tl->compute(name, c.flops, c.bytes, runtime::precision_of(c.dtype), t);
    t = span.end;
    if (attention) attention_ns += span.duration();
  }
};

Tensor gemm(Chip& chip, const Tensor& a, const Tensor& b, const std::string& name) {
  Tensor c(a.dtype(), {a.dim(0), b.dim(1)});
  chip.charge(kernels::gemm(a, b, c), name);
  return c;
}

Tensor rmsnorm(Chip& chip, const Tensor& x, const Tensor& w, const std::string& name) {
  Tensor y(x.dtype(), x.shape());
  chip.charge(kernels::rmsnorm(x, w, y), name);
  return y;
}

// A run of consecutive tokens a chip holds: local rows [local, local+len) are global positions [global, ...).
struct Chunk {
  int64_t local = 0, global = 0, len = 0;
};

std::vector<int64_t> positions_of(const std::vector<Chunk>& chunks) {
  std::vector<int64_t> p;
  for (const auto& c : chunks)
    for (int64_t i = 0; i < c.len; ++i) p.push_back(c.global + i);
  return p;
}

// Local attention of Q (rows in Q_CHUNKS) against K/V (rows in K_CHUNKS), merged into ACC/LSE (fp32). On the
// host it runs one kernel call per (q chunk, kv chunk) pair that is not fully masked. The simulated chip runs it
// as ONE fused kernel with a per-token position mask, as a chip-side ring-attention kernel would: one launch;
// the FLOPs of the visible pairs; the HBM bytes of one call over all q rows x all kv rows, scaled by the visible
// fraction (so cutting the rows into zig-zag chunks does not lower the tiles' arithmetic intensity); one merge
// per q chunk.
void attend(Chip& chip, const BlockShape& s, const Tensor& q, const std::vector<Chunk>& q_chunks, const Tensor& k,
            const Tensor& v, const std::vector<Chunk>& k_chunks, std::vector<Tensor>& acc, std::vector<Tensor>& lse,
            const std::string& name) {
  const int64_t nq = q.dim(1);
  double flops = 0, merge_flops = 0, merge_bytes = 0;
  int64_t q_rows = 0, k_rows = 0;
  for (const auto& c : q_chunks) q_rows += c.len;
  for (const auto& c : k_chunks) k_rows += c.len;
  for (size_t a = 0; a < q_chunks.size(); ++a) {
    const Chunk& qc = q_chunks[a];
    const Tensor qa = q.rows(qc.local, qc.len);
    bool merged = false;
    for (const Chunk& kc : k_chunks) {
      if (s.causal && qc.global + qc.len - 1 < kc.global) continue;  // fully masked: nothing to compute
      kernels::AttentionOptions o;
      o.causal = s.causal;
      o.q_offset = qc.global;
      o.k_offset = kc.global;
      Tensor out(DType::fp32, {qc.len, nq, q.dim(2)}), l(DType::fp32, {nq, qc.len});
      const Tensor kb = k.rows(kc.local, kc.len), vb = v.rows(kc.local, kc.len);
      flops += kernels::attention(qa, kb, vb, out, l, o).flops;
      const auto m = kernels::merge_attention_partials(acc[a], lse[a], out, l);
      if (!merged) {  // the fused kernel merges each q chunk once per call
        merge_flops += m.flops;
        merge_bytes += m.bytes;
        merged = true;
      }
    }
  }
  if (flops <= 0) return;
  const auto full = kernels::attention_cost(q_rows, k_rows, nq, k.dim(1), q.dim(2), q.dtype(), DType::fp32);
  const double visible = full.flops > 0 ? flops / full.flops : 1.0;
  chip.charge(kernels::KernelCost{name, flops + merge_flops, full.bytes * visible + merge_bytes, q.dtype()}, name, true);
}

void init_acc(const std::vector<Chunk>& q_chunks, int64_t nq, int64_t d, std::vector<Tensor>& acc,
              std::vector<Tensor>& lse) {
  for (const auto& c : q_chunks) {
    acc.emplace_back(DType::fp32, runtime::Shape{c.len, nq, d});
    Tensor l(DType::fp32, {nq, c.len});
    for (int64_t i = 0; i < l.numel(); ++i) l.f32()[i] = -std::numeric_limits<float>::infinity();
    lse.push_back(std::move(l));
  }
}

Tensor finish_acc(const std::vector<Chunk>& q_chunks, std::vector<Tensor>& acc, DType dtype, int64_t rows) {
  Tensor o(dtype, {rows, acc.empty() ? 0 : acc[0].dim(1), acc.empty() ? 0 : acc[0].dim(2)});
  for (size_t a = 0; a < q_chunks.size(); ++a) {
    const auto f = acc[a].to_float();
    const int64_t off = q_chunks[a].local * o.dim(1) * o.dim(2);
    for (size_t i = 0; i < f.size(); ++i) o.set(off + static_cast<int64_t>(i), f[i]);
  }
  return o;
}

Tensor mlp(Chip& chip, const Tensor& b, const Weights& w) {
  Tensor g = gemm(chip, b, w.wg, "gemm.gate (column-parallel)");
  Tensor u = gemm(chip, b, w.wu, "gemm.up (column-parallel)");
  chip.charge(kernels::glu_inplace(g, u, kernels::Activation::silu), "swiglu");
  return gemm(chip, g, w.wd, "gemm.down (row-parallel)");
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
  Tensor out = mlp(chip, rmsnorm(chip, x1, w.norm2, "rmsnorm.mlp"), w);
  chip.charge(kernels::add_inplace(out, x1), "residual");
  return out;
}

const std::vector<std::string> kCommKeys = {"tp all_reduce", "sp all_gather", "sp reduce_scatter", "cp ring K/V",
                                            "ulysses all_to_all"};

struct Comm {
  std::map<std::string, CommStat> stats;
  void add(const std::string& key, double bytes, double expected) {
    auto& s = stats[key];
    s.bytes += bytes;
    s.expected += expected;
    ++s.calls;
  }
};

collectives::CollectiveOptions ring_opts(const std::string& name, const std::string& algorithm = "ring") {
  collectives::CollectiveOptions o;
  o.algorithm = algorithm;
  o.name = name;
  return o;
}

}  // namespace

// ------------------------------------------------------------------------------------------------ run

BlockReport run_block(const runtime::World& world, const BlockConfig& cfg, const std::string& trace_path) {
  const auto t_start = std::chrono::steady_clock::now();
  const BlockShape& s = cfg.shape;
  const BlockPlan& p = cfg.plan;
  const int rank = world.rank(), chips = world.size();
  const int chip_id = cfg.topology.placement().at(static_cast<size_t>(rank));
  const int64_t d = s.head_dim(), T = s.seq;
  const size_t es = runtime::dtype_size(s.dtype);
  // Mesh coordinates: tp-major (rank = t*cp + c), ulysses alone.
  const int t_idx = p.ulysses > 1 ? 0 : rank / p.cp, c_idx = p.ulysses > 1 ? 0 : rank % p.cp;

  sim::Timeline tl(chip_id, cfg.topology, cfg.device);
  runtime::Transport world_tp(world.comm(), tl, cfg.topology.placement());
  runtime::Transport& tp_group = world_tp.subgroup("block.tp", c_idx, t_idx);
  runtime::Transport& cp_group = world_tp.subgroup("block.cp", t_idx, c_idx);
  sim::Memory memory(chip_id, cfg.device.hbm_bytes());

  // Which tokens this chip's attention covers (q rows), and which residual rows it holds.
  std::vector<Chunk> attn_chunks;
  if (p.ulysses > 1) {
    attn_chunks.push_back({0, 0, T});
  } else if (p.cp == 1) {
    attn_chunks.push_back({0, 0, T});
  } else if (p.zigzag) {
    const int64_t n = T / (2 * p.cp);
    attn_chunks.push_back({0, c_idx * n, n});
    attn_chunks.push_back({n, (2 * p.cp - 1 - c_idx) * n, n});
  } else {
    attn_chunks.push_back({0, c_idx * (T / p.cp), T / p.cp});
  }
  int64_t n_attn = 0;
  for (const auto& c : attn_chunks) n_attn += c.len;
  const auto attn_rows = positions_of(attn_chunks);
  std::vector<int64_t> resid_rows = attn_rows;
  if (p.sp) {
    const int64_t n = n_attn / p.tp;
    resid_rows.assign(attn_rows.begin() + t_idx * n, attn_rows.begin() + (t_idx + 1) * n);
  } else if (p.ulysses > 1) {
    const int64_t n = T / p.ulysses;
    resid_rows.clear();
    for (int64_t i = 0; i < n; ++i) resid_rows.push_back(rank * n + i);
  }
  const int64_t n_resid = static_cast<int64_t>(resid_rows.size());

  Weights w = make_weights(s, p.tp, t_idx);
  const Tensor x = init_x(s, resid_rows);
  const BlockMemory mem_plan = block_memory(s, p, t_idx);
  memory.allocate("weights", mem_plan.weights);
  memory.allocate("x", mem_plan.x);
  world.sleepy_barrier();

  Chip chip{&tl, 0.0, 0.0};
  Comm comm;
  auto coll_bytes = [](const collectives::CollectiveResult& r) { return r.bytes_sent; };

  // ---- attention sublayer ----
  Tensor a_loc = rmsnorm(chip, x, w.norm1, "rmsnorm.attn");
  Tensor a = a_loc;
  const double P_tp = p.tp;
  const bool fused = p.fused.enabled;
  std::vector<FusedOp> fused_ops;
  auto fused_done = [&](const std::string& op, const FusedTiming& f, sim::TimeNs ready) {
    chip.t = ready + f.fused_ns;
    fused_ops.push_back({op, f});
  };
  if (p.sp && !fused) {
    a = Tensor(s.dtype, {n_attn, s.hidden});
    const auto r = collectives::all_gather(tp_group, a_loc.data(), a.data(), static_cast<size_t>(a.numel()), s.dtype,
                                           chip.t, ring_opts("sp all_gather (before QKV)"));
    chip.t = r.span.end;
    comm.add("sp all_gather", coll_bytes(r), (P_tp - 1) / P_tp * static_cast<double>(a.nbytes()));
  }
  // The memory plan (block_memory, also checked at parse time) must be what this run holds.
  const auto plan_mismatch = [&](const char* what, uint64_t planned, uint64_t actual) {
    if (planned != actual)
      throw RuntimeFault("chip " + std::to_string(chip_id) + ": internal: memory plan '" + what + "' " +
                         std::to_string(planned) + " B differs from the run's " + std::to_string(actual) + " B");
  };
  plan_mismatch("weights", mem_plan.weights, weight_bytes(w));
  plan_mismatch("x", mem_plan.x, x.nbytes());
  const int64_t qkv_rows = p.sp ? n_attn : a.dim(0);
  plan_mismatch("q/k/v", mem_plan.qkv, static_cast<uint64_t>(qkv_rows * (w.nq + 2 * w.nkv) * d) * es);
  if (p.cp > 1) plan_mismatch("ring", mem_plan.ring, 2 * static_cast<uint64_t>(qkv_rows * w.nkv * d) * es);
  auto act_mem = memory.scoped("activations q/k/v", mem_plan.qkv);
  Tensor q, k, v;
  if (p.sp && fused) {  // one ring all_gather of the normed shard feeds the three column-parallel GEMMs
    Tensor q2(s.dtype, {n_attn, w.nq * d}), k2(s.dtype, {n_attn, w.nkv * d}), v2(s.dtype, {n_attn, w.nkv * d});
    const sim::TimeNs ready = chip.t;
    const auto f = all_gather_gemm(tp_group, a_loc, {&w.wq, &w.wk, &w.wv}, {&q2, &k2, &v2}, ready,
                                   "sp all_gather + gemm.qkv");
    fused_done("sp all_gather + gemm.q/k/v", f, ready);
    comm.add("sp all_gather", f.bytes_sent, (P_tp - 1) / P_tp * static_cast<double>(n_attn * s.hidden) * es);
    q = std::move(q2).reshaped({n_attn, w.nq, d});
    k = std::move(k2).reshaped({n_attn, w.nkv, d});
    v = std::move(v2).reshaped({n_attn, w.nkv, d});
  } else {
    q = gemm(chip, a, w.wq, "gemm.q (column-parallel)").reshaped({a.dim(0), w.nq, d});
    k = gemm(chip, a, w.wk, "gemm.k (column-parallel)").reshaped({a.dim(0), w.nkv, d});
    v = gemm(chip, a, w.wv, "gemm.v (column-parallel)").reshaped({a.dim(0), w.nkv, d});
  }
  if (s.rope) {
    const auto pos = p.ulysses > 1 ? resid_rows : attn_rows;
    chip.charge(kernels::rope_inplace(q, pos), "rope.q");
    chip.charge(kernels::rope_inplace(k, pos), "rope.k");
  }

  Tensor o;  // [rows, nq*d] in the row order of a
  if (p.ulysses > 1) {
    // Sequence-sharded [n, H, d] -> head-sharded [T, H/u, d]: block j = my rows x heads of rank j.
    const int u = p.ulysses;
    const int64_t n = n_resid;
    auto to_heads = [&](const Tensor& t, int64_t heads, const std::string& what) {
      const int64_t hpu = heads / u;
      Tensor send(s.dtype, {static_cast<int64_t>(u) * n, hpu, d}), recv(s.dtype, {T, hpu, d});
      for (int j = 0; j < u; ++j)
        for (int64_t i = 0; i < n; ++i)
          std::memcpy(static_cast<unsigned char*>(send.data()) + ((j * n + i) * hpu) * d * es,
                      static_cast<const unsigned char*>(t.data()) + ((i * heads) + j * hpu) * d * es,
                      static_cast<size_t>(hpu * d) * es);
      const auto r = collectives::all_to_all(world_tp, send.data(), recv.data(), static_cast<size_t>(send.numel()),
                                             s.dtype, chip.t, ring_opts("ulysses all_to_all (" + what + ")", "direct"));
      chip.t = r.span.end;
      comm.add("ulysses all_to_all", coll_bytes(r), (u - 1.0) / u * static_cast<double>(t.nbytes()));
      return recv;
    };
    Tensor qh = to_heads(q, s.heads, "q"), kh = to_heads(k, s.kv_heads, "k"), vh = to_heads(v, s.kv_heads, "v");
    std::vector<Chunk> all{{0, 0, T}};
    std::vector<Tensor> acc, lse;
    init_acc(all, s.heads / u, d, acc, lse);
    attend(chip, s, qh, all, kh, vh, all, acc, lse, "attention (ulysses heads)");
    Tensor oh = finish_acc(all, acc, s.dtype, T);  // [T, H/u, d]: block j = rows of rank j
    Tensor back(s.dtype, {static_cast<int64_t>(u) * n, s.heads / u, d});
    const auto r = collectives::all_to_all(world_tp, oh.data(), back.data(), static_cast<size_t>(oh.numel()), s.dtype,
                                           chip.t, ring_opts("ulysses all_to_all (o)", "direct"));
    chip.t = r.span.end;
    comm.add("ulysses all_to_all", coll_bytes(r), (u - 1.0) / u * static_cast<double>(oh.nbytes()));
    o = Tensor(s.dtype, {n, s.heads * d});
    const int64_t hpu = s.heads / u;
    for (int j = 0; j < u; ++j)
      for (int64_t i = 0; i < n; ++i)
        std::memcpy(static_cast<unsigned char*>(o.data()) + (i * s.heads + j * hpu) * d * es,
                    static_cast<const unsigned char*>(back.data()) + ((j * n + i) * hpu) * d * es,
                    static_cast<size_t>(hpu * d) * es);
  } else {
    std::vector<Tensor> acc, lse;
    init_acc(attn_chunks, w.nq, d, acc, lse);
    // Local chunk layout of q/k/v follows attn_chunks (a's rows are attn_rows).
    if (p.cp == 1) {
      attend(chip, s, q, attn_chunks, k, v, attn_chunks, acc, lse, "attention");
    } else {
      // Ring attention: the K/V block (with the chunk positions of its owner) goes around the cp ring.
      const int P = p.cp;
      const int next = (c_idx + 1) % P, prev = (c_idx + P - 1) % P;
      Tensor kcur = k, vcur = v;
      std::vector<Chunk> kchunks = attn_chunks;
      sim::TimeNs kv_ready = chip.t;
      const sim::TimeNs q_ready = chip.t;
      const size_t kvb = k.nbytes();
      auto ring_mem = memory.scoped("ring K/V receive buffers", mem_plan.ring);
      for (int step = 0; step < P; ++step) {
        const int owner = (c_idx - step + P) % P;  // whose chunks we hold now
        std::vector<Chunk> owner_chunks;
        if (p.zigzag) {
          const int64_t n = T / (2 * P);
          owner_chunks = {{0, owner * n, n}, {n, (2 * P - 1 - owner) * n, n}};
        } else {
          owner_chunks = {{0, owner * (T / P), T / P}};
        }
        Tensor knext, vnext;
        sim::TimeNs next_ready = kv_ready;
        if (step + 1 < P) {  // post the exchange first: it overlaps the compute below in simulated time
          knext = Tensor(s.dtype, k.shape());
          vnext = Tensor(s.dtype, v.shape());
          std::vector<unsigned char> sbuf(2 * kvb), rbuf(2 * kvb);
          std::memcpy(sbuf.data(), kcur.data(), kvb);
          std::memcpy(sbuf.data() + kvb, vcur.data(), kvb);
          const double before = cp_group.bytes_sent();
          next_ready = cp_group.sendrecv(sbuf.data(), sbuf.size(), next, rbuf.data(), rbuf.size(), prev, kv_ready,
                                         "cp ring K/V step" + std::to_string(step));
          tl.record_region("cp ring K/V step" + std::to_string(step), "collective", {kv_ready, next_ready},
                           static_cast<double>(sbuf.size()));
          comm.add("cp ring K/V", cp_group.bytes_sent() - before, static_cast<double>(sbuf.size()));
          std::memcpy(knext.data(), rbuf.data(), kvb);
          std::memcpy(vnext.data(), rbuf.data() + kvb, kvb);
        }
        chip.t = std::max(chip.t, std::max(q_ready, kv_ready));
        attend(chip, s, q, attn_chunks, kcur, vcur, owner_chunks, acc, lse,
               "ring attention (block of chip " + std::to_string(owner) + ")");
        if (step + 1 < P) {
          kcur = std::move(knext);
          vcur = std::move(vnext);
          kv_ready = next_ready;
        }
      }
    }
    o = finish_acc(attn_chunks, acc, s.dtype, n_attn).reshaped({n_attn, w.nq * d});
  }
  // A row-parallel GEMM and its tp reduction: fused (gemm_all_reduce / gemm_reduce_scatter) or one after the other.
  auto row_parallel_fused = [&](const Tensor& in, const Tensor& wt, const std::string& gname,
                                const std::string& what) -> Tensor {
    const sim::TimeNs ready = chip.t;
    if (p.sp) {
      Tensor out(s.dtype, {n_resid, s.hidden});
      const auto f = gemm_reduce_scatter(tp_group, in, wt, out, ready, gname + " + sp reduce_scatter (" + what + ")");
      fused_done(gname + " + sp reduce_scatter", f, ready);
      comm.add("sp reduce_scatter", f.bytes_sent, (P_tp - 1) / P_tp * static_cast<double>(in.dim(0) * s.hidden) * es);
      return out;
    }
    Tensor out(s.dtype, {in.dim(0), s.hidden});
    const auto f = gemm_all_reduce(tp_group, in, wt, out, p.fused.chunks, ready,
                                   gname + " + tp all_reduce (" + what + ")");
    fused_done(gname + " + tp all_reduce", f, ready);
    comm.add("tp all_reduce", f.bytes_sent, 2 * (P_tp - 1) / P_tp * static_cast<double>(out.nbytes()));
    return out;
  };
  auto reduce_tp = [&](Tensor& partial, const std::string& what) -> Tensor {
    if (p.tp == 1) return partial;
    if (p.sp) {
      Tensor out(s.dtype, {n_resid, s.hidden});
      const auto r = collectives::reduce_scatter(tp_group, partial.data(), out.data(), static_cast<size_t>(partial.numel()),
                                                 s.dtype, collectives::ReduceOp::sum, chip.t,
                                                 ring_opts("sp reduce_scatter (" + what + ")"));
      chip.t = r.span.end;
      comm.add("sp reduce_scatter", coll_bytes(r), (P_tp - 1) / P_tp * static_cast<double>(partial.nbytes()));
      return out;
    }
    const auto r = collectives::all_reduce(tp_group, partial.data(), partial.data(), static_cast<size_t>(partial.numel()),
                                           s.dtype, collectives::ReduceOp::sum, chip.t,
                                           ring_opts("tp all_reduce (" + what + ")"));
    chip.t = r.span.end;
    comm.add("tp all_reduce", coll_bytes(r), 2 * (P_tp - 1) / P_tp * static_cast<double>(partial.nbytes()));
    return partial;
  };
  Tensor x1;
  if (fused) {
    x1 = row_parallel_fused(o, w.wo, "gemm.o", "attention output");
  } else {
    Tensor y = gemm(chip, o, w.wo, "gemm.o (row-parallel)");
    x1 = reduce_tp(y, "attention output");
  }
  chip.charge(kernels::add_inplace(x1, x), "residual");
  act_mem.release();

  // ---- MLP sublayer ----
  Tensor b_loc = rmsnorm(chip, x1, w.norm2, "rmsnorm.mlp");
  Tensor b = b_loc;
  if (p.sp && !fused) {
    b = Tensor(s.dtype, {n_attn, s.hidden});
    const auto r = collectives::all_gather(tp_group, b_loc.data(), b.data(), static_cast<size_t>(b.numel()), s.dtype,
                                           chip.t, ring_opts("sp all_gather (before MLP)"));
    chip.t = r.span.end;
    comm.add("sp all_gather", coll_bytes(r), (P_tp - 1) / P_tp * static_cast<double>(b.nbytes()));
  }
  const int64_t mlp_rows = p.sp ? n_attn : b.dim(0);
  plan_mismatch("mlp", mem_plan.mlp, static_cast<uint64_t>(mlp_rows * 2 * w.nf) * es);
  auto mlp_mem = memory.scoped("activations mlp", mem_plan.mlp);
  Tensor out;
  if (fused) {
    Tensor g, u;
    if (p.sp) {  // one ring all_gather feeds gate and up
      g = Tensor(s.dtype, {n_attn, w.nf});
      u = Tensor(s.dtype, {n_attn, w.nf});
      const sim::TimeNs ready = chip.t;
      const auto f = all_gather_gemm(tp_group, b_loc, {&w.wg, &w.wu}, {&g, &u}, ready, "sp all_gather + gemm.gate/up");
      fused_done("sp all_gather + gemm.gate/up", f, ready);
      comm.add("sp all_gather", f.bytes_sent, (P_tp - 1) / P_tp * static_cast<double>(n_attn * s.hidden) * es);
    } else {
      g = gemm(chip, b, w.wg, "gemm.gate (column-parallel)");
      u = gemm(chip, b, w.wu, "gemm.up (column-parallel)");
    }
    chip.charge(kernels::glu_inplace(g, u, kernels::Activation::silu), "swiglu");
    out = row_parallel_fused(g, w.wd, "gemm.down", "MLP output");
  } else {
    Tensor z = mlp(chip, b, w);
    out = reduce_tp(z, "MLP output");
  }
  chip.charge(kernels::add_inplace(out, x1), "residual");
  mlp_mem.release();
  world.sleepy_barrier();

  BlockReport rep;
  rep.name = cfg.name;
  rep.model = cfg.model;
  rep.file = cfg.file;
  rep.topology = cfg.topology.describe();
  rep.device = cfg.device.name;
  rep.plan = p.describe();
  rep.chips = chips;

  // ---- validation: gather the distinct residual rows on rank 0 ----
  const bool owner = p.sp || p.ulysses > 1 || t_idx == 0;
  std::vector<float> mine;
  std::vector<double> mine_rows;
  if (owner) {
    mine = out.to_float();
    mine_rows.assign(resid_rows.begin(), resid_rows.end());
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
                               static_cast<double>(memory.peak())};
  for (const auto& key : kCommKeys) {
    const auto it = comm.stats.find(key);
    stats.push_back(it == comm.stats.end() ? 0 : it->second.bytes);
    stats.push_back(it == comm.stats.end() ? 0 : it->second.expected);
    stats.push_back(it == comm.stats.end() ? 0 : it->second.calls);
  }
  const size_t n_plain = stats.size();
  for (double f : pack(fused_ops)) stats.push_back(f);
  const size_t nf = stats.size();
  std::vector<double> all_stats(rank == 0 ? nf * static_cast<size_t>(chips) : 0);
  runtime::check_mpi(MPI_Gather(stats.data(), static_cast<int>(nf), MPI_DOUBLE, all_stats.data(), static_cast<int>(nf),
                                MPI_DOUBLE, 0, world.comm()), rank, "block report");
  if (!trace_path.empty()) write_trace(world, tl, trace_path);

  if (rank == 0) {
    for (int r = 0; r < chips; ++r) {
      const double* v = &all_stats[nf * static_cast<size_t>(r)];
      rep.per_chip_total_ns.push_back(v[0]);
      rep.per_chip_peak_bytes.push_back(v[5]);
      if (r == 0 || v[0] > rep.sim_total_ns) {
        rep.sim_total_ns = v[0];
        rep.critical_chip = cfg.topology.placement()[static_cast<size_t>(r)];
        rep.compute_ns = v[1];
        rep.communication_ns = v[2];
        rep.exposed_ns = v[3];
        rep.attention_ns = v[4];
        rep.comm.clear();
        for (size_t k2 = 0; k2 < kCommKeys.size(); ++k2)
          if (v[8 + 3 * k2] > 0) rep.comm[kCommKeys[k2]] = CommStat{v[6 + 3 * k2], v[7 + 3 * k2], static_cast<int>(v[8 + 3 * k2])};
        rep.fused = unpack(v + n_plain, fused_ops);
      }
    }
    if (cfg.validate) {
      rep.validated = true;
      rep.tolerance = cfg.tolerance;
      const Weights full = make_weights(s, 1, 0);
      std::vector<int64_t> rows(static_cast<size_t>(T));
      for (int64_t i = 0; i < T; ++i) rows[static_cast<size_t>(i)] = i;
      sim::Timeline ref_tl(chip_id, cfg.topology, cfg.device);
      Chip ref{&ref_tl, 0.0, 0.0};
      const Tensor want = block_single(ref, s, init_x(s, rows), full);
      rep.single_device_ns = ref_tl.end_time();
      const auto wf = want.to_float();
      std::vector<int> seen(static_cast<size_t>(T), 0);
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
    }
  }
  rep.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  return rep;
}

// ------------------------------------------------------------------------------------------------ report

namespace {
std::string us(double ns) {
  char b[64];
  std::snprintf(b, sizeof b, "%.3f us", ns / 1e3);
  return b;
}
}  // namespace

std::string to_text(const BlockReport& r) {
  std::ostringstream os;
  char b[256];
  os << "shardsim run: " << r.name << (r.model.empty() ? "" : " (" + r.model + ")") << "  (" << r.file << ")\n";
  os << "  topology   " << r.topology << "\n  device     " << r.device << "\n  plan       " << r.plan << "\n";
  os << "simulated (modelled hardware; critical chip " << r.critical_chip << ")\n";
  os << "  total              " << us(r.sim_total_ns) << "\n";
  auto pct = [&](double v) {
    std::snprintf(b, sizeof b, "%5.1f%%", r.sim_total_ns > 0 ? 100.0 * v / r.sim_total_ns : 0.0);
    return std::string(b);
  };
  os << "  compute            " << us(r.compute_ns) << "  " << pct(r.compute_ns) << "   (attention "
     << us(r.attention_ns) << ")\n";
  os << "  communication      " << us(r.communication_ns) << "  " << pct(r.communication_ns) << "\n";
  os << "  exposed comm       " << us(r.exposed_ns) << "  " << pct(r.exposed_ns) << "\n";
  double lo = r.per_chip_total_ns.empty() ? 0 : r.per_chip_total_ns[0], hi = lo;
  for (double t : r.per_chip_total_ns) {
    lo = std::min(lo, t);
    hi = std::max(hi, t);
  }
  os << "  chip totals        " << us(lo) << " .. " << us(hi) << " (load balance " << (hi > 0 ? lo / hi : 1.0) << ")\n";
  double peak = 0;
  for (double v : r.per_chip_peak_bytes) peak = std::max(peak, v);
  std::snprintf(b, sizeof b, "  peak memory        %.3f GiB (largest chip)\n", peak / 1073741824.0);
  os << b;
  os << "communication per chip (bytes sent; formula in sharding/transformer.h)\n";
  for (const auto& [k, c] : r.comm)
    os << "  " << k << std::string(20 - std::min<size_t>(19, k.size()), ' ') << format_mib(c.bytes) << " in " << c.calls
       << " call(s), formula " << format_mib(c.expected) << "\n";
  if (r.single_device_ns > 0)
    os << "  single device      " << us(r.single_device_ns) << "  -> speedup "
       << (r.sim_total_ns > 0 ? r.single_device_ns / r.sim_total_ns : 0) << "x on " << r.chips << " chips\n";
  os << fused_text(r.fused, r.sim_total_ns);
  std::snprintf(b, sizeof b, "wall (this host)\n  total %.3f s\n", r.wall_s);
  os << b;
  if (r.validated) {
    std::snprintf(b, sizeof b, "validation %s  max|out-ref| = %.3g, max|ref| = %.3g, relative %.3g (tolerance %.3g)\n",
                  r.passed ? "PASS" : "FAIL", r.max_abs_error, r.max_abs_reference,
                  r.max_abs_reference > 0 ? r.max_abs_error / r.max_abs_reference : r.max_abs_error, r.tolerance);
    os << b;
  }
  os << (r.passed ? "PASS" : "FAIL") << "\n";
  return os.str();
}

std::string to_json_text(const BlockReport& r) {
  nlohmann::json comm = nlohmann::json::object();
  for (const auto& [k, c] : r.comm) comm[k] = {{"bytes_per_chip", c.bytes}, {"formula_bytes", c.expected}, {"calls", c.calls}};
  nlohmann::json j = {{"name", r.name},
                      {"model", r.model},
                      {"plan", r.plan},
                      {"chips", r.chips},
                      {"topology", r.topology},
                      {"simulated",
                       {{"total_ns", r.sim_total_ns},
                        {"critical_chip", r.critical_chip},
                        {"compute_ns", r.compute_ns},
                        {"communication_ns", r.communication_ns},
                        {"exposed_comm_ns", r.exposed_ns},
                        {"attention_ns", r.attention_ns},
                        {"per_chip_total_ns", r.per_chip_total_ns},
                        {"per_chip_peak_memory_bytes", r.per_chip_peak_bytes},
                        {"single_device_ns", r.single_device_ns}}},
                      {"communication", comm},
                      {"validation",
                       {{"enabled", r.validated},
                        {"passed", r.passed},
                        {"max_abs_error", r.max_abs_error},
                        {"max_abs_reference", r.max_abs_reference},
                        {"tolerance", r.tolerance}}},
                      {"verdict", r.passed ? "PASS" : "FAIL"},
                      {"wall_s", r.wall_s}};
  if (!r.fused.empty()) j["simulated"]["fused"] = fused_json(r.fused, r.sim_total_ns);
  return j.dump(2) + "\n";
}

}  // namespace shardsim::sharding

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
#include "runtime/host_memory.h"
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
  const double have = runtime::mem_available_bytes();  // 0: unknown, not checked
  const double need = block_host_bytes(c);
  if (have <= 0 || need <= have) return;
  char b[256];
  std::snprintf(b, sizeof b, "needs about %.2f GiB of host memory (the %d ranks' shards%s) but this host has "
                "%.2f GiB available", need / 1073741824.0, c.plan.tp * c.plan.cp * c.plan.ulysses * c.plan.dp,
                c.validate ? " and the single-device reference on rank 0" : "", have / 1073741824.0);
  throw RuntimeFault(c.file + ": " + b + "; lower workload.seq/hidden/ffn" +
                     (c.validate ? std::string(" or set validate.enabled: false") : std::string()));
}

// ------------------------------------------------------------------------------------------------ config

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
  c.mesh = mesh_from_config(root, p, c.topology);
  // Simulated HBM of every chip, before anything is allocated (the same replay run_block makes).
  for (int r = 0; r < chips && r < p.tp * p.cp * p.ulysses * p.dp; ++r) {
    sim::Memory m(c.topology.placement().at(static_cast<size_t>(r)), c.device.usable_hbm_bytes());
    try {
      replay(m, block_memory(s, p, c.mesh.coordinate("tp", r)));
    } catch (const sim::OutOfMemory& e) {
      root.child("workload").fail(root.child("workload").path() + ": " + e.what() + hbm_capacity_note(c.device));
    }
  }
  return c;
}

}  // namespace shardsim::sharding

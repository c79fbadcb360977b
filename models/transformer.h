// A Llama-style transformer block, single-device and sharded, validated against one device.
//
//   x1  = x  + Wo · attention(rope(Wq·rmsnorm(x)), rope(Wk·rmsnorm(x)), Wv·rmsnorm(x))     (pre-norm)
//   out = x1 + Wd · (silu(Wg·rmsnorm(x1)) ⊙ Wu·rmsnorm(x1))                                (SwiGLU MLP)
// Shapes: x, out [seq, hidden]; heads Hq of head_dim d = hidden / Hq; Hkv KV heads (grouped-query attention when
// Hkv < Hq); ffn columns in the MLP. Batch 1. Causal self-attention by default; RoPE optional.
//
// Parallel plans (Megatron-LM terms; Shoeybi et al. 2019, Korthikanti et al. 2022 for sequence parallelism):
//   tp       tensor parallel: Wq/Wk/Wv column-parallel by heads (q heads [t·Hq/tp, ...); KV heads split when
//            tp <= Hkv, else each chip holds the one KV head its q heads use: replicated), Wo row-parallel + an
//            all_reduce; the MLP column-/row-parallel + an all_reduce. Needs Hq % tp == 0 and (Hkv % tp == 0 or
//            tp % Hkv == 0): an uneven head split is rejected (exit 2), not approximated.
//   sp       with tp: norms and residuals on a sequence shard (seq/tp rows); all_gather before each
//            column-parallel GEMM, reduce_scatter after each row-parallel GEMM (instead of the all_reduce).
//   cp       context parallel / ring attention (Liu et al., "Ring Attention with Blockwise Transformers", 2023):
//            the sequence is split over cp chips, K/V blocks travel around the cp ring (cp-1 steps) while each
//            chip computes its queries against the block it holds; partials merge by log-sum-exp. The send of
//            the next block is issued before the compute on the current one, so they overlap in the simulated
//            timeline. cp_split zigzag (default; chip c holds chunks c and 2cp-1-c of 2cp, the causal load
//            balance of Megatron-LM's context parallelism) or contiguous (chip c holds chunk c).
//   ulysses  DeepSpeed-Ulysses (Jacobs et al. 2023): sequence-sharded activations, all_to_all to head-sharded
//            q/k/v before attention and back after; needs Hq and Hkv divisible by the ulysses size.
//   fused    with tp (parallel.fused: true; sharding/fused.h): each tp collective runs fused with the GEMM it
//            feeds or follows. Without sp: Wo and W_down + all_reduce as gemm_all_reduce (parallel.chunks pieces,
//            auto by default). With sp: all_gather + Wq/Wk/Wv and all_gather + W_gate/W_up as all_gather_gemm (one
//            gather feeds all the weights), Wo and W_down + reduce_scatter as gemm_reduce_scatter. The report gives
//            T_compute, T_comm, T_fused, the unfused time, overlap efficiency and speedup per op.
//   Combinations on the device mesh (sharding/device_mesh.h; ulysses and cp both shard the sequence, so both use
//   the mesh's cp axis): tp x cp, tp+sp x cp, tp x ulysses (heads split by tp first, then each tp shard's heads
//   by the ulysses all_to_all: needs (Hq/tp) and (Hkv/tp) divisible by ulysses). Mesh rank r has tp = r % tp
//   (tp innermost, Megatron's order); the mesh's placement on the topology decides which chips each group spans
//   (on a torus [2, 4], tp=2 x cp=4 puts tp on the size-2 dimension and each cp ring on a ring of the torus).
//   dp       data parallel (the mesh's dp axis, outside tp and cp): dp replicas of the tp x cp (or ulysses) plan,
//            replica d runs the block on sequence d of a batch of dp sequences (x rows d·seq .. of the seeded
//            [dp·seq, hidden] input), with the same weights; a forward has no dp communication. Validated against
//            one device running the dp sequences one after the other (its time is single_device_ns).
//   sp only with tp and not with ulysses; ulysses not with cp. tp·cp·ulysses·dp = chips. parallel.mesh_dims: [d0, ...]
//   chooses the topology dimensions the mesh fills, innermost axis first (device_mesh.h).
//   The plan units live in sharding/plans/ (tensor_parallel, sequence_parallel, context_parallel, ulysses).
// Communication per chip (bytes sent, M = seq·hidden·elem; ring algorithms):
//   tp all_reduce 2(P-1)/P·M per all_reduce (two per block); sp all_gather and reduce_scatter (P-1)/P·M each
//   (two of each); cp ring 2(P-1)/P·seq·Hkv·d·elem (K and V); ulysses all_to_all (P-1)/P of each local q, k, v,
//   o (4 all_to_alls). Reported next to these formulas.
// Errors: ConfigError (exit 2) naming the field for shapes or plans that do not fit.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/config.h"
#include "kernels/elementwise.h"
#include "runtime/tensor.h"
#include "runtime/world.h"
#include "models/trace_filter.h"
#include "sharding/device_mesh.h"
#include "models/report.h"
#include "sharding/model_spec.h"
#include "sharding/fused.h"
#include "sim/device_spec.h"
#include "topology/topology.h"

namespace shardsim::sharding {

// The block's model and plan are the one description of sharding/model_spec.h (ModelSpec with vocab 0 and, for the
// MLP workload, attention false: the MLP's parser, models/workload.h, fills it with heads = kv_heads = 0 and seq =
// workload.tokens; its weights and input are then seeded as models/mlp.h says, its checkpoints also hold
// activations/input and activations/output). model.layers: L blocks in sequence, each with its own seeded weights,
// run by the same code one after the other; the report's totals are the L layers' sum. The plan's tp all_reduce
// runs plan.algorithm_for(PlanCollective::tp_all_reduce), the sp and Ulysses collectives their own kinds' choice.


struct BlockConfig {
  std::string file, name, model;
  std::string text;  // the YAML as run (stored in checkpoints)
  topology::Topology topology;
  sim::DeviceSpec device;
  ModelSpec shape;    // vocab 0 (no embedding or head); attention false for the MLP workload
  ParallelPlan plan;
  DeviceMesh mesh;  // tp x cp (ulysses on the cp axis), placed on the topology (its placement() is the mesh's)
  bool validate = true;
  double tolerance = 0;  // max|out - ref| / max|ref|; default 1e-4 fp32, 3e-2 bf16
  // mode: shape_only (or run --shape-only): storage-less tensors, cost-only kernels, header-only collectives; the
  // same schedule and simulated figures as real data, no validation (docs/ARCHITECTURE.md, "Shape-only mode").
  bool shape_only = false;
};

// ---- Simulated HBM of one chip (sim::Memory), the allocations run_block makes, in bytes ----
// resident: weights (this chip's shards of Wq/Wk/Wv/Wo/W_gate/W_up/W_down and both norm vectors, times
// workload.layers) and x (its residual rows); attention phase: q/k/v activations + (cp > 1) the ring's two receive buffers for K and V;
// MLP phase (after q/k/v are freed): the gate and up activations. peak = weights + x + out + max(qkv + ring, mlp).
// Without attention (the MLP workload; models/mlp.h's accounting, the same bytes): weights W_gate/W_up/W_down, x,
// out = y [tokens, hidden] held through the layer, mlp = gate and up, ring = one all_reduce ring chunk of y
// (tp > 1), qkv = 0.
struct BlockMemory {
  uint64_t weights = 0, x = 0, qkv = 0, ring = 0, mlp = 0, out = 0;
  uint64_t peak() const { return weights + x + out + std::max(qkv + ring, mlp); }
};
// For tensor-parallel index T of PLAN (chips of one t differ only by their cp shard, which is the same size).
BlockMemory block_memory(const ModelSpec& s, const ParallelPlan& p, int t);

// The root keys of a block config (docs/CONFIG.md; tests/unit/config_doc_test.cpp checks); model: and parallel:
// take sharding/model_spec.h's kModelKeys and parallel_keys() (the one parser), validate: engine_config.h's
// kValidateKeys.
inline constexpr std::string_view kBlockRootKeys[] = {"name",     "topology", "device", "workload",
                                                      "parallel", "validate", "mode"};
bool is_block_config(const ConfigNode& root);  // workload.kind == transformer_block
// Also checks that every chip's block_memory fits the device's HBM: "FILE:LINE: workload: simulated out of
// memory on chip N: needs X GiB, has Y GiB (allocating ...)" (ConfigError, exit 2) before anything runs.
// ROOT as load_workload_config (sharding/engine_config.h) returns it: topology and device inline or by name.
BlockConfig parse_block_config(const ConfigNode& root, const std::string& file);

// Host memory the run needs: every rank's block_memory peak plus, with validation, the single-device reference on
// rank 0 (bytes; an estimate: host temporaries come on top). check_host_memory throws RuntimeFault (exit 3)
// naming the config file when it exceeds MemAvailable (/proc/meminfo) of this host, instead of letting the OS kill
// ranks.
double block_host_bytes(const BlockConfig& c);
void check_host_memory(const BlockConfig& c);

// Checkpoints of a block (checkpoint/checkpoint.h format): the nine weights with their GLOBAL shapes, each rank
// writing its shard (placements: Wq/Wk/Wv/W_gate/W_up Shard(1) over tp, Wo/W_down Shard(0) over tp, norms
// Replicate; replicas over cp and repeated KV heads are written once), root attributes workload, heads, kv_heads,
// seed, plan, mesh, config. Any plan reads any plan's checkpoint (resharding by reading each shard's block).
//   weights/norm1 [hidden], weights/wq [hidden, heads·d], weights/wk, wv [hidden, kv_heads·d],
//   weights/wo [heads·d, hidden], weights/norm2 [hidden], weights/w_gate, w_up [hidden, ffn], weights/w_down [ffn, hidden]
struct BlockRunOptions {
  std::string trace_path;
  TraceOptions trace;           // the trace's filters and size limit (models/trace_filter.h)
  bool profile = false;         // RunReport::profile: the critical path across chips (models/profile.h)
  std::string plots_dir;        // roofline and utilisation plots (models/profile_plots.h; "" none)
  std::string checkpoint_path;  // write the weights here after the run ("" none)
  std::string resume_from;      // read the weights from this checkpoint instead of the seed ("" none); the
                                // single-device reference then uses the checkpoint's weights too
  bool shape_only = false;      // run --shape-only (BlockConfig::shape_only, whatever the config's mode: says)
};

// Runs the block on WORLD (collective); the report is complete on rank 0. A checkpoint that does not fit the
// config (shapes, dtype, heads) is a ConfigError on every rank (exit 2).
// The report is models/report.h's RunReport (one report type for every model).
RunReport run_block(const runtime::World& world, const BlockConfig& config, const BlockRunOptions& options);
RunReport run_block(const runtime::World& world, const BlockConfig& config, const std::string& trace_path);

}  // namespace shardsim::sharding

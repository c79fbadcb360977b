// Pieces every parallel plan of the transformer block shares (sharding/plans/*.h): the chip's compute clock, the
// per-collective byte counts, token chunks, and PlanContext, what one chip's plan units see while the block runs
// (forward and backward). Internal to sharding/ (no stable API).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "collectives/collectives.h"
#include "kernels/attention.h"
#include "runtime/tensor.h"
#include "runtime/transport.h"
#include "sharding/fused.h"
#include "sharding/model_spec.h"
#include "sim/memory.h"
#include "sim/timeline.h"

namespace shardsim::sharding {
// One collective's figures on the critical chip (bytes sent by this chip; the plan's formula for them).
struct CommStat {
  double bytes = 0;     // bytes this chip sent
  double expected = 0;  // the formula's bytes per chip
  int calls = 0;
  double ns = 0;          // simulated time of the calls (the unfused collective alone for fused ops)
  std::string algorithm;  // what ran ("auto" resolved), when recorded
};

}  // namespace shardsim::sharding

namespace shardsim::sharding::plans {

using runtime::DType;
using runtime::Tensor;

// Charges kernels to a chip's compute engine, in order.
struct Chip {
  sim::Timeline* tl = nullptr;
  sim::TimeNs t = 0;
  double attention_ns = 0;
  void charge(const kernels::KernelCost& c, const std::string& name, bool attention = false) {
    if (!tl) return;
    const auto span = tl->compute(name, c.flops, c.bytes, runtime::precision_of(c.dtype), t, c.shape);
    t = span.end;
    if (attention) attention_ns += span.duration();
  }
};

// A run of consecutive tokens a chip holds: local rows [local, local+len) are global positions [global, ...).
struct Chunk {
  int64_t local = 0, global = 0, len = 0;
};

struct Comm {
  std::map<std::string, CommStat> stats;
  void add(const std::string& key, double bytes, double expected) {
    auto& s = stats[key];
    s.bytes += bytes;
    s.expected += expected;
    ++s.calls;
  }
  // ADD, plus the calls' simulated time and the algorithm that ran.
  void add(const std::string& key, double bytes, double expected, double ns, const std::string& algorithm) {
    add(key, bytes, expected);
    stats[key].ns += ns;
    stats[key].algorithm = algorithm;
  }
};


Tensor gemm(Chip& chip, const Tensor& a, const Tensor& b, const std::string& name);
// The GEMMs X·W_i of the weights that read one input (q/k/v; SwiGLU's gate and up), computed one by one (values as
// gemm's), charged to CHIP: as ONE GEMM over the concatenated columns, named FUSED_NAME, when the chip's device
// issues fused kernels (device.kernel_fusion: fused; Megatron-LM's linear_qkv and linear_fc1 of 2 x ffn columns,
// Transformer Engine's LayerNormLinear / LayerNormMLP, NxD's qkv_proj and gate_up_proj: one weight matrix, one
// GEMM), else each as its own GEMM named NAMES[i] (PyTorch eager modules with separate wq/wk/wv and w1/w3, as
// torchtitan's Llama). One weight, or no timeline: the plain GEMMs.
std::vector<Tensor> column_gemms(Chip& chip, const Tensor& x, const std::vector<const Tensor*>& weights,
                                 const std::vector<std::string>& names, const std::string& fused_name);
// The backward of column_gemms: DX = sum_i dY_i·W_i^T (X's shape, X's dtype) and, for each non-null DWS[i],
// DWS[i] = X^T·dY_i. Charged as column_gemms decides: one gemm_backward over the concatenated columns (the sum is
// the fused GEMM's contraction), or one per weight plus the adds of the partial dX.
Tensor column_gemms_backward(Chip& chip, const Tensor& x, const std::vector<const Tensor*>& weights,
                             const std::vector<const Tensor*>& dys, const std::vector<Tensor*>& dws,
                             const std::string& fused_name);
// Whether CHIP charges several column GEMMs as one (column_gemms): a timeline whose device issues fused kernels.
bool fuses_column_gemms(const Chip& chip);
Tensor rmsnorm(Chip& chip, const Tensor& x, const Tensor& w, const std::string& name, double eps = 1e-5);
std::vector<int64_t> positions_of(const std::vector<Chunk>& chunks);
collectives::CollectiveOptions ring_opts(const std::string& name, const std::string& algorithm = "ring");

struct KvAttention;  // sharding/plans/kv_attention.h

// What the plan units of one chip share during the block forward.
struct PlanContext {
  const ModelSpec& s;
  const ParallelPlan& p;
  runtime::Transport& tp;   // the mesh's tp sub-group
  runtime::Transport& cp;   // the mesh's cp sub-group (ring attention or the ulysses all_to_all)
  Chip& chip;
  Comm& comm;
  std::vector<FusedOp>& fused_ops;
  int64_t n_attn = 0;   // rows this chip's attention covers (q rows; the gathered rows with sp)
  int64_t n_resid = 0;  // rows of the residual stream this chip holds
  // Serving mode (sharding/plans/kv_attention.h): the block's attention appends to and reads this KV cache.
  const KvAttention* kv = nullptr;
  // A fused op took F from READY on: the chip continues after it.
  void fused_done(const std::string& op, const FusedTiming& f, sim::TimeNs ready) {
    chip.t = ready + f.fused_ns;
    fused_ops.push_back({op, f});
  }
};

}  // namespace shardsim::sharding::plans

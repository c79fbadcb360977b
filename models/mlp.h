// The gated MLP of Llama-style transformers and its Megatron-LM tensor-parallel sharding.
//
//   y = ( act(x · W_gate) ⊙ (x · W_up) ) · W_down          (SwiGLU for act = silu; GeGLU for gelu)
//   x [tokens, hidden], W_gate and W_up [hidden, ffn], W_down [ffn, hidden], y [tokens, hidden]
//
// Tensor parallelism over T chips (Shoeybi et al., "Megatron-LM", 2019, section 3): W_gate and W_up are
// column-parallel (chip t holds columns ffn_t of both, Shard(1)), W_down is row-parallel (rows ffn_t,
// Shard(0)); x is replicated. Each chip computes its slice of the FFN activation with no communication,
// multiplies by its W_down rows to a partial y, and one all_reduce(sum) of [tokens, hidden] makes y on
// every chip. ffn need not divide by T: the first ffn % T chips get one extra column (collectives::Partition).
//
// Tensor ids for the seeded initialisation (init.h): 1 input, 2 W_gate, 3 W_up, 4 W_down.
// Init ranges: x ~ U(-1, 1); W_gate, W_up ~ U(±1/sqrt(hidden)); W_down ~ U(±1/sqrt(ffn)) (torch Linear's default).
#pragma once

#include <cstdint>
#include <string>

#include "collectives/types.h"
#include "kernels/elementwise.h"
#include "runtime/tensor.h"
#include "runtime/transport.h"
#include "models/transformer.h"
#include "sharding/fused.h"
#include "sim/memory.h"
#include "sim/timeline.h"

namespace shardsim::sharding {

struct MlpShape {
  int64_t tokens = 0;
  int64_t hidden = 0;
  int64_t ffn = 0;
  kernels::Activation activation = kernels::Activation::silu;
  runtime::DType dtype = runtime::DType::fp32;
  uint64_t seed = 0;
};

// Weights for columns [ffn_offset, ffn_offset + ffn_size) of the FFN dimension (all of it for the reference).
struct MlpWeights {
  int64_t ffn_offset = 0;
  int64_t ffn_size = 0;
  runtime::Tensor w_gate;  // [hidden, ffn_size]
  runtime::Tensor w_up;    // [hidden, ffn_size]
  runtime::Tensor w_down;  // [ffn_size, hidden]
};

// The MLP as a layer stack without attention (models/transformer.h's ModelSpec, attention false: tokens -> seq,
// heads 0) and back: the one runner (run_block) runs the MLP workload in this form.
ModelSpec mlp_block_shape(const MlpShape& s);
MlpShape mlp_shape_of(const ModelSpec& s);

// STORAGE false: shape-only tensors of the same shapes (runtime/tensor.h), for mode: shape_only.
runtime::Tensor make_mlp_input(const MlpShape& s, bool storage = true);
MlpWeights make_mlp_weights(const MlpShape& s, int64_t ffn_offset, int64_t ffn_size, bool storage = true);
// The FFN slice chip RANK of TP holds.
collectives::Partition ffn_partition(const MlpShape& s, int tp);

// What the forward did on this chip in simulated time.
struct MlpTiming {
  sim::TimeNs end = 0;
  sim::TimeNs all_reduce_ns = 0;
  double all_reduce_bytes_sent = 0;
  std::string all_reduce_algorithm;  // what ran ("auto" resolved)
  double flops = 0;
  bool fused_used = false;  // the down projection ran fused with the all_reduce
  FusedTiming fused;        // its T_compute, T_comm, T_fused, unfused (sharding/fused.h)
};

// ---- Simulated device memory (HBM), counted in a sim::Memory per chip ----
// Every tensor a chip holds is allocated in its sim::Memory under a fixed name (bytes = elements x dtype size;
// ffn_r = this chip's FFN columns):
//   resident, for the whole run (allocate_mlp_resident):
//     "x [tokens, hidden]", "w_gate [hidden, ffn_r]", "w_up [hidden, ffn_r]", "w_down [ffn_r, hidden]"
//   during the local forward (the lifetimes of the host tensors in mlp.cpp):
//     "gate [tokens, ffn_r]", "up [tokens, ffn_r]" (freed when the local part ends), "y [tokens, hidden]" (the
//     output, held until the forward returns)
//   during the all_reduce, tp > 1 only:
//     "all_reduce ring buffer": one chunk of y, ceil(tokens x hidden / tp) elements (the receive buffer of one
//     ring step; the model charges this one chunk whatever the algorithm)
// So the peak is max over the two phases:
//     3 hidden ffn_r + 2 tokens hidden + max(2 tokens ffn_r, ceil(tokens hidden / tp))     (elements)
// which mlp_tp_peak_bytes gives in closed form; plan_mlp_tp_memory replays the same allocations without data.

struct MlpResident {
  sim::Memory::Scoped x, w_gate, w_up, w_down;
};
// Allocates this chip's resident tensors (FFN_SIZE columns) in MEMORY. Throws sim::OutOfMemory.
MlpResident allocate_mlp_resident(sim::Memory& memory, const MlpShape& s, int64_t ffn_size);

// The allocations of chip RANK of TP for one forward, replayed in a fresh sim::Memory of CAPACITY_BYTES without
// touching data (no host memory beyond the bookkeeping). Returns it with its peak; throws sim::OutOfMemory
// naming RANK at the first allocation that does not fit.
sim::Memory plan_mlp_tp_memory(const MlpShape& s, int tp, int rank, double capacity_bytes);

// Closed form of plan_mlp_tp_memory(...).peak() (bytes); TP = 1 is one device. Tests check the two agree.
double mlp_tp_peak_bytes(const MlpShape& s, int tp, int rank);

// Runs plan_mlp_tp_memory for chips 0..TP-1 and rethrows the first sim::OutOfMemory (a ConfigError):
// "simulated out of memory on chip N: needs X GiB, has Y GiB (allocating ...)". Every rank computes the same
// answer from the config alone, so the job fails on every rank with one message before any real allocation.
void check_mlp_fits(const MlpShape& s, int tp, double capacity_gib);

// Single-device forward. When TIMELINE is given, each kernel is charged to it (starting at 0). When MEMORY is
// given, the forward's own tensors (gate, up, y) are allocated in it as listed above (x and W are the caller's).
runtime::Tensor mlp_forward(const MlpShape& s, const runtime::Tensor& x, const MlpWeights& w,
                            sim::Timeline* timeline, MlpTiming* timing, sim::Memory* memory = nullptr);

// Tensor-parallel forward on this chip (FUSED.enabled: the down projection and the all_reduce run as one
// gemm_all_reduce of FUSED.chunks pieces, each piece's all_reduce with ALL_REDUCE_ALGORITHM; TIMING's
// all_reduce_ns is then the unfused all_reduce alone, T_comm): W holds this chip's shard; returns the full y (after all_reduce with
// ALL_REDUCE_ALGORITHM, see collectives/all_reduce.h). MEMORY as for mlp_forward, plus the ring buffer.
runtime::Tensor mlp_forward_tp(runtime::Transport& tp, const MlpShape& s, const runtime::Tensor& x,
                               const MlpWeights& w, sim::TimeNs ready, MlpTiming* timing,
                               const std::string& all_reduce_algorithm = "ring", sim::Memory* memory = nullptr,
                               const FusedPlan& fused = {});

}  // namespace shardsim::sharding

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

runtime::Tensor make_mlp_input(const MlpShape& s);
MlpWeights make_mlp_weights(const MlpShape& s, int64_t ffn_offset, int64_t ffn_size);
// The FFN slice chip RANK of TP holds.
collectives::Partition ffn_partition(const MlpShape& s, int tp);

// What the forward did on this chip in simulated time.
struct MlpTiming {
  sim::TimeNs end = 0;
  sim::TimeNs all_reduce_ns = 0;
  double all_reduce_bytes_sent = 0;
  std::string all_reduce_algorithm;  // what ran ("auto" resolved)
  double flops = 0;
};

// Simulated device memory (HBM) the tensor-parallel forward needs on chip RANK of TP, in bytes, at its peak
// (during the down projection): weight shards 3·hidden·ffn_r, input x and output y (tokens·hidden each),
// gate/up activations 2·tokens·ffn_r, and the ring's receive buffer of one chunk of y. TP = 1 is one device.
double mlp_tp_peak_bytes(const MlpShape& s, int tp, int rank);

// Throws ConfigError "simulated out of memory on chip N: needs X GiB, has Y GiB" for the first chip whose
// peak exceeds CAPACITY_GIB (every rank computes the same answer, so the job fails before any work).
void check_mlp_fits(const MlpShape& s, int tp, double capacity_gib);

// Single-device forward. When TIMELINE is given, each kernel is charged to it (starting at 0).
runtime::Tensor mlp_forward(const MlpShape& s, const runtime::Tensor& x, const MlpWeights& w,
                            sim::Timeline* timeline, MlpTiming* timing);

// Tensor-parallel forward on this chip: W holds this chip's shard; returns the full y (after all_reduce with
// ALL_REDUCE_ALGORITHM, see collectives/all_reduce.h).
runtime::Tensor mlp_forward_tp(runtime::Transport& tp, const MlpShape& s, const runtime::Tensor& x,
                               const MlpWeights& w, sim::TimeNs ready, MlpTiming* timing,
                               const std::string& all_reduce_algorithm = "ring");

}  // namespace shardsim::sharding

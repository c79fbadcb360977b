// The transformer block's weights and its single-device reference (models/transformer.h): the seeded values every
// plan and the reference share, this chip's shard of them, and the checkpoint slots they are written to. Internal
// to models/ (transformer.cpp, block_runner.cpp).
//
// Shapes: x [rows, hidden]; Wq [hidden, heads·d], Wk/Wv [hidden, kv_heads·d], Wo [heads·d, hidden], W_gate/W_up
// [hidden, ffn], W_down [ffn, hidden], norms [hidden] (tp shards: columns of Wq/Wk/Wv/W_gate/W_up, rows of
// Wo/W_down). dtype: the model's. Values: Philox uniform (models/init.h), U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for
// projections, U(0.9, 1.1) for norms, U(-1, 1) for x; layer l uses tensor ids + 16·l.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/tensor.h"
#include "sharding/model_spec.h"
#include "sharding/placement.h"
#include "sharding/plans/block.h"

namespace shardsim::sharding::block_detail {

using runtime::Tensor;

// The rows ROWS (global token ids) of the input x; shape-only (STORAGE false): the shape without storage.
Tensor init_x(const ModelSpec& s, const std::vector<int64_t>& rows, bool storage = true);

// This chip's weights: q heads [q0, q0+nq), kv heads [g0, g0+nkv), ffn columns [f0, f0+nf).
struct Weights {
  int64_t q0 = 0, nq = 0, g0 = 0, nkv = 0, f0 = 0, nf = 0;
  Tensor norm1, wq, wk, wv, wo, norm2, wg, wu, wd;
};

// Layer LAYER's weights of tp rank T of TP (layer 0: the base tensor ids; layer l adds 16·l, so every layer has its
// own seeded values). Shape-only (STORAGE false): the same shapes without storage.
Weights make_weights(const ModelSpec& s, int tp, int t, int64_t layer = 0, bool storage = true);
uint64_t weight_bytes(const Weights& w);
plans::BlockWeights block_weights(const Weights& w);

// The single-device block (the reference), charged to CHIP.
Tensor block_single(plans::Chip& chip, const ModelSpec& s, const Tensor& x, const Weights& w);


// max |y - reference| / max |reference| over all elements (max |y - reference| when the reference is all zero); a
// non-finite y counts as an infinite error.
double relative_error(const Tensor& y, const Tensor& ref);

// One weight of the block for the checkpoint: this chip's tensor, where it sits in the global one, its placement.
struct WeightSlot {
  std::string name;
  Tensor* t;
  runtime::Shape global, offset;
  Placement on_tp;
  bool kv = false;  // Wk/Wv: whole KV heads repeated over tp/kv_heads chips when tp > kv_heads
};

std::vector<WeightSlot> weight_slots(const ModelSpec& s, Weights& w);

}  // namespace shardsim::sharding::block_detail

// The layers a model is a stack of (one code path per layer for every workload and plan).
//
// mlp_layer: the gated MLP of models/mlp.h, y = ( act(x · W_gate) ⊙ (x · W_up) ) · W_down. The MLP workload
// (workload.kind: mlp, a model of one MLP layer: a block without attention, norms and residuals) and the
// transformer block's MLP sublayer (models/transformer.h) both run this function.
//   ctx == nullptr: one device (the single-device reference), charged to CHIP in order gate, up, GLU, down.
//   ctx given: sharded on the mesh's tp axis by the plan units of sharding/plans/tensor_parallel.h (Megatron
//   column-parallel W_gate/W_up, row-parallel W_down and its all_reduce with ctx.p.all_reduce; the sp and fused
//   variants of the plan), charged to ctx.chip. Returns the full output (or this chip's Shard(0) rows with sp).
// Shapes: in [rows, hidden] (this chip's sp shard with sp); w_gate, w_up [hidden, ffn_r]; w_down [ffn_r, hidden];
// all one dtype (fp32 or bf16). The GLU runs in place on the gate activation.
#pragma once

#include "kernels/elementwise.h"
#include "runtime/tensor.h"
#include "sharding/plans/block_ops.h"

namespace shardsim::sharding {

struct MlpLayerWeights {
  const runtime::Tensor* w_gate = nullptr;  // [hidden, ffn_r]
  const runtime::Tensor* w_up = nullptr;    // [hidden, ffn_r]
  const runtime::Tensor* w_down = nullptr;  // [ffn_r, hidden]
};

runtime::Tensor mlp_layer(plans::Chip& chip, plans::PlanContext* ctx, const runtime::Tensor& in,
                          const MlpLayerWeights& w, kernels::Activation activation);

// "swiglu" | "geglu": the GLU kernel's label in the timeline.
const char* glu_label(kernels::Activation activation);

}  // namespace shardsim::sharding

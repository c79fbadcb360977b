#include "models/layers.h"

#include "sharding/plans/tensor_parallel.h"

namespace shardsim::sharding {

using runtime::Tensor;

const char* glu_label(kernels::Activation a) { return a == kernels::Activation::silu ? "swiglu" : "geglu"; }

Tensor mlp_layer(plans::Chip& chip, plans::PlanContext* ctx, const Tensor& in, const MlpLayerWeights& w,
                 kernels::Activation activation) {
  if (!ctx) {  // one device
    Tensor g = plans::gemm(chip, in, *w.w_gate, "gemm.gate");
    Tensor u = plans::gemm(chip, in, *w.w_up, "gemm.up");
    chip.charge(kernels::glu_inplace(g, u, activation), glu_label(activation));
    return plans::gemm(chip, g, *w.w_down, "gemm.down");
  }
  auto gu = plans::column_parallel(*ctx, in, {w.w_gate, w.w_up}, {"gemm.gate", "gemm.up"}, "before MLP",
                                   "sp all_gather + gemm.gate/up", "sp all_gather + gemm.gate/up");
  ctx->chip.charge(kernels::glu_inplace(gu[0], gu[1], activation), glu_label(activation));
  return plans::row_parallel(*ctx, gu[0], *w.w_down, "gemm.down", "MLP output");
}

}  // namespace shardsim::sharding

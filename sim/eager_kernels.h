// What PyTorch eager issues for shardsim's fused element-wise kernels (device.kernel_fusion: eager).
//
// shardsim's blocks charge their element-wise work as the fused kernels Megatron-LM / Transformer Engine / Apex
// run (one RMSNorm kernel, one rotary kernel, one SwiGLU kernel, a fused cross-entropy). A model written in plain
// PyTorch and run eagerly (no torch.compile) issues each of these as several ATen kernels, with fp32
// intermediates where the code upcasts. With kernel_fusion: eager, Timeline::compute charges such a kernel as
// its eager sequence: each part a kernel of its own (its own launch overhead and host issue), the fused kernel's
// FLOPs shared evenly, bytes per element of the fused kernel's main tensor as listed below (e = the kernel's
// dtype size, f = 4, fp32). The sequences are those of torchtitan's Llama code (pytorch/torchtitan,
// torchtitan/models/llama/model.py and torchtitan/models/norms.py, 2024-12) and of their autograd backward:
//
//   rmsnorm            x.float() (e+f), pow (2f), mean (f), add eps, rsqrt (per row), mul (2f), type_as (f+e),
//                      mul weight (2e): 8 kernels, 4e + 7f per element (fused: 2e)
//   rmsnorm_backward   dy*w (3e), dy*y and its row sum for dw (3e, e), .float() (e+f), g*rstd (2f), g*x (3f) and
//                      its row sum (f), mean's expand (f), pow backward (3f), the two paths' add (3f), to dtype
//                      (f+e): 11 kernels, 9e + 15f (fused: 3e)
//   rope, rope_backward  .float() (e+f), complex multiply (2f), type_as (f+e): 3 kernels, 2e + 4f (fused: 2e)
//   swiglu             silu (2e), mul (3e): 2 kernels, 5e (fused: 3e)
//   swiglu_backward    g*silu (3e), g*up (3e), silu backward (3e): 3 kernels, 9e (fused: 5e)
//   ce_max             logits .float() (e+f), log_softmax's max pass (f)           (fused ce_max: e)
//   ce_stats           log_softmax's sum-of-exp pass (f), its output pass (2f)     (fused ce_stats: e)
//   ce_backward        nll_loss backward's zero fill (f), log_softmax backward (4f: the gradient's row sum,
//                      then gradient and output read, written), .float()'s backward (f+e)   (fused: 2e)
// A .float() / type_as part is skipped when e is 4 (a no-op on fp32 tensors). Kernels not listed (GEMMs,
// attention, residual adds, the embedding, the collectives) are issued as they are: eager PyTorch runs them as
// one kernel too. Not decomposed yet: torch.optim.AdamW(foreach=True) (eight list kernels over the parameters,
// about 80 bytes per fp32 element against the fused kernel's 30). What is not here: torch.compile (Inductor fuses these sequences again: kernel_fusion: fused
// is then closer), torchtitan's repeat_kv copies of K and V for grouped-query attention (small beside these).
#pragma once

#include <string_view>
#include <vector>

namespace shardsim::sim {

struct EagerPart {
  const char* name;  // the ATen op ("to_fp32", "pow", "mean", ...)
  double e_bytes;    // bytes per element in the kernel's dtype
  double f_bytes;    // bytes per element in fp32
  bool cast = false; // a dtype conversion: skipped when the kernel's dtype is fp32
};

struct EagerDecomposition {
  double fused_e_bytes;  // the fused kernel's bytes per element, in units of its dtype's size
  std::vector<EagerPart> parts;
};

// The eager sequence of the fused kernel named NAME (its base name before the first '.': "rmsnorm.attn" ->
// "rmsnorm"), nullptr when eager PyTorch runs it as one kernel too.
const EagerDecomposition* eager_decomposition(std::string_view name);

}  // namespace shardsim::sim

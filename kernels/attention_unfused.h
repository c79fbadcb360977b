// Megatron-LM's attention core on one chip, unfused (model.attention_impl: unfused): the scores of every query
// head are materialised, as the published Megatron runs executed it (Shoeybi et al. 2019; Narayanan et al. 2021;
// Korthikanti et al. 2022, §4.1: "the softmax output ... the dropout mask ... the output of dropout" are the
// core's [s, s] activations; their Table 2's 5as²b):
//
//   forward, per query head h (kv head g = h / (Hq / Hkv)):
//     S = scale · Q_h K_g^T            [seq_q, seq_k]   one batched GEMM over the heads (baddbmm)
//     P = softmax(mask(S))             [seq_q, seq_k]   one fused scale/mask/softmax kernel; P is stored
//     P' = dropout(P)                                    one kernel when attention dropout is charged (below)
//     O_h = P' V_g                     [seq_q, d]       one batched GEMM (bmm)
//   backward, from the stored P (or, under selective recomputation, a P recomputed by running the forward again):
//     dP = dO_h V_g^T,  dV_g += P^T dO_h                the PV GEMM's backward (two GEMMs)
//     dS = P ∘ (dP − rowsum(dP ∘ P))                    the softmax backward (one kernel)
//     dQ_h = scale · dS K_g,  dK_g += scale · dS^T Q_h  the QK^T GEMM's backward (two GEMMs)
//
// Values: the same function as kernels/attention.h (causal rule and offsets, scale default 1/sqrt(d), a row with
// no visible key gives O = 0), computed in fp32 (cblas_sgemm per head) with P rounded to the compute dtype when it
// is stored, as Megatron stores it. Attention dropout is not applied to the values (no element is dropped: the
// losses are those of dropout 0); when DROPOUT_P > 0 its kernels are charged (the mask written and read, P' written
// and read) so the step time and memory are those of the run with dropout.
//
// Costs (several kernels, in launch order; shapes for sim/kernel_model.h):
//   attention_core.qk             gemm  m = seq_q, n = seq_k, k = d, batch = Hq; 2·seq_q·seq_k·d FLOPs per head
//                                 (the whole matrix: a dense GEMM computes the masked half too); bytes Q, K read,
//                                 S written (compute dtype)
//   attention_core.softmax        vector; S read, P written; 4 FLOPs per element (scale, max, exp, divide)
//   attention_core.dropout        vector (DROPOUT_P > 0); P read, P' and a 1-byte mask written
//   attention_core.pv             gemm  m = seq_q, n = d, k = seq_k, batch = Hq; P' and V read, O written
// backward (attention_unfused_backward):
//   attention_core.pv_backward    gemm_backward of the PV shape: dP and dV, 4·seq_q·seq_k·d FLOPs per head
//   attention_core.dropout_backward  vector (DROPOUT_P > 0): dP' and the mask read, dP written
//   attention_core.softmax_backward  vector: P and dP read, dS written; 3 FLOPs per element
//   attention_core.qk_backward    gemm_backward of the QK^T shape: dQ and dK, 4·seq_q·seq_k·d FLOPs per head
//
// Layouts as attention(): Q, O, dO, dQ [seq_q, Hq, d]; K, V, dK, dV [seq_k, Hkv, d]; P [Hq, seq_q, seq_k] in Q's
// dtype. Options: causal, q_offset, k_offset, scale; the head range must be the full one. Errors:
// std::invalid_argument with the shapes. Shape-only tensors: the kernel_cost.h rule (costs only).
#pragma once

#include <vector>

#include "kernels/attention.h"
#include "kernels/kernel_cost.h"
#include "runtime/tensor.h"

namespace shardsim::kernels {

// Forward: O and the stored softmax output P.
std::vector<KernelCost> attention_unfused(const runtime::Tensor& q, const runtime::Tensor& k,
                                          const runtime::Tensor& v, runtime::Tensor& out, runtime::Tensor& probs,
                                          const AttentionOptions& options = {}, double dropout_p = 0);

// Backward from P (as the forward stored it): dQ, dK, dV (overwritten).
std::vector<KernelCost> attention_unfused_backward(const runtime::Tensor& q, const runtime::Tensor& k,
                                                   const runtime::Tensor& v, const runtime::Tensor& probs,
                                                   const runtime::Tensor& dout, runtime::Tensor& dq,
                                                   runtime::Tensor& dk, runtime::Tensor& dv,
                                                   const AttentionOptions& options = {}, double dropout_p = 0);

}  // namespace shardsim::kernels

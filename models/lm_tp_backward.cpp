// LmTpTrainer's backward (models/lm_tp.h): the loss's and the head's gradients, each block's through the block
// program (sharding/plans/block.h, block_backward), the embedding's, gradient accumulation over micro-batches, the
// zero-bubble W pass, and sequence parallelism's norm-gradient all_reduce.
#include <cstring>
#include <set>

#include "collectives/all_reduce.h"
#include "kernels/backward.h"
#include "kernels/cross_entropy.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/fp8.h"
#include "kernels/gemm.h"
#include "kernels/mse_loss.h"
#include "kernels/norm.h"
#include "models/lm_tp.h"
#include "sharding/plans/tensor_parallel.h"

namespace shardsim::models {

using runtime::DType;
using runtime::Tensor;

void LmTpTrainer::norm_backward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor& dx, Tensor* dw, Tensor* db,
                                sim::TimeNs& t) {
  const ModelSpec& c = local_;
  charge(c.layernorm() ? kernels::layernorm_backward(x, w, dy, dx, dw, db, c.norm_eps)
                       : kernels::rmsnorm_backward(x, w, dy, dx, dw, c.norm_eps),
         t);
}

void LmTpTrainer::unit_grads_done(int u, int micro, sim::TimeNs& t, UnitPart part) {
  if (micro > 0)  // gradient accumulation: this micro-batch's gradients added into the step's
    for (const UnitGrad& g : unit_grads_[size_t(u)])
      if (part == UnitPart::all || g.in_bi == (part == UnitPart::bi)) charge(kernels::add_inplace(*g.acc, *g.one), t);
  if (micro == micro_ - 1 && part != UnitPart::bi) {
    // Tp above the KV heads: the KV group's replicas of Wk, Wv hold partial gradients (tensor_parallel.h,
    // kv_replica_grads_reduce); summed once per step, when the layer's gradients are complete, before its bucket.
    if (kv_group_ && u >= 1 && u <= int(local_.layers)) {
      LmLayer& G = grads_.layers[size_t(u - 1)];
      t = sharding::plans::kv_replica_grads_reduce(*kv_group_, {&G.wk, &G.wv}, algorithm_, t);
    }
    data_->grads_ready(u, t);
  }
}

void LmTpTrainer::embedding_backward(const Tensor& dx_full, const std::vector<int64_t>& tokens, int micro,
                                     sim::TimeNs& t, UnitPart part) {
  const ModelSpec& c = local_;
  LmWeights& g = micro > 0 ? mgrads_ : grads_;
  sharding::plans::Chip chip{&tl_, t};  // unit 0: the tp unit's vocab-parallel embedding
  sharding::plans::vocab_parallel_embedding_backward(chip, dx_full, tokens, tp_rank_ * c.vocab, global_.vocab, g.embed);
  t = chip.t;
  if (c.tied_embeddings) charge(kernels::add_inplace(g.embed, kernels::transposed(dhead_)), t);  // the head's use
  if (c.position == sharding::PositionKind::learned)  // every row of this chip's tokens (gathered with sp)
    charge(kernels::embedding_backward(dx_full, layout_.pos, 0, global_.seq, g.pos_embed), t);
  unit_grads_done(0, micro, t, part);
}

double LmPendingW::bytes() const {
  double b = double(embed_dx.nbytes()) + double(tokens.size() * sizeof(int64_t));
  std::set<const Tensor*> inputs;  // an input shared by several GEMMs counts once
  for (const auto& [u, gemms] : units)
    for (const auto& g : gemms) {
      b += double(g.dy.nbytes());
      if (inputs.insert(g.x.get()).second) b += double(g.x->nbytes());
    }
  return b;
}

void LmTpTrainer::weight_backward(LmPendingW& pw, int micro, sim::TimeNs& t) {
  for (auto& [u, gemms] : pw.units) {
    sharding::plans::Chip chip{&tl_, t};
    const bool block_unit = u >= 1 && u <= int(local_.layers);  // not the embedding (0) nor the head
    const kernels::Fp8Scope fp8(block_unit ? fp8_recipe() : kernels::Fp8Recipe{});
    sharding::plans::run_weight_grads(chip, gemms);
    t = chip.t;
    unit_grads_done(u, micro, t, UnitPart::weights);
  }
  if (pw.embed_dx.rank() > 0) embedding_backward(pw.embed_dx, pw.tokens, micro, t, UnitPart::weights);
}

void LmTpTrainer::backward(const LmBatch& batch, LmCache& C, Tensor& dx, int chunk, int micro, sim::TimeNs& t,
                           LmPendingW* defer) {
  const ModelSpec& c = local_;
  const LmWeights& w = work_;
  LmWeights& g = micro > 0 ? mgrads_ : grads_;  // this micro-batch's gradients (the first: the step's)
  const int64_t N = c.batch * c.seq, h = c.hidden;
  const int64_t v0 = tp_rank_ * c.vocab, V = global_.vocab;
  auto act = [&](runtime::Shape sh) { return make(c.dtype, std::move(sh)); };
  const int head_unit = int(c.layers) + 1;
  const int ms = schedule_.model_stage(pp_rank_, chunk);
  const int64_t Nr = sp_ ? N / tp_size_ : N;
  // zb_h1: unit U's deferred dW GEMMs (nullptr: run in place), and which part of its gradients BI completes.
  auto deferred = [&](int u) { return defer ? &defer->units.emplace_back(u, sharding::plans::WeightGradGemms{}).second
                                            : nullptr; };
  const UnitPart done_part = defer ? UnitPart::bi : UnitPart::all;
  if (ms == schedule_.p * schedule_.v - 1 && c.vocab == 0) {  // a block stack: the regression loss's gradient
    begin_backward(head_unit, t);
    dx = act({Nr, h});
    charge(kernels::mse_loss_backward(C.x_final, sp_ ? batch.target.rows(tp_rank_ * Nr, Nr) : batch.target,
                                      N * micro_, dx),
           t);
    unit_grads_done(head_unit, micro, t, done_part);
  } else if (ms == schedule_.p * schedule_.v - 1) {  // the head and the loss: the last model stage's
  begin_backward(head_unit, t);
  Tensor dlogits = act({N, c.vocab});
  charge(kernels::ce_backward(C.logits, C.row_max, C.sumexp, batch.targets, v0, V, 1.0f / (float(N) * float(micro_)),
                              dlogits),
         t);
  // Column-parallel head: the partial input gradient reduced over tp (sp: reduce_scatter to the token rows).
  Tensor head_t;
  const Tensor& head = lm_head_weight(c, w, head_t);
  if (c.tied_embeddings) dhead_ = make(c.dtype, {h, c.vocab});  // added into the embedding's gradient at its unit
  sharding::plans::WeightGradGemms* dhead = deferred(head_unit);
  const Tensor dxf_r = on_chip(t, [&](auto& ctx) {
    return sharding::plans::column_parallel_backward(ctx, C.xf, {&head}, {&dlogits},
                                                     {c.tied_embeddings ? &dhead_ : &g.head}, "dhead_in", dhead);
  });
  dx = act({Nr, h});
  norm_backward(C.x_final, w.final_norm, dxf_r, dx, &g.final_norm, &g.final_norm_b, t);
  unit_grads_done(head_unit, micro, t, done_part);
  }  // else DX arrived from the next stage
  const int64_t l0 = chunk_first_[size_t(chunk)], l1 = l0 + chunk_len_[size_t(chunk)];
  for (int64_t l = l1 - 1; l >= l0; --l) {
    begin_backward(int(l) + 1, t);
    LmLayer& G = g.layers[size_t(l)];
    // The block's backward (with full recomputation its forward again first) through the plan units
    // (sharding/plans/block.h), its GEMMs in FP8 under model.fp8.
    const kernels::Fp8Scope fp8(fp8_recipe());
    sharding::plans::WeightGradGemms* dl = deferred(int(l) + 1);
    const sharding::plans::BlockGrads bg{&G.attn_norm, &G.wq,          &G.wk,          &G.wv,
                                         &G.wo,        &G.mlp_norm,    &G.w_gate,      &G.w_up,
                                         &G.w_down,    &G.attn_norm_b, &G.mlp_norm_b,  local_.moe_layer(l) ? &G.moe : nullptr,
                                         moe_aux_grad()};
    if (fp8_recipe().active()) {  // Transformer Engine's cast-transposes of the linears' dY (kernels/fp8.h)
      const LmLayer& L = w.layers[size_t(l)];
      const auto lin = kernels::fp8_block_linears(double(N), L.wq, L.wk, L.wv, L.wo, L.w_gate, L.w_up, L.w_down);
      charge(kernels::fp8_block_cast_cost(lin, c.dtype, fp8_recipe(), true), t);
    }
    on_chip(t, [&](auto& ctx) {
      sharding::plans::block_backward(ctx, layout_, block_weights(l), C.layers[size_t(l)], bg, dx, dl);
      return 0;
    });
    unit_grads_done(int(l) + 1, micro, t, done_part);
  }
  // Delayed scaling's update after the chunk's backward: two FP8 tensors (output and input gradients) per linear.
  if (fp8_recipe().active() && l1 > l0)
    charge(kernels::fp8_amax_update_cost(8.0 * double(l1 - l0), kernels::kFp8AmaxHistory, fp8_recipe()), t);
  if (ms == 0 && c.vocab == 0) {  // a block stack: no embedding to differentiate
    begin_backward(0, t);
    unit_grads_done(0, micro, t, UnitPart::all);
  } else if (ms == 0) {  // else DX goes to the previous stage
    begin_backward(0, t);
    Tensor dx_full = on_chip(t, [&](auto& ctx) { return sharding::plans::tp_gather(ctx, dx, "dembed"); });
    if (defer) {  // the embedding's gradient is a weight gradient: all of it in W
      defer->embed_dx = std::move(dx_full);
      defer->tokens = batch.inputs;
    } else {
      embedding_backward(dx_full, batch.inputs, micro, t, UnitPart::all);
    }
  }
}

void LmTpTrainer::finish_backward(sim::TimeNs& t) {
  const ModelSpec& c = local_;
  if (sp_) {
    // Each rank differentiated the norms over its token rows only: all_reduce(sum) of the norm weights'
    // gradients over tp (one packed buffer; Megatron's allreduce of sequence-parallel layer norm grads).
    std::vector<Tensor*> norms;
    for (auto& [name, gt] : grads_.named_weights())  // the step's (accumulated) gradients
      if ((is_norm(name) || (sp_routes_own_rows() && is_moe(name))) && owns(name))
        norms.push_back(gt);  // a MoE layer's weights too when each tp chip routed its own rows (etp 1)
    int64_t total = 0;
    for (Tensor* n : norms) total += n->numel();
    Tensor flat = make(c.dtype, {total});
    const size_t es = runtime::dtype_size(c.dtype);
    size_t off = 0;
    for (Tensor* n : norms) {
      if (store_) std::memcpy(static_cast<char*>(flat.data()) + off * es, n->data(), size_t(n->numel()) * es);
      off += size_t(n->numel());
    }
    all_reduce_tp(flat, collectives::ReduceOp::sum, t, "all_reduce.norm_grads");
    off = 0;
    for (Tensor* n : norms) {
      if (store_) std::memcpy(n->data(), static_cast<const char*>(flat.data()) + off * es, size_t(n->numel()) * es);
      off += size_t(n->numel());
    }
  }
  // Without overlap (the default with sp: every unit holds a norm weight, whose gradient is complete after the
  // all_reduce above) every bucket waits for the end of backward. With it, buckets go as their units are ready: the
  // dp average and the norm weights' tp sum are linear and commute.
  if (!dp_.overlap_grad_reduce.value_or(!sp_)) data_->all_grads_ready(t);
}

}  // namespace shardsim::models

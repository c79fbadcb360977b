// LmTpTrainer's forward (models/lm_tp.h): the embedding, each block through the block program
// (sharding/plans/block.h, block_forward), the final norm, the column-parallel head and the vocab-parallel loss.
#include "kernels/cross_entropy.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/fp8.h"
#include "kernels/mse_loss.h"
#include "kernels/norm.h"
#include "models/lm_tp.h"
#include "sharding/plans/tensor_parallel.h"

namespace shardsim::models {

using runtime::DType;
using runtime::Tensor;

std::vector<int64_t> LmTpTrainer::resid_positions() const {
  if (!sp_) return layout_.pos;
  const size_t rows = layout_.pos.size() / size_t(tp_size_);
  return {layout_.pos.begin() + std::ptrdiff_t(rows * size_t(tp_rank_)),
          layout_.pos.begin() + std::ptrdiff_t(rows * size_t(tp_rank_ + 1))};
}

sharding::plans::BlockWeights LmTpTrainer::block_weights(int64_t l) const {
  const LmLayer& L = work_.layers[size_t(l)];
  return {&L.attn_norm, &L.wq,     &L.wk,     &L.wv,          &L.wo,          &L.mlp_norm, global_.gated() ? &L.w_gate : nullptr,
          &L.w_up,      &L.w_down, &L.attn_norm_b, &L.mlp_norm_b, block_moe(l)};
}

void LmTpTrainer::block_forward(int64_t l, Tensor& x, LmCache::Layer& S, sim::TimeNs& t) {
  const kernels::Fp8Scope fp8(fp8_recipe());  // the block's linear layers in FP8 (model.fp8; none: no change)
  sharding::plans::Chip chip{&tl_, t};
  auto ctx = context(chip);
  x = sharding::plans::block_forward(ctx, layout_, block_weights(l), x, &S);
  t = chip.t;
  attention_ns_ += chip.attention_ns;
  if (fp8_recipe().active()) {  // Transformer Engine's casts of the linears' inputs (kernels/fp8.h)
    const LmLayer& L = work_.layers[size_t(l)];
    const auto lin = kernels::fp8_block_linears(double(local_.batch * local_.seq), L.wq, L.wk, L.wv, L.wo, L.w_gate,
                                                L.w_up, L.w_down);
    charge(kernels::fp8_block_cast_cost(lin, local_.dtype, fp8_recipe(), false), t);
  }
}

double LmTpTrainer::forward(const LmBatch& batch, LmCache& C, Tensor& x, int chunk, sim::TimeNs& t) {
  const ModelSpec& c = local_;
  const LmWeights& w = work_;
  const int64_t N = c.batch * c.seq, h = c.hidden;
  const int64_t v0 = tp_rank_ * c.vocab, V = global_.vocab;
  auto act = [&](runtime::Shape sh) { return make(c.dtype, std::move(sh)); };
  if (C.layers.empty()) C.layers.assign(size_t(c.layers), {});
  const int64_t Nr = sp_ ? N / tp_size_ : N;  // rows of the residual stream on this rank
  const int ms = schedule_.model_stage(pp_rank_, chunk);
  if (ms == 0 && c.vocab == 0) {  // a block stack: this chip's residual rows of the input, in the compute dtype
    begin_forward(0, t);
    x = act({Nr, h});
    if (store_) {
      const Tensor in = batch.input.rows(sp_ ? tp_rank_ * Nr : 0, Nr);
      for (int64_t i = 0; i < x.numel(); ++i) x.set(i, in.get(i));
    }
  } else if (ms == 0) {  // the embedding: the first model stage's
    begin_forward(0, t);
    x = on_chip(t, [&](auto& ctx) {  // the tp unit's vocab-parallel embedding
      return sharding::plans::vocab_parallel_embedding(ctx, w.embed, batch.inputs, v0, V, act({N, h}));
    });
    if (c.position == sharding::PositionKind::learned) {  // + pos_embed at this chip's rows' global positions
      const std::vector<int64_t> pos = resid_positions();
      Tensor p = act({Nr, h});
      charge(kernels::embedding_forward(w.pos_embed, pos, 0, global_.seq, p), t);
      charge(kernels::add_inplace(x, p), t);
    }
  }
  const int64_t l0 = chunk_first_[size_t(chunk)], l1 = l0 + chunk_len_[size_t(chunk)];
  double aux = 0;  // this chunk's MoE aux losses: part of the loss on every stage (summed over pp)
  for (int64_t l = l0; l < l1; ++l) {
    begin_forward(int(l) + 1, t);
    block_forward(l, x, C.layers[size_t(l)], t);
    const auto& m = C.layers[size_t(l)].moe;
    if (local_.moe_layer(l)) {
      moe_stats_[layer_global_[size_t(l)]] = {layer_global_[size_t(l)], m.routing.counts, m.local_rows(), m.aux,
                                              m.dispatch_bytes, m.dispatch_ns, m.buffer_bytes(c.hidden, c.dtype),
                                              m.expert_ns, m.balanced_expert_ns};
      moe_stats_[layer_global_[size_t(l)]].send_rows = m.send_rows;
      note_remote_reach(m.routing, moe_stats_[layer_global_[size_t(l)]]);
      if (!dp_.forward_only && local_.moe->bias_update > 0) {  // the step's load (not a recomputed forward's)
        std::vector<int64_t>& load = moe_load_[l];
        load.resize(m.routing.counts.size());
        for (size_t e = 0; e < load.size(); ++e) load[e] += m.routing.counts[e];
      }
    }
    aux += m.aux;
  }
  // Delayed scaling's amax-history and scale update at fp8_autocast's exit, once per chunk and micro-batch: three
  // FP8 tensors (input, weight, output) per linear, four linears per block (kernels/fp8.h).
  if (fp8_recipe().active() && l1 > l0)
    charge(kernels::fp8_amax_update_cost(12.0 * double(l1 - l0), kernels::kFp8AmaxHistory, fp8_recipe()), t);
  // A sequence split over chips: each holds its share of its sequence's aux losses; the loss counts their sum.
  if (ep_groups_)
    for (runtime::Transport* g : ep_groups_->span) aux = sum_over(*g, aux, "lm aux span");
  if (ms != schedule_.p * schedule_.v - 1) return aux;  // X goes on to the next stage
  begin_forward(int(c.layers) + 1, t);
  C.x_final = x;
  if (c.vocab == 0) {  // a block stack: the regression loss over this chip's residual rows
    // The forward mode computes it (validation) but does not charge it: a block stack's forward is its blocks
    // (run's figures); the loss is the training objective.
    double loss = 0;
    const auto mse = kernels::mse_loss(x, sp_ ? batch.target.rows(tp_rank_ * Nr, Nr) : batch.target, N, loss);
    if (!dp_.forward_only) charge(mse, t);
    if (sp_ && tp_size_ > 1) loss = sum_over_tp(loss);  // each tp rank holds N / tp of the rows
    return loss + aux;
  }
  Tensor xf = act({Nr, h});
  charge(c.layernorm() ? kernels::layernorm(x, w.final_norm, w.final_norm_b, xf, c.norm_eps)
                       : kernels::rmsnorm(x, w.final_norm, xf, c.norm_eps),
         t);
  Tensor head_t;
  const Tensor& head = lm_head_weight(c, w, head_t);
  // The column-parallel head (the tp unit: sp all_gather, or fused all_gather_gemm; C.xf is the input as its GEMM
  // read it, this rank's rows when fused, which the backward re-gathers): [N, V/T], this rank's vocabulary slice.
  C.logits = on_chip(t, [&](auto& ctx) {
    return std::move(sharding::plans::column_parallel(ctx, xf, {&head}, {"gemm.head"}, "before the head",
                                                      "sp all_gather + gemm.head", "sp all_gather + gemm.head",
                                                      &C.xf)[0]);
  });
  // Vocab-parallel cross-entropy (the tp plan unit, sharding/plans/tensor_parallel.h).
  return aux + sharding::plans::vocab_parallel_cross_entropy(mesh_["tp"], tl_, algorithm_, C.logits, batch.targets,
                                                             v0, V, C.row_max, C.sumexp, t);
}

}  // namespace shardsim::models

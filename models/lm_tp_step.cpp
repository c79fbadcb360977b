// LmTpTrainer's step (models/lm_tp.h): both modes' start (a fresh timeline, this stage's schedule), the training
// step's gradient reduction, global gradient norm, clipping and AdamW, the forward mode's step, the reported loss.
#include <cmath>
#include <cstring>
#include <sstream>
#include <stdexcept>

#include "collectives/all_gather.h"
#include "collectives/all_reduce.h"
#include "kernels/fp8.h"
#include "kernels/optimizer.h"
#include "models/lm_tp.h"

namespace shardsim::models {

using runtime::DType;
using runtime::Tensor;

namespace {

// R.loss = the mean of every replica's LOCAL_LOSS (gathered over REPLICAS, one rank per replica, summed in rank
// order: host-side reporting through the transport's control plane, not simulated); std::runtime_error when
// R.grad_norm is not finite (the step is then not applied).
void finish_step_loss(LmDpStepResult& r, double local_loss, runtime::Transport& replicas) {
  int64_t bits = 0;
  std::memcpy(&bits, &local_loss, sizeof bits);
  const std::vector<int64_t> all = replicas.allgather(bits, "lm loss");
  for (int64_t b : all) {
    double l = 0;
    std::memcpy(&l, &b, sizeof l);
    r.loss += l;
  }
  r.loss /= double(all.size());
  if (!std::isfinite(r.grad_norm)) {
    std::ostringstream msg;
    msg << "lm training: gradient norm is " << r.grad_norm << " at step " << r.step << " (loss " << r.loss
        << "); the step was not applied";
    throw std::runtime_error(msg.str());
  }
}

}  // namespace

double LmTpTrainer::sum_over_tp(double v) { return sum_over(mesh_["tp"], v, "lm loss tp"); }

double LmTpTrainer::sum_over(runtime::Transport& g, double v, const char* what) {
  int64_t bits = 0;
  std::memcpy(&bits, &v, sizeof bits);
  double sum = 0;
  for (int64_t b : g.allgather(bits, what)) {
    double x = 0;
    std::memcpy(&x, &b, sizeof x);
    sum += x;  // in the group's order: the same sum on every member
  }
  return sum;
}

double LmTpTrainer::start_step(LmDpStepResult& r, sim::TimeNs& t, bool forward_only) {
  r.step = step_ + 1;
  tl_.reset();
  fused_ops_.clear();
  comm_ = {};
  attention_ns_ = 0;
  moe_stats_.clear();
  moe_load_.clear();
  t = 0;
  data_->begin_step();
  return run_schedule(t, forward_only);
}

LmDpStepResult LmTpTrainer::step() {
  if (dp_.forward_only) throw std::logic_error("lm_tp: a forward-only trainer (LmDpConfig::forward_only) cannot step");
  LmDpStepResult r;
  sim::TimeNs t = 0;
  double local_loss = start_step(r, t, false);
  finish_backward(t);
  local_loss = last_stage_loss(local_loss);

  // Gradient reduction per bucket (the data-parallel unit), each issued when its last unit's gradients are ready;
  // then the squares of the reduced elements this rank counts, summed over the whole mesh.
  double sq = 0;
  sim::TimeNs reduced = data_->reduce_gradients(prefs(grads_), sq, t);
  reduced = update_moe_bias(reduced);  // Megatron-Core: in finalize_model_grads, after the gradients' reduction
  for (const auto& k : data_->grad_norm_cost()) charge(k, reduced);  // the local sum of squares (multi_tensor_l2norm)
  const auto [norm_sq, normed] = grad_norm_sq(sq, reduced);
  t = std::max(t, normed);
  tl_.host_sync(normed);  // the host reads the norm back before the clip and the step (clip_grad_norm's .item())
  r.grad_norm = std::sqrt(norm_sq);
  // Reported loss: the dp replicas' means (identical over tp), averaged in dp order (host-side).
  finish_step_loss(r, local_loss, *rep_);
  r.clip = train_.max_grad_norm > 0 ? kernels::clip_coefficient(r.grad_norm, train_.max_grad_norm) : 1.0;
  // AdamW on the owned chunks as FusedAdam's multi-tensor launches, then the parameters back to every replica.
  for (const auto& k : data_->optimizer_step(r.step, train_.adamw, float(r.clip))) charge(k, t);
  // FP8: the updated weights cast once for the next step's GEMMs (Transformer Engine caches them over micro-batches).
  // Without FP8 there is no cast kernel (an empty one would still pay a launch).
  if (fp8_recipe().active()) charge(kernels::fp8_weight_cast_cost(fp8_weight_elements(), global_.dtype, fp8_recipe()), t);
  data_->publish(work_refs_, t);
  step_ = r.step;
  r.breakdown = tl_.breakdown();
  return r;
}

LmDpStepResult LmTpTrainer::forward_step() {
  LmDpStepResult r;
  sim::TimeNs t = 0;
  const double local_loss = last_stage_loss(start_step(r, t, /*forward_only=*/true));
  finish_step_loss(r, local_loss, *rep_);
  r.breakdown = tl_.breakdown();
  return r;
}

std::pair<double, sim::TimeNs> LmTpTrainer::grad_norm_sq(double sq, sim::TimeNs ready) {
  // Summed in two stages that every data-parallel replica runs alike (a replica shift maps each stage onto
  // itself, so a folded run stays exact: docs/performance/fold.md): all_reduce(sum) over the chips of one replica
  // (tp x cp x pp), then an all_gather of one partial sum per replica over dp, added in dp order on every chip
  // (one value everywhere, in any rank layout).
  collectives::CollectiveOptions o;
  o.algorithm = algorithm_;
  o.name = "all_reduce.grad_norm";
  double replica_sq = 0;
  const auto a = collectives::all_reduce(mesh_.excluding("dp"), &sq, &replica_sq, 1, DType::fp64,
                                         collectives::ReduceOp::sum, ready, o);
  const int dp_axis = mesh_.size("dp");  // excluding("dp") covered ep
  if (dp_axis == 1) return {replica_sq, a.span.end};
  std::vector<double> parts(static_cast<size_t>(dp_axis), 0.0);
  o.name = "all_gather.grad_norm";
  o.algorithm = grad_norm_gather_algorithm();
  const auto g = collectives::all_gather(mesh_["dp"], &replica_sq, parts.data(), parts.size(), DType::fp64,
                                         a.span.end, o);
  double total = 0;
  for (double v : parts) total += v;
  return {total, g.span.end};
}

kernels::Fp8Recipe LmTpTrainer::fp8_recipe() const {
  kernels::Fp8Recipe r;
  r.scaling = global_.fp8;
  return r;
}

double LmTpTrainer::fp8_weight_elements() const {
  if (global_.fp8 == kernels::Fp8Scaling::none) return 0;
  double n = 0;
  for (const LmLayer& L : work_.layers)
    for (const Tensor* w : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down}) n += double(w->numel());
  return n;
}

}  // namespace shardsim::models

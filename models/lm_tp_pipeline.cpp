// LmTpTrainer's step-level scheduling (models/lm_tp.h): the micro-batches of a step, the pipeline stages of the pp
// axis, and the hooks through which the pipeline executor (sharding/plans/pipeline_executor.h) runs this stage's
// actions of a schedule; the forward and backward are lm_tp_forward.cpp's and lm_tp_backward.cpp's.
#include <algorithm>
#include <cstring>
#include <map>
#include <stdexcept>

#include "collectives/broadcast.h"
#include "models/lm_data.h"
#include "models/lm_tp.h"

namespace shardsim::models {

using runtime::DType;
using runtime::Tensor;

double LmTpTrainer::run_schedule(sim::TimeNs& t, bool forward_only) {
  // This stage's actions of the schedule through the pipeline executor (sharding/plans/pipeline_executor.h); without
  // pp the schedule is 1F1B on one stage: each micro-batch's forward then its backward. The loss is the
  // micro-batches' mean.
  const int last = schedule_.p * schedule_.v - 1;
  const int64_t rows = (sp_ ? local_.batch * local_.seq / tp_size_ : local_.batch * local_.seq);
  struct Live {
    LmBatch batch;
    LmCache cache;
  };
  std::map<std::pair<int, int>, Live> live;  // (chunk, micro) between its forward and its backward
  std::map<std::pair<int, int>, LmPendingW> pending_w;  // zb_h1: (chunk, micro) between its BI and its BW
  double loss = 0, pending_w_bytes = 0;
  double recompute_working_bytes = -1;  // of activation_bytes_: the one block rebuilt at a time (set at the first F)
  sharding::plans::PipeStageHooks hooks;
  hooks.make_boundary = [&] { return make(local_.dtype, {rows, local_.hidden}); };
  hooks.forward = [&](const sharding::plans::PipeAction& a, Tensor& x, sim::TimeNs& at) {
    Live& s = live[{a.chunk, a.micro}];
    s.batch = micro_batch_tokens(a.micro);
    if (!store_) {  // shape-only: only the embedding reads the tokens and only the head the targets (host memory)
      const int ms = schedule_.model_stage(pp_rank_, a.chunk);
      if (ms != 0) s.batch.inputs = {};
      if (ms != last) s.batch.targets = {};
    }
    loss += forward(s.batch, s.cache, x, a.chunk, at) / micro_;
    if (activation_bytes_ == 0) activation_bytes_ = lm_cache_bytes(s.cache, dp_.recompute);
    if (recompute_working_bytes < 0) recompute_working_bytes = dp_.recompute ? lm_recompute_working_bytes(s.cache) : 0.0;
    if (dp_.recompute) lm_drop_block_activations(s.cache);  // keep the block inputs only
    if (forward_only) {  // nothing is kept for a backward
      if (a.chunk == schedule_.v - 1) keep_output(a.micro, x, schedule_.model_stage(pp_rank_, a.chunk) == last);
      live.erase({a.chunk, a.micro});
    }
  };
  hooks.weight_backward = [&](const sharding::plans::PipeAction& a, sim::TimeNs& at) {
    auto it = pending_w.find({a.chunk, a.micro});
    if (it == pending_w.end()) throw std::logic_error("lm_tp pipeline: a weight-gradient pass before its BI");
    weight_backward(it->second, a.micro, at);
    pending_w_bytes -= it->second.bytes();
    pending_w.erase(it);
  };
  hooks.backward = [&](const sharding::plans::PipeAction& a, Tensor& dx, sim::TimeNs& at) {
    auto it = live.find({a.chunk, a.micro});
    if (it == live.end()) throw std::logic_error("lm_tp pipeline: a backward before its forward");
    LmPendingW* defer = a.op == sharding::plans::PipeOp::BI ? &pending_w[{a.chunk, a.micro}] : nullptr;
    backward(it->second.batch, it->second.cache, dx, a.chunk, a.micro, at, defer);
    if (defer) pending_w_bytes += defer->bytes();  // kept from the forward's saved tensors, which are freed
    live.erase(it);
  };
  // Each held (chunk, micro-batch) keeps its saved tensors; under recompute those are its block inputs, and the one
  // block rebuilt at a time (recompute_working_bytes) is counted once, not per held micro-batch.
  hooks.held_bytes = [&](int held) {
    const double work = std::max(recompute_working_bytes, 0.0), each = activation_bytes_ - work;
    const double act = held > 0 ? held * each + work : 0.0;
    return std::pair{act + pending_w_bytes, pending_w_bytes};
  };
  runtime::Transport& pp = mesh_["pp"];
  sharding::plans::run_pipeline_stage(schedule_, pp_rank_, pp, tl_, forward_only, hooks, stage_stats_, t);
  stage_stats_.chunk_activation_bytes = activation_bytes_;
  return loss;
}

std::vector<LmStageSummary> LmTpTrainer::pipeline_summary() {
  const LmStageStats& st = stage_stats_;
  sim::TimeNs end = 0;
  for (const auto& sp : st.spans) end = std::max(end, sp.end);
  // Mean span of each kind of action (F; B or BI; BW): the per-stage costs of the zb_h1 closed form.
  double sum[3] = {0, 0, 0}, count[3] = {0, 0, 0};
  for (const auto& sp : st.spans) {
    const int k = sp.action.op == sharding::plans::PipeOp::F ? 0 : sp.action.op == sharding::plans::PipeOp::BW ? 2 : 1;
    sum[k] += sp.end - sp.start;
    ++count[k];
  }
  auto mean = [&](int k) { return count[k] > 0 ? sum[k] / count[k] : 0.0; };
  const double mine[] = {st.busy_ns(), end, st.peak_activation_bytes, st.peak_in_flight / double(schedule_.v),
                         st.bytes_forward, st.bytes_backward, st.peak_pending_w_bytes, mean(0), mean(1), mean(2)};
  std::vector<std::vector<int64_t>> all;
  for (double d : mine) {
    int64_t bits = 0;
    std::memcpy(&bits, &d, sizeof bits);
    all.push_back(world_.allgather(bits, "lm pipeline summary"));  // host-side, not simulated
  }
  auto get = [&](size_t k, int rank) {
    double d = 0;
    std::memcpy(&d, &all[k][size_t(rank)], sizeof d);
    return d;
  };
  // One chip per stage (its tp, cp and dp coordinates 0): the mesh rank stage·(tp·cp·dp), pp being outermost.
  std::vector<LmStageSummary> out(static_cast<size_t>(pp_size_));
  double pipe_end = 0;
  for (int s = 0; s < pp_size_; ++s) pipe_end = std::max(pipe_end, get(1, s * tp_size_ * cp_size_ * dp_size_));
  for (int s = 0; s < pp_size_; ++s) {
    const int r = s * tp_size_ * cp_size_ * dp_size_;
    LmStageSummary& o = out[size_t(s)];
    o.busy_ns = get(0, r);
    o.pipeline_ns = pipe_end;
    o.bubble_ns = std::max(0.0, pipe_end - o.busy_ns);
    o.peak_activation_bytes = get(2, r);
    o.peak_microbatches = get(3, r);
    o.bytes_forward = get(4, r);
    o.bytes_backward = get(5, r);
    o.peak_pending_w_bytes = get(6, r);
    o.mean_f_ns = get(7, r);
    o.mean_b_ns = get(8, r);
    o.mean_w_ns = get(9, r);
  }
  return out;
}

sharding::plans::PipeCosts lm_stage_costs(const std::vector<LmStageSummary>& stages) {
  sharding::plans::PipeCosts c{0, 0, 0, 0};
  for (const LmStageSummary& st : stages) {
    c.f += st.mean_f_ns / double(stages.size());
    c.b += (st.mean_b_ns + st.mean_w_ns) / double(stages.size());
    c.w += st.mean_w_ns / double(stages.size());
  }
  return c;
}

void LmTpTrainer::keep_output(int micro, const Tensor& x, bool last_stage) {
  if (global_.vocab != 0 || !store_) return;
  ForwardOutput& o = forward_out_;
  const int64_t n = local_.batch * local_.seq, nr = x.dim(0), r0 = sp_ ? int64_t(tp_rank_) * nr : 0;
  const int64_t first = (int64_t(dp_rank_) * micro_ + micro) * local_.batch;  // as micro_batch_tokens
  if (micro == 0) o = {{}, Tensor(local_.dtype, {0, local_.hidden}), last_stage && (sp_ || tp_rank_ == 0)};
  for (int64_t r = r0; r < r0 + nr && r < n; ++r)
    o.rows.push_back((first + r / local_.seq) * global_.seq + layout_.pos[size_t(r)]);
  Tensor all(local_.dtype, {o.out.dim(0) + nr, local_.hidden});
  if (o.out.dim(0) > 0) all.set_rows(0, o.out);
  all.set_rows(o.out.dim(0), x);
  o.out = std::move(all);
}

LmBatch LmTpTrainer::micro_batch_tokens(int micro) const {
  LmBatch lb;
  const int64_t n = local_.batch * local_.seq;
  if (!store_) {  // shape-only: the kernels read no token; only the count matters
    if (global_.vocab == 0) {
      lb.input = Tensor::make(DType::fp32, {n, local_.hidden}, false);
      lb.target = Tensor::make(DType::fp32, {n, local_.hidden}, false);
      return lb;
    }
    lb.inputs.assign(size_t(n), 0);
    lb.targets.assign(size_t(n), 0);
    return lb;
  }
  // This replica's sequences [dp_rank·B/dp, ...), of them micro-batch MICRO's; of each, this cp rank's chunks.
  const int64_t first = (int64_t(dp_rank_) * micro_ + micro) * local_.batch;
  if (global_.vocab == 0) {  // a block stack: the input and target rows of this chip's tokens
    lb.input = Tensor(DType::fp32, {n, local_.hidden});
    lb.target = Tensor(DType::fp32, {n, local_.hidden});
    Tensor in(DType::fp32, {1, local_.hidden}), tg(DType::fp32, {1, local_.hidden});
    for (int64_t b = 0; b < local_.batch; ++b)
      for (int64_t i = 0; i < local_.seq; ++i) {
        const int64_t row = b * local_.seq + i;
        lm_synthetic_activations(global_, train_.data_seed, step_, (first + b) * global_.seq + layout_.pos[size_t(row)],
                                 in, tg);
        lb.input.set_rows(row, in);
        lb.target.set_rows(row, tg);
      }
    return lb;
  }
  const LmBatch gb = lm_synthetic_batch(global_, train_.data_seed, step_);
  lb.inputs.resize(size_t(n));
  lb.targets.resize(size_t(n));
  for (int64_t b = 0; b < local_.batch; ++b)
    for (int64_t i = 0; i < local_.seq; ++i) {
      const size_t src = size_t((first + b) * global_.seq + layout_.pos[size_t(b * local_.seq + i)]);
      lb.inputs[size_t(b * local_.seq + i)] = gb.inputs[src];
      lb.targets[size_t(b * local_.seq + i)] = gb.targets[src];
    }
  return lb;
}

double LmTpTrainer::last_stage_loss(double local_loss) {
  if (pp_size_ == 1) return local_loss;
  // The loss is the last model stage's, plus every stage's MoE aux losses (the other stages' losses: 0 without
  // MoE layers): summed over the pp axis in pp order (host-side, not simulated).
  int64_t bits = 0;
  std::memcpy(&bits, &local_loss, sizeof bits);
  const std::vector<int64_t> all = mesh_["pp"].allgather(bits, "lm loss pp");
  const int last = (pp_size_ * schedule_.v - 1) % pp_size_;
  std::memcpy(&local_loss, &all[size_t(last)], sizeof local_loss);
  for (int s = 0; s < pp_size_; ++s) {
    double v = 0;
    std::memcpy(&v, &all[size_t(s)], sizeof v);
    if (s != last) local_loss += v;
  }
  return local_loss;
}

void LmTpTrainer::setup_pipeline(const ModelSpec& global) {
  using sharding::plans::ScheduleKind;
  const ScheduleKind kind = pp_size_ > 1 ? dp_.schedule : ScheduleKind::one_f_one_b;
  const int v = pp_size_ > 1 ? dp_.virtual_stages : 1;
  const std::string why = sharding::plans::pipeline_obstacle(kind, pp_size_, micro_, v, global.layers, dp_.pp_layers);
  if (!why.empty()) throw std::invalid_argument(why);
  if (kind == ScheduleKind::zb_h1 && fused_)  // the fused ops compute dW inside (sharding/fused.h)
    throw std::invalid_argument("parallel.fused: the zb_h1 schedule defers the weight gradients' GEMMs, which the "
                                "fused collectives compute inside their fused ops; use fused: false with zb_h1");
  schedule_ = sharding::plans::make_schedule(kind, pp_size_, micro_, v);
  const std::vector<int64_t> per = sharding::plans::stage_layers(global.layers, pp_size_ * v, dp_.pp_layers);
  std::vector<int64_t> first(per.size() + 1, 0);
  for (size_t i = 0; i < per.size(); ++i) first[i + 1] = first[i] + per[i];
  layer_global_.clear();
  chunk_first_.clear();
  chunk_len_.clear();
  for (int c = 0; c < v; ++c) {
    const size_t ms = size_t(schedule_.model_stage(pp_rank_, c));
    chunk_first_.push_back(int64_t(layer_global_.size()));
    chunk_len_.push_back(per[ms]);
    for (int64_t l = first[ms]; l < first[ms + 1]; ++l) layer_global_.push_back(l);
  }
  owns_embed_ = pp_rank_ == 0;
  owns_head_ = schedule_.model_stage(pp_rank_, v - 1) == pp_size_ * v - 1;
  local_.layers = int64_t(layer_global_.size());
}

LmWeights LmTpTrainer::gather_stages(const LmWeights& mine) {
  // Every tensor broadcast over the pp axis from the stage that holds it (host-side assembly, charged as
  // broadcasts on the timeline like gather()'s all_gathers).
  LmWeights out = lm_zeros(global_, mine.embed.dtype());
  runtime::Transport& pp = mesh_["pp"];
  const std::vector<int64_t> per = sharding::plans::stage_layers(global_.layers, pp_size_ * schedule_.v, dp_.pp_layers);
  std::vector<int> owner(size_t(global_.layers));
  for (int ms = 0, l = 0; ms < int(per.size()); ++ms)
    for (int64_t i = 0; i < per[size_t(ms)]; ++i) owner[size_t(l++)] = ms % pp_size_;
  std::vector<int64_t> local_of(size_t(global_.layers), -1);
  for (size_t i = 0; i < layer_global_.size(); ++i) local_of[size_t(layer_global_[i])] = int64_t(i);
  auto share = [&](const Tensor& src, Tensor& dst, int root) {
    if (pp_rank_ == root) dst = src;
    collectives::CollectiveOptions o;
    o.algorithm = algorithm_;
    o.name = "broadcast.state";
    o.root = root;
    collectives::broadcast(pp, dst.data(), dst.data(), size_t(dst.numel()), dst.dtype(), tl_.end_time(), o);
  };
  const int last = (pp_size_ * schedule_.v - 1) % pp_size_;
  share(mine.embed, out.embed, 0);
  if (out.pos_embed.rank() > 0) share(mine.pos_embed, out.pos_embed, 0);
  share(mine.final_norm, out.final_norm, last);
  if (out.final_norm_b.rank() > 0) share(mine.final_norm_b, out.final_norm_b, last);
  if (out.head.rank() > 0) share(mine.head, out.head, last);
  for (int64_t l = 0; l < global_.layers; ++l) {
    LmLayer empty;
    LmLayer& src = local_of[size_t(l)] >= 0 ? const_cast<LmLayer&>(mine.layers[size_t(local_of[size_t(l)])]) : empty;
    LmLayer& dst = out.layers[size_t(l)];
    const int root = owner[size_t(l)];
    const auto a = src.slots(), b = dst.slots();
    for (size_t i = 0; i < b.size(); ++i)
      if (b[i].second->rank() > 0) share(*a[i].second, *b[i].second, root);
  }
  return out;
}

}  // namespace shardsim::models

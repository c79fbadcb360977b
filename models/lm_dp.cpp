#include "models/lm_dp.h"

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>
#include <stdexcept>

#include "collectives/all_gather.h"
#include "collectives/all_reduce.h"
#include "collectives/reduce_scatter.h"
#include "models/lm_data.h"
#include "models/lm_grad_bucket.h"
#include "runtime/world.h"

namespace shardsim::models {

using runtime::DType;
using runtime::Tensor;

namespace {

bool same_costs(const std::vector<kernels::KernelCost>& a, const std::vector<kernels::KernelCost>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].flops != b[i].flops || a[i].bytes != b[i].bytes || a[i].dtype != b[i].dtype) return false;
  return true;
}

LmBatch slice_batch(const LmBatch& g, int64_t seq, int64_t first, int64_t n) {
  LmBatch b;
  b.inputs.assign(g.inputs.begin() + first * seq, g.inputs.begin() + (first + n) * seq);
  b.targets.assign(g.targets.begin() + first * seq, g.targets.begin() + (first + n) * seq);
  return b;
}

}  // namespace

LmDpTrainer::LmDpTrainer(const LmConfig& global, const LmTrainConfig& train, const LmDpConfig& dp,
                         runtime::Transport& tp, sim::Timeline& timeline)
    : global_(global), local_(global), train_(train), dp_(dp), tp_(tp), tl_(timeline) {
  check_lm_config(global);
  rank_ = tp.rank();
  size_ = tp.size();
  if (dp.zero < 0 || dp.zero > 3)
    throw std::invalid_argument("parallel.zero: must be 0, 1, 2 or 3 (got " + std::to_string(dp.zero) + ")");
  if (dp.bucket_bytes < 0)
    throw std::invalid_argument("parallel.bucket_bytes: must be >= 0 (got " + std::to_string(dp.bucket_bytes) + ")");
  if (global.batch % size_ != 0)
    throw std::invalid_argument("model.batch: the global batch (" + std::to_string(global.batch) +
                                " sequences) must be a multiple of dp (" + std::to_string(size_) + ")");
  local_.batch = global.batch / size_;

  LmWeights master = lm_init(global);
  work_ = lm_compute_copy(global, master);
  grads_ = lm_zeros(global, global.dtype);
  const auto named = master.named_weights();
  const int units = static_cast<int>(global.layers) + 2;
  const size_t esize = runtime::dtype_size(global.dtype);

  // Flat order: units in backward order, weights in named order within a unit.
  std::vector<Slot> order;
  for (int u = units - 1; u >= 0; --u)
    for (size_t i = 0; i < named.size(); ++i)
      if (lm_unit_of(named[i].first, global.layers) == u) order.push_back({i, u, 0, size_t(named[i].second->numel())});
  unit_bucket_.assign(size_t(units), -1);
  for (const Slot& s : order) {
    const bool new_bucket =
        buckets_.empty() ||
        (dp.zero == 3 ? buckets_.back().last_unit != s.unit
                      : dp.bucket_bytes > 0 && double(buckets_.back().count * esize) >= double(dp.bucket_bytes));
    if (new_bucket) buckets_.emplace_back();
    Bucket& b = buckets_.back();
    Slot t = s;
    t.offset = b.count;
    b.slots.push_back(t);
    b.count += s.numel;
    b.last_unit = s.unit;  // flat order visits units downwards: the last one is the latest completed
    unit_bucket_[size_t(s.unit)] = static_cast<int>(buckets_.size()) - 1;
  }
  for (Bucket& b : buckets_) {
    if (dp.zero >= 1) {
      const collectives::Partition p{b.count, size_t(size_)};
      b.own_off = p.offset(size_t(rank_));
      b.own_n = p.size(size_t(rank_));
    } else {
      b.own_off = 0;
      b.own_n = b.count;
    }
    b.master = Tensor(DType::fp32, {int64_t(b.own_n)});
    lm_take_bucket_chunk(b, master, DType::fp32, b.master, "lm_dp");
    b.m = Tensor(DType::fp32, {int64_t(b.own_n)});
    b.v = Tensor(DType::fp32, {int64_t(b.own_n)});
    if (global.dtype != DType::fp32) {
      b.copy = Tensor(global.dtype, {int64_t(b.own_n)});
      lm_take_bucket_chunk(b, work_, global.dtype, b.copy, "lm_dp");
    }
    b.grad = Tensor(global.dtype, {int64_t(dp.zero >= 2 ? b.own_n : b.count)});
  }

  // The step's kernels depend on shapes only: record them once (and check every step that they did not change).
  const LmBatch gb = lm_synthetic_batch(global_, train_.data_seed, 0);
  const LmBatch lb = slice_batch(gb, global.seq, rank_ * local_.batch, local_.batch);
  LmCache cache;
  lm_forward(local_, work_, lb, &cache, &fwd_costs_, &fwd_marks_);
  lm_backward(local_, work_, lb, cache, grads_, &bwd_costs_, &bwd_marks_);
  activation_bytes_ = lm_cache_bytes(cache, dp.recompute);
}

void LmDpTrainer::pack(const Bucket& b, const LmWeights& w, Tensor& flat) const {
  lm_pack_slots(b.slots, w, flat, "lm_dp");
}

void LmDpTrainer::unpack(const Bucket& b, const Tensor& flat, LmWeights& w) const {
  lm_unpack_slots(b.slots, flat, w, "lm_dp");
}

sim::TimeNs LmDpTrainer::gather_bucket(Bucket& b, sim::TimeNs ready) {
  const Tensor& src = global_.dtype == DType::fp32 ? b.master : b.copy;
  Tensor flat(global_.dtype, {int64_t(b.count)});
  collectives::CollectiveOptions o;
  o.algorithm = dp_.algorithm;
  o.name = "all_gather.params";
  const auto r = collectives::all_gather(tp_, src.data(), flat.data(), b.count, global_.dtype, ready, o);
  unpack(b, flat, work_);
  return r.span.end;
}

void LmDpTrainer::replay(const std::vector<kernels::KernelCost>& costs, size_t from, size_t to, sim::TimeNs& t) {
  for (size_t i = from; i < to; ++i) {
    const auto& k = costs[i];
    t = tl_.compute(k.name, k.flops, k.bytes, runtime::precision_of(k.dtype), t).end;
  }
}

LmDpStepResult LmDpTrainer::step() {
  LmDpStepResult r;
  r.step = step_ + 1;
  tl_.reset();
  const int units = static_cast<int>(global_.layers) + 2;
  const LmBatch gb = lm_synthetic_batch(global_, train_.data_seed, step_);
  const LmBatch lb = slice_batch(gb, global_.seq, rank_ * local_.batch, local_.batch);

  // Forward on the simulated timeline (stage 3: unit u's gather is issued when unit u-1 starts).
  sim::TimeNs t = 0;
  std::vector<sim::TimeNs> fwd_start(size_t(units), 0), bwd_start(size_t(units), 0), grad_ready(size_t(units), 0);
  for (int u = 0; u < units; ++u) {
    if (dp_.zero == 3)
      t = std::max(t, gather_bucket(buckets_[size_t(unit_bucket_[size_t(u)])], u == 0 ? 0 : fwd_start[size_t(u - 1)]));
    fwd_start[size_t(u)] = std::max(t, tl_.free_at(sim::Timeline::kComputeEngine));
    replay(fwd_costs_, fwd_marks_[size_t(u)], fwd_marks_[size_t(u + 1)], t);
  }
  replay(fwd_costs_, fwd_marks_[size_t(units)], fwd_costs_.size(), t);  // (nothing after the last mark today)
  LmCache cache;
  std::vector<kernels::KernelCost> costs;
  std::vector<size_t> marks;
  const double local_loss = lm_forward(local_, work_, lb, &cache, &costs, &marks);
  if (!same_costs(costs, fwd_costs_)) throw std::logic_error("lm_dp: the forward's kernels changed between steps");

  // Backward: units in reverse; stage 3 gathers each unit again, one unit ahead.
  for (int k = 0; k < units; ++k) {
    const int u = units - 1 - k;
    if (dp_.zero == 3)
      t = std::max(t, gather_bucket(buckets_[size_t(unit_bucket_[size_t(u)])],
                                    k == 0 ? fwd_start[size_t(units - 1)] : bwd_start[size_t(u + 1)]));
    bwd_start[size_t(u)] = std::max(t, tl_.free_at(sim::Timeline::kComputeEngine));
    if (dp_.recompute && u >= 1 && u <= int(global_.layers))  // block u - 1's forward again, then its backward
      replay(fwd_costs_, fwd_marks_[size_t(u)], fwd_marks_[size_t(u + 1)], t);
    replay(bwd_costs_, k == 0 ? 0 : bwd_marks_[size_t(k - 1)], bwd_marks_[size_t(k)], t);
    grad_ready[size_t(u)] = t;
  }
  if (dp_.recompute) {
    // Keep the block inputs only, then rebuild each block from its input (host order: all blocks before the
    // backward, which takes the whole cache; the timeline above charges each one right before its backward).
    lm_drop_block_activations(cache);
    for (int64_t l = global_.layers - 1; l >= 0; --l) {
      costs.clear();
      lm_recompute_block(local_, work_, l, cache, &costs);
      const std::vector<kernels::KernelCost> want(fwd_costs_.begin() + long(fwd_marks_[size_t(l + 1)]),
                                                  fwd_costs_.begin() + long(fwd_marks_[size_t(l + 2)]));
      if (!same_costs(costs, want)) throw std::logic_error("lm_dp: a recomputed block ran other kernels");
    }
  }
  costs.clear();
  lm_backward(local_, work_, lb, cache, grads_, &costs, &marks);
  if (!same_costs(costs, bwd_costs_)) throw std::logic_error("lm_dp: the backward's kernels changed between steps");

  // Gradient reduction per bucket, each issued when its last unit's gradients are ready.
  collectives::CollectiveOptions o;
  o.algorithm = dp_.algorithm;
  sim::TimeNs reduced = t;
  double sq = 0;
  for (Bucket& b : buckets_)  // models/lm_grad_bucket.h: all_reduce or ZeRO's reduce_scatter, and the norm piece
    reduced = std::max(reduced, lm_reduce_grad_bucket(b, grads_, dp_.zero, tp_, global_.dtype,
                                                      grad_ready[size_t(b.last_unit)], o,
                                                      [](const Slot&) { return true; }, sq, "lm_dp"));
  // Global norm: all_reduce(sum) of the per-rank pieces (8 bytes).
  double norm_sq = 0;
  o.name = "all_reduce.grad_norm";
  const auto nr = collectives::all_reduce(tp_, &sq, &norm_sq, 1, DType::fp64, collectives::ReduceOp::sum, reduced, o);
  r.grad_norm = std::sqrt(norm_sq);
  finish_step_loss(r, local_loss, tp_, "lm_dp loss");
  r.clip = train_.max_grad_norm > 0 ? kernels::clip_coefficient(r.grad_norm, train_.max_grad_norm) : 1.0;

  // AdamW on the chunks this rank owns, charged as one multi-tensor kernel over every bucket (as fused optimizers
  // do), so the optimizer's simulated time does not depend on the bucket count; then the parameters back to every
  // replica (stages 1-2: all_gather per bucket).
  const bool copy = global_.dtype != DType::fp32;
  t = std::max(t, nr.span.end);
  kernels::KernelCost opt{"adamw", 0, 0, DType::fp32};
  for (Bucket& b : buckets_) {
    Tensor g;
    if (dp_.zero == 1) {
      g = Tensor(global_.dtype, {int64_t(b.own_n)});
      const size_t es = runtime::dtype_size(global_.dtype);
      std::memcpy(g.data(), static_cast<const char*>(b.grad.data()) + b.own_off * es, b.own_n * es);
    } else {
      g = b.grad;
    }
    const auto k = kernels::adamw_step(b.master, b.m, b.v, g, r.step, train_.adamw, static_cast<float>(r.clip),
                                       copy ? &b.copy : nullptr);
    opt.flops += k.flops;
    opt.bytes += k.bytes;
  }
  t = tl_.compute(opt.name, opt.flops, opt.bytes, runtime::precision_of(opt.dtype), t).end;
  for (Bucket& b : buckets_) {
    if (dp_.zero == 0) {
      unpack(b, copy ? b.copy : b.master, work_);
    } else if (dp_.zero <= 2) {
      gather_bucket(b, t);
    }  // stage 3: gathered before the next use
  }
  step_ = r.step;
  r.breakdown = tl_.breakdown();
  return r;
}

LmWeights LmDpTrainer::gather_field(Tensor Bucket::*field, const char* name) {
  LmWeights w = lm_zeros(global_, DType::fp32);
  for (Bucket& b : buckets_) {
    if (dp_.zero == 0) {
      unpack(b, b.*field, w);
      continue;
    }
    Tensor flat(DType::fp32, {int64_t(b.count)});
    collectives::CollectiveOptions o;
    o.algorithm = dp_.algorithm;
    o.name = name;
    collectives::all_gather(tp_, (b.*field).data(), flat.data(), b.count, DType::fp32, tl_.end_time(), o);
    unpack(b, flat, w);
  }
  return w;
}

LmWeights LmDpTrainer::gather_master() { return gather_field(&Bucket::master, "all_gather.master"); }

LmTrainSnapshot LmDpTrainer::gather_state() {
  LmTrainSnapshot s;
  s.master = gather_field(&Bucket::master, "all_gather.master");
  s.m = gather_field(&Bucket::m, "all_gather.adam_m");
  s.v = gather_field(&Bucket::v, "all_gather.adam_v");
  s.step = step_;
  return s;
}

void LmDpTrainer::restore(const LmTrainSnapshot& s) {
  const LmWeights shapes = lm_zeros(global_, DType::fp32);
  const auto want = shapes.named_weights();
  for (const LmWeights* w : {&s.master, &s.m, &s.v}) {
    const auto got = w->named_weights();
    if (got.size() != want.size())
      throw std::invalid_argument("lm_dp restore: " + std::to_string(got.size()) + " tensors, the model has " +
                                  std::to_string(want.size()));
    for (size_t i = 0; i < want.size(); ++i)
      if (got[i].second->dtype() != DType::fp32 || got[i].second->shape() != want[i].second->shape())
        throw std::invalid_argument("lm_dp restore: " + want[i].first + " is " +
                                    runtime::dtype_name(got[i].second->dtype()) + " " +
                                    runtime::shape_str(got[i].second->shape()) + ", need fp32 " +
                                    runtime::shape_str(want[i].second->shape()));
  }
  if (s.step < 0) throw std::invalid_argument("lm_dp restore: negative step");
  work_ = lm_compute_copy(global_, s.master);
  for (Bucket& b : buckets_) {
    for (auto [src, dst] : {std::pair{&s.master, &b.master}, std::pair{&s.m, &b.m}, std::pair{&s.v, &b.v}})
      lm_take_bucket_chunk(b, *src, DType::fp32, *dst, "lm_dp");
    if (global_.dtype != DType::fp32) lm_take_bucket_chunk(b, work_, global_.dtype, b.copy, "lm_dp");
  }
  step_ = s.step;
}

LmDpMemory LmDpTrainer::memory() const {
  LmDpMemory m;
  const double P = double(runtime::dtype_size(global_.dtype));
  const bool mixed = global_.dtype != DType::fp32;
  const double K = mixed ? 12 : 8;
  const double psi = double(lm_param_count(global_));
  const double n = double(size_);
  for (const Bucket& b : buckets_) {
    // Parameters: the whole compute-dtype weights between steps, except at stage 3 (the chunk only; the gathered
    // unit is a working buffer freed after use). fp32: the master chunk is the parameters' and is counted there.
    m.params += dp_.zero == 3 ? double(b.own_n) * P : double(b.count) * P;
    m.grads += double(b.grad.nbytes());
    m.optimizer += double(b.m.nbytes() + b.v.nbytes()) + (mixed ? double(b.master.nbytes()) : 0.0);
  }
  m.activations = activation_bytes_;
  m.formula_params = P * psi / (dp_.zero >= 3 ? n : 1);
  m.formula_grads = P * psi / (dp_.zero >= 2 ? n : 1);
  m.formula_optimizer = K * psi / (dp_.zero >= 1 ? n : 1);
  return m;
}

void finish_step_loss(LmDpStepResult& r, double local_loss, runtime::Transport& replicas, const char* op) {
  int64_t bits = 0;
  std::memcpy(&bits, &local_loss, sizeof bits);
  const std::vector<int64_t> all = replicas.allgather(bits, op);
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

}  // namespace shardsim::models

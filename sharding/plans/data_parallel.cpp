#include "sharding/plans/data_parallel.h"

#include "common/byte_size.h"
#include "sharding/plans/registry.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <stdexcept>
#include <utility>

#include "collectives/algorithms.h"
#include "collectives/all_gather.h"
#include "collectives/all_reduce.h"
#include "collectives/reduce_scatter.h"
#include "collectives/types.h"
#include "runtime/chips.h"

namespace shardsim::sharding::plans {

namespace {
size_t pad_to(size_t n, size_t divisor) { return (n + divisor - 1) / divisor * divisor; }
}  // namespace

size_t bucket_alignment(int replicas) { return std::lcm(size_t(std::max(replicas, 1)), size_t(128)); }

size_t megatron_bucket_elements(int replicas) {
  return std::max<size_t>(40000000, size_t(1000000) * size_t(std::max(replicas, 1)));
}

using runtime::DType;
using runtime::Tensor;

DataParallel::DataParallel(std::vector<DpParam> params, int units, const ZeroConfig& config,
                           runtime::Transport& replicas, DType compute, bool store, const DpExperts& experts)
    : config_(config), group_(replicas), experts_(experts), dtype_(compute), store_(store), rank_(replicas.rank()),
      size_(replicas.size()), units_(units) {
  if (config.zero < 0 || config.zero > 3)
    throw std::invalid_argument("parallel.zero: must be 0, 1, 2 or 3 (got " + std::to_string(config.zero) + ")");
  if (config.bucket_bytes < 0 && config.bucket_bytes != kMegatronBuckets)
    throw std::invalid_argument("parallel.bucket_bytes: must be >= 0 (got " + std::to_string(config.bucket_bytes) +
                                ")");
  // Flat order: units in backward order, parameters in list order within a unit. Stages 1-3 lay the flat buffer
  // out as Megatron's distributed optimizer does (data_parallel.h, "Padding").
  const size_t esize = runtime::dtype_size(compute);
  const bool padded = config.zero >= 1;
  bool has_experts = false;
  for (const DpParam& p : params) has_experts = has_experts || p.expert;
  if (has_experts && !experts.replicas)
    throw std::invalid_argument("data_parallel: expert parameters without an expert-data-parallel group");
  const size_t param_align = padded ? kParamAlignment : 1;
  unit_buckets_.assign(size_t(units), {});
  const auto close = [&](Bucket& b) { b.count = pad_to(b.count, padded ? bucket_alignment(group_size(b)) : 1); };
  // Megatron's rule ("Buckets"): a unit's model chunk, and the bucket limit in elements of a chunk (0: one bucket).
  const bool megatron = config.bucket_bytes == kMegatronBuckets;
  if (megatron && !config.unit_chunk.empty() && config.unit_chunk.size() != size_t(units))
    throw std::logic_error("data_parallel: unit_chunk needs one chunk per unit");
  const auto chunk = [&](int u) { return config.unit_chunk.empty() ? 0 : config.unit_chunk[size_t(u)]; };
  const size_t chunk_limit = config.overlap_grad_reduce && config.first_stage ? megatron_bucket_elements(size_) : 0;
  const auto full = [&](const Bucket& b, int u) {
    if (config.zero == 3) return b.last_unit != u;
    if (!megatron) return config.bucket_bytes > 0 && double(b.count * esize) >= double(config.bucket_bytes);
    if (chunk(b.last_unit) != chunk(u)) return true;
    return chunk(u) == 0 && chunk_limit > 0 && b.count >= chunk_limit;
  };
  // The dense parameters' buckets, then the experts' (a bucket holds one group's).
  for (const bool expert : {false, true}) {
  const size_t first = buckets_.size();
  for (int u = units - 1; u >= 0; --u)
    for (size_t i = 0; i < params.size(); ++i) {
      if (params[i].unit != u || params[i].expert != expert) continue;
      const bool new_bucket = buckets_.size() == first || full(buckets_.back(), u);
      if (new_bucket) {
        if (buckets_.size() > first) close(buckets_.back());
        buckets_.emplace_back();
        buckets_.back().expert = expert;
      }
      Bucket& b = buckets_.back();
      b.count = pad_to(b.count, param_align);
      b.slots.push_back({i, u, b.count, params[i].numel, params[i].counted, params[i].no_decay});
      b.count += params[i].numel;
      b.real += params[i].numel;
      b.last_unit = u;  // flat order visits units downwards: the last one is the latest completed
      auto& ub = unit_buckets_[size_t(u)];  // stage 3: the unit's dense bucket, then its experts'
      if (ub.empty() || ub.back() != int(buckets_.size()) - 1) ub.push_back(int(buckets_.size()) - 1);
    }
  if (buckets_.size() > first) close(buckets_.back());
  }
  for (Bucket& b : buckets_) {
    const collectives::Partition p{b.count, size_t(group_size(b))};
    b.own_off = config.zero >= 1 ? p.offset(size_t(group_rank(b))) : 0;
    b.own_n = config.zero >= 1 ? p.size(size_t(group_rank(b))) : b.count;
    b.master = Tensor::make(DType::fp32, {int64_t(b.own_n)}, store_);
    const bool state = store_ && !config.forward_only;  // gradients and moments: a training run's only
    b.m = Tensor::make(DType::fp32, {int64_t(b.own_n)}, state);
    b.v = Tensor::make(DType::fp32, {int64_t(b.own_n)}, state);
    if (compute != DType::fp32) b.copy = Tensor::make(compute, {int64_t(b.own_n)}, store_);
    b.grad = Tensor::make(compute, {int64_t(config.zero >= 2 ? b.own_n : b.count)}, state);
  }
  gather_pending_.assign(buckets_.size(), false);
  gather_end_.assign(buckets_.size(), -1);
  if (!config.forward_only) {  // the optimizer's and the norm's launches: the most any replica has
    int replicas = 1;
    if (config.zero >= 1)
      for (const Bucket& b : buckets_) replicas = std::max(replicas, group_size(b));
    for (int r = 0; r < replicas; ++r) {
      // FusedAdam steps each parameter group with a multi_tensor_apply of its own: the weight-decay group, then
      // the no-decay group (DpParam::no_decay); the gradient norm is one multi_tensor_l2norm over all of them.
      std::vector<int64_t> adam;
      for (int g : {0, 1})
        for (int64_t n : kernels::multi_tensor_launches(pieces_of(r, g), compute != DType::fp32 ? 5 : 4))
          adam.push_back(n);
      auto norm = kernels::multi_tensor_launches(pieces_of(r), 1);
      if (adam.size() > adam_launches_.size()) adam_launches_ = std::move(adam);
      if (norm.size() > norm_launches_.size()) norm_launches_ = std::move(norm);
    }
  }
  check_fold();
}

void DataParallel::check_fold() const {
  // A folded run (docs/performance/fold.md) decides here, before its first step, whether every replica runs this
  // plan's calls over the replicas alike: each bucket's reduction and parameter gather (the run-time checks say
  // the same words if anything slips past this).
  collectives::CollectiveOptions o;
  o.algorithm = config_.algorithm;
  using collectives::Collective;
  for (const Bucket& b : buckets_) {
    runtime::Transport& g = group(b);  // the replicas, or the experts' replicas
    if (group_size(b) == 1 || !g.spans_mirrored()) continue;
    std::string why =
        config_.zero == 0
            ? collectives::fold_obstacle(Collective::all_reduce, o, g, b.count, dtype_, "all_reduce.grads")
            : collectives::fold_obstacle(Collective::reduce_scatter, o, g, b.count, dtype_, "reduce_scatter.grads");
    if (why.empty() && config_.zero >= 1)
      why = collectives::fold_obstacle(Collective::all_gather, o, g, b.count, dtype_, "all_gather.params");
    if (!why.empty()) runtime::chips::fold_refused(why);
  }
}

void DataParallel::pack(const Bucket& b, const TensorRefs& w, Tensor& flat) const {
  if (!flat.has_storage()) return;  // shape-only: no bytes to move
  const size_t es = runtime::dtype_size(flat.dtype());
  for (const Slot& s : b.slots) {
    const Tensor& t = *w.at(s.index);
    if (t.dtype() != flat.dtype()) throw std::logic_error("data_parallel: pack dtype mismatch");
    std::memcpy(static_cast<char*>(flat.data()) + s.offset * es, t.data(), s.numel * es);
  }
}

void DataParallel::unpack(const Bucket& b, const Tensor& flat, const TensorRefs& w) const {
  if (!flat.has_storage()) return;
  const size_t es = runtime::dtype_size(flat.dtype());
  for (const Slot& s : b.slots) {
    Tensor& t = *w.at(s.index);
    if (t.dtype() != flat.dtype()) throw std::logic_error("data_parallel: unpack dtype mismatch");
    std::memcpy(t.data(), static_cast<const char*>(flat.data()) + s.offset * es, s.numel * es);
  }
}

void DataParallel::take_chunk(const Bucket& b, const TensorRefs& w, DType dtype, Tensor& dst) const {
  Tensor flat(dtype, {int64_t(b.count)});
  pack(b, w, flat);
  const size_t es = runtime::dtype_size(dtype);
  std::memcpy(dst.data(), static_cast<const char*>(flat.data()) + b.own_off * es, b.own_n * es);
}

void DataParallel::load(const TensorRefs& master, const TensorRefs* m, const TensorRefs* v, const TensorRefs& work) {
  gather_pending_.assign(buckets_.size(), false);  // WORK is the caller's, current
  gather_end_.assign(buckets_.size(), -1);
  if (!store_) return;  // shape-only: nothing to hold
  for (Bucket& b : buckets_) {
    take_chunk(b, master, DType::fp32, b.master);
    if (m) take_chunk(b, *m, DType::fp32, b.m);
    if (v) take_chunk(b, *v, DType::fp32, b.v);
    if (dtype_ != DType::fp32) take_chunk(b, work, dtype_, b.copy);
  }
}

sim::TimeNs DataParallel::gather_bucket(Bucket& b, const TensorRefs& work, sim::TimeNs ready) {
  const Tensor& src = dtype_ == DType::fp32 ? b.master : b.copy;
  if (group_size(b) == 1) {  // the chunk is the whole bucket
    unpack(b, src, work);
    return ready;
  }
  Tensor flat = Tensor::make(dtype_, {int64_t(b.count)}, store_);
  collectives::CollectiveOptions o;
  o.algorithm = config_.algorithm;
  o.name = "all_gather.params";
  const auto r = collectives::all_gather(group(b), src.data_if_stored(), flat.data_if_stored(), b.count, dtype_, ready, o);
  unpack(b, flat, work);
  return r.span.end;
}

void DataParallel::begin_step() {
  fwd_start_.assign(size_t(units_), 0);
  bwd_start_.assign(size_t(units_), 0);
  grad_ready_.assign(size_t(units_), 0);
  gather_end_.assign(buckets_.size(), -1);
}

sim::TimeNs DataParallel::begin_forward(int unit, const TensorRefs& work, sim::TimeNs t) {
  if (config_.zero == 3) {  // issued when the previous unit started: one unit ahead
    const sim::TimeNs issue_at = unit == 0 ? 0 : fwd_start_[size_t(unit - 1)];
    for (int b : unit_buckets_[size_t(unit)]) t = std::max(t, gather_bucket(buckets_[size_t(b)], work, issue_at));
  }
  // overlap_param_gather: the previous step's deferred parameter gathers, by the unit each bucket opens in forward
  // order (its last_unit). This unit's are issued now unless already prefetched and awaited; then the next unit's
  // are issued, overlapping this unit's forward (Megatron dispatches the next bucket's all_gather when it waits for
  // the current one).
  const auto issue = [&](int u, sim::TimeNs at) {
    for (size_t i = 0; i < buckets_.size(); ++i)
      if (gather_pending_[i] && buckets_[i].last_unit == u) {
        gather_pending_[i] = false;
        gather_end_[i] = gather_bucket(buckets_[i], work, at);
      }
  };
  issue(unit, t);
  bool waited = false;
  for (size_t i = 0; i < buckets_.size(); ++i)
    if (gather_end_[i] >= 0 && buckets_[i].last_unit == unit) {
      t = std::max(t, gather_end_[i]);
      gather_end_[i] = -1;
      waited = true;
    }
  if (waited) {
    int next = -1;
    for (size_t i = 0; i < buckets_.size(); ++i)
      if (gather_pending_[i] && buckets_[i].last_unit > unit && (next < 0 || buckets_[i].last_unit < next))
        next = buckets_[i].last_unit;
    if (next >= 0) issue(next, t);
  }
  fwd_start_[size_t(unit)] = t;
  return t;
}

sim::TimeNs DataParallel::begin_backward(int unit, const TensorRefs& work, sim::TimeNs t) {
  if (config_.zero == 3) {  // a unit without parameters gathers nothing
    const sim::TimeNs issue_at = unit == units_ - 1 ? fwd_start_[size_t(unit)] : bwd_start_[size_t(unit + 1)];
    for (int b : unit_buckets_[size_t(unit)]) t = std::max(t, gather_bucket(buckets_[size_t(b)], work, issue_at));
  }
  bwd_start_[size_t(unit)] = t;
  return t;
}

void DataParallel::grads_ready(int unit, sim::TimeNs t) { grad_ready_[size_t(unit)] = t; }

void DataParallel::all_grads_ready(sim::TimeNs t) {
  for (auto& r : grad_ready_) r = t;
}

// Stage 0: B.grad (the whole bucket) = all_reduce(avg). Stage 1: the packed gradients go into B.grad (the whole
// bucket) and reduce_scatter(avg) writes the owned chunk in place at own_off (reduce_scatter copies its send buffer
// before it writes the receive buffer, so the two may overlap). Stages 2-3: reduce_scatter(avg) of the packed
// gradients into B.grad (the chunk). A single replica issues none (the average of one gradient is itself).
sim::TimeNs DataParallel::reduce_bucket(Bucket& b, const TensorRefs& grads, double& sq, sim::TimeNs ready) {
  const bool store = b.grad.has_storage();
  const int zero = config_.zero;
  collectives::CollectiveOptions o;
  o.algorithm = config_.algorithm;
  const int size = group_size(b);
  const collectives::Partition p{b.count, size_t(size)};
  const size_t own_off = p.offset(size_t(group_rank(b))), own_n = p.size(size_t(group_rank(b)));
  sim::TimeNs end = ready;
  size_t base = 0;  // the bucket element at b.grad's index 0
  if (zero >= 1) {
    Tensor flat;
    if (zero >= 2) {  // b.grad is the chunk: pack into a whole-bucket buffer
      flat = Tensor::make(dtype_, {int64_t(b.count)}, store);
      pack(b, grads, flat);
    } else {
      pack(b, grads, b.grad);
    }
    if (size == 1) {
      if (zero >= 2) b.grad = std::move(flat);
    } else {
      const Tensor& whole = zero >= 2 ? flat : b.grad;
      void* out = store ? static_cast<char*>(b.grad.data()) + (zero == 1 ? own_off : 0) * runtime::dtype_size(dtype_)
                        : nullptr;
      o.name = "reduce_scatter.grads";
      end = collectives::reduce_scatter(group(b), whole.data_if_stored(), out, b.count, dtype_,
                                        collectives::ReduceOp::avg, ready, o)
                .span.end;
    }
    base = zero >= 2 ? own_off : 0;
  } else {
    pack(b, grads, b.grad);
    if (size > 1) {
      o.name = "all_reduce.grads";
      end = collectives::all_reduce(group(b), b.grad.data_if_stored(), b.grad.data_if_stored(), b.count, dtype_,
                                    collectives::ReduceOp::avg, ready, o)
                .span.end;
    }
  }
  if (!store) return end;  // shape-only: no values, the norm piece is 0
  if (b.expert && experts_.scale != 1)  // the expert gradient scaling (DpExperts)
    for (int64_t i = 0; i < b.grad.numel(); ++i) b.grad.set(i, float(b.grad.get(i) * experts_.scale));
  for (const Slot& s : b.slots) {
    if (!s.counted) continue;
    const size_t lo = std::max(s.offset, own_off), hi = std::min(s.offset + s.numel, own_off + own_n);
    for (size_t i = lo; i < hi; ++i) {
      const double g = b.grad.get(int64_t(i - base));
      sq += g * g;
    }
  }
  return end;
}

sim::TimeNs DataParallel::reduce_gradients(const TensorRefs& grads, double& sq, sim::TimeNs t) {
  if (config_.forward_only) throw std::logic_error("data_parallel: a forward-only state has no gradients to reduce");
  sim::TimeNs reduced = t;
  for (Bucket& b : buckets_)
    reduced = std::max(reduced, reduce_bucket(b, grads, sq, grad_ready_[size_t(b.last_unit)]));
  return reduced;
}

std::vector<int64_t> DataParallel::pieces_of(int r, int group) const {
  std::vector<int64_t> pieces;
  for (const Bucket& b : buckets_) {
    const collectives::Partition p{b.count, size_t(group_size(b))};
    const size_t own_off = config_.zero == 0 ? 0 : p.offset(size_t(r % group_size(b)));
    const size_t own_n = config_.zero == 0 ? b.count : p.size(size_t(r % group_size(b)));
    for (const Slot& s : b.slots) {
      if (group >= 0 && s.no_decay != (group == 1)) continue;
      const size_t lo = std::max(s.offset, own_off), hi = std::min(s.offset + s.numel, own_off + own_n);
      if (hi > lo) pieces.push_back(int64_t(hi - lo));
    }
  }
  return pieces;
}

std::vector<kernels::KernelCost> DataParallel::optimizer_step(int64_t step, const kernels::AdamWConfig& adamw,
                                                              float clip) {
  if (config_.forward_only) throw std::logic_error("data_parallel: a forward-only state has no optimizer state");
  const bool copy = dtype_ != DType::fp32;
  const size_t es = runtime::dtype_size(dtype_);
  // Not charged: Megatron's clip_grad_by_total_norm_fp32 scales the gradients with a multi_tensor_scale only when
  // the coefficient is below 1, which a shape-only run cannot know; its timing equals a real-data run's (the scaling
  // happens inside AdamW here), and published steady-state steps rarely clip.
  kernels::KernelCost opt{"adamw", 0, 0, DType::fp32, {}};
  for (Bucket& b : buckets_) {
    Tensor g;
    if (config_.zero == 1) {  // the owned chunk of the whole local gradient buffer
      g = Tensor::make(dtype_, {int64_t(b.own_n)}, store_);
      if (store_) std::memcpy(g.data(), static_cast<const char*>(b.grad.data()) + b.own_off * es, b.own_n * es);
    } else {
      g = b.grad;
    }
    const auto k = kernels::adamw_step(b.master, b.m, b.v, g, step, adamw, clip, copy ? &b.copy : nullptr);
    opt.flops += k.flops;
    opt.bytes += k.bytes;
  }
  return kernels::split_launches(opt, adam_launches_);
}

std::vector<kernels::KernelCost> DataParallel::grad_norm_cost() const {
  double n = 0;
  for (const Bucket& b : buckets_) n += double(config_.zero == 0 ? b.count : b.own_n);
  const kernels::KernelCost whole{"multi_tensor_l2norm", 2 * n, n * double(runtime::dtype_size(dtype_)), dtype_, {}};
  auto out = kernels::split_launches(whole, norm_launches_);
  out.push_back(kernels::l2norm_cleanup_cost());
  return out;
}

void DataParallel::publish(const TensorRefs& work, sim::TimeNs t) {
  const bool copy = dtype_ != DType::fp32;
  for (size_t i = 0; i < buckets_.size(); ++i) {
    Bucket& b = buckets_[i];
    if (config_.zero == 0)
      unpack(b, copy ? b.copy : b.master, work);
    else if (config_.zero <= 2 && config_.overlap_param_gather)
      gather_pending_[i] = true;  // gathered at the next step's forward (begin_forward)
    else if (config_.zero <= 2)
      gather_bucket(b, work, t);
  }
}

void DataParallel::gather_state(Field field, const TensorRefs& out) {
  if (!store_) throw std::logic_error("data_parallel: a shape-only run has no state to gather");
  if (config_.forward_only && field != Field::master)
    throw std::logic_error("data_parallel: a forward-only state has no AdamW moments");
  Tensor Bucket::*member = field == Field::master ? &Bucket::master : field == Field::m ? &Bucket::m : &Bucket::v;
  const char* name = field == Field::master ? "all_gather.master" : field == Field::m ? "all_gather.adam_m"
                                                                                       : "all_gather.adam_v";
  for (Bucket& b : buckets_) {
    if (config_.zero == 0 || group_size(b) == 1) {
      unpack(b, b.*member, out);
      continue;
    }
    Tensor flat(DType::fp32, {int64_t(b.count)});
    collectives::CollectiveOptions o;
    o.algorithm = config_.algorithm;
    o.name = name;
    collectives::all_gather(group(b), (b.*member).data(), flat.data(), b.count, DType::fp32,
                            group_.timeline().end_time(), o);
    unpack(b, flat, out);
  }
}

double DataParallel::param_count() const {
  double psi = 0;
  for (const Bucket& b : buckets_) psi += double(b.real);
  return psi;
}

double DataParallel::padding() const {
  double pad = 0;
  for (const Bucket& b : buckets_) pad += double(b.count - b.real);
  return pad;
}

DpMemory DataParallel::memory() const {
  DpMemory m;
  const bool mixed = dtype_ != DType::fp32;
  const double P = double(runtime::dtype_size(dtype_)), K = mixed ? 12 : 8;
  for (const Bucket& b : buckets_) {
    // Parameters: the whole compute-dtype weights between steps, except at stage 3 (the chunk; the gathered unit
    // is a working buffer). fp32: the master chunk is the parameters' and is counted there.
    m.params += config_.zero == 3 ? double(b.own_n) * P : double(b.count) * P;
    m.grads += double(b.grad.nbytes());
    m.optimizer += double(b.m.nbytes() + b.v.nbytes()) + (mixed ? double(b.master.nbytes()) : 0.0);
  }
  m.padding = padding();
  m.psi = param_count();
  for (const Bucket& b : buckets_) {  // each bucket over its own group's N_d
    const double psi = double(b.real), nd = double(group_size(b));
    m.formula_params += P * psi / (config_.zero >= 3 ? nd : 1);
    m.formula_grads += P * psi / (config_.zero >= 2 ? nd : 1);
    m.formula_optimizer += K * psi / (config_.zero >= 1 ? nd : 1);
  }
  return m;
}

}  // namespace shardsim::sharding::plans

// ==== plan registration (sharding/plans/registry.h: the descriptor make_registry() lists) ====

namespace shardsim::sharding::plans {

namespace {

// ---- dp: data parallel, ZeRO stages, gradient buckets and their overlap (data_parallel.h) ----
void dp_read(const PlanParse& c, ParallelPlan& p) {
  if (!c.given) return;
  p.zero = static_cast<int>(c.par.get_int_in("zero", 0, 3, 0));
  if (c.par.has("bucket_bytes") && c.par.child("bucket_bytes").printable_text() == "auto")
    p.bucket_bytes = -1;
  else
    p.bucket_bytes = config_bytes_in(c.par, "bucket_bytes", 0, SpecBounds::bucket_bytes, p.bucket_bytes);
  p.overlap_grad_reduce = c.par.get_bool("overlap_grad_reduce", !p.sp);
  p.overlap_param_gather = c.par.get_bool("overlap_param_gather", false);
  if (p.overlap_param_gather && (p.zero < 1 || p.zero > 2))
    c.fail("overlap_param_gather",
           "needs zero 1 or 2 (the distributed optimizer's parameter all_gather; ZeRO-3 "
           "gathers before every use already)");
}
void dp_check(const PlanParse& c, const ParallelPlan& p) {
  const ModelSpec& s = c.model;
  if (!c.train()) {
    if (s.batch != 0 && s.batch != p.dp)
      c.at("dp").fail("model.batch other than dp (one sequence per replica): not implemented yet in " +
                      std::string(spec_use_name(c.use)));
    return;
  }
  if (s.batch % p.dp != 0)
    c.fail("dp", "the global batch (model.batch " + std::to_string(s.batch) + " sequences) must be a multiple of dp (" +
                     std::to_string(p.dp) + ")");
  if (s.micro_batch > 0 && (s.batch / p.dp) % s.micro_batch != 0) {
    const ConfigNode at = c.model_at("micro_batch");
    const std::string path = c.root.has("workload") ? c.root.child("workload").path() : "model";
    at.fail(path + ".micro_batch: " + std::to_string(s.micro_batch) + " sequences per micro-batch must divide the " +
            std::to_string(s.batch / p.dp) + " sequences of each data-parallel replica (model.batch / dp = " +
            std::to_string(s.batch) + " / " + std::to_string(p.dp) + ")");
  }
}
std::string dp_text(const ModelSpec&, const ParallelPlan& p, bool train_mode) {
  if (!train_mode) return "data parallel dp=" + std::to_string(p.dp) + " (replicas)";
  const int nd = p.dp * p.cp * p.ulysses;
  std::string t = "data parallel dp=" + std::to_string(p.dp) + " (gradients averaged over " +
                  (nd != p.dp ? std::string(p.cp > 1 ? "dp x cp = " : "dp x ulysses = ") + std::to_string(nd) : "dp") +
                  ", ZeRO stage " + std::to_string(p.zero) + ", ";
  if (p.zero == 3)
    t += "reduced per unit";
  else if (p.bucket_bytes == 0)
    t += "one reduction after the backward";
  else if (p.bucket_bytes < 0)
    t += p.overlap_grad_reduce ? "Megatron's buckets (max(40M, 1M x " + std::to_string(nd) +
                                     ") elements on the first stage's first model chunk, one bucket per chunk "
                                     "elsewhere) reduced as ready"
                               : "one bucket per model chunk, reduced after the backward (Megatron's rule)";
  else
    t += "buckets of " + std::to_string(p.bucket_bytes) + " bytes reduced " +
         (p.overlap_grad_reduce ? "as ready" : "after the backward");
  if (p.overlap_param_gather) t += ", parameter all_gather overlapping the next forward";
  return t + ")";
}

}  // namespace

namespace {
const PlanModes kGradientsOnly{ModeUse::no_effect, ModeUse::runs, ModeUse::no_effect, "no gradients to reduce"};
}  // namespace

PlanDescriptor dp_plan_descriptor() {
  PlanDescriptor d;
  d.name = "dp";
  d.title = "data parallel";
  d.summary =
      "replicas on the outermost axis but pp: the batch split over them, gradients averaged in buckets "
      "overlapping the backward, optimizer state sharded by ZeRO stage 0-3 "
      "(sharding/plans/data_parallel.h)";
  d.axis = "dp";
  d.size = &ParallelPlan::dp;
  d.keys = {{"dp", PlanValue::size, kPlanSizes, "chips / (tp x cp x ulysses x ep x pp); MLP: 1",
             "data-parallel replicas", true},
            {"zero", PlanValue::number, "0..3", "0",
             "ZeRO stage over the dp (x cp) replicas (forward: stage 3 all_gathers the parameters)"},
            {"bucket_bytes", PlanValue::number, "auto | 0..2^50 (or 25M, 1G)", "auto (Megatron's rule)",
             "gradient bucket bytes (0: one reduction after the backward)", false, true, kGradientsOnly},
            {"overlap_grad_reduce", PlanValue::flag, "true | false", "true; with sp false",
             "each bucket reduced as soon as its gradients are ready", false, false, kGradientsOnly},
            {"overlap_param_gather", PlanValue::flag, "true | false", "false",
             "ZeRO 1-2: the parameter all_gather overlaps the next forward", false, false,
             PlanModes{ModeUse::no_effect, ModeUse::runs, ModeUse::no_effect, "no optimizer step to gather after"}}};
  d.read = dp_read;
  d.check = dp_check;
  d.text = dp_text;
  d.example = {
      plan_test_model("", "dp: 2, zero: 1, bucket_bytes: 1M, overlap_grad_reduce: false, overlap_param_gather: true"),
      SpecUse::train, 2, ""};
  d.bad_cases = {{plan_test_model("", "dp: 4"), SpecUse::train, 4, "dp"},
                 {plan_test_model("", "overlap_param_gather: true"), SpecUse::train, 1, "overlap_param_gather"},
                 {std::string(kPlanTestBlock) + "parallel: {tp: 4, bucket_bytes: 1M}\n", SpecUse::block, 4,
                  "bucket_bytes"}};
  return d;
}

}  // namespace shardsim::sharding::plans

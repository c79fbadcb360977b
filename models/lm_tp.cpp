#include "models/lm_tp.h"

#include <mpi.h>

#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>
#include <sstream>
#include <stdexcept>

#include "collectives/algorithms.h"
#include "collectives/all_gather.h"
#include "collectives/all_reduce.h"
#include "collectives/all_to_all.h"
#include "collectives/reduce_scatter.h"
#include "kernels/attention.h"
#include "kernels/attention_backward.h"
#include "kernels/backward.h"
#include "kernels/cross_entropy.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/fp8.h"
#include "kernels/gemm.h"
#include "kernels/mse_loss.h"
#include "kernels/norm.h"
#include "models/lm_data.h"
#include "runtime/chips.h"
#include "runtime/world.h"
#include "sharding/fused.h"
#include "sharding/plans/context_parallel.h"
#include "sharding/plans/tensor_parallel.h"
#include "sharding/plans/ulysses.h"

namespace shardsim::models {

using runtime::DType;
using runtime::Tensor;

namespace {

kernels::AttentionOptions causal(bool on) {
  kernels::AttentionOptions o;
  o.causal = on;
  return o;
}

bool is_norm(const std::string& name) { return name.find("norm") != std::string::npos; }


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

bool LmTpTrainer::owns(const std::string& name) const {
  if (name == "embed" || name == "pos_embed") return owns_embed_;
  if (name == "final_norm" || name == "final_norm_b" || name == "head") return owns_head_;
  return true;  // every block of local_ is this chip's
}

sharding::plans::TensorRefs LmTpTrainer::prefs(LmWeights& w) const {
  sharding::plans::TensorRefs out;
  for (auto& [name, t] : w.named_weights())
    if (owns(name)) out.push_back(t);
  return out;
}

LmWeights LmTpTrainer::own_layers(const LmWeights& whole) const {
  if (pp_size_ == 1) return whole;
  LmWeights out = whole;
  out.layers.clear();
  for (int64_t g : layer_global_) out.layers.push_back(whole.layers[size_t(g)]);
  return out;
}

bool LmTpTrainer::replicated_kv(const std::string& name) const {
  if (kv_rep_ == 1) return false;
  const auto dot = name.rfind('.');
  const std::string leaf = dot == std::string::npos ? name : name.substr(dot + 1);
  return leaf == "wk" || leaf == "wv";
}

LmTpTrainer::Split LmTpTrainer::split_of(const std::string& name, bool expert_tp) {
  if (is_norm(name) || name == "pos_embed") return Split::replicate;
  if (name.find(".moe.") != std::string::npos && (!expert_tp || name.ends_with(".router"))) return Split::replicate;
  if (name == "embed") return Split::rows;
  const auto dot = name.rfind('.');
  const std::string leaf = dot == std::string::npos ? name : name.substr(dot + 1);
  if (leaf == "wo" || leaf == "w_down") return Split::rows;
  return Split::cols;  // wq, wk, wv, w_gate, w_up, head
}

LmTpTrainer::LmTpTrainer(const LmConfig& global, const LmTrainConfig& train, sharding::DeviceMesh& mesh,
                         runtime::Transport& world, sim::Timeline& timeline, std::string algorithm, bool sequence_parallel)
    : LmTpTrainer(global, train, mesh, world, timeline, LmDpConfig{.zero = 0, .bucket_bytes = 0, .algorithm = std::move(algorithm)},
                  sequence_parallel, true) {}

LmTpTrainer::LmTpTrainer(const LmConfig& global, const LmTrainConfig& train, sharding::DeviceMesh& mesh,
                         runtime::Transport& world, sim::Timeline& timeline, const LmDpConfig& dp,
                         bool sequence_parallel, bool cp_zigzag, bool ulysses, bool fused)
    : global_(global), local_(global), train_(train), mesh_(mesh), world_(world), tl_(timeline), dp_(dp),
      algorithm_(dp.algorithm), sp_(sequence_parallel), zigzag_(cp_zigzag && !ulysses), ulysses_(ulysses),
      fused_(fused), store_(!world.shape_only()) {
  check_lm_config(global);
  for (const auto& a : mesh.axes())
    if (a.size > 1 && a.name != "tp" && a.name != "dp" && a.name != "cp" && a.name != "pp" && a.name != "ep")
      throw std::invalid_argument("parallel: train runs on pp x dp x ep x cp x tp meshes only (got " + mesh.describe() + ")");
  tp_size_ = mesh.size("tp");
  ep_size_ = mesh.size("ep");
  etp_ = dp.etp;
  dp_size_ = mesh.size("dp") * ep_size_;  // ep: for attention and the dense weights one more data-parallel axis
  if (fused_ && (tp_size_ < 2 || (!sp_ && !dp.forward_only)))
    throw std::invalid_argument("parallel.fused: the trainer fuses the sequence-parallel collectives with their GEMMs "
                                "(all_gather + column-parallel GEMM, GEMM + reduce_scatter); needs tp > 1 and sp: true");
  const int r = world.rank();
  tp_rank_ = mesh.coordinate("tp", r);
  ep_rank_ = mesh.coordinate("ep", r);
  dp_rank_ = ep_rank_ + ep_size_ * mesh.coordinate("dp", r);
  cp_size_ = mesh.size("cp");
  cp_rank_ = mesh.coordinate("cp", r);
  pp_size_ = mesh.size("pp");
  pp_rank_ = mesh.coordinate("pp", r);
  rep_size_ = dp_size_ * cp_size_;
  rep_rank_ = cp_rank_ + cp_size_ * dp_rank_;
  auto need = [&](int64_t v, const char* field) {
    if (v % tp_size_ != 0)
      throw std::invalid_argument(std::string("model.") + field + ": " + std::to_string(v) +
                                  " must be a multiple of parallel.tp (" + std::to_string(tp_size_) + ")");
  };
  need(global.heads, "heads");
  // KV heads: split over tp, or (tp a multiple of them) replicated: each tp rank holds the one KV head of its query
  // heads' GQA group (the forward mode only: the backward would sum the replicas' dK/dV weight gradients).
  if (global.attention && dp.forward_only && global.kv_heads < tp_size_ && tp_size_ % global.kv_heads == 0)
    kv_rep_ = tp_size_ / int(global.kv_heads);
  else
    need(global.kv_heads, "kv_heads");
  need(global.ffn, "ffn");
  need(global.vocab, "vocab");
  if (global.tied_embeddings && mesh.size("pp") > 1)
    throw std::invalid_argument("model.tied_embeddings: not implemented yet with parallel.pp > 1 (the embedding and "
                                "the head live on different stages; their gradients would need an all_reduce)");
  if (global.batch % dp_size_ != 0)
    throw std::invalid_argument("model.batch: the global batch (" + std::to_string(global.batch) +
                                " sequences) must be a multiple of dp (" + std::to_string(dp_size_) + ")");
  if (ulysses_ && cp_size_ > 1) {
    if (global.heads % (int64_t(tp_size_) * cp_size_) != 0)
      throw std::invalid_argument("model.heads: " + std::to_string(global.heads) +
                                  " must be a multiple of parallel.tp x parallel.ulysses (" +
                                  std::to_string(tp_size_ * cp_size_) + "): Ulysses splits each tp rank's heads");
    // kv heads: split over U like the query heads, or, with fewer kv heads per tp rank than U, replicated (each
    // Ulysses rank receives the one kv head of its query heads' GQA group; Megatron's replication of the query
    // groups when a parallel degree exceeds them).
    const int64_t kv_l = global.kv_heads / tp_size_;
    if (global.kv_heads % tp_size_ == 0 && kv_l % cp_size_ != 0 && cp_size_ % kv_l != 0)
      throw std::invalid_argument("model.kv_heads: " + std::to_string(global.kv_heads) + " over parallel.tp " +
                                  std::to_string(tp_size_) + " leaves " + std::to_string(kv_l) +
                                  " kv heads per tp rank, neither a multiple nor a divisor of parallel.ulysses (" +
                                  std::to_string(cp_size_) + "): Ulysses splits or replicates them");
  }
  if (!global.causal && cp_size_ > 1 && !ulysses_)
    throw std::invalid_argument("model.causal: false with parallel.cp: ring attention runs the causal mask only");
  const int64_t pieces = int64_t(cp_size_) * (cp_size_ > 1 && zigzag_ ? 2 : 1);
  if (global.seq % pieces != 0)
    throw std::invalid_argument("model.seq: " + std::to_string(global.seq) + " must be a multiple of " +
                                std::to_string(pieces) + " (parallel.cp = " + std::to_string(cp_size_) +
                                (cp_size_ > 1 && zigzag_ ? ", zigzag: 2 chunks per chip" : "") + ")");
  if (sp_ && (global.seq / cp_size_) % tp_size_ != 0)
    throw std::invalid_argument("model.seq: " + std::to_string(global.seq) + (cp_size_ > 1 ? " / parallel.cp" : "") +
                                " must be a multiple of parallel.tp (" + std::to_string(tp_size_) +
                                ") for sequence parallelism");
  local_.heads /= tp_size_;
  local_.kv_heads = kv_rep_ > 1 ? 1 : local_.kv_heads / tp_size_;
  local_.ffn /= tp_size_;
  local_.vocab /= tp_size_;
  local_.batch /= dp_size_;
  if (dp.micro_batch < 0 || (dp.micro_batch > 0 && local_.batch % dp.micro_batch != 0))
    throw std::invalid_argument("model.micro_batch: " + std::to_string(dp.micro_batch) +
                                " sequences per micro-batch must divide the sequences of each data-parallel replica "
                                "(batch / dp = " + std::to_string(local_.batch) + ")");
  if (dp.micro_batch > 0) {
    micro_ = int(local_.batch / dp.micro_batch);
    local_.batch = dp.micro_batch;  // the trainer's forward and backward run one micro-batch
  }
  setup_pipeline(global);
  setup_moe();
  local_.seq /= cp_size_;  // this chip's tokens of each sequence (its cp chunks, concatenated)
  local_.positions = global.seq;  // the whole learned position table
  // Sub-groups are made collectively on first use: every rank asks for the same axes in the same order.
  (void)mesh_["tp"];
  (void)mesh_["dp"];
  (void)mesh_.excluding("dp");  // one replica's chips (the gradient norm's first stage)
  if (pp_size_ > 1) (void)mesh_["pp"];
  if (cp_size_ > 1 || ep_size_ > 1) {
    if (cp_size_ > 1) (void)mesh_["cp"];
    // The replicas of a tp shard: the dp x cp ranks of one tp coordinate (Megatron's dp-cp group; x ep: dp_rank_),
    // ordered cp-innermost. Gradients are averaged and ZeRO state partitioned over it. Its (color, key) as a rule
    // of the world rank too, so a folded run can split it over mirrored chips (the replica shift rotates its members
    // by cp x ep x the fold's period: docs/performance/fold.md).
    std::array<std::pair<int, int>, 5> ax{};  // (stride, size) of tp, pp, cp, ep, dp: coordinate(q) = q / stride % size
    const char* names[5] = {"tp", "pp", "cp", "ep", "dp"};
    for (int i = 0; i < 5; ++i)
      for (const auto& a : mesh.axes())
        if (a.name == names[i]) ax[size_t(i)] = {a.stride, a.size};
    const auto co = [ax](int i, int q) { return ax[size_t(i)].second > 0 ? q / ax[size_t(i)].first % ax[size_t(i)].second : 0; };
    rep_ = &world.subgroup("lm_tp.dp_cp", tp_rank_ + tp_size_ * pp_rank_, rep_rank_,
                           [co, tp = tp_size_, cp = cp_size_, ep = ep_size_](int q) {
                             return std::pair{co(0, q) + tp * co(1, q), co(2, q) + cp * (co(3, q) + ep * co(4, q))};
                           });
  } else {
    rep_ = &mesh_["dp"];
  }
  layout_ = sharding::plans::token_layout(global.seq, local_.batch, cp_size_, cp_rank_, zigzag_);
  // The block program's description of the model and the plan (sharding/plans/block.h).
  spec_ = lm_model_spec(global);
  plan_.tp = tp_size_;
  plan_.dp = mesh.size("dp");
  plan_.pp = pp_size_;
  plan_.ep = ep_size_;
  plan_.etp = etp_;
  (ulysses_ ? plan_.ulysses : plan_.cp) = cp_size_;
  plan_.sp = sp_;
  plan_.zigzag = zigzag_;
  plan_.fused.enabled = fused_;
  plan_.fused.chunks = dp.fused_chunks;
  plan_.algorithm = dp.algorithm;  // train's rule: one algorithm (parallel.algorithm, else auto) for every collective
  plan_.selective_recompute = dp.selective;  // the unfused core keeps no softmax output (plans/block.h)

  // Shape-only (Transport::shape_only): storage-less weights of the local shapes, nothing initialised.
  LmWeights master = store_ ? shard(own_layers(lm_init(global))) : lm_zeros(local_, DType::fp32, false);
  work_ = store_ ? lm_compute_copy(local_, master) : lm_zeros(local_, global.dtype, false);
  grads_ = lm_zeros(local_, global.dtype, store_);
  if (micro_ > 1) {
    mgrads_ = lm_zeros(local_, global.dtype, store_);
    unit_grads_.resize(size_t(local_.layers) + 2);
    const auto acc = grads_.named_weights(), one = mgrads_.named_weights();
    for (size_t i = 0; i < acc.size(); ++i)
      if (owns(acc[i].first))
        unit_grads_[size_t(lm_unit_of(acc[i].first, local_.layers))].push_back(
            {acc[i].second, one[i].second, is_norm(acc[i].first)});
  }
  // ZeRO over the replicas of this rank's shards; a replicated norm weight counts in the norm on tp coordinate 0.
  std::vector<sharding::plans::DpParam> params;
  for (const auto& [name, t] : master.named_weights())
    if (owns(name))
      params.push_back({lm_unit_of(name, local_.layers), size_t(t->numel()),
                        split_of(name, etp_ > 1) != Split::replicate || tp_rank_ == 0, expert_weight(name)});
  // A MoE model's experts: averaged over their dp replicas, scaled by 1 / ep (sharding/plans/data_parallel.h).
  const sharding::plans::DpExperts experts{ep_size_ > 1 ? &mesh_["dp"] : nullptr, 1.0 / ep_size_};
  // Megatron's bucket rule (data_parallel.h, "Buckets") needs each unit's model chunk: the embedding is chunk 0's,
  // block l its virtual stage's, the head the last chunk's.
  sharding::plans::ZeroConfig zc{dp.zero, dp.bucket_bytes, dp.algorithm, dp.overlap_param_gather};
  zc.overlap_grad_reduce = dp.overlap_grad_reduce.value_or(!sp_);
  zc.first_stage = pp_rank_ == 0;
  zc.unit_chunk.assign(size_t(local_.layers) + 2, int(chunk_first_.empty() ? 0 : chunk_first_.size() - 1));
  zc.unit_chunk[0] = 0;
  for (size_t c = 0; c < chunk_first_.size(); ++c)
    for (int64_t l = 0; l < chunk_len_[c]; ++l) zc.unit_chunk[size_t(1 + chunk_first_[c] + l)] = int(c);
  data_ = std::make_unique<sharding::plans::DataParallel>(std::move(params), static_cast<int>(local_.layers) + 2,
                                                          zc, *rep_, global.dtype, store_, experts);
  work_refs_ = prefs(work_);
  data_->load(prefs(master), nullptr, nullptr, work_refs_);
  if (mesh_.size("dp") > 1) {  // a folded run: the gradient norm's gather over dp is decided before the first step
    collectives::CollectiveOptions o;
    o.algorithm = grad_norm_gather_algorithm();
    const std::string why = collectives::fold_obstacle(collectives::Collective::all_gather, o, mesh_["dp"],
                                                       size_t(mesh_.size("dp")), DType::fp64, "all_gather.grad_norm");
    if (!why.empty()) runtime::chips::fold_broken(why);
  }
}

std::string LmTpTrainer::grad_norm_gather_algorithm() const {
  // A ring: equal 8-byte chunks, neighbours by offset, so every replica runs it alike (auto's choice for 8 bytes
  // may pair XOR partners, which a replica shift does not keep). (dp - 1) latencies.
  return algorithm_ == "auto" ? "ring" : algorithm_;
}

Tensor LmTpTrainer::make(DType dtype, runtime::Shape shape) const { return Tensor::make(dtype, std::move(shape), store_); }

void LmTpTrainer::begin_forward(int unit, sim::TimeNs& t) { t = data_->begin_forward(unit, work_refs_, t); }

void LmTpTrainer::begin_backward(int unit, sim::TimeNs& t) { t = data_->begin_backward(unit, work_refs_, t); }

LmWeights LmTpTrainer::shard(const LmWeights& whole) const {
  LmWeights out = lm_zeros(local_, whole.embed.dtype());
  auto dst = out.named_weights();
  std::map<std::string, const Tensor*> src;  // by name: a chip holds a subset of the experts (ep)
  for (const auto& [name, t] : whole.named_weights()) src[name] = t;
  const size_t es = runtime::dtype_size(whole.embed.dtype());
  for (size_t i = 0; i < dst.size(); ++i) {
    const Tensor& g = *src.at(dst[i].first);
    Tensor& l = *dst[i].second;
    switch (split_of(dst[i].first, etp_ > 1)) {
      case Split::replicate:
        l = g;
        break;
      case Split::rows:
        l = g.rows(tp_rank_ * l.dim(0), l.dim(0));
        break;
      case Split::cols: {
        const int64_t rows = g.dim(0), lc = l.dim(1), gc = g.dim(1);
        const int64_t block = replicated_kv(dst[i].first) ? tp_rank_ / kv_rep_ : tp_rank_;  // this rank's columns
        for (int64_t i0 = 0; i0 < rows; ++i0)
          std::memcpy(static_cast<char*>(l.data()) + size_t(i0 * lc) * es,
                      static_cast<const char*>(g.data()) + size_t(i0 * gc + block * lc) * es, size_t(lc) * es);
        break;
      }
    }
  }
  return out;
}

LmWeights LmTpTrainer::gather(const LmWeights& local) {
  if (!store_) throw std::logic_error("lm_tp: a shape-only run has no weights to gather");
  const DType dt = local.embed.dtype();
  LmConfig whole_tp = global_;  // global shapes, this chip's layers (every expert: ep's are shared below)
  whole_tp.layers = local_.layers;
  LmWeights out = lm_zeros(whole_tp, dt);
  auto dst = out.named_weights();
  std::map<std::string, const Tensor*> src;
  for (const auto& [name, t] : local.named_weights()) src[name] = t;
  const size_t es = runtime::dtype_size(dt);
  runtime::Transport& tp = mesh_["tp"];
  for (size_t i = 0; i < dst.size(); ++i) {
    if (!src.count(dst[i].first)) continue;  // another ep rank's expert
    const Tensor& l = *src.at(dst[i].first);
    Tensor& g = *dst[i].second;
    const Split s = split_of(dst[i].first, etp_ > 1);
    if (s == Split::replicate) {
      g = l;
      continue;
    }
    Tensor all(dt, {int64_t(l.numel()) * tp_size_});
    collectives::CollectiveOptions o;
    o.algorithm = algorithm_;
    o.name = "all_gather.state";
    collectives::all_gather(tp, l.data(), all.data(), size_t(all.numel()), dt, tl_.end_time(), o);  // count: the whole
    if (s == Split::rows) {
      std::memcpy(g.data(), all.data(), size_t(g.numel()) * es);
    } else {
      // Column block j of the whole from tp rank j (replicated KV heads: from the first rank of each head's group).
      const int64_t rows = l.dim(0), lc = l.dim(1), gc = g.dim(1), step = replicated_kv(dst[i].first) ? kv_rep_ : 1;
      for (int64_t j = 0; j * lc < gc; ++j)
        for (int64_t i0 = 0; i0 < rows; ++i0)
          std::memcpy(static_cast<char*>(g.data()) + size_t(i0 * gc + j * lc) * es,
                      static_cast<const char*>(all.data()) + size_t(j * step * l.numel() + i0 * lc) * es,
                      size_t(lc) * es);
    }
  }
  if (ep_size_ > 1) share_experts(out);
  return pp_size_ > 1 ? gather_stages(out) : out;
}

LmWeights LmTpTrainer::gather_field(sharding::plans::DataParallel::Field field) {
  if (!store_) throw std::logic_error("lm_tp: a shape-only run has no state to gather");
  LmWeights w = lm_zeros(local_, DType::fp32);
  data_->gather_state(field, prefs(w));
  return w;
}

LmWeights LmTpTrainer::gather_master() { return gather(gather_field(sharding::plans::DataParallel::Field::master)); }

LmTrainSnapshot LmTpTrainer::gather_state() {
  LmTrainSnapshot s;
  s.master = gather(gather_field(sharding::plans::DataParallel::Field::master));
  s.m = gather(gather_field(sharding::plans::DataParallel::Field::m));
  s.v = gather(gather_field(sharding::plans::DataParallel::Field::v));
  s.step = step_;
  return s;
}

void LmTpTrainer::restore(const LmTrainSnapshot& s) {
  if (!store_) throw std::logic_error("lm_tp: a shape-only run cannot restore a state");
  const LmWeights want = lm_zeros(global_, DType::fp32);
  const auto wn = want.named_weights();
  for (const LmWeights* w : {&s.master, &s.m, &s.v}) {
    const auto got = w->named_weights();
    if (got.size() != wn.size()) throw std::invalid_argument("lm_tp restore: tensor count differs from the model's");
    for (size_t i = 0; i < wn.size(); ++i)
      if (got[i].second->dtype() != DType::fp32 || got[i].second->shape() != wn[i].second->shape())
        throw std::invalid_argument("lm_tp restore: " + wn[i].first + " has shape " +
                                    runtime::shape_str(got[i].second->shape()));
  }
  if (s.step < 0) throw std::invalid_argument("lm_tp restore: negative step");
  LmWeights master = shard(own_layers(s.master)), m = shard(own_layers(s.m)), v = shard(own_layers(s.v));
  work_ = lm_compute_copy(local_, master);
  const auto mr = prefs(m), vr = prefs(v);
  work_refs_ = prefs(work_);
  data_->load(prefs(master), &mr, &vr, work_refs_);
  step_ = s.step;
}

std::vector<int64_t> LmTpTrainer::resid_positions() const {
  if (!sp_) return layout_.pos;
  const size_t rows = layout_.pos.size() / size_t(tp_size_);
  return {layout_.pos.begin() + std::ptrdiff_t(rows * size_t(tp_rank_)),
          layout_.pos.begin() + std::ptrdiff_t(rows * size_t(tp_rank_ + 1))};
}

void LmTpTrainer::norm_backward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor& dx, Tensor* dw, Tensor* db,
                                sim::TimeNs& t) {
  const LmConfig& c = local_;
  charge(c.layernorm() ? kernels::layernorm_backward(x, w, dy, dx, dw, db, c.norm_eps)
                       : kernels::rmsnorm_backward(x, w, dy, dx, dw, c.norm_eps),
         t);
}

void LmTpTrainer::charge(const kernels::KernelCost& k, sim::TimeNs& t) {
  t = tl_.compute(k.name, k.flops, k.bytes, runtime::precision_of(k.dtype), t, k.shape).end;
}

void LmTpTrainer::all_reduce_tp(Tensor& x, collectives::ReduceOp op, sim::TimeNs& t, const char* name) {
  if (tp_size_ == 1) return;
  collectives::CollectiveOptions o;
  o.algorithm = algorithm_;
  o.name = name;
  t = collectives::all_reduce(mesh_["tp"], x.data_if_stored(), x.data_if_stored(), size_t(x.numel()), x.dtype(), op, t,
                              o).span.end;
}

sharding::plans::PlanContext LmTpTrainer::context(sharding::plans::Chip& chip) {
  const int64_t N = local_.batch * local_.seq;
  return {spec_, plan_, mesh_["tp"], cp_size_ > 1 ? mesh_["cp"] : mesh_["tp"], chip, comm_, fused_ops_, N,
          sp_ ? N / tp_size_ : N};
}

void LmTpTrainer::block_forward(int64_t l, Tensor& x, LmCache::Layer& S, sim::TimeNs& t) {
  const kernels::Fp8Scope fp8(fp8_recipe());  // the block's linear layers in FP8 (model.fp8; none: no change)
  const LmLayer& L = work_.layers[size_t(l)];
  sharding::plans::Chip chip{&tl_, t};
  auto ctx = context(chip);
  x = sharding::plans::block_forward(ctx, layout_,
                                     {&L.attn_norm, &L.wq, &L.wk, &L.wv, &L.wo, &L.mlp_norm,
                                      global_.gated() ? &L.w_gate : nullptr, &L.w_up, &L.w_down, &L.attn_norm_b,
                                      &L.mlp_norm_b, block_moe(l)},
                                     x, &S);
  t = chip.t;
}

double LmTpTrainer::forward(const LmBatch& batch, LmCache& C, Tensor& x, int chunk, sim::TimeNs& t) {
  const LmConfig& c = local_;
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
    x = act({N, h});
    charge(kernels::embedding_forward(w.embed, batch.inputs, v0, V, x), t);
    x = on_chip(t, [&](auto& ctx) { return sharding::plans::tp_reduce(ctx, std::move(x), "embed"); });
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
    if (local_.moe_layer(l))
      moe_stats_[layer_global_[size_t(l)]] = {layer_global_[size_t(l)], m.routing.counts, m.local_rows(), m.aux,
                                              m.dispatch_bytes, m.dispatch_ns, m.buffer_bytes(c.hidden, c.dtype)};
    aux += m.aux;
  }
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

void LmTpTrainer::unit_grads_done(int u, int micro, sim::TimeNs& t, UnitPart part) {
  if (micro > 0)  // gradient accumulation: this micro-batch's gradients added into the step's
    for (const UnitGrad& g : unit_grads_[size_t(u)])
      if (part == UnitPart::all || g.norm == (part == UnitPart::norms)) charge(kernels::add_inplace(*g.acc, *g.one), t);
  if (micro == micro_ - 1 && part != UnitPart::norms) data_->grads_ready(u, t);
}

void LmTpTrainer::embedding_backward(const Tensor& dx_full, const std::vector<int64_t>& tokens, int micro,
                                     sim::TimeNs& t, UnitPart part) {
  const LmConfig& c = local_;
  LmWeights& g = micro > 0 ? mgrads_ : grads_;
  charge(kernels::embedding_backward(dx_full, tokens, tp_rank_ * c.vocab, global_.vocab, g.embed), t);  // unit 0
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
  const LmConfig& c = local_;
  const LmWeights& w = work_;
  LmWeights& g = micro > 0 ? mgrads_ : grads_;  // this micro-batch's gradients (the first: the step's)
  const int64_t N = c.batch * c.seq, h = c.hidden, T = c.seq, hq = c.heads, hkv = c.kv_heads, d = c.head_dim;
  const int64_t v0 = tp_rank_ * c.vocab, V = global_.vocab;
  const std::vector<int64_t>& pos = layout_.pos;
  auto act = [&](runtime::Shape sh) { return make(c.dtype, std::move(sh)); };
  using collectives::ReduceOp;
  const int head_unit = int(c.layers) + 1;
  const int ms = schedule_.model_stage(pp_rank_, chunk);
  const int64_t Nr = sp_ ? N / tp_size_ : N;
  // zb_h1: unit U's deferred dW GEMMs (nullptr: run in place), and which part of its gradients BI completes.
  auto deferred = [&](int u) { return defer ? &defer->units.emplace_back(u, sharding::plans::WeightGradGemms{}).second
                                            : nullptr; };
  const UnitPart done_part = defer ? UnitPart::norms : UnitPart::all;
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
    const LmLayer& L = w.layers[size_t(l)];
    LmLayer& G = g.layers[size_t(l)];
    if (dp_.recompute) {  // the block's forward again from its saved input (its kernels and tp collectives)
      Tensor x = C.layers[size_t(l)].x_in;
      block_forward(l, x, C.layers[size_t(l)], t);
    }
    const auto& S = C.layers[size_t(l)];
    const kernels::Fp8Scope fp8(fp8_recipe());  // the block's backward GEMMs in FP8 (model.fp8)
    for (const auto& k : kernels::block_extras_backward(
             sharding::plans::block_extras(spec_, N, Nr, (hq + 2 * hkv) * d, c.ffn)))  // charged bias/dropout work
      charge(k, t);
    sharding::plans::WeightGradGemms* dl = deferred(int(l) + 1);
    Tensor dnorm = act({Nr, h});
    const bool moe = local_.moe_layer(l);
    Tensor dact = act({N, moe ? 0 : c.ffn}), dgate = act({N, moe ? 0 : c.ffn}), dup = act({N, moe ? 0 : c.ffn});
    if (!moe)
      on_chip(t, [&](auto& ctx) {
        sharding::plans::row_parallel_backward(ctx, S.act, L.w_down, dx, dact, G.w_down, "dmlp_out", dl);
        return 0;
      });
    const Tensor dm_r = moe ? moe_backward(L, G, S, dx, t) : on_chip(t, [&](auto& ctx) {  // column-parallel gate/up
      if (!c.gated()) {
        charge(kernels::gelu_backward(S.up, dact, dup), ctx.chip.t);
        return sharding::plans::column_parallel_backward(ctx, S.m, {&L.w_up}, {&dup}, {&G.w_up}, "dmlp_in", dl);
      }
      charge(kernels::swiglu_backward(S.gate, S.up, dact, dgate, dup), ctx.chip.t);
      return sharding::plans::column_parallel_backward(ctx, S.m, {&L.w_gate, &L.w_up}, {&dgate, &dup},
                                                       {&G.w_gate, &G.w_up}, "dmlp_in", dl);
    });
    norm_backward(S.x_mid, L.mlp_norm, dm_r, dnorm, &G.mlp_norm, &G.mlp_norm_b, t);
    charge(kernels::add_inplace(dx, dnorm), t);
    if (c.attention) {  // the attention sublayer's backward (none in an MLP-only block)
      const Tensor o2 = Tensor(S.o).reshaped({N, hq * d});
      Tensor do2 = act({N, hq * d});
      on_chip(t, [&](auto& ctx) {
        sharding::plans::row_parallel_backward(ctx, o2, L.wo, dx, do2, G.wo, "dattn_out", dl);
        return 0;
      });
      const Tensor dout = std::move(do2).reshaped({N, hq, d});
      Tensor dq = act({N, hq, d}), dk = act({N, hkv, d}), dv = act({N, hkv, d});
      if (cp_size_ > 1 && ulysses_) {
        const int64_t Tg = global_.seq, hu = hq / cp_size_, hku = std::max<int64_t>(1, hkv / cp_size_);
        const Tensor doh = seq_to_heads(dout, t, "do");
        Tensor dqh = act({c.batch * Tg, hu, d}), dkh = act({c.batch * Tg, hku, d}), dvh = act({c.batch * Tg, hku, d});
        for (int64_t b = 0; b < c.batch; ++b) {
          Tensor dqb = act({Tg, hu, d}), dkb = act({Tg, hku, d}), dvb = act({Tg, hku, d});
          charge(kernels::attention_backward(S.q.rows(b * Tg, Tg), S.k.rows(b * Tg, Tg), S.v.rows(b * Tg, Tg),
                                             S.o_heads.rows(b * Tg, Tg), S.lse[size_t(b)], doh.rows(b * Tg, Tg), dqb,
                                             dkb, dvb, causal(c.causal)),
                 t);
          dqh.set_rows(b * Tg, dqb);
          dkh.set_rows(b * Tg, dkb);
          dvh.set_rows(b * Tg, dvb);
        }
        dq = heads_to_seq(dqh, hq, t, "dq");
        dk = heads_to_seq(dkh, hkv, t, "dk");  // replicated kv heads: the Ulysses ranks' partial dK/dV are summed
        dv = heads_to_seq(dvh, hkv, t, "dv");
      } else if (cp_size_ > 1) {
        auto ring = cp_ring();
        sharding::plans::Chip chip{&tl_, t};
        sharding::plans::ring_attention_backward(ring, seq_shard(), S.q, S.k, S.v, S.o, S.lse, dout, dq, dk, dv, chip);
        t = chip.t;
      } else if (c.unfused_attention()) {  // Megatron's core, from the kept (or recomputed) softmax output
        sharding::plans::unfused_attention_backward(spec_, S.q, S.k, S.v, S.probs, dout, dq, dk, dv, c.batch, T,
                                                    [&](const kernels::KernelCost& k) { charge(k, t); });
      } else
      for (int64_t b = 0; b < c.batch; ++b) {
        Tensor dqb = act({T, hq, d}), dkb = act({T, hkv, d}), dvb = act({T, hkv, d});
        charge(kernels::attention_backward(S.q.rows(b * T, T), S.k.rows(b * T, T), S.v.rows(b * T, T),
                                           S.o.rows(b * T, T), S.lse[size_t(b)], dout.rows(b * T, T), dqb, dkb, dvb,
                                           causal(c.causal)),
               t);
        dq.set_rows(b * T, dqb);
        dk.set_rows(b * T, dkb);
        dv.set_rows(b * T, dvb);
      }
      if (c.position == sharding::PositionKind::rope) {
        charge(kernels::rope_backward_inplace(dq, pos, c.rope_theta), t);
        charge(kernels::rope_backward_inplace(dk, pos, c.rope_theta), t);
      }
      const Tensor dq2 = std::move(dq).reshaped({N, hq * d}), dk2 = std::move(dk).reshaped({N, hkv * d}),
                   dv2 = std::move(dv).reshaped({N, hkv * d});
      const Tensor da_r = on_chip(t, [&](auto& ctx) {  // column-parallel q/k/v
        return sharding::plans::column_parallel_backward(ctx, S.a, {&L.wq, &L.wk, &L.wv}, {&dq2, &dk2, &dv2},
                                                         {&G.wq, &G.wk, &G.wv}, "dattn_in", dl);
      });
      norm_backward(S.x_in, L.attn_norm, da_r, dnorm, &G.attn_norm, &G.attn_norm_b, t);
      charge(kernels::add_inplace(dx, dnorm), t);
      }
    unit_grads_done(int(l) + 1, micro, t, done_part);
    if (dp_.recompute) {  // the rebuilt block is freed again after its backward
      Tensor keep = std::move(C.layers[size_t(l)].x_in);
      C.layers[size_t(l)] = LmCache::Layer{};
      C.layers[size_t(l)].x_in = std::move(keep);
    }
  }
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
  const LmConfig& c = local_;
  if (sp_) {
    // Each rank differentiated the norms over its token rows only: all_reduce(sum) of the norm weights'
    // gradients over tp (one packed buffer; Megatron's allreduce of sequence-parallel layer norm grads).
    std::vector<Tensor*> norms;
    for (auto& [name, gt] : grads_.named_weights())  // the step's (accumulated) gradients
      if (is_norm(name) && owns(name)) norms.push_back(gt);
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

double LmTpTrainer::sum_over_tp(double v) {
  int64_t bits = 0;
  std::memcpy(&bits, &v, sizeof bits);
  double sum = 0;
  for (int64_t b : mesh_["tp"].allgather(bits, "lm loss tp")) {
    double x = 0;
    std::memcpy(&x, &b, sizeof x);
    sum += x;  // in tp order: the same sum on every tp rank
  }
  return sum;
}

double LmTpTrainer::start_step(LmDpStepResult& r, sim::TimeNs& t, bool forward_only) {
  r.step = step_ + 1;
  tl_.reset();
  fused_ops_.clear();
  comm_ = {};
  moe_stats_.clear();
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
  charge(data_->grad_norm_cost(), reduced);  // the local sum of squares (multi_tensor_l2norm)
  const auto [norm_sq, normed] = grad_norm_sq(sq, reduced);
  t = std::max(t, normed);
  tl_.host_sync(normed);  // the host reads the norm back before the clip and the step (clip_grad_norm's .item())
  r.grad_norm = std::sqrt(norm_sq);
  // Reported loss: the dp replicas' means (identical over tp), averaged in dp order (host-side).
  finish_step_loss(r, local_loss, *rep_);
  r.clip = train_.max_grad_norm > 0 ? kernels::clip_coefficient(r.grad_norm, train_.max_grad_norm) : 1.0;
  // AdamW on the owned chunks as one multi-tensor kernel, then the parameters back to every replica.
  charge(data_->optimizer_step(r.step, train_.adamw, float(r.clip)), t);
  // FP8: the updated weights cast once for the next step's GEMMs (Transformer Engine caches them over micro-batches).
  // Without FP8 there is no cast kernel (an empty one would still pay a launch).
  if (fp8_recipe().active()) charge(kernels::fp8_weight_cast_cost(fp8_weight_elements(), spec_.dtype, fp8_recipe()), t);
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
  r.scaling = spec_.fp8;
  return r;
}

double LmTpTrainer::fp8_weight_elements() const {
  if (spec_.fp8 == kernels::Fp8Scaling::none) return 0;
  double n = 0;
  for (const LmLayer& L : work_.layers)
    for (const Tensor* w : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down}) n += double(w->numel());
  return n;
}

double LmTpTrainer::local_param_count() const { return data_->param_count(); }

LmDpMemory LmTpTrainer::memory() const {
  LmDpMemory m;
  static_cast<sharding::plans::DpMemory&>(m) = data_->memory();  // Ψ = Ψ_tp, N_d = dp·cp
  m.activations = activation_bytes_;
  return m;
}

sharding::plans::SeqShard LmTpTrainer::seq_shard() const {
  return {local_.batch, local_.seq, local_.heads, local_.kv_heads, local_.head_dim, local_.dtype};
}

sharding::plans::CpRing LmTpTrainer::cp_ring() {
  return {mesh_["cp"], zigzag_, global_.seq, store_};
}

Tensor LmTpTrainer::seq_to_heads(const Tensor& x, sim::TimeNs& t, const std::string& name) {
  return sharding::plans::ulysses_seq_to_heads(mesh_["cp"], x, local_.batch, local_.seq, store_, t, name,
                                               plan_.algorithm_for(sharding::PlanCollective::ulysses_all_to_all));
}

Tensor LmTpTrainer::heads_to_seq(const Tensor& y, int64_t H, sim::TimeNs& t, const std::string& name) {
  return sharding::plans::ulysses_heads_to_seq(mesh_["cp"], y, H, local_.batch, local_.seq, store_, t, name,
                                               plan_.algorithm_for(sharding::PlanCollective::ulysses_all_to_all));
}

}  // namespace shardsim::models

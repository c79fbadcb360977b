// LmTpTrainer (models/lm_tp.h): construction (the plan's checks, the mesh's sub-groups, the data-parallel unit),
// the weights' placement over tp (shard, gather), the training state (gather_state, restore) and memory.
#include "models/lm_tp.h"

#include <mpi.h>

#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>
#include <sstream>
#include <stdexcept>
#include <tuple>

#include "collectives/algorithms.h"
#include "collectives/all_gather.h"
#include "collectives/all_reduce.h"
#include "collectives/all_to_all.h"
#include "collectives/reduce_scatter.h"
#include "common/error.h"
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
// A state to restore (MASTER, and M and V unless MOMENTS is false) holds LAYOUT's tensors, in order, each fp32 of
// its shape; else std::invalid_argument naming the first tensor that differs.
void check_state_layout(const LmWeights& master, const LmWeights& m, const LmWeights& v, const ModelSpec& layout,
                        bool moments) {
  const LmWeights want = lm_zeros(layout, DType::fp32, false);
  const auto wn = want.named_weights();
  for (const LmWeights* w : {&master, &m, &v}) {
    if (!moments && w != &master) continue;
    const auto got = w->named_weights();
    if (got.size() != wn.size()) throw std::invalid_argument("lm_tp restore: tensor count differs from the model's");
    for (size_t i = 0; i < wn.size(); ++i)
      if (got[i].second->dtype() != DType::fp32 || got[i].second->shape() != wn[i].second->shape())
        throw std::invalid_argument("lm_tp restore: " + wn[i].first + " has shape " +
                                    runtime::shape_str(got[i].second->shape()));
  }
}
}  // namespace

bool LmTpTrainer::is_norm(const std::string& name) { return name.find("norm") != std::string::npos; }
bool LmTpTrainer::is_moe(const std::string& name) { return name.find(".moe.") != std::string::npos; }

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

LmTpTrainer::LmTpTrainer(const ModelSpec& global, const LmTrainConfig& train, sharding::DeviceMesh& mesh,
                         runtime::Transport& world, sim::Timeline& timeline, std::string algorithm, bool sequence_parallel)
    : LmTpTrainer(global, train, mesh, world, timeline, LmDpConfig{.zero = 0, .bucket_bytes = 0, .algorithm = std::move(algorithm)},
                  sequence_parallel, true) {}

LmTpTrainer::LmTpTrainer(const ModelSpec& global, const LmTrainConfig& train, sharding::DeviceMesh& mesh,
                         runtime::Transport& world, sim::Timeline& timeline, const LmDpConfig& dp,
                         bool sequence_parallel, bool cp_zigzag, bool ulysses, bool fused)
    : global_(global), local_(global), train_(train), mesh_(mesh), world_(world), tl_(timeline), dp_(dp),
      algorithm_(dp.algorithm), sp_(sequence_parallel), zigzag_(cp_zigzag && !ulysses), ulysses_(ulysses),
      fused_(fused), store_(!world.shape_only()) {
  check_lm_config(global);
  if (global.mlp == sharding::MlpKind::geglu && !dp.forward_only)
    throw std::invalid_argument("model.mlp: geglu trains not yet (its backward is not implemented; swiglu | gelu); "
                                "run computes its forward");
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
  // The plan's divisibility rules against the model (heads, KV heads, ffn and vocabulary over tp; the batch over dp;
  // micro-batches; the sequence over cp, Ulysses and sp; tied embeddings with pp; a causal mask with cp) are the plan
  // registry's (sharding/plans/registry.cpp, checked by parse_parallel_plan with the config's FILE:LINE), not
  // repeated here: the trainer takes a parsed plan.
  // KV heads: split over tp, or (tp a multiple of them) replicated: each tp rank holds the one KV head of its query
  // heads' GQA group; training sums the replicas' Wk / Wv gradients over their group (unit_grads_done).
  if (global.attention && global.kv_heads < tp_size_ && tp_size_ % global.kv_heads == 0)
    kv_rep_ = tp_size_ / int(global.kv_heads);
  local_.heads /= tp_size_;
  local_.kv_heads = kv_rep_ > 1 ? 1 : local_.kv_heads / tp_size_;
  local_.ffn /= tp_size_;
  local_.vocab /= tp_size_;
  local_.batch /= dp_size_;
  if (dp.micro_batch > 0) {
    micro_ = int(local_.batch / dp.micro_batch);
    local_.batch = dp.micro_batch;  // the trainer's forward and backward run one micro-batch
  }
  setup_pipeline(global);
  setup_moe();
  local_.seq /= cp_size_;  // this chip's tokens of each sequence (its cp chunks, concatenated)
  local_.shard.positions = global.seq;  // the whole learned position table
  // Sub-groups are made collectively on first use: every rank asks for the same axes in the same order.
  (void)mesh_["tp"];
  (void)mesh_["dp"];
  (void)mesh_.excluding("dp");  // one replica's chips (the gradient norm's first stage)
  if (pp_size_ > 1) (void)mesh_["pp"];
  if (kv_rep_ > 1 && !dp.forward_only) kv_group_ = &sharding::plans::kv_replica_group(mesh_["tp"], kv_rep_);
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
    // With cp, the experts' replicas are the dp x cp chips of one (tp, pp, ep) coordinate (Megatron's expert
    // data-parallel group spans the context-parallel chips), ordered cp-innermost.
    if (cp_size_ > 1 && ep_size_ > 1)
      expert_dp_ = &world.subgroup("lm_tp.dp_cp_experts", tp_rank_ + tp_size_ * (pp_rank_ + pp_size_ * ep_rank_),
                                   cp_rank_ + cp_size_ * mesh.coordinate("dp", r),
                                   [co, tp = tp_size_, pp = pp_size_, cp = cp_size_](int q) {
                                     return std::pair{co(0, q) + tp * (co(1, q) + pp * co(3, q)), co(2, q) + cp * co(4, q)};
                                   });
  } else {
    rep_ = &mesh_["dp"];
  }
  layout_ = sharding::plans::token_layout(global.seq, local_.batch, cp_size_, cp_rank_, zigzag_);
  // The plan as the block program reads it (sharding/plans/block.h; the model: global_).
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
  plan_.recompute = dp.recompute;            // full: each block's forward again before its backward (plans/block.h)
  plan_.selective_recompute = dp.selective;  // the unfused core keeps no softmax output (plans/block.h)

  // Shape-only (Transport::shape_only): storage-less weights of the local shapes, nothing initialised.
  // (One whole seeded copy at a time: own_layers copies only under pp.)
  LmWeights master = !store_ ? lm_zeros(local_, DType::fp32, false)
                     : pp_size_ == 1 ? shard(lm_init(global)) : shard(own_layers(lm_init(global)));
  work_ = store_ ? lm_compute_copy(local_, master) : lm_zeros(local_, global.dtype, false);
  // The forward mode holds the weights and the forward's tensors only: no gradient buffers (storage-less).
  grads_ = lm_zeros(local_, global.dtype, store_ && !dp.forward_only);
  if (micro_ > 1) {
    mgrads_ = lm_zeros(local_, global.dtype, store_ && !dp.forward_only);
    unit_grads_.resize(size_t(local_.layers) + 2);
    const auto acc = grads_.named_weights(), one = mgrads_.named_weights();
    for (size_t i = 0; i < acc.size(); ++i)
      if (owns(acc[i].first))
        unit_grads_[size_t(lm_unit_of(acc[i].first, local_.layers))].push_back(
            {acc[i].second, one[i].second, is_norm(acc[i].first) || is_moe(acc[i].first)});
  }
  // ZeRO over the replicas of this rank's shards; a replicated norm weight counts in the norm on tp coordinate 0,
  // a replicated KV projection on the first chip of its KV group.
  std::vector<sharding::plans::DpParam> params;
  for (const auto& [name, t] : master.named_weights())
    if (owns(name))
      params.push_back({lm_unit_of(name, local_.layers), size_t(t->numel()),
                        replicated_kv(name) ? tp_rank_ % kv_rep_ == 0
                                            : split_of(name, etp_ > 1) != Split::replicate || tp_rank_ == 0,
                        expert_weight(name),
                        t->rank() == 1});  // Megatron's no-weight-decay group: 1-D tensors (norms, biases)
  // A MoE model's experts: averaged over their dp replicas, scaled by 1 / ep (sharding/plans/data_parallel.h).
  const sharding::plans::DpExperts experts{ep_size_ > 1 ? (expert_dp_ ? expert_dp_ : &mesh_["dp"]) : nullptr,
                                           1.0 / ep_size_};
  // Megatron's bucket rule (data_parallel.h, "Buckets") needs each unit's model chunk: the embedding is chunk 0's,
  // block l its virtual stage's, the head the last chunk's.
  sharding::plans::ZeroConfig zc{dp.zero, dp.bucket_bytes, dp.algorithm, dp.overlap_param_gather,
                                 dp.forward_only};
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
  check_plan_algorithm(dp.zero);
  if (mesh_.size("dp") > 1) {  // a folded run: the gradient norm's gather over dp is decided before the first step
    collectives::CollectiveOptions o;
    o.algorithm = grad_norm_gather_algorithm();
    const std::string why = collectives::fold_obstacle(collectives::Collective::all_gather, o, mesh_["dp"],
                                                       size_t(mesh_.size("dp")), DType::fp64, "all_gather.grad_norm");
    if (!why.empty()) runtime::chips::fold_refused(why);
  }
}

void LmTpTrainer::check_plan_algorithm(int zero) {
  // A named parallel.algorithm on every group of this plan that runs a collective, before the first step (exit 2
  // naming the key; it used to fail at the first collective): collectives::plan_obstacle, the rule choose() applies.
  if (algorithm_ == "auto") return;
  using C = collectives::Collective;
  std::vector<std::tuple<const char*, C, runtime::Transport*>> calls = {
      {"tp", C::all_reduce, &mesh_["tp"]}, {"tp", C::all_gather, &mesh_["tp"]},
      {"replica (tp x cp x pp)", C::all_reduce, &mesh_.excluding("dp")}, {"dp", C::all_gather, &mesh_["dp"]},
      {"data-parallel", zero == 0 ? C::all_reduce : C::reduce_scatter, rep_}};
  if (sp_) calls.emplace_back("tp", C::reduce_scatter, &mesh_["tp"]);
  if (kv_group_) calls.emplace_back("KV-replica (tp / kv_heads)", C::all_reduce, kv_group_);
  if (zero > 0) calls.emplace_back("data-parallel", C::all_gather, rep_);
  if (ulysses_ && cp_size_ > 1) calls.emplace_back("ulysses", C::all_to_all, &mesh_["cp"]);
  if (pp_size_ > 1) calls.emplace_back("pp", C::broadcast, &mesh_["pp"]);
  if (ep_size_ > 1)
    for (C c : {C::all_to_allv, C::all_to_all, zero == 0 ? C::all_reduce : C::reduce_scatter})
      calls.emplace_back(c == C::all_reduce || c == C::reduce_scatter ? "experts' data-parallel" : "ep", c,
                         c == C::all_reduce || c == C::reduce_scatter ? &mesh_["dp"] : &mesh_["ep"]);
  for (const auto& [group, c, g] : calls)
    if (const std::string why = collectives::plan_obstacle(c, algorithm_, *g); !why.empty())
      throw ConfigKeyError("parallel.algorithm", "parallel.algorithm: '" + algorithm_ + "' cannot run the " + group +
                                                     " group's " + why + "; name another algorithm, or auto");
}

std::string LmTpTrainer::grad_norm_gather_algorithm() const {
  // A ring: equal 8-byte chunks, neighbours by offset, so every replica runs it alike (auto's choice for 8 bytes
  // may pair XOR partners, which a replica shift does not keep). (dp - 1) latencies.
  return collectives::plan_algorithm(collectives::Collective::all_gather, algorithm_, 2) == "auto" ? "ring" : algorithm_;
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
  ModelSpec whole_tp = global_;  // global shapes, this chip's layers (every expert: ep's are shared below)
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
  share_moe_bias(s.master);
  s.m = gather(gather_field(sharding::plans::DataParallel::Field::m));
  s.v = gather(gather_field(sharding::plans::DataParallel::Field::v));
  s.step = step_;
  return s;
}

void LmTpTrainer::restore(const LmTrainSnapshot& s) {
  if (!store_) throw std::logic_error("lm_tp: a shape-only run cannot restore a state");
  const bool moments = !dp_.forward_only;  // the forward mode restores the weights alone
  check_state_layout(s.master, s.m, s.v, global_, moments);
  // This chip's blocks of the whole state, then the one restore path (the checkpoint's).
  LmStateShard mine;
  mine.master = pp_size_ == 1 ? shard(s.master) : shard(own_layers(s.master));
  if (moments) {
    mine.m = pp_size_ == 1 ? shard(s.m) : shard(own_layers(s.m));
    mine.v = pp_size_ == 1 ? shard(s.v) : shard(own_layers(s.v));
  }
  for (int64_t l = 0; l < local_.layers; ++l)
    if (local_.moe_layer(l))
      mine.moe_bias[layer_global_[size_t(l)]] = s.master.layers[size_t(layer_global_[size_t(l)])].moe.bias;
  mine.step = s.step;
  restore(mine);
}

// Each local tensor's block of its dataset: its global name (a pipeline stage numbers its layers locally), where
// the tp split puts it, and whether this chip is its one owner: the first of its replicas (dp x ep x cp for the
// dense weights, dp x cp for an expert under ep), tp rank 0 of a tensor replicated over tp (the first tp rank of a
// replicated KV head), and the stage that holds it (the embedding's, the head's).
std::vector<LmStateBlock> LmTpTrainer::state_blocks(const LmWeights& local) const {
  std::vector<LmStateBlock> out;
  const bool dense_lead = rep_rank_ == 0, expert_lead = cp_rank_ == 0 && dp_rank_ / ep_size_ == 0;
  for (const auto& [name, t] : local.named_weights()) {
    LmStateBlock b{name, runtime::Shape(t->shape().size(), 0), false};
    if (pp_size_ > 1 && name.rfind("layers.", 0) == 0) {
      const size_t dot = name.find('.', 7);
      b.dataset = "layers." + std::to_string(layer_global_.at(size_t(std::stoll(name.substr(7, dot - 7))))) +
                  name.substr(dot);
    }
    bool lead = name.find(".moe.expert.") != std::string::npos ? expert_lead : dense_lead;
    switch (split_of(name, etp_ > 1)) {
      case Split::replicate:
        lead = lead && tp_rank_ == 0;
        break;
      case Split::rows:
        b.offset[0] = tp_rank_ * t->dim(0);
        break;
      case Split::cols: {
        const bool kv = replicated_kv(name);
        b.offset[1] = (kv ? tp_rank_ / kv_rep_ : tp_rank_) * t->dim(1);
        lead = lead && (!kv || tp_rank_ % kv_rep_ == 0);
        break;
      }
    }
    b.owner = lead && owns(name);
    out.push_back(std::move(b));
  }
  return out;
}

LmStateShard LmTpTrainer::state_shard(bool moments) {
  if (!store_) throw std::logic_error("lm_tp: a shape-only run has no state to save");
  LmStateShard s;
  s.master = gather_field(sharding::plans::DataParallel::Field::master);
  if (moments) {
    s.m = gather_field(sharding::plans::DataParallel::Field::m);
    s.v = gather_field(sharding::plans::DataParallel::Field::v);
  }
  s.blocks = state_blocks(s.master);
  if (local_.moe && local_.moe->bias_update > 0)
    for (int64_t l = 0; l < local_.layers; ++l)
      if (local_.moe_layer(l)) s.moe_bias[layer_global_[size_t(l)]] = work_.layers[size_t(l)].moe.bias;
  s.bias_owner = rep_rank_ == 0 && tp_rank_ == 0;
  s.step = step_;
  s.weights_only = !moments;
  return s;
}

LmStateShard LmTpTrainer::state_layout(bool moments) const {
  if (!store_) throw std::logic_error("lm_tp: a shape-only run cannot restore a state");
  LmStateShard s;
  s.master = lm_zeros(local_, DType::fp32);
  if (moments) s.m = lm_zeros(local_, DType::fp32), s.v = lm_zeros(local_, DType::fp32);
  s.blocks = state_blocks(s.master);
  if (local_.moe && local_.moe->bias_update > 0)  // the config's start (zeros) unless the file has them
    for (int64_t l = 0; l < local_.layers; ++l)
      if (local_.moe_layer(l)) s.moe_bias[layer_global_[size_t(l)]] = s.master.layers[size_t(l)].moe.bias;
  s.bias_owner = rep_rank_ == 0 && tp_rank_ == 0;
  return s;
}

void LmTpTrainer::restore(LmStateShard& s) {
  if (!store_) throw std::logic_error("lm_tp: a shape-only run cannot restore a state");
  const bool moments = !dp_.forward_only;  // the forward mode restores the weights alone
  check_state_layout(s.master, s.m, s.v, local_, moments);
  if (s.step < 0) throw std::invalid_argument("lm_tp restore: negative step");
  work_ = lm_compute_copy(local_, s.master);
  if (local_.moe && local_.moe->bias_update > 0) {
    const size_t E = size_t(global_.moe->spec.experts());
    for (int64_t l = 0; l < local_.layers; ++l) {
      if (!local_.moe_layer(l)) continue;
      const auto it = s.moe_bias.find(layer_global_[size_t(l)]);
      if (it == s.moe_bias.end() || it->second.size() != E)
        throw std::invalid_argument("lm_tp restore: layer " + std::to_string(layer_global_[size_t(l)]) +
                                    "'s selection bias has " +
                                    std::to_string(it == s.moe_bias.end() ? 0 : it->second.size()) + " entries for " +
                                    std::to_string(E) + " experts");
      work_.layers[size_t(l)].moe.bias = it->second;
    }
  }
  work_refs_ = prefs(work_);
  if (!moments) {
    data_->load(prefs(s.master), nullptr, nullptr, work_refs_);
  } else {
    const auto mr = prefs(s.m), vr = prefs(s.v);
    data_->load(prefs(s.master), &mr, &vr, work_refs_);
  }
  step_ = s.step;
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
  return {global_, plan_, mesh_["tp"], cp_size_ > 1 ? mesh_["cp"] : mesh_["tp"], chip, comm_, fused_ops_, N,
          sp_ ? N / tp_size_ : N};
}

double LmTpTrainer::local_param_count() const { return data_->param_count(); }

LmDpMemory LmTpTrainer::memory() const {
  LmDpMemory m;
  static_cast<sharding::plans::DpMemory&>(m) = data_->memory();  // Ψ = Ψ_tp, N_d = dp·cp
  m.activations = activation_bytes_;
  return m;
}

}  // namespace shardsim::models

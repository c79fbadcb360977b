// LmTpTrainer's mixture-of-experts pieces (models/lm_tp.h): this chip's experts, the ep groups and the routing
// statistics of the last step (a MoE layer's backward is the block program's: sharding/plans/block.h).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <numeric>

#include "collectives/all_reduce.h"
#include "collectives/broadcast.h"
#include "models/lm_tp.h"
#include "sharding/plans/expert_parallel_config.h"

namespace shardsim::models {

using runtime::Tensor;

void LmTpTrainer::setup_moe() {
  local_.shard.global_layers = layer_global_;
  if (!local_.moe) {
    if (ep_size_ > 1 || etp_ > 1)
      throw std::invalid_argument("parallel.ep: expert parallelism needs model.moe (a mixture-of-experts model)");
    return;
  }
  kernels::MoeSpec& s = local_.moe->spec;
  if (etp_ != 1 && etp_ != tp_size_)
    throw std::invalid_argument("parallel.etp: " + std::to_string(etp_) + " must be 1 or tp (" +
                                std::to_string(tp_size_) + ")");
  const std::string why = sharding::plans::ep_obstacle(s.experts(), ep_size_);
  if (!why.empty()) throw std::invalid_argument("parallel.ep: " + why);
  for (int64_t& f : s.expert_ffn) {
    if (f % etp_ != 0)
      throw std::invalid_argument("parallel.etp: model.moe.expert_ffn " + std::to_string(f) +
                                  " is not a multiple of etp " + std::to_string(etp_));
    f /= etp_;
  }
  s.shared_ffn /= etp_;
  if (local_.moe->balance_placement && store_ && ep_size_ > 1)
    throw std::invalid_argument("model.moe.placement: balanced places the experts by the declared routing's load, "
                                "in shape-only runs (--shape-only); a real-data run's placement is not yet modelled");
  const sharding::plans::EpShard shard = sharding::plans::ep_shard(s.experts(), ep_size_, ep_rank_);
  local_.shard.expert_first = shard.first;
  local_.shard.expert_count = shard.count;
  // Every rank makes the same sub-groups in the same order (collective on first use).
  ep_groups_ = std::make_unique<sharding::plans::EpGroups>(
      sharding::plans::EpGroups{mesh_["ep"], etp_ > 1 ? &mesh_["tp"] : nullptr, {}});
  // A sequence split over chips (sp over tp, cp or Ulysses over cp): each routes its own rows; the aux loss's group
  // is the micro-batch's sequence on all of them (Megatron-Core's sequence_partition_group). With etp and sp the
  // tp chips route their gathered rows together (sharding/plans/block.cpp), so tp is not a split there.
  if (sp_routes_own_rows()) ep_groups_->span.push_back(&mesh_["tp"]);
  if (cp_size_ > 1) ep_groups_->span.push_back(&mesh_["cp"]);
}

bool LmTpTrainer::sp_routes_own_rows() const { return sp_ && tp_size_ > 1 && etp_ == 1; }

bool LmTpTrainer::expert_weight(const std::string& name) const {
  return ep_size_ > 1 && name.find(".moe.expert.") != std::string::npos;
}

sharding::plans::BlockMoe LmTpTrainer::block_moe(int64_t l) const {
  if (!local_.moe_layer(l)) return {};
  return {&work_.layers[size_t(l)].moe, ep_groups_.get(), layer_global_[size_t(l)]};
}

double LmTpTrainer::moe_aux_grad() const {
  // d loss / d a micro-batch's aux loss: the step's loss is the mean over the micro-batches. With cp, this chip's
  // share of its sequence's aux loss counts whole (the group's loss is the shares' sum) while the gradients are
  // averaged over the cp chips too: times cp. (sp: the shares' gradients are summed over tp, finish_backward.)
  return double(cp_size_) / micro_;
}

void LmTpTrainer::share_experts(LmWeights& whole) {
  runtime::Transport& ep = mesh_["ep"];
  const int64_t per = global_.moe->spec.experts() / ep_size_;
  const std::string key = ".moe.expert.";
  for (auto& [name, t] : whole.named_weights()) {
    const auto at = name.find(key);
    if (at == std::string::npos) continue;
    collectives::CollectiveOptions o;
    o.root = static_cast<int>(std::stoll(name.substr(at + key.size())) / per);
    o.name = "broadcast.state";
    collectives::broadcast(ep, t->data(), t->data(), size_t(t->numel()), t->dtype(), tl_.end_time(), o);
  }
}

sim::TimeNs LmTpTrainer::update_moe_bias(sim::TimeNs ready) {
  if (!local_.moe || local_.moe->bias_update <= 0) return ready;
  std::vector<int64_t> layers;  // this chip's MoE layers, in order
  for (int64_t l = 0; l < local_.layers; ++l)
    if (local_.moe_layer(l)) layers.push_back(l);
  if (layers.empty()) return ready;
  const int64_t E = global_.moe->spec.experts(), n = int64_t(layers.size());
  // One fp32 buffer [layers, E] (Megatron-Core's stacked local_tokens_per_expert; exact up to 2^24 tokens per
  // expert and step), summed over the replicas: the dp x ep x cp chips of this tp coordinate and stage route
  // distinct tokens; the tp chips route the same rows, unless sp splits them (then summed over tp too: Megatron's
  // TP x CP x DP group).
  Tensor load = make(runtime::DType::fp32, {n * E});
  if (store_)
    for (int64_t i = 0; i < n; ++i)
      for (int64_t e = 0; e < E; ++e) {
        const auto it = moe_load_.find(layers[size_t(i)]);
        load.set(i * E + e, it == moe_load_.end() ? 0.0 : double(it->second[size_t(e)]));
      }
  collectives::CollectiveOptions o;
  o.algorithm = grad_norm_gather_algorithm();  // a ring under auto: every replica runs it alike (a folded run)
  o.name = "all_reduce.expert_load";
  sim::TimeNs t = collectives::all_reduce(*rep_, load.data_if_stored(), load.data_if_stored(), size_t(load.numel()),
                                          load.dtype(), collectives::ReduceOp::sum, ready, o).span.end;
  if (sp_routes_own_rows())  // with sp (etp 1) each tp chip routed its own rows
    t = collectives::all_reduce(mesh_["tp"], load.data_if_stored(), load.data_if_stored(), size_t(load.numel()),
                                load.dtype(), collectives::ReduceOp::sum, t, o).span.end;
  // bias += gamma * sign(mean - load) per expert: one small vector kernel (loads and biases read, biases written).
  charge(kernels::KernelCost{"moe.bias_update", double(3 * n * E), double(n * E * 12), runtime::DType::fp32, {}}, t);
  if (store_)
    for (int64_t i = 0; i < n; ++i) {
      std::vector<int64_t> counts(static_cast<size_t>(E));
      for (int64_t e = 0; e < E; ++e) counts[size_t(e)] = std::llround(load.get(i * E + e));
      kernels::update_expert_bias(work_.layers[size_t(layers[size_t(i)])].moe.bias, counts, local_.moe->bias_update);
    }
  return t;
}

void LmTpTrainer::share_moe_bias(LmWeights& whole) {
  if (!local_.moe || local_.moe->bias_update <= 0) return;
  const int64_t E = global_.moe->spec.experts(), L = global_.layers;
  // [layers x E] fp32, this stage's layers filled: summed over pp, every layer comes from its one stage (exact).
  Tensor all = make(runtime::DType::fp32, {L * E});
  for (int64_t l = 0; l < local_.layers; ++l)
    if (local_.moe_layer(l))
      for (int64_t e = 0; e < E; ++e)
        all.set(layer_global_[size_t(l)] * E + e, double(work_.layers[size_t(l)].moe.bias[size_t(e)]));
  if (pp_size_ > 1) {
    collectives::CollectiveOptions o;
    o.algorithm = algorithm_;
    o.name = "all_reduce.state";
    collectives::all_reduce(mesh_["pp"], all.data(), all.data(), size_t(all.numel()), all.dtype(),
                            collectives::ReduceOp::sum, tl_.end_time(), o);
  }
  for (int64_t l = 0; l < L; ++l)
    if (global_.moe_layer(l)) {
      std::vector<float>& b = whole.layers[size_t(l)].moe.bias;
      b.assign(size_t(E), 0.0f);
      for (int64_t e = 0; e < E; ++e) b[size_t(e)] = float(all.get(l * E + e));
    }
}

double LmTpTrainer::expert_param_count() const {
  double n = 0;
  for (const auto& [name, t] : work_.named_weights())
    if (name.find(".moe.expert.") != std::string::npos) n += double(t->numel());
  return n;
}

std::vector<LmTpTrainer::MoeLayerStats> LmTpTrainer::moe_stats() const {
  std::vector<MoeLayerStats> out;
  for (const auto& [l, st] : moe_stats_) out.push_back(st);
  return out;
}

void LmTpTrainer::note_remote_reach(const kernels::Routing& r, MoeLayerStats& st) const {
  const kernels::RouterOptions& o = global_.moe->spec.router;
  if (!o.group_limited() || int64_t(r.counts.size()) != o.experts) return;
  const int64_t n = o.experts / o.groups, k = r.top_k;
  const int64_t g0 = local_.shard.expert_first / n,  // the groups holding this chip's experts
      g1 = (local_.shard.expert_first + std::max<int64_t>(local_.shard.expert_count, 1) - 1) / n;
  const auto remote = [&](int64_t g) { return g < g0 || g > g1; };
  double reach = 0;
  if (r.has_values) {  // each token's distinct remote groups among its kept assignments
    std::vector<int64_t> seen(size_t(o.groups), -1);
    for (int64_t t = 0; t < r.tokens; ++t)
      for (int64_t j = 0; j < k; ++j) {
        const int64_t g = r.expert[size_t(t * k + j)] / n;
        if (r.kept[size_t(t * k + j)] && remote(g) && seen[size_t(g)] != t) seen[size_t(g)] = t, ++reach;
      }
  } else {
    const std::vector<int64_t> d = kernels::declared_node_tokens(o, r.counts, r.tokens);
    for (int64_t g = 0; g < o.groups; ++g)
      if (remote(g)) reach += double(d[size_t(g)]);
  }
  st.remote_reach = reach;
  st.routed_tokens = double(r.tokens);
}

LmTpTrainer::DispatchLink LmTpTrainer::busiest_dispatch_link(const double* rows, runtime::Transport& ep) const {
  // Every flow s -> d of the group (ROWS [P x P], rows s sent to d) along its route; the link they keep busy longest.
  const topology::Topology& topo = tl_.topology();
  const double row_bytes = double(global_.hidden) * double(runtime::dtype_size(global_.dtype));
  const int P = ep.size();
  std::map<int, double> load;
  for (int s = 0; s < P; ++s)
    for (int d = 0; d < P; ++d)
      if (s != d && rows[s * P + d] > 0)
        for (int l : topo.route(ep.chip_of(s), ep.chip_of(d))) load[l] += rows[s * P + d] * row_bytes;
  DispatchLink out;
  for (const auto& [l, bytes] : load)  // the link whose bytes take longest at its bandwidth (GB/s = B/ns)
    if (const sim::TimeNs t = bytes / topo.link(l).bandwidth_gbps; t > out.bound_ns) out = {l, bytes, t};
  return out;
}

std::vector<LmTpTrainer::MoeLayerStats> LmTpTrainer::moe_layer_table() {
  if (!global_.moe) return {};
  const size_t E = size_t(global_.moe->spec.experts());
  // This chip's MoE layers (its ep group's: one stage), summed over the ep group: E tokens, aux, balanced_ns; at its
  // maximum: received, dispatch bytes and ns, buffers, expert_ns.
  std::vector<int64_t> mine;
  for (int64_t l = 0; l < local_.layers; ++l)
    if (local_.moe_layer(l)) mine.push_back(layer_global_[size_t(l)]);
  runtime::Transport& ep = mesh_["ep"];
  // sums: tokens, aux, balanced, rows s -> d, remote reach, routed tokens
  const size_t P = size_t(ep.size()), ns = E + 4 + P * P, nm = 5;
  std::vector<double> sum(mine.size() * ns, 0.0), max(mine.size() * nm, 0.0);
  for (size_t i = 0; i < mine.size(); ++i) {
    const auto it = moe_stats_.find(mine[i]);
    if (it == moe_stats_.end()) continue;
    const MoeLayerStats& st = it->second;
    double* a = sum.data() + i * ns;
    for (size_t e = 0; e < E && e < st.tokens.size(); ++e) a[e] = double(st.tokens[e]);
    a[E] = st.aux, a[E + 1] = st.balanced_expert_ns;
    for (size_t d = 0; d < P && d < st.send_rows.size(); ++d) a[E + 2 + size_t(ep.rank()) * P + d] = double(st.send_rows[d]);
    a[E + 2 + P * P] = st.remote_reach, a[E + 3 + P * P] = st.routed_tokens;
    double* b = max.data() + i * nm;
    b[0] = double(st.received), b[1] = st.dispatch_bytes, b[2] = st.dispatch_ns, b[3] = st.buffer_bytes;
    b[4] = st.expert_ns;
  }
  ep.allreduce(std::span<double>(sum), runtime::Reduce::sum, "lm moe table ep");  // host-side, not simulated
  ep.allreduce(std::span<double>(max), runtime::Reduce::max, "lm moe table ep");
  // Per model MoE layer, 9 figures: the maximum over the world of what the groups at tp, cp and dp coordinate 0
  // hold (the others contribute 0): a maximum, not a sum, so a folded run's mirrored chips (which repeat a
  // simulated chip's contribution) change nothing.
  std::vector<int64_t> layers;
  for (int64_t l = 0; l < global_.layers; ++l)
    if (global_.moe_layer(l)) layers.push_back(l);
  constexpr size_t nf = 13;
  std::vector<double> all(layers.size() * nf, 0.0);
  const bool reports = tp_rank_ == 0 && cp_rank_ == 0 && dp_rank_ / ep_size_ == 0;
  for (size_t i = 0; reports && i < mine.size(); ++i) {
    const size_t at = size_t(std::find(layers.begin(), layers.end(), mine[i]) - layers.begin());
    const double* a = sum.data() + i * ns;
    const double* b = max.data() + i * nm;
    double* f = all.data() + at * nf;
    f[0] = E ? *std::max_element(a, a + E) : 0.0;
    f[1] = std::accumulate(a, a + E, 0.0) / double(std::max<size_t>(E, 1));
    f[2] = a[E] / ep_size_, f[3] = a[E + 1] / ep_size_;
    std::copy(b, b + nm, f + 4);
    const DispatchLink busiest = busiest_dispatch_link(a + E + 2, ep);
    f[9] = double(busiest.link + 1), f[10] = busiest.bytes, f[11] = busiest.bound_ns;
    const double routed = a[E + 3 + P * P];  // +1: 0 stays "no node limit" under the world's maximum
    f[12] = global_.moe->spec.router.group_limited() && routed > 0 ? a[E + 2 + P * P] / routed + 1 : 0.0;
  }
  world_.allreduce(std::span<double>(all), runtime::Reduce::max, "lm moe table");
  std::vector<MoeLayerStats> out;
  for (size_t i = 0; i < layers.size(); ++i) {
    const double* f = all.data() + i * nf;
    MoeLayerStats st;
    st.layer = layers[i];
    st.max_tokens = f[0], st.mean_tokens = f[1], st.aux = f[2], st.balanced_expert_ns = f[3];
    st.received = std::llround(f[4]);
    st.dispatch_bytes = f[5], st.dispatch_ns = f[6], st.buffer_bytes = f[7], st.expert_ns = f[8];
    st.link = int(std::llround(f[9])) - 1, st.link_bytes = f[10], st.link_bound_ns = f[11];
    if (st.link >= 0) st.link_name = tl_.topology().link_name(st.link);
    st.remote_nodes = f[12] - 1;
    out.push_back(std::move(st));
  }
  return out;
}

}  // namespace shardsim::models

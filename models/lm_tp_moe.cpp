// LmTpTrainer's mixture-of-experts pieces (models/lm_tp.h): this chip's experts, the ep groups and the routing
// statistics of the last step (a MoE layer's backward is the block program's: sharding/plans/block.h).
#include <algorithm>
#include <cstring>

#include "collectives/broadcast.h"
#include "models/lm_tp.h"
#include "sharding/plans/expert_parallel_config.h"

namespace shardsim::models {

using runtime::Tensor;

void LmTpTrainer::setup_moe() {
  local_.global_layers = layer_global_;
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
  const sharding::plans::EpShard shard = sharding::plans::ep_shard(s.experts(), ep_size_, ep_rank_);
  local_.expert_first = shard.first;
  local_.expert_count = shard.count;
  // Every rank makes the same sub-groups in the same order (collective on first use).
  ep_groups_ = std::make_unique<sharding::plans::EpGroups>(
      sharding::plans::EpGroups{mesh_["ep"], etp_ > 1 ? &mesh_["tp"] : nullptr});
}

bool LmTpTrainer::expert_weight(const std::string& name) const {
  return ep_size_ > 1 && name.find(".moe.expert.") != std::string::npos;
}

sharding::plans::BlockMoe LmTpTrainer::block_moe(int64_t l) const {
  if (!local_.moe_layer(l)) return {};
  return {&work_.layers[size_t(l)].moe, ep_groups_.get(), layer_global_[size_t(l)]};
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

}  // namespace shardsim::models

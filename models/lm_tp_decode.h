// The serving mode's piece outside the trainer (models/lm_tp_decode.cpp): the KV-cache transfer of prefill/decode
// disaggregation (issue 50; DistServe, Zhong et al. OSDI 2024, arXiv 2401.09670; Splitwise, Patel et al. ISCA
// 2024). A prefill instance (one data-parallel replica's chips) computes a prompt's keys and values; a decode
// instance (another replica's chips, the same tp x pp shape) receives them and decodes on.
#pragma once

#include <cstdint>

#include "runtime/transport.h"
#include "sharding/plans/kv_attention.h"

namespace shardsim::models {

// Sequence SLOT_FROM's first TOKENS cached keys and values of every layer this chip holds, from replica FROM's
// chip to replica TO's chip with the same tp and pp coordinates (its slot SLOT_TO), data ready at READY.
struct KvTransfer {
  int64_t slot_from = 0, slot_to = 0;
  int64_t tokens = 0;
  int from = 0, to = 1;  // data-parallel replicas (ranks of the dp transport)
  sim::TimeNs ready = 0;
};

// One message per chip pair over DP (the mesh's dp transport: its ranks are the replicas, the rest of the
// coordinates fixed), of LAYERS · 2 · TOKENS · kv heads · head_dim · dtype bytes (this chip's K then V per layer,
// [tokens, kv heads, head_dim] each): the sender books it on its timeline (injection port, route), the receiver
// books its arrival against the flows addressed to it, so transfers that overlap in simulated time queue on the
// links as every other flow does (runtime/transport.h). Real data: the receiver's CACHE holds the keys and values
// at positions [0, TOKENS) of SLOT_TO. Returns the simulated time the data is at this chip (the receiver), the
// sender's end of sending (the sender), READY on the chips of other replicas (nothing happens there).
// std::invalid_argument when FROM == TO, TOKENS < 1 or a replica is out of range.
sim::TimeNs kv_transfer(runtime::Transport& dp, sharding::plans::KvCache& cache, int64_t layers, const KvTransfer& x);

}  // namespace shardsim::models

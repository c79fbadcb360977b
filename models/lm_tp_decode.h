// The serving mode's piece outside the trainer (models/lm_tp_decode.cpp): the KV-cache transfer of prefill/decode
// disaggregation (issue 50; DistServe, Zhong et al. OSDI 2024, arXiv 2401.09670; Splitwise, Patel et al. ISCA
// 2024). A prefill instance (some chips) computes a prompt's keys and values; a decode instance (other chips, the
// same or another tp x pp plan) receives them, resharded to its layers and KV heads, and decodes on.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/transport.h"
#include "sharding/plans/kv_attention.h"

namespace shardsim::models {

// Where one instance's KV cache lives, for a transfer between two instances that may run different plans
// (DistServe's per-phase parallelism: a prefill instance at one tp x pp, a decode instance at another): its chips as
// ranks of the transport the transfer runs on, chip (tp t, pp s) at RANKS[t + TP * s], and the pipeline's layers per
// stage (empty: LAYERS split evenly, sharding/plans/pipeline_schedule.h stage_layers). KV heads as the executor
// holds them (models/lm_tp.h): tp rank t holds the kv_heads / TP heads from t · kv_heads / TP, or, TP above the KV
// heads (a multiple of them), the one head of its query heads' group, t / (TP / kv_heads).
struct KvLayout {
  int tp = 1, pp = 1;
  std::vector<int> ranks;
  std::vector<int64_t> layers_per_stage;
};

// Sequence SLOT_FROM's first TOKENS cached keys and values (layout FROM) to slot SLOT_TO of layout TO, data ready
// at READY.
struct KvTransfer {
  int64_t slot_from = 0, slot_to = 0;
  int64_t tokens = 0;
  sim::TimeNs ready = 0;
};

// One message per (sender, receiver) chip pair whose layers and KV heads meet (a head replicated over the sending
// tp ranks is sent to copy k of the receiving layout by the sending copy k mod its copies), over T: per common layer, in order, K then V, [TOKENS, common heads, head_dim] each
// (common layers · 2 · TOKENS · common heads · head_dim · dtype bytes); each sender sends in the receivers' rank
// order and each receiver receives in the senders' (no cycle: the two layouts are disjoint). The sender books its
// messages on its timeline (injection port, route), the receiver their arrivals against the flows addressed to it
// (runtime/transport.h). Equal layouts move each chip's whole cache to its peer, one message per pair. Real data:
// each receiver's CACHE (its layers and heads) holds at positions [0, TOKENS) of SLOT_TO what the sender's held.
// Returns the simulated time the last message is at this chip (a receiver), the end of its last send (a sender:
// its timeline's end), READY on other chips. Every chip of both layouts calls it (others may). LAYERS, KV_HEADS: the model's.
// std::invalid_argument when the layouts share a chip, a layout's ranks are not tp · pp ranks of T, KV_HEADS and
// a tp neither divides the other, the layers do not split over a pp, or TOKENS < 1.
sim::TimeNs kv_transfer(runtime::Transport& t, sharding::plans::KvCache& cache, int64_t layers, int64_t kv_heads,
                        const KvLayout& from, const KvLayout& to, const KvTransfer& x);

// The messages kv_transfer sends between FROM and TO, in its order (each sender's in the receivers' rank order,
// senders in FROM's rank order): the sending and the receiving rank (of the transport) and the bytes per cached
// token (common layers · 2 · common heads · HEAD_DIM · ELEMENT_BYTES). The same rules and errors as kv_transfer.
struct KvMessage {
  int from = 0, to = 0;
  double bytes_per_token = 0;
};
std::vector<KvMessage> kv_transfer_messages(int64_t layers, int64_t kv_heads, int64_t head_dim, double element_bytes,
                                            const KvLayout& from, const KvLayout& to);

}  // namespace shardsim::models

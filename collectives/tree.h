// Rooted algorithms for broadcast and reduce.
//
// binomial tree (Thakur, Rabenseifner & Gropp 2005, section 4.1): in root-relative ranks v, v receives from
// v - lowbit(v) and sends to v + 2^j for every 2^j < lowbit(v) (largest subtree first); ceil(log2 p) rounds:
//   T_broadcast = sum over the rounds on the critical path (alpha + S/B) = ceil(log2 p)(alpha + S/B)
// reduce is the mirror image (children send up, the parent reduces).
// chain ("ring" in NCCL's terms: broadcast and reduce along the ring): v receives from v-1 and forwards to v+1
// (broadcast from the root: 0 -> 1 -> ... -> p-1; reduce: 1 -> 2 -> ... -> p-1 -> 0, so both use the forward
// links of a one-way ring).
// Both cut the message into pieces of chunk_bytes (default 1 MiB for the chain, whole message for the tree)
// that are forwarded as soon as they arrive, so the chain is a pipeline:
//   T_chain = (p-1)(alpha + c/B) + (m-1) c/B,  m = ceil(S/c) pieces of c bytes
// which tends to S/B for large S (bandwidth-optimal), while the tree wins for small S.
// Crossing flows (docs/MODEL.md): a one-piece binomial tree declares each level's pattern
// (runtime::FlowPattern::binomial), so a level's flows of different senders that share a link get B/k each; the
// pipelined tree and the chain declare none (their pieces do not move together), keeping the send and receive rules.
#pragma once

#include <string>

#include "collectives/types.h"
#include "runtime/transport.h"

namespace shardsim::collectives::tree {

constexpr size_t kDefaultChainPiece = size_t{1} << 20;

// Pieces of a COUNT-element buffer of ES-byte elements: a Partition into m = ceil(bytes / CHUNK_BYTES) parts,
// clamped to 1..1024 and to COUNT (CHUNK_BYTES 0: one piece). Shared by every pipelined tree.
Partition pieces(size_t count, size_t es, size_t chunk_bytes);

// BUF (COUNT elements) holds the data on ROOT; afterwards on every rank.
sim::TimeNs broadcast_binomial(runtime::Transport& tp, void* buf, size_t count, DType t, int root,
                               size_t chunk_bytes, sim::TimeNs ready, const std::string& name);
sim::TimeNs broadcast_chain(runtime::Transport& tp, void* buf, size_t count, DType t, int root, size_t chunk_bytes,
                            sim::TimeNs ready, const std::string& name);
// ACC (COUNT elements) holds this rank's contribution and is used as scratch; afterwards ROOT's ACC holds the
// reduction of all ranks' contributions.
sim::TimeNs reduce_binomial(runtime::Transport& tp, void* acc, size_t count, DType t, ReduceOp op, int root,
                            size_t chunk_bytes, sim::TimeNs ready, const std::string& name);
sim::TimeNs reduce_chain(runtime::Transport& tp, void* acc, size_t count, DType t, ReduceOp op, int root,
                         size_t chunk_bytes, sim::TimeNs ready, const std::string& name);

}  // namespace shardsim::collectives::tree

// Internal: the cost models of the collective algorithms (the one place for them, as NCCL keeps its own in
// graph/tuning.cc). Each replays an algorithm's schedule through event-free sim::Timelines on the group's routes
// (the simulator's own rules: port and own-link serialization, cut-through route latency, bottleneck bandwidth),
// so an estimate equals the simulated time of a lone collective started at time 0 on every chip (see
// collectives/algorithms.h for where they are exact). Units: bytes in, simulated ns out. The registry
// (collectives/registry.cpp) points each algorithm's cost estimate at one of these.
#pragma once

#include <cstddef>

#include "runtime/transport.h"

namespace shardsim::collectives::cost {

// Slowest time over all ranks r of a message of BYTES from r to r + DIST (mod p).
double worst_step(const runtime::Transport& tp, int dist, double bytes);
// Ring passes (PASSES = 1: reduce-scatter or all-gather, 2: both) of CHUNK bytes per rank, one or two directions,
// cut into pieces of CHUNK_BYTES as ring::make_lanes does.
double ring(const runtime::Transport& tp, double chunk, int passes, bool bidir, size_t chunk_bytes);
// Halving-doubling (Thakur's fold for non-powers of two) of a BYTES buffer: RS and/or AG phases.
double halving_doubling(const runtime::Transport& tp, double bytes, bool rs, bool ag);
// Recursive doubling all_reduce of a BYTES buffer (whole-vector swaps; same fold as halving-doubling).
double recursive_doubling(const runtime::Transport& tp, double bytes);
// Pipelined chain (broadcast from rank 0 or REDUCE to rank 0) of BYTES.
double chain(const runtime::Transport& tp, double bytes, size_t chunk_bytes, bool reduce);
// Per-dimension rings of the torus algorithm for a BYTES buffer.
double torus(const runtime::Transport& tp, double bytes, int passes, size_t chunk_bytes);
// Direct exchange of PER_PEER bytes between every pair (optionally only from / only to rank 0).
double direct(const runtime::Transport& tp, double per_peer, bool root_only_sends, bool root_only_recvs);
// Binomial tree broadcast from / REDUCE to rank 0 of BYTES.
double binomial(const runtime::Transport& tp, double bytes, size_t chunk_bytes, bool reduce);

}  // namespace shardsim::collectives::cost

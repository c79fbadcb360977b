// Internal: the cost models of the collective algorithms (the one place for them, as NCCL keeps its own in
// graph/tuning.cc). Each replays an algorithm's schedule through event-free sim::Timelines on the group's routes
// (the simulator's own rules: port and own-link serialization, cut-through route latency, bottleneck bandwidth),
// so an estimate equals the simulated time of a lone collective started at time 0 on every chip (see
// collectives/algorithms.h for where they are exact). Units: bytes in, simulated ns out. The registry
// (collectives/registry.cpp) points each algorithm's cost estimate at one of these.
#pragma once

#include <cstddef>
#include <vector>

#include "collectives/algorithms.h"
#include "collectives/ring.h"
#include "runtime/transport.h"

namespace shardsim::collectives::cost {

// Whether ring replays fold onto one period of a symmetric group (cost_model.cpp, ring_estimate: the same estimate
// from fewer replayed ranks). On by default; tests turn it off to compare with the full replay.
void set_replay_folding(bool on);
// ring_cycles on the group of RANK_TO_CHIP (rank -> chip of TOPO) without a transport (tests, tools).
double ring_cycles_on(const topology::Topology& topo, std::vector<int> rank_to_chip, double chunk, int passes,
                      const std::vector<ring::Cycle>& cycles, size_t chunk_bytes);

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
// Concurrent-dimension torus (torus_concurrent.h) for a BYTES buffer: reduce-scatter phases (RS), all-gather
// phases (AG) or both.
double torus_concurrent(const runtime::Transport& tp, double bytes, bool rs, bool ag, size_t chunk_bytes);
// The physical lower bound (ns) of C on BYTES (sized as estimate_ns sizes them) for any algorithm that moves data
// only between chips (no in-network reduction): every chip must send at least (p-1)/p x BYTES of reduce-scatter
// and / or all-gather traffic over its outgoing links, so T >= passes x (p-1)/p x BYTES / E, E = the smallest
// total outgoing line rate of a member chip (Chan et al., "Collective communication: theory, practice, and
// experience", CCPE 2007; Patarasuk & Yuan, JPDC 2009). all_reduce: 2 passes; reduce_scatter, all_gather(v): 1;
// other collectives: 0 (no bound stated). Latency is not counted (a bound, not an estimate).
double lower_bound_ns(Collective c, const runtime::Transport& tp, double bytes);
// In-switch reduction (in_switch.h) of C on a BYTES buffer: its piece schedule replayed from time 0 on every chip.
double in_switch(Collective c, const runtime::Transport& tp, double bytes, size_t chunk_bytes);
// The physical lower bound (ns) of C on BYTES with in-network reduction (in_switch.h): every chip must send its
// data up and receive its result (U_r over its up-link, D_r over its down-link, as in_switch.h lists them) and the
// switch must reduce the buffer at its own rate: T >= max over r of (U_r / B_up, D_r / B_down, S_reduced / R).
// Latency is not counted.
double in_network_lower_bound_ns(Collective c, const runtime::Transport& tp, double bytes);
// Direct exchange of PER_PEER bytes between every pair (optionally only from / only to rank 0).
double direct(const runtime::Transport& tp, double per_peer, bool root_only_sends, bool root_only_recvs);
// Ring passes over several directed rings at once (multi_ring.h's strides, rail_ring.h's channels): PASSES of
// CHUNK bytes per rank, split equally over CYCLES and cut into pieces of CHUNK_BYTES as ring::make_lanes does.
double ring_cycles(const runtime::Transport& tp, double chunk, int passes, const std::vector<ring::Cycle>& cycles,
                   size_t chunk_bytes);
// Double binary tree all_reduce (double_binary_tree.h) of a BYTES buffer: its schedule replayed on every rank
// in the run's order (halves of BYTES / 2, pieces of CHUNK_BYTES or 1 MiB, at most 1024 per half).
double double_binary_tree(const runtime::Transport& tp, double bytes, size_t chunk_bytes);
// Binomial tree broadcast from / REDUCE to rank 0 of BYTES.
double binomial(const runtime::Transport& tp, double bytes, size_t chunk_bytes, bool reduce);

}  // namespace shardsim::collectives::cost

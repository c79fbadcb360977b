// In-switch (in-network) reduction: all_reduce, reduce_scatter and all_gather(v) through a switch that reduces and
// multicasts itself (NVIDIA NVLink SHARP, "NVLS", on an NVSwitch node; InfiniBand SHARP across nodes). Every chip
// sends its data up to the switch once; the switch reduces what its chips sent and multicasts the result down.
// The switch's capability comes from the topology (`reduction: true` on a switch, with its own bandwidth and
// latency; topology/topology.h, SwitchReduction).
//
// Needs: a grid topology with a switch dimension of size > 1 that has in-switch reduction, and a group whose chips
// are exactly one line of that dimension (the chips of one switch), one rank per chip.
//
// What moves, per chip r (S = the buffer as estimate_ns sizes it, C_r = rank r's chunk of the layout):
//   all_reduce      up S,    the switch reduces S,  down S
//   reduce_scatter  up S,    the switch reduces S,  down C_r (its own chunk of the result)
//   all_gather(v)   up C_r,  the switch multicasts, down S - C_r (every other chunk)
// Pipelining: the data goes in m pieces, m = ceil(largest per-chip total / P) clamped to 1..64, P = chunk_bytes or
// 1 MiB when chunk_bytes is 0 (the algorithm always pipelines, as NCCL's NVLS kernels do). Each piece of chip r
// enters its up-link as a message (its port busy for o + piece / (B eff): topology.h, Protocol), back to back,
// and reaches the switch o + alpha + piece / (B eff) after it entered. The switch reduces piece i when every
// chip's piece i is in, one piece after the other at its own rate R:
//   e(i) = max(max_r u_r(i), e(i-1)) + (reduced piece)/R        (all_gather: multicast only, + 0)
// and sends it down at e(i) + alpha_R; chip r's down-link delivers it o + alpha + piece / (B eff) later, queued
// behind the previous piece (Timeline::receive).
// Closed form (every chip ready at 0, equal links of bandwidth B and latency alpha, efficiency 1, o = 0, m equal
// pieces): all_reduce with R <= B: T = 2 alpha + alpha_R + S/R + 2 S/(mB); R >= B: 2 alpha + alpha_R + S/B +
// S/(mR) + S/(mB). So busbw = 2(p-1)/p x S/T tends to 2(p-1)/p x min(R, B): with R at the link rate an 8-chip
// switch reaches 1.75x the ring's busbw (every chip's up- and down-link busy at once, each carrying S instead of
// the ring's 2(p-1)/p S per direction).
// Physical lower bound (cost::in_network_lower_bound_ns): T >= max(U_r / B_up, D_r / B_down, S_reduced / R).
//
// Data. The simulated movement is booked on the timeline (Transport::send_to_switch for the up-link,
// Timeline::receive from the switch for the down-link); the data itself travels between ranks in untimed messages
// (runtime::SendOp::timed = false): every rank sends its copy of chunk j to rank j, which reduces them
// (reduce-scatter), and rank j sends its reduced chunk to every rank (all-gather). The untimed messages also
// carry the time each chip's first piece entered its up-link, so every chip computes the same switch times without
// any other exchange.
#pragma once

#include <string>
#include <vector>

#include "collectives/types.h"
#include "runtime/transport.h"

namespace shardsim::collectives::in_switch {

// Why the algorithm cannot run on TP (empty when it can).
std::string obstacle(const runtime::Transport& tp);

// The piece schedule, shared by the run and the estimate (cost/cost_model.cpp). A transfer of T bytes goes in pieces
// of whole bytes, piece i = floor((i+1) T / m) - floor(i T / m), so byte counts add up exactly.
struct Schedule {
  int dim = -1;               // the reduction switch dimension
  int pieces = 1;             // m
  std::vector<double> up;     // per rank: bytes it sends up in all (0: nothing)
  std::vector<double> down;   // per rank: bytes it receives from the switch in all
  double reduced = 0;         // bytes the switch reduces in all (0: multicast only)
  double rate_gbps = 0;       // the switch's reduction rate R
  double latency_ns = 0;      // its latency alpha_R
  double piece(double total, int i) const;
};
// RS / AG: which halves run (all_reduce both). CHUNK[r]: rank r's chunk in bytes.
Schedule schedule(const runtime::Transport& tp, bool rs, bool ag, const std::vector<double>& chunk,
                  size_t chunk_bytes);
// When rank R's pieces reach the switch, its first piece entering its up-link at START with the port and the
// link free from then on (as Timeline::send books them back to back).
std::vector<double> up_arrivals(const runtime::Transport& tp, const Schedule& sched, int r, double start);
// The times the switch sends each piece down, given every rank's up_arrivals (ignored where SCHED.up[r] is 0).
std::vector<double> emit_times(const Schedule& sched, const std::vector<std::vector<double>>& arrivals);
// Down-link flight of rank R's piece I once the link is free (o + alpha x factor + occupancy, as Timeline::receive).
double down_flight(const runtime::Transport& tp, const Schedule& sched, int r, int i);
// When rank R has each piece, the switch sending them at EMIT, its down-link free (as Timeline::receive queues
// them); the last entry is when the chip has all of its result.
std::vector<double> down_arrivals(const runtime::Transport& tp, const Schedule& sched, int r,
                                  const std::vector<double>& emit);

sim::TimeNs all_reduce(runtime::Transport& tp, const void* sendbuf, void* recvbuf, size_t count, DType t, ReduceOp op,
                       size_t chunk_bytes, sim::TimeNs ready, const std::string& name);
sim::TimeNs reduce_scatter(runtime::Transport& tp, void* base, const Layout& layout, DType t, ReduceOp op,
                           size_t chunk_bytes, sim::TimeNs ready, const std::string& name);
sim::TimeNs all_gather(runtime::Transport& tp, void* base, const Layout& layout, DType t, size_t chunk_bytes,
                       sim::TimeNs ready, const std::string& name);

}  // namespace shardsim::collectives::in_switch

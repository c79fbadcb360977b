// The collective catalogue and algorithm selection.
//
// Every collective has a list of algorithms, derived from the registry (collectives/registry.h, one descriptor per
// algorithm); at present: A caller either forces one (an unknown name or
// one that cannot run on the group/topology is a UsageError, exit 2, saying which and why) or asks for
// "auto": each applicable algorithm's simulated time is estimated by replaying its schedule on the group's
// routes (below), and the lowest estimate wins (ties: the earlier name in the list). The explanation lists
// every estimate.
//
//   all_reduce, reduce_scatter, all_gather, all_gatherv : ring, bidir_ring, torus, torus_concurrent, in_switch,
//                                                         halving_doubling (all_reduce also recursive_doubling, opt-in)
//   broadcast, reduce                                   : binomial_tree, ring (pipelined chain)
//   all_to_all, all_to_allv, gather, scatter            : direct
//   send_recv                                           : direct;   barrier : dissemination
// Aliases: bidirectional_ring, hd / rabenseifner / recursive_halving_doubling, tree / binomial, chain, pairwise,
// hierarchical / multi_dim (= torus: per-dimension rings on any grid topology), concurrent_torus / torus_2d,
// nvls / sharp / in_network (= in_switch: a switch that reduces in the network, collectives/in_switch.h).
//
// Estimates replay each algorithm's schedule through event-free sim::Timelines (the simulator's own rules:
// port and own-link serialization, cut-through route latency, bottleneck bandwidth), so they equal the simulated
// time of a lone collective started at time 0 on every chip (ring/bidir_ring incl. pipelining,
// halving_doubling incl. the unequal chunk halves of non-powers of two, chains, binomial trees, direct); the
// torus replays the ring of each dimension through chip 0 in torus::dim_order (exact when a dimension's lines are
// alike). Chunks are taken as S/p bytes: with counts not divisible by p the estimate is off by up to one element
// per chunk (about 1e-4 relative in the tests).
#pragma once

#include <string>
#include <vector>

#include "collectives/types.h"
#include "runtime/transport.h"

namespace shardsim::collectives {

enum class Collective {
  all_reduce, reduce_scatter, all_gather, all_gatherv, broadcast, reduce, all_to_all, all_to_allv, gather, scatter,
  send_recv, barrier
};
std::string collective_name(Collective c);
Collective parse_collective(const std::string& name);  // std::invalid_argument listing the known names
const std::vector<Collective>& all_collectives();
bool is_reduction(Collective c);  // takes a ReduceOp
bool is_rooted(Collective c);     // takes a root

// Algorithm names for C, canonical spelling, in tie-break order.
const std::vector<std::string>& algorithm_names(Collective c);
// Canonical name for NAME or an alias; "" if unknown for C.
std::string canonical_algorithm(Collective c, const std::string& name);
// The message for NAME not being an algorithm of C (canonical_algorithm(C, NAME) empty): when NAME (or an alias)
// is an algorithm of other collectives, "algorithm 'halving_doubling' is not applicable to broadcast (it is an
// algorithm of all_reduce, ...); broadcast takes: binomial_tree, ring, auto", else "unknown algorithm 'warp'
// (known: ..., auto)". No "C: " prefix.
std::string not_an_algorithm_of(Collective c, const std::string& name);
// Why ALGORITHM cannot run C on TP ("" when it can).
std::string obstacle(Collective c, const std::string& algorithm, const runtime::Transport& tp);
// The plan rule (parallel.algorithm, docs/CONFIG.md; ParallelPlan::algorithm_for): a plan names one algorithm for
// all its collectives; C runs NAME when C implements it and its group has GROUP_SIZE >= 2 chips, else "auto" (a
// collective without NAME, or a group of one chip where nothing moves). choose() applies it on transports with
// Transport::plan_algorithms() set.
std::string plan_algorithm(Collective c, const std::string& name, int group_size);
// Why a plan naming ALGORITHM cannot run C on TP under the plan rule ("" when it can, or when the rule runs auto):
// "all_reduce over 4 chips (ring 4 chips, ...): the topology has no switch with in-switch reduction ...". The
// check a command makes on every group of its plan before the first step (exit 2 naming parallel.algorithm).
std::string plan_obstacle(Collective c, const std::string& algorithm, const runtime::Transport& tp);
// Closed-form simulated time (ns) of C with ALGORITHM for a per-rank buffer of BYTES (as nccl-tests sizes it:
// all_reduce/broadcast/reduce the buffer; reduce_scatter the input; all_gather the output; all_to_all the
// send buffer; gather the root's buffer).
// Includes call_overhead_ns(C, TP) (below), as the simulated run does.
double estimate_ns(Collective c, const std::string& algorithm, const runtime::Transport& tp, double bytes,
                   size_t chunk_bytes = 0);

// The fixed cost of one call of C on TP's group (ns): the topology's Protocol::call_overhead_ns (topology.h) for
// every collective on p > 1 chips, 0 for send_recv and barrier (point-to-point and host synchronisation, not a
// device collective call) and for a group of one chip (nothing moves, as estimate_ns's 0). The one rule: choose()
// puts it in Choice::call_overhead_ns, which every collective adds to its ready time before the first step
// (Choice::start), and estimate_ns adds it to the replay.
double call_overhead_ns(Collective c, const runtime::Transport& tp);

// When OPTIONS.check_args: every rank of TP must pass the same arguments (COUNT is what must agree: the
// total count, or a hash of per-rank counts for the v-variants). The first call with a given signature on a
// communicator agrees in one small round (runtime::Transport::agree_max) and throws AgreedError(exit 2) on every
// rank on a mismatch; later calls with that signature skip the round, and a mismatch then surfaces where a rank
// receives a message whose header carries another signature (UsageError, exit 2, on the receiving ranks;
// runtime/transport.h). The mixed case (some ranks with a signature agreed before, others with a new one) is a
// UsageError (exit 2) on a skipping rank that sees the others' agreement messages (Transport::agreed() says when
// that is guaranteed; otherwise, and in chip mode, the watchdog ends the job with exit 3). Returns the call's
// signature: the collective holds it in a runtime::SignatureScope while it moves data.
// Test hook: SHARDSIM_TEST_NEW_SIGNATURE="R1,R2,...@N" makes world ranks R1, R2, ... call the N-th argument check
// (0-based, per communicator) with count + 1 as a new signature (the mixed case, tests/e2e/collectives_cli.sh).
runtime::CallSignature check_args(Collective c, runtime::Transport& tp, const CollectiveOptions& options,
                                  uint64_t count, DType dtype, int op);

struct AlgorithmDescriptor;  // collectives/registry.h

struct Choice {
  std::string algorithm;  // canonical name
  const AlgorithmDescriptor* descriptor = nullptr;  // its registry entry (run hooks)
  std::string explanation;  // "auto: ring 12.3 us, bidir_ring 6.4 us (chosen), torus n/a (...)"
  double call_overhead_ns = 0;  // call_overhead_ns(C, TP): charged once per call, before the first step
  // When the call's first step may start on TP's chip: READY + call_overhead_ns (READY itself, bit for bit, at 0).
  // The collective's span still starts at READY, so the overhead counts as the call's (communication) time. With
  // dependency recording the overhead is an event NAME + ".launch" on the host lane (sim::Timeline::fixed_cost),
  // so the profiler's critical path runs through it (it was "waiting" before).
  sim::TimeNs start(runtime::Transport& tp, sim::TimeNs ready, const std::string& name) const;
};
// Resolves OPTIONS.algorithm for C. Throws UsageError for unknown or inapplicable algorithms.
Choice choose(Collective c, const CollectiveOptions& options, const runtime::Transport& tp, double bytes);

// A folded run (docs/performance/fold.md), decided before its first step: why the call C (named NAME on the
// timeline) of COUNT elements of DTYPE over TP, a group of simulated and mirrored chips, would not run the same
// program on every member up to a rotation of the group's ranks ("" when it would, or when TP spans no mirrored
// chip). It would not unless choose() picks ring or bidir_ring for it and its Partition chunks are equal
// (COUNT a multiple of the group size). The same rule the collectives apply while they run (choose and the
// rings' chunk check end a folded attempt with the same words), so a plan that passes it before the first step
// does not break on it later. Throws as choose() does (UsageError for an algorithm that cannot run on TP).
std::string fold_obstacle(Collective c, const CollectiveOptions& options, const runtime::Transport& tp, size_t count,
                          DType dtype, const std::string& name);
// The fold's words for a collective whose algorithm is not symmetric under the replica shift, and for unequal
// chunks (one message for fold_obstacle and the run-time checks).
std::string fold_algorithm_reason(Collective c, const std::string& algorithm);
std::string fold_chunks_reason(const std::string& name, size_t count, int parts);

}  // namespace shardsim::collectives

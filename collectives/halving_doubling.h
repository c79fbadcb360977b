// Recursive halving (reduce-scatter) and recursive doubling (all-gather), and all_reduce as the two in a row
// (Rabenseifner's algorithm). Thakur, Rabenseifner & Gropp, "Optimization of Collective Communication
// Operations in MPICH", IJHPCA 19(1), 2005, sections 4.4-4.5.
//
// Power-of-two p: log2(p) steps per phase; at reduce-scatter step i (distance p/2^(i+1)) each rank exchanges
// half of its current range with the rank at that distance; all-gather mirrors it (distances 1, 2, 4, ...).
//   T_all_reduce = sum_i 2(alpha_i + S/(2^(i+1) B)) = 2 log2(p) alpha + 2 (p-1)/p S/B  (uniform links)
// Non-power-of-two p (Thakur's scheme): with p' = 2^floor(log2 p) and rem = p - p', the first 2*rem ranks pair
// up; each even rank sends its data to the odd rank above it and sits out, leaving p' "virtual" ranks; at the
// end the odd ranks send the result back. That adds one full-size step before and one after.
// The data layout must be packed in rank order (Layout::from(Partition) or from_counts): each virtual rank then
// owns a contiguous range of chunks.
// On a ring topology the partners are up to p/2 hops apart: alpha_i includes every hop's latency. Every step,
// the fold and the unfold included, declares its global pattern (runtime::FlowPattern::halving_doubling), so
// concurrent routes that share a link are charged B/k each (docs/MODEL.md "Crossing flows").
#pragma once

#include <string>

#include "collectives/types.h"
#include "runtime/transport.h"

namespace shardsim::collectives::halving_doubling {

// Reads SENDBUF, writes RECVBUF (COUNT elements each; equal pointers = in place; out of place costs no copy).
// Returns the time this chip's output is complete.
sim::TimeNs all_reduce(runtime::Transport& tp, const void* sendbuf, void* recvbuf, size_t count, DType t,
                       ReduceOp op, sim::TimeNs ready, const std::string& name);
// Recursive doubling all_reduce (Thakur et al. 2005, section 4.4; MPICH's and Open MPI's small-message
// all_reduce): log2(p') steps in which partners at XOR distance 1, 2, 4, ... among the p' virtual ranks swap their
// whole COUNT-element vectors and both reduce, plus the fold/unfold steps above for non-powers of two.
//   T = sum_i (alpha_i + S/B) = log2(p) alpha + log2(p) S/B  (uniform links): fewest steps, most bytes; it wins
// only where latency dominates (and always at p = 2: one exchange against the ring's two).
// Reads SENDBUF, writes RECVBUF (COUNT elements each; equal pointers = in place; out of place costs no copy).
// Returns the time this chip's output is complete.
sim::TimeNs recursive_doubling_all_reduce(runtime::Transport& tp, const void* sendbuf, void* recvbuf, size_t count,
                                          DType t, ReduceOp op,
                                          sim::TimeNs ready, const std::string& name);
// After the call chunk r of LAYOUT on rank r holds the reduction (other chunks: scratch).
sim::TimeNs reduce_scatter(runtime::Transport& tp, void* base, const Layout& layout, DType t, ReduceOp op,
                           sim::TimeNs ready, const std::string& name);
// Chunk r of LAYOUT on rank r is the input; afterwards every chunk is filled on every rank.
sim::TimeNs all_gather(runtime::Transport& tp, void* base, const Layout& layout, DType t, sim::TimeNs ready,
                       const std::string& name);

}  // namespace shardsim::collectives::halving_doubling

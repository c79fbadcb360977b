// Double binary tree all_reduce (NCCL's tree algorithm; Sanders, Speck & Träff, "Two-tree algorithms for full
// bandwidth broadcast, reduction and scan", Parallel Computing 35(12), 2009; NCCL 2.4 release notes and blog
// "Massively Scale Your Deep Learning Training with NCCL 2.4", 2019).
//
// The buffer is split in two halves (the first ceil(count/2) elements and the rest). Each half is reduced up one
// binary tree to its root and broadcast back down the same tree, pipelined in pieces, so the two trees run at
// once. The trees are complementary: tree A is the in-order binary tree over positions 1..p (position x = rank + 1;
// a node's interval [lo, hi] has as its root the position with the most trailing zero bits, so the root is the
// largest power of two <= p, leaves are odd positions, depth ceil(log2(p + 1)) - 1); tree B is tree A shifted by
// one rank (position x = rank, rank 0 at position p). A rank that is interior in A (even position) is a leaf in B,
// so every rank is interior in at most one tree and sends (and receives) about 2S whatever p (a ring: 2(p-1)/p S):
// per-rank traffic stays O(S) while the latency is O(log p) instead of the ring's O(p).
//
// Schedule on each rank, four exchanges (the same order of sends and of receives in the run and in its cost
// estimate, cost/cost_model.cpp); grouped so that no rank blocks on a send whose receive its peer posts only after a
// receive of its own (on MPI ranks a large send completes when its receive is posted):
//   U1. the halves where the rank is a leaf go up to their parents; the children's pieces of the half where it is
//       interior ("inner") come in, and are reduced into its own;
//   U2. the inner half's reduced pieces go up to its parent (none at the root);
//   D1. the inner half's result comes down from its parent (none at the root);
//   D2. the inner half goes on down to the children, piece-major (piece j to both before piece j + 1), while the
//       leaf halves' results come in from their parents.
// Pieces: chunk_bytes (default kDefaultPiece) per piece, at most 1024 per half (tree::pieces); each piece is
// forwarded at the simulated time it is complete, so the trees pipeline. No flow pattern (pipelined pieces do not
// move in steps): the transport's send and receive rules charge the contention.
//
// Closed form where every tree edge is a link of its own (fully connected) and each half is one piece (S/2 <=
// chunk): T = 2D(alpha + S/(2B)), D = ceil(log2(p + 1)) - 1 the deeper tree's depth (tests/mpi/all_reduce_test.cpp,
// DoubleBinaryTree.*). Pipelined, about 2(D(alpha + c/B) + (m - 1)c/B'), B' what an interior chip's port gives
// each of its two children; the estimate (cost::double_binary_tree) replays the exact schedule instead.
//
// all_reduce only (NCCL runs its trees for all_reduce only). `auto` considers it after halving_doubling (its
// estimate is O(p m) flows per size; registry.cpp).
#pragma once

#include <string>

#include "collectives/types.h"
#include "runtime/transport.h"

namespace shardsim::collectives::double_binary_tree {

constexpr size_t kDefaultPiece = size_t{1} << 20;

// Rank R's place in tree TREE (0 = A, 1 = B) of P ranks: PARENT (-1 at the root) and up to two CHILDREN (-1: none).
struct TreeNode {
  int parent = -1;
  int children[2] = {-1, -1};
  int n_children() const { return (children[0] >= 0) + (children[1] >= 0); }
};
TreeNode node(int tree, int r, int p);

// The halves: tree 0 reduces elements [0, first), tree 1 [first, count).
inline size_t first_half(size_t count) { return (count + 1) / 2; }

sim::TimeNs all_reduce(runtime::Transport& tp, const void* sendbuf, void* recvbuf, size_t count, DType t, ReduceOp op,
                       size_t chunk_bytes, sim::TimeNs ready, const std::string& name);

}  // namespace shardsim::collectives::double_binary_tree

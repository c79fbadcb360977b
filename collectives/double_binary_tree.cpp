#include "collectives/double_binary_tree.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "collectives/tree.h"

namespace shardsim::collectives::double_binary_tree {

namespace {

// The position in [LO, HI] (1-based, LO <= HI) with the most trailing zero bits: the root of that interval's
// in-order binary tree. Unique: two multiples of b in the range would put a multiple of 2b between them.
int interval_root(int lo, int hi) {
  int b = 1;
  while (b <= hi / 2) b *= 2;
  for (; b > 0; b /= 2) {
    const int x = (lo + b - 1) / b * b;
    if (x <= hi) return x;
  }
  return lo;
}

int position(int tree, int r, int p) { return tree == 0 ? r + 1 : (r + p - 1) % p + 1; }
int rank_at(int tree, int pos, int p) { return tree == 0 ? pos - 1 : pos % p; }

}  // namespace

TreeNode node(int tree, int r, int p) {
  TreeNode n;
  if (p <= 1) return n;
  const int pos = position(tree, r, p);
  int lo = 1, hi = p, parent = -1;
  for (;;) {
    const int x = interval_root(lo, hi);
    if (x == pos) break;
    parent = x;
    if (pos < x)
      hi = x - 1;
    else
      lo = x + 1;
  }
  n.parent = parent < 0 ? -1 : rank_at(tree, parent, p);
  if (lo <= pos - 1) n.children[0] = rank_at(tree, interval_root(lo, pos - 1), p);
  if (pos + 1 <= hi) n.children[n.children[0] >= 0 ? 1 : 0] = rank_at(tree, interval_root(pos + 1, hi), p);
  return n;
}

namespace {

// One half of the buffer on this rank: its tree node, its elements, its pieces and their ready times.
struct Half {
  TreeNode n;
  unsigned char* base = nullptr;
  Partition part{0, 1};
  std::vector<sim::TimeNs> t;
  bool active() const { return part.count > 0; }
  bool leaf() const { return n.n_children() == 0; }
};

// Appends the half's pieces, sent up to the parent, to SENDS.
void up_sends(const Half& h, size_t es, std::vector<runtime::SendOp>& sends) {
  for (size_t j = 0; j < h.part.parts; ++j)
    sends.push_back({h.base + h.part.offset(j) * es, h.part.size(j) * es, h.n.parent, h.t[j]});
}

// Appends the receives of every child's pieces (into scratch IN) to RECVS.
void child_recvs(const Half& h, size_t es, unsigned char* in, std::vector<runtime::RecvOp>& recvs) {
  const size_t bytes = h.part.count * es;
  for (int c = 0; c < h.n.n_children(); ++c)
    for (size_t j = 0; j < h.part.parts; ++j)
      recvs.push_back({in + c * bytes + h.part.offset(j) * es, h.part.size(j) * es, h.n.children[c], 0});
}

// Reduces the received children's pieces (RECVS[FIRST...], from child_recvs) into the half; piece j is complete
// when every child's piece j is here.
void reduce_children(const runtime::Transport& tp, Half& h, size_t es, DType dt, ReduceOp op, const unsigned char* in,
                     const std::vector<runtime::RecvOp>& recvs, size_t first) {
  const size_t bytes = h.part.count * es;
  for (int c = 0; c < h.n.n_children(); ++c) {
    if (!tp.shape_only()) reduce_into(h.base, in + c * bytes, h.part.count, dt, op);
    for (size_t j = 0; j < h.part.parts; ++j)
      h.t[j] = std::max(h.t[j], recvs[first + static_cast<size_t>(c) * h.part.parts + j].arrival);
  }
}

void parent_recvs(const Half& h, size_t es, std::vector<runtime::RecvOp>& recvs) {
  for (size_t j = 0; j < h.part.parts; ++j)
    recvs.push_back({h.base + h.part.offset(j) * es, h.part.size(j) * es, h.n.parent, 0});
}

// Piece-major: piece j to every child before piece j + 1.
void down_sends(const Half& h, size_t es, std::vector<runtime::SendOp>& sends) {
  for (size_t j = 0; j < h.part.parts; ++j)
    for (int c = 0; c < h.n.n_children(); ++c)
      sends.push_back({h.base + h.part.offset(j) * es, h.part.size(j) * es, h.n.children[c], h.t[j]});
}

void take_arrivals(Half& h, const std::vector<runtime::RecvOp>& recvs, size_t first) {
  for (size_t j = 0; j < h.part.parts; ++j) h.t[j] = std::max(h.t[j], recvs[first + j].arrival);
}

}  // namespace

sim::TimeNs all_reduce(runtime::Transport& tp, const void* sendbuf, void* recvbuf, size_t count, DType dt, ReduceOp op,
                       size_t chunk_bytes, sim::TimeNs ready, const std::string& name) {
  const size_t es = runtime::dtype_size(dt);
  if (sendbuf != recvbuf && count && !tp.shape_only()) std::memcpy(recvbuf, sendbuf, count * es);
  const int p = tp.size();
  if (p == 1 || count == 0) return ready;
  auto* base = static_cast<unsigned char*>(recvbuf);
  const size_t piece = chunk_bytes ? chunk_bytes : kDefaultPiece;
  const size_t first = first_half(count);
  Half h[2];
  for (int k = 0; k < 2; ++k) {
    const size_t off = k == 0 ? 0 : first, n = k == 0 ? first : count - first;
    h[k].n = node(k, tp.rank(), p);
    h[k].base = base + off * es;
    if (n == 0) continue;
    h[k].part = tree::pieces(n, es, piece);
    h[k].t.assign(h[k].part.parts, ready);
  }
  // Which half this rank is interior in (I, at most one) and which it is only a leaf of (L).
  Half* inner = nullptr;
  std::vector<Half*> leaf;
  for (auto& x : h) {
    if (!x.active()) continue;
    if (x.leaf())
      leaf.push_back(&x);
    else
      inner = &x;
  }
  // Exchanges are grouped so that no rank blocks on a send whose receive is posted only after a receive of its
  // own (MPI ranks: a large send completes when its receive is posted). Order of the sends and of the receives
  // is the schedule's (double_binary_tree.h), which the estimate replays.
  std::vector<runtime::SendOp> sends;
  std::vector<runtime::RecvOp> recvs;
  // U1: leaf halves go up; the children's pieces of the inner half come in.
  for (Half* x : leaf)
    if (x->n.parent >= 0) up_sends(*x, es, sends);
  unsigned char* in = nullptr;
  if (inner) {
    in = tp.scratch(2, static_cast<size_t>(inner->n.n_children()) * inner->part.count * es);
    child_recvs(*inner, es, in, recvs);
  }
  if (!sends.empty() || !recvs.empty()) tp.exchange(sends, recvs, name + ".up");
  if (inner) {
    reduce_children(tp, *inner, es, dt, op, in, recvs, 0);
    // U2: the inner half's reduced pieces go up.
    if (inner->n.parent >= 0) {
      sends.clear();
      up_sends(*inner, es, sends);
      tp.exchange(sends, {}, name + ".up");
    }
    // D1: the inner half's result comes down from its parent.
    if (inner->n.parent >= 0) {
      recvs.clear();
      parent_recvs(*inner, es, recvs);
      tp.exchange({}, recvs, name + ".down");
      take_arrivals(*inner, recvs, 0);
    }
  }
  // D2: the inner half goes on down to the children while the leaf halves' results come in.
  sends.clear();
  recvs.clear();
  if (inner) down_sends(*inner, es, sends);
  for (Half* x : leaf)
    if (x->n.parent >= 0) parent_recvs(*x, es, recvs);
  if (!sends.empty() || !recvs.empty()) tp.exchange(sends, recvs, name + ".down");
  size_t at = 0;
  for (Half* x : leaf)
    if (x->n.parent >= 0) {
      take_arrivals(*x, recvs, at);
      at += x->part.parts;
    }
  sim::TimeNs end = ready;
  for (const auto& x : h)
    for (auto v : x.t) end = std::max(end, v);
  return end;
}

}  // namespace shardsim::collectives::double_binary_tree

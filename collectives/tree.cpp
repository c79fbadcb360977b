#include "collectives/tree.h"

#include <algorithm>
#include <vector>

namespace shardsim::collectives::tree {

Partition pieces(size_t count, size_t es, size_t chunk_bytes) {
  const size_t bytes = count * es;
  // At most 1024 pieces: a tiny chunk size on a huge buffer would otherwise mean millions of messages.
  const size_t m = chunk_bytes == 0 ? 1 : std::clamp<size_t>((bytes + chunk_bytes - 1) / chunk_bytes, 1, 1024);
  return Partition{count, std::min(m, std::max<size_t>(count, 1))};
}

namespace {

int real(int v, int root, int p) { return (v + root) % p; }

// Receives all pieces from SRC (arrival per piece into T) as one exchange (with PATTERN, if any).
void recv_pieces(runtime::Transport& tp, unsigned char* base, size_t es, const Partition& part, int src,
                 std::vector<sim::TimeNs>& t, const std::string& label, const runtime::FlowPattern* pattern = nullptr) {
  std::vector<runtime::RecvOp> recvs;
  for (size_t j = 0; j < part.parts; ++j) recvs.push_back({base + part.offset(j) * es, part.size(j) * es, src, 0});
  tp.exchange({}, recvs, label, pattern);
  for (size_t j = 0; j < part.parts; ++j) t[j] = std::max(t[j], recvs[j].arrival);
}

// Sends every piece to every rank in DSTS (rank-major) as one exchange (with PATTERN, if any).
void send_pieces(runtime::Transport& tp, const unsigned char* base, size_t es, const Partition& part,
                 const std::vector<int>& dsts, const std::vector<sim::TimeNs>& t, const std::string& label,
                 const runtime::FlowPattern* pattern = nullptr) {
  std::vector<runtime::SendOp> sends;
  for (int dst : dsts)
    for (size_t j = 0; j < part.parts; ++j) sends.push_back({base + part.offset(j) * es, part.size(j) * es, dst, t[j]});
  if (!sends.empty()) tp.exchange(sends, {}, label, pattern);
}

// Binomial tree in root-relative ranks: parent and children (largest subtree first).
void binomial(int v, int p, int* parent, std::vector<int>* children) {
  int mask = 1;
  *parent = -1;
  while (mask < p) {
    if (v & mask) {
      *parent = v - mask;
      break;
    }
    mask <<= 1;
  }
  for (mask >>= 1; mask > 0; mask >>= 1)
    if (v + mask < p) children->push_back(v + mask);
}

sim::TimeNs finish(const std::vector<sim::TimeNs>& t, sim::TimeNs ready) {
  sim::TimeNs end = ready;
  for (auto x : t) end = std::max(end, x);
  return end;
}

// What every rooted algorithm starts from: root-relative rank, the pieces and their ready times, the buffer.
struct Call {
  int p, v, root;
  size_t es;
  Partition part;
  std::vector<sim::TimeNs> t;
  unsigned char* base;
  Call(const runtime::Transport& tp, void* buf, size_t count, DType dt, int root_, size_t piece_bytes,
       sim::TimeNs ready)
      : p(tp.size()), v((tp.rank() - root_ + tp.size()) % tp.size()), root(root_), es(runtime::dtype_size(dt)),
        part(pieces(count, es, piece_bytes)), t(part.parts, ready), base(static_cast<unsigned char*>(buf)) {}
  int real_rank(int vr) const { return real(vr, root, p); }
};

}  // namespace

// Crossing flows (docs/MODEL.md): with one piece, the flows of one tree level (root-relative v -> v + mask for
// one mask) run together, so each send and receive is an exchange of its own with that level's global pattern
// (runtime::FlowPattern::binomial). Pipelined (several pieces), a level's pieces leave at different times and
// every level is busy at once, which a step's fair share does not describe: no pattern (send and receive rules).
sim::TimeNs broadcast_binomial(runtime::Transport& tp, void* buf, size_t count, DType dt, int root,
                               size_t chunk_bytes, sim::TimeNs ready, const std::string& name) {
  if (tp.size() == 1 || count == 0) return ready;
  Call k(tp, buf, count, dt, root, chunk_bytes, ready);
  int parent;
  std::vector<int> children;
  binomial(k.v, k.p, &parent, &children);
  const bool one_piece = k.part.parts == 1;
  if (parent >= 0) {
    const auto level = runtime::FlowPattern::binomial(k.v - parent, root, false);
    recv_pieces(tp, k.base, k.es, k.part, k.real_rank(parent), k.t, name + ".recv", one_piece ? &level : nullptr);
  }
  // One exchange per child (largest subtree first, as before): the same sends in the same order.
  for (int c : children) {
    const auto level = runtime::FlowPattern::binomial(c - k.v, root, false);
    send_pieces(tp, k.base, k.es, k.part, {k.real_rank(c)}, k.t, name + ".send", one_piece ? &level : nullptr);
  }
  return finish(k.t, ready);
}

sim::TimeNs broadcast_chain(runtime::Transport& tp, void* buf, size_t count, DType dt, int root, size_t chunk_bytes,
                            sim::TimeNs ready, const std::string& name) {
  if (tp.size() == 1 || count == 0) return ready;
  Call k(tp, buf, count, dt, root, chunk_bytes ? chunk_bytes : kDefaultChainPiece, ready);
  if (k.v > 0) recv_pieces(tp, k.base, k.es, k.part, k.real_rank(k.v - 1), k.t, name + ".recv");
  if (k.v < k.p - 1) send_pieces(tp, k.base, k.es, k.part, {k.real_rank(k.v + 1)}, k.t, name + ".send");
  return finish(k.t, ready);
}

namespace {

// Receives every child's pieces and reduces them into ACC; piece j is ready when all children's piece j is in.
void gather_children(runtime::Transport& tp, unsigned char* acc, size_t es, const Partition& part, DType dt,
                     ReduceOp op, const std::vector<int>& children, std::vector<sim::TimeNs>& t,
                     const std::string& label, const runtime::FlowPattern* pattern = nullptr) {
  if (children.empty()) return;
  unsigned char* in = tp.scratch(2, children.size() * part.count * es);
  auto from = [&](size_t c) { return in + c * part.count * es; };
  std::vector<runtime::RecvOp> recvs;
  for (size_t c = 0; c < children.size(); ++c)
    for (size_t j = 0; j < part.parts; ++j)
      recvs.push_back({from(c) + part.offset(j) * es, part.size(j) * es, children[c], 0});
  tp.exchange({}, recvs, label, pattern);
  for (size_t c = 0; c < children.size(); ++c) {
    if (!tp.shape_only()) reduce_into(acc, from(c), part.count, dt, op);
    for (size_t j = 0; j < part.parts; ++j) t[j] = std::max(t[j], recvs[c * part.parts + j].arrival);
  }
}

}  // namespace

sim::TimeNs reduce_binomial(runtime::Transport& tp, void* acc, size_t count, DType dt, ReduceOp op, int root,
                            size_t chunk_bytes, sim::TimeNs ready, const std::string& name) {
  if (tp.size() == 1 || count == 0) return ready;
  Call k(tp, acc, count, dt, root, chunk_bytes, ready);
  int parent;
  std::vector<int> children;
  binomial(k.v, k.p, &parent, &children);
  // Reduce in the order MPICH does: smallest subtree first (children are listed largest first).
  std::vector<int> kids;
  for (auto it = children.rbegin(); it != children.rend(); ++it) kids.push_back(*it);
  // Crossing flows, as broadcast_binomial: with one piece, child c sends at level c - v (FlowPattern::binomial,
  // UP). Where some child's level has flows of two senders meeting on a link, the children's flows are received
  // one exchange per child (each with its level's pattern, smallest subtree first); otherwise as one exchange,
  // exactly as without patterns.
  const bool one_piece = k.part.parts == 1;
  bool split = false;
  for (int c : kids)
    split = split || (one_piece && tp.step_share(runtime::FlowPattern::binomial(c - k.v, root, true)) != nullptr);
  if (split) {
    for (int c : kids) {
      const auto level = runtime::FlowPattern::binomial(c - k.v, root, true);
      gather_children(tp, k.base, k.es, k.part, dt, op, {k.real_rank(c)}, k.t, name + ".recv", &level);
    }
  } else {
    std::vector<int> real_kids;
    for (int c : kids) real_kids.push_back(k.real_rank(c));
    gather_children(tp, k.base, k.es, k.part, dt, op, real_kids, k.t, name + ".recv");
  }
  if (parent >= 0) {
    const auto level = runtime::FlowPattern::binomial(k.v - parent, root, true);
    send_pieces(tp, k.base, k.es, k.part, {k.real_rank(parent)}, k.t, name + ".send", one_piece ? &level : nullptr);
  }
  return finish(k.t, ready);
}

sim::TimeNs reduce_chain(runtime::Transport& tp, void* acc, size_t count, DType dt, ReduceOp op, int root,
                         size_t chunk_bytes, sim::TimeNs ready, const std::string& name) {
  if (tp.size() == 1 || count == 0) return ready;
  Call k(tp, acc, count, dt, root, chunk_bytes ? chunk_bytes : kDefaultChainPiece, ready);
  // Data flows the same way round as broadcast's chain (rank r to r+1, the ring's forward links):
  // root+1 -> root+2 -> ... -> root+p-1 -> root; in root-relative ranks 1 -> 2 -> ... -> p-1 -> 0.
  if (k.v != 1) gather_children(tp, k.base, k.es, k.part, dt, op, {k.real_rank((k.v + k.p - 1) % k.p)}, k.t,
                                name + ".recv");
  if (k.v != 0) send_pieces(tp, k.base, k.es, k.part, {k.real_rank((k.v + 1) % k.p)}, k.t, name + ".send");
  return finish(k.t, ready);
}

}  // namespace shardsim::collectives::tree

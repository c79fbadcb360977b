#include "collectives/tree.h"

#include <algorithm>
#include <vector>

namespace shardsim::collectives::tree {

namespace {

// Pieces of a COUNT-element buffer: Partition into m parts with parts of at most CHUNK_BYTES.
Partition pieces(size_t count, size_t es, size_t chunk_bytes) {
  const size_t bytes = count * es;
  // At most 1024 pieces: a tiny chunk size on a huge buffer would otherwise mean millions of messages.
  const size_t m = chunk_bytes == 0 ? 1 : std::clamp<size_t>((bytes + chunk_bytes - 1) / chunk_bytes, 1, 1024);
  return Partition{count, std::min(m, std::max<size_t>(count, 1))};
}

int real(int v, int root, int p) { return (v + root) % p; }

// Receives all pieces from SRC (arrival per piece into T), then forwards each to every rank in DSTS.
void recv_pieces(runtime::Transport& tp, unsigned char* base, size_t es, const Partition& part, int src,
                 std::vector<sim::TimeNs>& t, const std::string& label) {
  std::vector<runtime::RecvOp> recvs;
  for (size_t j = 0; j < part.parts; ++j) recvs.push_back({base + part.offset(j) * es, part.size(j) * es, src, 0});
  tp.exchange({}, recvs, label);
  for (size_t j = 0; j < part.parts; ++j) t[j] = std::max(t[j], recvs[j].arrival);
}

void send_pieces(runtime::Transport& tp, const unsigned char* base, size_t es, const Partition& part,
                 const std::vector<int>& dsts, const std::vector<sim::TimeNs>& t, const std::string& label) {
  std::vector<runtime::SendOp> sends;
  for (int dst : dsts)
    for (size_t j = 0; j < part.parts; ++j) sends.push_back({base + part.offset(j) * es, part.size(j) * es, dst, t[j]});
  if (!sends.empty()) tp.exchange(sends, {}, label);
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

sim::TimeNs broadcast_binomial(runtime::Transport& tp, void* buf, size_t count, DType dt, int root,
                               size_t chunk_bytes, sim::TimeNs ready, const std::string& name) {
  if (tp.size() == 1 || count == 0) return ready;
  Call k(tp, buf, count, dt, root, chunk_bytes, ready);
  int parent;
  std::vector<int> children;
  binomial(k.v, k.p, &parent, &children);
  if (parent >= 0) recv_pieces(tp, k.base, k.es, k.part, k.real_rank(parent), k.t, name + ".recv");
  std::vector<int> dsts;
  for (int c : children) dsts.push_back(k.real_rank(c));
  send_pieces(tp, k.base, k.es, k.part, dsts, k.t, name + ".send");
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
                     const std::string& label) {
  if (children.empty()) return;
  unsigned char* in = tp.scratch(2, children.size() * part.count * es);
  auto from = [&](size_t c) { return in + c * part.count * es; };
  std::vector<runtime::RecvOp> recvs;
  for (size_t c = 0; c < children.size(); ++c)
    for (size_t j = 0; j < part.parts; ++j)
      recvs.push_back({from(c) + part.offset(j) * es, part.size(j) * es, children[c], 0});
  tp.exchange({}, recvs, label);
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
  for (auto it = children.rbegin(); it != children.rend(); ++it) kids.push_back(k.real_rank(*it));
  gather_children(tp, k.base, k.es, k.part, dt, op, kids, k.t, name + ".recv");
  if (parent >= 0) send_pieces(tp, k.base, k.es, k.part, {k.real_rank(parent)}, k.t, name + ".send");
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

#include "collectives/halving_doubling.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <vector>

namespace shardsim::collectives::halving_doubling {

namespace {

struct Plan {
  int p = 1, pow2 = 1, rem = 0;
  explicit Plan(int n) : p(n) {
    while (pow2 * 2 <= p) pow2 *= 2;
    rem = p - pow2;
  }
  // -1 for the even ranks below 2*rem that sit out the core.
  int vrank(int r) const {
    if (r < 2 * rem) return r % 2 ? r / 2 : -1;
    return r - rem;
  }
  int real(int v) const { return v < rem ? 2 * v + 1 : v + rem; }
  bool sits_out(int r) const { return vrank(r) < 0; }
};

// Element range [begin, end) covered by virtual ranks [va, vb).
using RangeFn = std::function<std::pair<size_t, size_t>(int va, int vb)>;

struct Io {
  runtime::Transport& tp;
  unsigned char* base;
  size_t es;
  DType t;
  std::string name;
  // Out of place: the rank's input until the first reduction has written BASE (null: BASE holds it).
  const unsigned char* src = nullptr;
  const unsigned char* from() const { return src ? src : base; }
};

// DIST: the step's XOR distance among virtual ranks (its global pattern, FlowPattern::halving_doubling).
sim::TimeNs sendrecv_range(Io& io, std::pair<size_t, size_t> send, std::pair<size_t, size_t> recv, int peer,
                           void* into, sim::TimeNs t, const std::string& step, int dist) {
  const runtime::FlowPattern pattern = runtime::FlowPattern::halving_doubling(dist, false);
  return io.tp.sendrecv(io.from() + send.first * io.es, (send.second - send.first) * io.es, peer, into,
                        (recv.second - recv.first) * io.es, peer, t, io.name + step, &pattern);
}

// Core recursive halving among virtual ranks: afterwards virtual rank v holds the reduced range(v, v+1).
sim::TimeNs core_rs(Io& io, const Plan& plan, const RangeFn& range, ReduceOp op, sim::TimeNs t) {
  const int v = plan.vrank(io.tp.rank());
  int va = 0, vb = plan.pow2;
  int step = 0;
  for (int dist = plan.pow2 / 2; dist >= 1; dist /= 2, ++step) {
    const int mid = va + dist;
    const bool lower = v < mid;
    const auto keep = lower ? range(va, mid) : range(mid, vb);
    const auto give = lower ? range(mid, vb) : range(va, mid);
    const int peer = plan.real(lower ? v + dist : v - dist);
    unsigned char* scratch = io.tp.scratch(0, (keep.second - keep.first) * io.es);
    t = sendrecv_range(io, give, keep, peer, scratch, t, ".reduce_scatter.step" + std::to_string(step), dist);
    if (!io.tp.shape_only())
      reduce_to(io.base + keep.first * io.es, io.from() + keep.first * io.es, scratch, keep.second - keep.first,
                io.t, op);
    io.src = nullptr;  // BASE holds everything later steps send or reduce (the ranges this step kept)
    if (lower) vb = mid; else va = mid;
  }
  return t;
}

// Core recursive doubling: virtual rank v starts with range(v, v+1) and ends with range(0, pow2).
sim::TimeNs core_ag(Io& io, const Plan& plan, const RangeFn& range, sim::TimeNs t) {
  const int v = plan.vrank(io.tp.rank());
  int step = 0;
  for (int dist = 1; dist < plan.pow2; dist *= 2, ++step) {
    const int mine = v & ~(dist - 1), theirs = mine ^ dist;
    const auto send = range(mine, mine + dist), recv = range(theirs, theirs + dist);
    t = sendrecv_range(io, send, recv, plan.real(v ^ dist), io.base + recv.first * io.es, t,
                       ".all_gather.step" + std::to_string(step), dist);
  }
  return t;
}

// Real-chunk ranges of virtual ranks: v < rem owns chunks {2v, 2v+1}, else chunk v + rem.
RangeFn layout_range(const Plan& plan, const Layout& layout) {
  return [&plan, &layout](int va, int vb) {
    const size_t lo = static_cast<size_t>(va < plan.rem ? 2 * va : va + plan.rem);
    const size_t hi = static_cast<size_t>(vb - 1 < plan.rem ? 2 * (vb - 1) + 1 : vb - 1 + plan.rem);
    return std::make_pair(layout.offset[lo], layout.offset[hi] + layout.size[hi]);
  };
}

// Non-power-of-two entry: the even rank of a pair (r < 2 rem) hands N elements at OFFSET to the odd rank above,
// which reduces them into its own. Returns the odd rank's new ready time. The step's global pattern is the fold
// (FlowPattern::halving_doubling(0, false): 2i -> 2i + 1 for every i < rem), passed by both ends.
// OWN (default: the N elements at OFFSET) is this rank's vector: the even rank sends it, the odd rank writes
// OWN op (even rank's) at OFFSET, so an out-of-place caller needs no copy first.
sim::TimeNs fold_reduce(Io& io, const Plan& plan, size_t offset, size_t n, ReduceOp op, sim::TimeNs now,
                        const unsigned char* own = nullptr) {
  const int r = io.tp.rank();
  if (r >= 2 * plan.rem) return now;
  unsigned char* at = io.base + offset * io.es;
  if (own == nullptr) own = at;
  const runtime::FlowPattern fold = runtime::FlowPattern::halving_doubling(0, false);
  if (r % 2 == 0) {
    io.tp.send(own, n * io.es, r + 1, now, io.name + ".fold", &fold);
    return now;
  }
  unsigned char* in = io.tp.scratch(0, n * io.es);
  now = std::max(now, io.tp.recv(in, n * io.es, r - 1, io.name + ".fold", &fold));
  if (!io.tp.shape_only()) reduce_to(at, own, in, n, io.t, op);
  return now;
}

// Moves N elements at OFFSET between the two ranks of a pair (r < 2 rem): from the even rank to the odd one
// when EVEN_SENDS, else back. Returns the receiver's new ready time (the sender's is unchanged). The step's
// global pattern: the fold (even -> odd) or the unfold (odd -> even) of every pair.
sim::TimeNs pair_move(Io& io, const Plan& plan, size_t offset, size_t n, bool even_sends, const char* label,
                      sim::TimeNs now) {
  const int r = io.tp.rank();
  if (r >= 2 * plan.rem) return now;
  unsigned char* at = io.base + offset * io.es;
  const bool sender = (r % 2 == 0) == even_sends;
  const int peer = r % 2 ? r - 1 : r + 1;
  const runtime::FlowPattern pattern = runtime::FlowPattern::halving_doubling(0, !even_sends);
  if (sender) {
    io.tp.send(at, n * io.es, peer, now, io.name + label, &pattern);
    return now;
  }
  return std::max(now, io.tp.recv(at, n * io.es, peer, io.name + label, &pattern));
}

// The frame both all_reduces share: one chip or no elements: the input copied to the output (out of place).
// Otherwise the non-power-of-two fold (the even rank of a pair hands its whole input over; the odd rank writes
// (own) op (even's) into RECVBUF), CORE(io, plan, now) on the ranks that take part, then the unfold. IO works on
// RECVBUF; a rank whose input is still in SENDBUF reads it from there (io.src) until its first reduction, so out
// of place costs no initial copy.
template <class Core>
sim::TimeNs fold_core_unfold(runtime::Transport& tp, const void* sendbuf, void* recvbuf, size_t count, DType t,
                             ReduceOp op, sim::TimeNs ready, const std::string& name, const Core& core) {
  const Plan plan(tp.size());
  const size_t es = runtime::dtype_size(t);
  auto* out = static_cast<unsigned char*>(recvbuf);
  const auto* in0 = static_cast<const unsigned char*>(sendbuf);
  if (plan.p == 1 || count == 0) {
    if (in0 != out && count && !tp.shape_only()) std::memcpy(out, in0, count * es);
    return ready;
  }
  Io io{tp, out, es, t, name};
  sim::TimeNs now = fold_reduce(io, plan, 0, count, op, ready, in0);
  if (tp.rank() >= 2 * plan.rem && in0 != out) io.src = in0;
  if (!plan.sits_out(tp.rank())) now = core(io, plan, now);
  return pair_move(io, plan, 0, count, false, ".unfold", now);  // the odd ranks send the result back
}

}  // namespace

sim::TimeNs all_reduce(runtime::Transport& tp, const void* sendbuf, void* recvbuf, size_t count, DType t,
                       ReduceOp op, sim::TimeNs ready, const std::string& name) {
  const auto core = [&](Io& io, const Plan& plan, sim::TimeNs now) {
    const Partition part{count, static_cast<size_t>(plan.pow2)};
    const RangeFn range = [&part](int va, int vb) {
      return std::make_pair(part.offset(static_cast<size_t>(va)),
                            part.offset(static_cast<size_t>(vb - 1)) + part.size(static_cast<size_t>(vb - 1)));
    };
    now = core_rs(io, plan, range, op, now);
    return core_ag(io, plan, range, now);
  };
  return fold_core_unfold(tp, sendbuf, recvbuf, count, t, op, ready, name, core);
}

sim::TimeNs recursive_doubling_all_reduce(runtime::Transport& tp, const void* sendbuf, void* recvbuf, size_t count,
                                          DType t, ReduceOp op, sim::TimeNs ready, const std::string& name) {
  const auto core = [&](Io& io, const Plan& plan, sim::TimeNs now) {
    const int v = plan.vrank(io.tp.rank());
    int step = 0;
    for (int dist = 1; dist < plan.pow2; dist *= 2, ++step) {
      // Both partners hold the same two vectors; each combines them as (lower virtual rank) op (higher), so
      // the two results agree bit for bit even where the operator is not (NaN payloads).
      unsigned char* in = io.tp.scratch(0, count * io.es);
      now = sendrecv_range(io, {0, count}, {0, count}, plan.real(v ^ dist), in, now,
                           ".all_reduce.step" + std::to_string(step), dist);
      if (io.tp.shape_only()) continue;
      if (v & dist) reduce_to(io.base, in, io.from(), count, t, op);
      else reduce_to(io.base, io.from(), in, count, t, op);
      io.src = nullptr;  // BASE holds the vector from here on
    }
    return now;
  };
  return fold_core_unfold(tp, sendbuf, recvbuf, count, t, op, ready, name, core);
}

sim::TimeNs reduce_scatter(runtime::Transport& tp, void* base, const Layout& layout, DType t, ReduceOp op,
                           sim::TimeNs ready, const std::string& name) {
  const Plan plan(tp.size());
  const int r = tp.rank();
  if (plan.p == 1 || layout.total() == 0) return ready;
  Io io{tp, static_cast<unsigned char*>(base), runtime::dtype_size(t), t, name};
  sim::TimeNs now = fold_reduce(io, plan, layout.offset[0], layout.total(), op, ready);
  if (!plan.sits_out(r)) now = core_rs(io, plan, layout_range(plan, layout), op, now);
  // The odd rank of a pair holds chunks r-1 and r reduced: chunk r-1 goes home.
  const size_t c = static_cast<size_t>(r % 2 ? r - 1 : r);
  return pair_move(io, plan, layout.offset[c], layout.size[c], false, ".unfold", now);
}

sim::TimeNs all_gather(runtime::Transport& tp, void* base, const Layout& layout, DType t, sim::TimeNs ready,
                       const std::string& name) {
  const Plan plan(tp.size());
  const int r = tp.rank();
  if (plan.p == 1 || layout.total() == 0) return ready;
  Io io{tp, static_cast<unsigned char*>(base), runtime::dtype_size(t), t, name};
  // The even rank of a pair gives its chunk to the odd rank, which joins the core for both.
  const size_t c = static_cast<size_t>(r % 2 ? r - 1 : r);
  sim::TimeNs now = pair_move(io, plan, layout.offset[c], layout.size[c], true, ".fold", ready);
  if (!plan.sits_out(r)) now = core_ag(io, plan, layout_range(plan, layout), now);
  return pair_move(io, plan, layout.offset[0], layout.total(), false, ".unfold", now);
}

}  // namespace shardsim::collectives::halving_doubling

#include "collectives/halving_doubling.h"

#include <algorithm>
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
};

sim::TimeNs sendrecv_range(Io& io, std::pair<size_t, size_t> send, std::pair<size_t, size_t> recv, int peer,
                           void* into, sim::TimeNs t, const std::string& step) {
  return io.tp.sendrecv(io.base + send.first * io.es, (send.second - send.first) * io.es, peer, into,
                        (recv.second - recv.first) * io.es, peer, t, io.name + step);
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
    t = sendrecv_range(io, give, keep, peer, scratch, t, ".reduce_scatter.step" + std::to_string(step));
    reduce_into(io.base + keep.first * io.es, scratch, keep.second - keep.first, io.t, op);
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
                       ".all_gather.step" + std::to_string(step));
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

}  // namespace

sim::TimeNs all_reduce(runtime::Transport& tp, void* base, size_t count, DType t, ReduceOp op, sim::TimeNs ready,
                       const std::string& name) {
  const Plan plan(tp.size());
  const int r = tp.rank();
  if (plan.p == 1 || count == 0) return ready;
  Io io{tp, static_cast<unsigned char*>(base), runtime::dtype_size(t), t, name};
  const size_t bytes = count * io.es;
  sim::TimeNs now = ready;
  if (r < 2 * plan.rem) {  // fold: even ranks hand their whole buffer to the odd rank above
    if (r % 2 == 0) {
      tp.send(base, bytes, r + 1, now, name + ".fold");
    } else {
      unsigned char* in = tp.scratch(0, bytes);
      now = std::max(now, tp.recv(in, bytes, r - 1, name + ".fold"));
      reduce_into(base, in, count, t, op);
    }
  }
  if (!plan.sits_out(r)) {
    const Partition part{count, static_cast<size_t>(plan.pow2)};
    const RangeFn range = [&part](int va, int vb) {
      return std::make_pair(part.offset(static_cast<size_t>(va)),
                            part.offset(static_cast<size_t>(vb - 1)) + part.size(static_cast<size_t>(vb - 1)));
    };
    now = core_rs(io, plan, range, op, now);
    now = core_ag(io, plan, range, now);
  }
  if (r < 2 * plan.rem) {  // unfold: the odd ranks send the result back
    if (r % 2 == 1) tp.send(base, bytes, r - 1, now, name + ".unfold");
    else now = std::max(now, tp.recv(base, bytes, r + 1, name + ".unfold"));
  }
  return now;
}

sim::TimeNs reduce_scatter(runtime::Transport& tp, void* base, const Layout& layout, DType t, ReduceOp op,
                           sim::TimeNs ready, const std::string& name) {
  const Plan plan(tp.size());
  const int r = tp.rank();
  if (plan.p == 1 || layout.total() == 0) return ready;
  Io io{tp, static_cast<unsigned char*>(base), runtime::dtype_size(t), t, name};
  const size_t first = layout.offset[0], n = layout.total();
  sim::TimeNs now = ready;
  if (r < 2 * plan.rem) {
    if (r % 2 == 0) {
      tp.send(io.base + first * io.es, n * io.es, r + 1, now, name + ".fold");
    } else {
      unsigned char* in = tp.scratch(0, n * io.es);
      now = std::max(now, tp.recv(in, n * io.es, r - 1, name + ".fold"));
      reduce_into(io.base + first * io.es, in, n, t, op);
    }
  }
  if (!plan.sits_out(r)) now = core_rs(io, plan, layout_range(plan, layout), op, now);
  if (r < 2 * plan.rem) {  // the odd rank holds chunks r-1 and r reduced: chunk r-1 goes home
    const size_t c = static_cast<size_t>(r % 2 ? r - 1 : r);
    void* at = io.base + layout.offset[c] * io.es;
    if (r % 2 == 1) tp.send(at, layout.size[c] * io.es, r - 1, now, name + ".unfold");
    else now = std::max(now, tp.recv(at, layout.size[c] * io.es, r + 1, name + ".unfold"));
  }
  return now;
}

sim::TimeNs all_gather(runtime::Transport& tp, void* base, const Layout& layout, DType t, sim::TimeNs ready,
                       const std::string& name) {
  const Plan plan(tp.size());
  const int r = tp.rank();
  if (plan.p == 1 || layout.total() == 0) return ready;
  Io io{tp, static_cast<unsigned char*>(base), runtime::dtype_size(t), t, name};
  const size_t first = layout.offset[0], n = layout.total();
  sim::TimeNs now = ready;
  if (r < 2 * plan.rem) {  // the even rank's chunk joins the odd rank's
    const size_t c = static_cast<size_t>(r % 2 ? r - 1 : r);
    void* at = io.base + layout.offset[c] * io.es;
    if (r % 2 == 0) tp.send(at, layout.size[c] * io.es, r + 1, now, name + ".fold");
    else now = std::max(now, tp.recv(at, layout.size[c] * io.es, r - 1, name + ".fold"));
  }
  if (!plan.sits_out(r)) now = core_ag(io, plan, layout_range(plan, layout), now);
  if (r < 2 * plan.rem) {
    void* at = io.base + first * io.es;
    if (r % 2 == 1) tp.send(at, n * io.es, r - 1, now, name + ".unfold");
    else now = std::max(now, tp.recv(at, n * io.es, r + 1, name + ".unfold"));
  }
  return now;
}

}  // namespace shardsim::collectives::halving_doubling

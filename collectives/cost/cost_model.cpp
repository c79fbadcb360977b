#include "collectives/cost/cost_model.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <vector>

#include "collectives/double_binary_tree.h"
#include "collectives/in_switch.h"
#include "collectives/torus.h"
#include "topology/symmetry.h"

namespace shardsim::collectives::cost {

namespace {

// Route between the chips of two ranks: summed latency and bottleneck bandwidth, and the topology's message
// protocol (topology.h: efficiency, low-latency latency factor, per-message overhead), as sim::Timeline::send
// charges a lone message: o + latency x factor + S / (B x efficiency).
struct Path {
  double latency_ns = 0;
  double bandwidth = std::numeric_limits<double>::infinity();  // GB/s = bytes/ns
  const topology::Protocol* protocol = nullptr;
  bool to_self = true;
  double time(double bytes) const {
    if (to_self) return 0;
    return protocol->message_overhead_ns + latency_ns * protocol->latency_factor_for(bytes) +
           (bytes > 0 ? bytes / (bandwidth * protocol->efficiency_for(bytes)) : 0);
  }
};

Path path(const runtime::Transport& tp, int a, int b) {
  Path p;
  const auto& topo = tp.topology();
  p.protocol = &topo.protocol();
  for (int id : topo.route(tp.chip_of(a), tp.chip_of(b))) {
    p.to_self = false;
    p.latency_ns += topo.link(id).latency_ns;
    p.bandwidth = std::min(p.bandwidth, topo.link(id).bandwidth_gbps);
  }
  return p;
}

// Slowest time over all ranks r of a message of BYTES from r to r + DIST (mod p).
double worst_step_impl(const runtime::Transport& tp, int dist, double bytes) {
  double worst = 0;
  const int p = tp.size();
  for (int r = 0; r < p; ++r) worst = std::max(worst, path(tp, r, ((r + dist) % p + p) % p).time(bytes));
  return worst;
}

// Exact replays of the schedules the algorithms run, on the group's routes, through the same sim::Timeline
// rules the simulation uses (one event-free timeline per rank: its send side books the rank's injected flows, its
// receive side the flows addressed to it), in the same issue order as the code. Receive-side booking follows the
// transport's rule: the flows of one exchange in (sender start, sender's offset (from - to) mod p, issue) order, exchanges in program
// order. send() is a flow received alone; post() + flush() are the flows of one exchange.
struct Replay {
  const topology::Topology& topo;
  std::vector<int> chips;  // rank -> chip
  std::vector<std::unique_ptr<sim::Timeline>> tl;
  struct Flow {
    int from, to;
    double bytes;
    sim::Span span;
    size_t seq;
    double* out;  // *out = max(*out, arrival)
    int tag;      // which exchange of the receiver it belongs to (algorithms with several kinds of receive)
  };
  // Posted flows not yet booked, per receiver (a flush for one receiver looks at its own flows only).
  std::vector<std::vector<Flow>> pending;
  size_t posted = 0;
  // Crossing-flow contention: the current step's link sharing (as Transport::exchange with a pattern does).
  std::map<uint64_t, std::shared_ptr<const sim::StepShare>> shares;
  const sim::StepShare* step_share = nullptr;
  Replay(const topology::Topology& t, std::vector<int> rank_to_chip)
      : topo(t), chips(std::move(rank_to_chip)), tl(chips.size()), pending(chips.size()) {}
  explicit Replay(const runtime::Transport& t) : Replay(t.topology(), t.rank_to_chip()) {}
  int size() const { return static_cast<int>(chips.size()); }
  sim::Timeline& of(int rank) {
    auto& t = tl[static_cast<size_t>(rank)];
    if (!t) {
      t = std::make_unique<sim::Timeline>(chips[static_cast<size_t>(rank)], topo, sim::DeviceSpec{}, false);
      if (step_share) t->begin_step(step_share);
    }
    return *t;
  }
  // The flows until end_step() form one step with the global pattern PATTERN (every rank's timeline).
  // PATTERN's link sharing on this group (memoized by key; nullptr: no two senders meet, the pattern is a no-op).
  const sim::StepShare* share_of(const runtime::FlowPattern& pattern) {
    auto it = shares.find(pattern.key);
    if (it == shares.end()) it = shares.emplace(pattern.key, pattern.share_on(topo, chips)).first;
    return it->second.get();
  }
  void begin_step(const runtime::FlowPattern& pattern) {
    step_share = share_of(pattern);
    if (step_share)
      for (auto& t : tl)
        if (t) t->begin_step(step_share);
  }
  void end_step() {
    if (step_share)
      for (auto& t : tl)
        if (t) t->end_step();
    step_share = nullptr;
  }
  double deliver(int from, int to, double bytes, sim::Span span) {
    return of(to).receive(chips[static_cast<size_t>(from)], bytes, span.start, span.end);
  }
  double send(int from, int to, double ready, double bytes) {
    if (from == to) return ready;
    return deliver(from, to, bytes, of(from).send("", chips[static_cast<size_t>(to)], bytes, ready));
  }
  void post(int from, int to, double ready, double bytes, double* out, int tag = 0) {
    if (from == to) {
      *out = std::max(*out, ready);
      return;
    }
    const sim::Span span = of(from).send("", chips[static_cast<size_t>(to)], bytes, ready);
    pending[static_cast<size_t>(to)].push_back({from, to, bytes, span, posted++, out, tag});
  }
  // A folded replay (ring_estimate): FROM sends to TO, a rank that is not replayed; what TO's mirror MIRROR_TO
  // receives is the image of that flow, from MIRROR_FROM (the shift maps MIRROR_FROM -> MIRROR_TO onto
  // FROM -> TO, so the sender's span is FROM's).
  void post_mirrored(int from, int to, int mirror_from, int mirror_to, double ready, double bytes, double* out) {
    const sim::Span span = of(from).send("", chips[static_cast<size_t>(to)], bytes, ready);
    pending[static_cast<size_t>(mirror_to)].push_back({mirror_from, mirror_to, bytes, span, posted++, out, 0});
  }
  // Books the posted flows whose receiver is TO (every receiver if TO < 0) and, if FROM >= 0, whose sender is
  // FROM, and, if TAGS != 0, whose tag's bit is set in TAGS, as one exchange per receiver.
  void flush(int to = -1, int from = -1, unsigned tags = 0) {
    std::vector<Flow> now, later;
    const size_t lo = to < 0 ? 0 : static_cast<size_t>(to), hi = to < 0 ? pending.size() : lo + 1;
    for (size_t r = lo; r < hi; ++r) {
      later.clear();
      for (auto& f : pending[r])
        ((from < 0 || f.from == from) && (tags == 0 || ((tags >> f.tag) & 1u)) ? now : later).push_back(f);
      pending[r].swap(later);
    }
    std::sort(now.begin(), now.end(), [&](const Flow& a, const Flow& b) {
      if (a.to != b.to) return a.to < b.to;
      if (a.span.start != b.span.start) return a.span.start < b.span.start;
      const int oa = runtime::group_offset(a.from, a.to, size()), ob = runtime::group_offset(b.from, b.to, size());
      return oa != ob ? oa < ob : a.seq < b.seq;
    });
    for (const auto& f : now) *f.out = std::max(*f.out, deliver(f.from, f.to, f.bytes, f.span));
  }
};

// Ring passes (reduce-scatter and/or all-gather) over lanes as ring::make_lanes cuts them, every rank starting at
// START on RP's timelines (which keep what earlier passes left busy).
std::vector<ring::Cycle> ring_dirs(bool bidir) {
  return ring::stride_cycles(bidir ? std::vector<int>{1, -1} : std::vector<int>{1});
}

bool g_fold_replays = true;  // set_replay_folding (tests compare the folded replay with the full one)

// The smallest period P < p dividing p for which the rank shift r -> r + P (mod p) of RP's group is a symmetry of
// its network (topology/symmetry.h) that maps each of CYCLES onto itself; p when there is none. Every rank's
// replay is then the image of its preimage's, P ranks back, so replaying ranks 0..P-1 gives every rank's times
// (as a folded run gives every chip's: docs/performance/fold.md). O(divisors x p x dimensions).
int replay_period(const Replay& rp, const std::vector<ring::Cycle>& cycles) {
  const int p = rp.size();
  if (!g_fold_replays || !rp.topo.is_grid()) return p;
  bool unit = true;
  for (const auto& c : cycles) unit = unit && c.unit();
  std::vector<int> image(static_cast<size_t>(p)), to(static_cast<size_t>(p));
  for (int q = 1; q < p; ++q) {
    if (p % q != 0) continue;
    for (int r = 0; r < p; ++r) {
      image[static_cast<size_t>(r)] = (r + q) % p;
      to[static_cast<size_t>(r)] = rp.chips[static_cast<size_t>((r + q) % p)];
    }
    if (!topology::chip_map_obstacle(rp.topo, rp.chips, to, "the shift").empty()) continue;
    if (unit || ring::maps_onto_itself(cycles, image)) return q;
  }
  return p;
}

// DIRS: the lanes' cycles (ring::make_lanes); strides {1} one-way, {1, -1} bidirectional, more: multi_ring.h;
// general ring orders: rail_ring.h. Where the group has a rank shift that keeps its network and the cycles
// (replay_period), only the ranks of one period are replayed: a flow to a rank past them is received by that
// rank's mirror in the period, as the image of the flow (Replay::post_mirrored), so a ring of p ranks costs
// O(P x p) flows instead of O(p^2) (p = 16,384 on one switch: P = 1).
double ring_estimate(Replay& rp, double chunk, int passes, const std::vector<ring::Cycle>& dir_list,
                     size_t chunk_bytes, double start = 0) {
  const int p = rp.size();
  if (p == 1 || chunk <= 0) return start;
  const int q = replay_period(rp, dir_list);  // ranks replayed: 0 .. q-1
  const int dirs = static_cast<int>(dir_list.size());
  const bool bidir = dirs == 2 && dir_list[0].unit() && dir_list[1].unit() && dir_list[0].stride == 1 &&
                     dir_list[1].stride == -1;
  bool unit = true;
  for (const auto& d : dir_list) unit = unit && d.unit();
  const double per_dir = chunk / dirs;
  const int m = chunk_bytes == 0 ? 1
                                 : static_cast<int>(std::clamp(std::ceil(per_dir / static_cast<double>(chunk_bytes)),
                                                               1.0, 64.0));
  const double piece = per_dir / m;
  const int lanes = dirs * m;
  std::vector<std::vector<double>> t(static_cast<size_t>(lanes), std::vector<double>(static_cast<size_t>(q), start));
  const runtime::FlowPattern pattern = runtime::FlowPattern::shift(1, bidir ? -1 : 0, m);  // as ring.cpp
  for (int pass = 0; pass < passes; ++pass) {
    for (int r = 0; r < q; ++r) {  // a pass starts on each rank when all its lanes of the last pass are done
      double mx = 0;
      for (auto& l : t) mx = std::max(mx, l[static_cast<size_t>(r)]);
      for (auto& l : t) l[static_cast<size_t>(r)] = mx;
    }
    for (int step = 0; step < p - 1; ++step) {
      if (unit) rp.begin_step(pattern);
      auto next = t;
      for (int r = 0; r < q; ++r)
        for (int l = 0; l < lanes; ++l) {
          const int dst = dir_list[static_cast<size_t>(l / m)].at(r, 1, p);
          const double ready = t[static_cast<size_t>(l)][static_cast<size_t>(r)];
          if (dst < q) {
            rp.post(r, dst, ready, piece, &next[static_cast<size_t>(l)][static_cast<size_t>(dst)]);
          } else {  // DST's mirror DST - kq receives the image of this flow, from R - kq
            const int back = dst / q * q;
            rp.post_mirrored(r, dst, ((r - back) % p + p) % p, dst - back, ready, piece,
                             &next[static_cast<size_t>(l)][static_cast<size_t>(dst - back)]);
          }
        }
      rp.flush();  // a step is one exchange of all lanes
      if (unit) rp.end_step();
      t = std::move(next);
    }
  }
  double end = 0;
  for (const auto& l : t)
    for (double x : l) end = std::max(end, x);
  return end;
}

// Halving-doubling with Thakur's fold for non-powers of two (halving_doubling.cpp), step by step, with the
// same ranges: all_reduce halves the buffer among the pow2 virtual ranks; reduce_scatter / all_gather move whole
// chunks, and the first REM virtual ranks own two chunks each (so the halves are unequal when p is not 2^k).
// WHOLE: recursive doubling all_reduce (halving_doubling.h): the same fold, doubling steps and unfold, every one
// moving the whole vector.
double hd_estimate(const runtime::Transport& tp, double bytes, bool rs, bool ag, bool whole = false) {
  const int p = tp.size();
  if (p == 1 || bytes <= 0) return 0;
  int pow2 = 1;
  while (pow2 * 2 <= p) pow2 *= 2;
  const int rem = p - pow2;
  auto real = [rem](int v) { return v < rem ? 2 * v + 1 : v + rem; };
  const double chunk = bytes / p;
  const bool whole_chunks = !(rs && ag);  // reduce_scatter or all_gather alone
  auto range_bytes = [&](int va, int vb) {
    if (whole) return bytes;
    if (!whole_chunks) return bytes * (vb - va) / pow2;
    const int lo = va < rem ? 2 * va : va + rem, hi = vb - 1 < rem ? 2 * (vb - 1) + 1 : vb - 1 + rem;
    return chunk * (hi - lo + 1);
  };
  Replay rp(tp);
  std::vector<double> t(static_cast<size_t>(p), 0.0);
  auto exchange = [&](int a, int b, double ba, double bb) {  // a and b swap ba / bb bytes (sendrecv)
    const double ta = t[static_cast<size_t>(a)], tb = t[static_cast<size_t>(b)];
    const double at_b = rp.send(a, b, ta, ba), at_a = rp.send(b, a, tb, bb);
    t[static_cast<size_t>(a)] = std::max(ta, at_a);
    t[static_cast<size_t>(b)] = std::max(tb, at_b);
  };
  rp.begin_step(runtime::FlowPattern::halving_doubling(0, false));  // fold: the even rank hands its data to the odd one
  for (int r = 0; r + 1 < 2 * rem; r += 2)
    t[static_cast<size_t>(r + 1)] = std::max(t[static_cast<size_t>(r + 1)], rp.send(r, r + 1, 0, rs || whole ? bytes : chunk));
  rp.end_step();
  if (rs)
    for (int dist = pow2 / 2; dist >= 1; dist /= 2) {
      rp.begin_step(runtime::FlowPattern::halving_doubling(dist, false));  // as halving_doubling.cpp
      for (int v = 0; v < pow2; ++v) {
        if (v & dist) continue;  // v is the lower partner: it keeps [va, mid), sends [mid, vb)
        const int va = v & ~(2 * dist - 1), mid = va + dist, vb = va + 2 * dist;
        exchange(real(v), real(v + dist), range_bytes(mid, vb), range_bytes(va, mid));
      }
      rp.end_step();
    }
  if (ag)
    for (int dist = 1; dist < pow2; dist *= 2) {
      rp.begin_step(runtime::FlowPattern::halving_doubling(dist, false));
      for (int v = 0; v < pow2; ++v) {
        if (v & dist) continue;  // each sends the block of DIST virtual ranks it holds
        const int mine = v & ~(dist - 1), theirs = mine ^ dist;
        exchange(real(v), real(v ^ dist), range_bytes(mine, mine + dist), range_bytes(theirs, theirs + dist));
      }
      rp.end_step();
    }
  rp.begin_step(runtime::FlowPattern::halving_doubling(0, true));  // unfold: the odd rank sends the result back
  for (int r = 0; r + 1 < 2 * rem; r += 2)
    t[static_cast<size_t>(r)] = std::max(t[static_cast<size_t>(r)], rp.send(r + 1, r, t[static_cast<size_t>(r + 1)], ag ? bytes : chunk));
  rp.end_step();
  return *std::max_element(t.begin(), t.end());
}

// Pipelined chain (tree.cpp): pieces of PIECE bytes flow along ORDER[0] -> ORDER[1] -> ...
double chain_estimate(const runtime::Transport& tp, double bytes, size_t chunk_bytes, bool reduce) {
  const int p = tp.size();
  const double piece_bytes = static_cast<double>(chunk_bytes ? chunk_bytes : (size_t{1} << 20));
  const int m = static_cast<int>(std::clamp(std::ceil(bytes / piece_bytes), 1.0, 1024.0));
  const double piece = bytes / m;
  Replay rp(tp);
  std::vector<double> t(static_cast<size_t>(m), 0.0);
  double end = 0;
  for (int w = 0; w + 1 < p; ++w) {
    // Broadcast from rank 0 runs 0 -> 1 -> ... -> p-1; reduce to rank 0 runs 1 -> 2 -> ... -> p-1 -> 0.
    const int from = reduce ? w + 1 : w, to = reduce ? (w + 2) % p : w + 1;
    for (int j = 0; j < m; ++j) {
      t[static_cast<size_t>(j)] = rp.send(from, to, t[static_cast<size_t>(j)], piece);
      end = std::max(end, t[static_cast<size_t>(j)]);
    }
  }
  return end;
}

// Per-dimension rings (torus.cpp): the ring along each dimension through chip 0, in the algorithm's order
// (torus::dim_order), replayed with the data left after the dimensions before it (S, S/k, ...). Lines of one
// dimension use disjoint links.
double torus_estimate(const runtime::Transport& tp, double bytes, int passes, size_t chunk_bytes) {
  const auto& topo = tp.topology();
  double t = 0, s = bytes;
  for (const auto& d : torus::dim_order(topo)) {
    Replay line(topo, d.line);
    t += ring_estimate(line, s / d.k, passes, ring_dirs(d.bidirectional), chunk_bytes);
    s /= d.k;
  }
  return t;
}

// Concurrent-dimension torus (torus_concurrent.h): part j (S/D bytes) visits the dimensions in dim_order()
// rotated by j, phase by phase and part by part as the code issues them. A phase is the ring along its dimension
// through chip 0, started when the part's previous phase ended, on that dimension's timelines, which keep what the
// phases before it left busy (the simulator books a link's messages in issue order; dimensions share no link).
double torus_concurrent_estimate(const runtime::Transport& tp, double bytes, bool rs, bool ag, size_t chunk_bytes) {
  const auto& topo = tp.topology();
  const auto order = torus::dim_order(topo);
  const size_t parts = order.size();
  std::vector<Replay> lines;  // per entry of ORDER: its line's timelines, kept across phases
  for (const auto& d : order) lines.emplace_back(topo, d.line);
  std::vector<double> now(parts, 0.0);
  std::vector<std::vector<double>> entering(parts);  // [part][phase]: the data entering that phase's dimension
  for (size_t j = 0; j < parts; ++j) {
    double s = bytes / static_cast<double>(parts);
    for (size_t i = 0; i < parts; ++i) {
      entering[j].push_back(s);
      s /= order[(i + j) % parts].k;
    }
  }
  auto phase = [&](size_t j, size_t i) {
    const size_t e = (i + j) % parts;
    const auto& d = order[e];
    now[j] = ring_estimate(lines[e], entering[j][i] / d.k, 1, ring_dirs(d.bidirectional), chunk_bytes, now[j]);
  };
  if (rs)
    for (size_t i = 0; i < parts; ++i)
      for (size_t j = 0; j < parts; ++j) phase(j, i);
  if (ag)
    for (size_t i = parts; i-- > 0;)
      for (size_t j = 0; j < parts; ++j) phase(j, i);
  return *std::max_element(now.begin(), now.end());
}

// Direct exchange: every rank injects the given bytes to every peer at once (peer r+1 first, as the code
// issues them); the timeline serializes what shares a port or a link.
double direct_estimate(const runtime::Transport& tp, double per_peer, bool root_only_sends, bool root_only_recvs) {
  const int p = tp.size();
  Replay rp(tp);
  double worst = 0;
  // all_to_all: one exchange of every pair with the all-pairs pattern (all_to_all.cpp); scatter / gather: one
  // exchange at the root, no pattern. Each sender issues its sends to r + 1, r + 2, ... in that order.
  const bool all = !root_only_sends && !root_only_recvs;
  if (all) rp.begin_step(runtime::FlowPattern::all_pairs());
  for (int s = 1; s < p; ++s) {
    for (int r = 0; r < p; ++r) {
      if (root_only_sends && r != 0) continue;
      const int dst = (r + s) % p;
      if (root_only_recvs && dst != 0) continue;
      rp.post(r, dst, 0.0, per_peer, &worst);
    }
  }
  rp.flush();
  if (all) rp.end_step();
  return worst;
}

// The binomial tree's schedule replayed on the topology (root 0; every chip's sends queue on its ports in the
// order the tree code issues them), so sends that share a first link are charged, as the simulator does.
double binomial_estimate(const runtime::Transport& tp, double bytes, size_t chunk_bytes, bool reduce) {
  const int p = tp.size();
  const double m = chunk_bytes ? std::clamp(std::ceil(bytes / static_cast<double>(chunk_bytes)), 1.0, 1024.0) : 1.0;
  const double piece = bytes / m;  // pieces as tree.cpp cuts them (at most 1024)
  auto children = [p](int v) {
    std::vector<int> out;
    int mask = 1;
    while (mask < p && !(v & mask)) mask <<= 1;
    for (mask >>= 1; mask > 0; mask >>= 1)
      if (v + mask < p) out.push_back(v + mask);
    return out;
  };
  std::vector<std::vector<double>> ready(static_cast<size_t>(p), std::vector<double>(static_cast<size_t>(m), 0.0));
  Replay rp(tp);
  auto send = [&](int a, int b, double t) { return rp.send(a, b, t, piece); };
  // One piece: every send / receive is a step with its tree level's pattern, as tree.cpp runs it.
  const bool one_piece = ready[0].size() == 1;
  auto level = [reduce](int parent, int child) { return runtime::FlowPattern::binomial(child - parent, 0, reduce); };
  double end = 0;
  if (!reduce) {
    for (int v = 0; v < p; ++v)  // parents before children: a child's index is larger
      for (int ch : children(v)) {
        if (one_piece) rp.begin_step(level(v, ch));
        for (size_t j = 0; j < ready[0].size(); ++j) {
          ready[static_cast<size_t>(ch)][j] = send(v, ch, ready[static_cast<size_t>(v)][j]);
          end = std::max(end, ready[static_cast<size_t>(ch)][j]);
        }
        if (one_piece) rp.end_step();
      }
    return end;
  }
  // V's children's pieces: one exchange at V, or (one piece, some child's level shared) one exchange per child,
  // smallest subtree first, each a step with the child's level pattern (tree.cpp reduce_binomial).
  auto receive_children = [&](int v) {
    auto kids = children(v);
    std::reverse(kids.begin(), kids.end());
    bool split = false;
    for (int c : kids) split = split || (one_piece && rp.share_of(level(v, c)) != nullptr);
    if (!split) {
      rp.flush(v);
      return;
    }
    for (int c : kids) {
      rp.begin_step(level(v, c));
      rp.flush(v, c);
      rp.end_step();
    }
  };
  for (int v = p - 1; v > 0; --v) {  // children before parents; each sends all pieces to its parent
    receive_children(v);
    int parent = v;
    for (int mask = 1; mask < p; mask <<= 1)
      if (v & mask) {
        parent = v - mask;
        break;
      }
    if (one_piece) rp.begin_step(level(parent, v));
    for (size_t j = 0; j < ready[0].size(); ++j)
      rp.post(v, parent, ready[static_cast<size_t>(v)][j], piece, &ready[static_cast<size_t>(parent)][j]);
    if (one_piece) rp.end_step();
  }
  receive_children(0);
  for (double t : ready[0]) end = std::max(end, t);
  return end;
}

// The double binary tree's schedule (double_binary_tree.cpp), each rank's program run in its order: the leaf
// halves' up-sends, the children's pieces of the inner half (reduced) and its up-send, the inner half's pieces
// from its parent and on to its children, then the leaf halves' results (one exchange). Ranks are interleaved by
// a small interpreter: a receive runs once every flow it waits for has been posted, as the run blocks on it.
double dbt_estimate(const runtime::Transport& tp, double bytes, size_t chunk_bytes) {
  namespace dbt = double_binary_tree;
  const int p = tp.size();
  if (p == 1 || bytes <= 0) return 0;
  const double piece_bytes = static_cast<double>(chunk_bytes ? chunk_bytes : dbt::kDefaultPiece);
  const double half = bytes / 2;
  const size_t m = static_cast<size_t>(std::clamp(std::ceil(half / piece_bytes), 1.0, 1024.0));
  const double piece = half / static_cast<double>(m);
  enum Kind { leaf_up, reduce_up, inner_down, leaf_down };
  struct Rank {
    std::array<dbt::TreeNode, 2> n;
    int inner = -1;                     // the tree it has children in (at most one)
    std::vector<Kind> ops;
    size_t pc = 0;
    std::array<size_t, 4> posted = {};  // flows in per tag (tree x direction)
    std::array<std::vector<double>, 2> t;  // when piece j of each half is complete here
  };
  std::vector<Rank> rk(static_cast<size_t>(p));
  auto tag = [](int k, bool is_down) { return 2 * k + (is_down ? 1 : 0); };
  for (int r = 0; r < p; ++r) {
    Rank& x = rk[static_cast<size_t>(r)];
    for (int k = 0; k < 2; ++k) {
      x.n[static_cast<size_t>(k)] = dbt::node(k, r, p);
      x.t[static_cast<size_t>(k)].assign(m, 0.0);
      if (x.n[static_cast<size_t>(k)].n_children() > 0) x.inner = k;
    }
    x.ops = {leaf_up, reduce_up, inner_down, leaf_down};
  }
  Replay rp(tp);
  auto post_half = [&](int from, int to, int k, bool is_down) {
    auto& src = rk[static_cast<size_t>(from)].t[static_cast<size_t>(k)];
    auto& dst = rk[static_cast<size_t>(to)].t[static_cast<size_t>(k)];
    for (size_t j = 0; j < m; ++j) rp.post(from, to, src[j], piece, &dst[j], tag(k, is_down));
    rk[static_cast<size_t>(to)].posted[static_cast<size_t>(tag(k, is_down))] += m;
  };
  // Runs rank R's next op if what it waits for is posted; false otherwise.
  auto step = [&](int r) {
    Rank& x = rk[static_cast<size_t>(r)];
    const Kind op = x.ops[x.pc];
    if (op == leaf_up) {
      for (int k = 0; k < 2; ++k)
        if (k != x.inner && x.n[static_cast<size_t>(k)].parent >= 0) post_half(r, x.n[static_cast<size_t>(k)].parent, k, false);
    } else if (op == reduce_up && x.inner >= 0) {
      const auto& n = x.n[static_cast<size_t>(x.inner)];
      if (x.posted[static_cast<size_t>(tag(x.inner, false))] < m * static_cast<size_t>(n.n_children())) return false;
      rp.flush(r, -1, 1u << tag(x.inner, false));
      if (n.parent >= 0) post_half(r, n.parent, x.inner, false);
    } else if (op == inner_down && x.inner >= 0) {
      const auto& n = x.n[static_cast<size_t>(x.inner)];
      if (n.parent >= 0) {
        if (x.posted[static_cast<size_t>(tag(x.inner, true))] < m) return false;
        rp.flush(r, -1, 1u << tag(x.inner, true));
      }
      auto& src = x.t[static_cast<size_t>(x.inner)];
      for (size_t j = 0; j < m; ++j)  // piece-major, as the run sends them
        for (int c = 0; c < n.n_children(); ++c)
          rp.post(r, n.children[c], src[j], piece, &rk[static_cast<size_t>(n.children[c])].t[static_cast<size_t>(x.inner)][j],
                  tag(x.inner, true));
      for (int c = 0; c < n.n_children(); ++c)
        rk[static_cast<size_t>(n.children[c])].posted[static_cast<size_t>(tag(x.inner, true))] += m;
    } else if (op == leaf_down) {
      unsigned tags = 0;
      for (int k = 0; k < 2; ++k) {
        if (k == x.inner || x.n[static_cast<size_t>(k)].parent < 0) continue;
        if (x.posted[static_cast<size_t>(tag(k, true))] < m) return false;
        tags |= 1u << tag(k, true);
      }
      if (tags) rp.flush(r, -1, tags);
    }
    ++x.pc;
    return true;
  };
  size_t done = 0;
  for (bool progress = true; progress && done < static_cast<size_t>(p);) {
    progress = false;
    for (int r = 0; r < p; ++r) {
      Rank& x = rk[static_cast<size_t>(r)];
      while (x.pc < x.ops.size() && step(r)) {
        progress = true;
        if (x.pc == x.ops.size()) ++done;
      }
    }
  }
  double end = 0;
  for (const auto& x : rk)
    for (const auto& v : x.t)
      for (double e : v) end = std::max(end, e);
  return end;
}

}  // namespace

double worst_step(const runtime::Transport& tp, int dist, double bytes) { return worst_step_impl(tp, dist, bytes); }
void set_replay_folding(bool on) { g_fold_replays = on; }

double ring_cycles_on(const topology::Topology& topo, std::vector<int> rank_to_chip, double chunk, int passes,
                      const std::vector<ring::Cycle>& cycles, size_t chunk_bytes) {
  Replay rp(topo, std::move(rank_to_chip));
  return ring_estimate(rp, chunk, passes, cycles, chunk_bytes);
}

double ring(const runtime::Transport& tp, double chunk, int passes, bool bidir, size_t chunk_bytes) {
  Replay rp(tp);
  return ring_estimate(rp, chunk, passes, ring_dirs(bidir), chunk_bytes);
}
double halving_doubling(const runtime::Transport& tp, double bytes, bool rs, bool ag) {
  return hd_estimate(tp, bytes, rs, ag);
}
double recursive_doubling(const runtime::Transport& tp, double bytes) { return hd_estimate(tp, bytes, false, true, true); }
double chain(const runtime::Transport& tp, double bytes, size_t chunk_bytes, bool reduce) {
  return chain_estimate(tp, bytes, chunk_bytes, reduce);
}
double torus(const runtime::Transport& tp, double bytes, int passes, size_t chunk_bytes) {
  return torus_estimate(tp, bytes, passes, chunk_bytes);
}
double torus_concurrent(const runtime::Transport& tp, double bytes, bool rs, bool ag, size_t chunk_bytes) {
  return torus_concurrent_estimate(tp, bytes, rs, ag, chunk_bytes);
}
double lower_bound_ns(Collective c, const runtime::Transport& tp, double bytes) {
  const int p = tp.size();
  if (p < 2 || bytes <= 0) return 0;
  const auto& topo = tp.topology();
  double slowest = std::numeric_limits<double>::infinity();  // the smallest egress of a member chip, GB/s
  for (int r = 0; r < p; ++r) {
    double egress = 0;
    for (const auto& l : topo.links())
      if (l.src == tp.chip_of(r)) egress += l.bandwidth_gbps;
    slowest = std::min(slowest, egress);
  }
  const double share = static_cast<double>(p - 1) / p;
  switch (c) {
    case Collective::all_reduce: return 2 * share * bytes / slowest;
    case Collective::reduce_scatter:
    case Collective::all_gather:
    case Collective::all_gatherv: return share * bytes / slowest;
    default: return 0;
  }
}
namespace {
in_switch::Schedule in_switch_schedule(Collective c, const runtime::Transport& tp, double bytes, size_t chunk_bytes) {
  const bool rs = c == Collective::all_reduce || c == Collective::reduce_scatter;
  const bool ag = c != Collective::reduce_scatter;
  // Chunks of whole bytes: the first ones one byte larger (as Partition splits elements).
  const Partition part{static_cast<size_t>(bytes), static_cast<size_t>(tp.size())};
  std::vector<double> chunk;
  for (size_t r = 0; r < part.parts; ++r) chunk.push_back(static_cast<double>(part.size(r)));
  return in_switch::schedule(tp, rs, ag, chunk, chunk_bytes);
}
}  // namespace

double in_switch(Collective c, const runtime::Transport& tp, double bytes, size_t chunk_bytes) {
  const int p = tp.size();
  if (p < 2 || bytes <= 0) return 0;
  const auto s = in_switch_schedule(c, tp, bytes, chunk_bytes);
  std::vector<std::vector<double>> up;
  for (int r = 0; r < p; ++r) up.push_back(in_switch::up_arrivals(tp, s, r, 0.0));
  const auto emit = in_switch::emit_times(s, up);
  double end = 0;
  for (int r = 0; r < p; ++r) {
    if (s.up[static_cast<size_t>(r)] > 0) end = std::max(end, up[static_cast<size_t>(r)].back());
    if (s.down[static_cast<size_t>(r)] > 0) end = std::max(end, in_switch::down_arrivals(tp, s, r, emit).back());
  }
  return end;
}

double in_network_lower_bound_ns(Collective c, const runtime::Transport& tp, double bytes) {
  const int p = tp.size();
  if (p < 2 || bytes <= 0 || !in_switch::obstacle(tp).empty()) return 0;
  const auto s = in_switch_schedule(c, tp, bytes, 0);
  const auto& topo = tp.topology();
  double bound = s.reduced / s.rate_gbps;
  for (int r = 0; r < p; ++r) {
    const int chip = tp.chip_of(r), sw = topo.switch_node(s.dim, chip);
    bound = std::max(bound, s.up[static_cast<size_t>(r)] / topo.link(*topo.link_between(chip, sw)).bandwidth_gbps);
    bound = std::max(bound, s.down[static_cast<size_t>(r)] / topo.link(*topo.link_between(sw, chip)).bandwidth_gbps);
  }
  return bound;
}

double direct(const runtime::Transport& tp, double per_peer, bool root_only_sends, bool root_only_recvs) {
  return direct_estimate(tp, per_peer, root_only_sends, root_only_recvs);
}
double binomial(const runtime::Transport& tp, double bytes, size_t chunk_bytes, bool reduce) {
  return binomial_estimate(tp, bytes, chunk_bytes, reduce);
}
double ring_cycles(const runtime::Transport& tp, double chunk, int passes, const std::vector<ring::Cycle>& cycles,
                   size_t chunk_bytes) {
  Replay rp(tp);
  return ring_estimate(rp, chunk, passes, cycles, chunk_bytes);
}
double double_binary_tree(const runtime::Transport& tp, double bytes, size_t chunk_bytes) {
  return dbt_estimate(tp, bytes, chunk_bytes);
}

}  // namespace shardsim::collectives::cost

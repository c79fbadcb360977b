#include "collectives/registry.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>

#include "collectives/cost/cost_model.h"
#include "collectives/double_binary_tree.h"
#include "collectives/halving_doubling.h"
#include "collectives/in_switch.h"
#include "collectives/multi_ring.h"
#include "collectives/rail_ring.h"
#include "collectives/ring.h"
#include "collectives/torus.h"
#include "collectives/torus_concurrent.h"
#include "collectives/tree.h"
#include "common/error.h"
#include "runtime/chips.h"

namespace shardsim::collectives {

namespace {

using C = Collective;

// Reduce-scatter and all-gather passes and which a collective needs (all_reduce: both).
bool has_rs(C c) { return c == C::all_reduce || c == C::reduce_scatter; }
bool has_ag(C c) { return c == C::all_reduce || c == C::all_gather || c == C::all_gatherv; }
int passes(C c) { return c == C::all_reduce ? 2 : 1; }

void copy_in(const runtime::Transport& tp, const void* sendbuf, void* recvbuf, size_t count, DType t) {
  const size_t bytes = count * runtime::dtype_size(t);
  if (sendbuf != recvbuf && bytes && !tp.shape_only()) std::memcpy(recvbuf, sendbuf, bytes);
}

// The collectives of the flat (RS + AG) algorithms.
const std::vector<C> kFlat = {C::all_reduce, C::reduce_scatter, C::all_gather, C::all_gatherv};

// --- ring / bidir_ring (ring.h) / multi_ring (multi_ring.h) / rail_ring (rail_ring.h): one ring implementation
// over lanes, each kind a set of cycles ---
enum RingKind { one_way, bidir, multi, rail };
std::vector<ring::Cycle> ring_dirs(RingKind k, const runtime::Transport& tp) {
  if (k == rail) return rail_ring::cycles(tp);
  if (k == multi) return multi_ring::cycles(tp.size());
  return ring::stride_cycles(k == bidir ? std::vector<int>{1, -1} : std::vector<int>{1});
}
// A folded run's rings (docs/performance/fold.md, algorithms.cpp choose): the replica shift rotates the group's
// ranks, so every rank's chunk must have the same size.
void check_fold_chunks(const runtime::Transport& tp, const Layout& layout, const std::string& name) {
  const bool even = std::all_of(layout.size.begin(), layout.size.end(), [&](size_t n) { return n == layout.size[0]; });
  if (!even && tp.spans_mirrored())
    runtime::chips::fold_broken(fold_chunks_reason(name, layout.total(), static_cast<int>(layout.parts())));
}
template <RingKind K>
sim::TimeNs ring_rs(runtime::Transport& tp, void* base, const Layout& layout, DType t, ReduceOp op,
                    size_t chunk_bytes, sim::TimeNs ready, const std::string& name) {
  check_fold_chunks(tp, layout, name);
  auto lanes = ring::make_lanes(layout, runtime::dtype_size(t), ring_dirs(K, tp), chunk_bytes, ready);
  return std::max(ready, ring::reduce_scatter(tp, base, lanes, t, op, name));
}
template <RingKind K>
sim::TimeNs ring_ag(runtime::Transport& tp, void* base, const Layout& layout, DType t, size_t chunk_bytes,
                    sim::TimeNs ready, const std::string& name) {
  check_fold_chunks(tp, layout, name);
  auto lanes = ring::make_lanes(layout, runtime::dtype_size(t), ring_dirs(K, tp), chunk_bytes, ready);
  return std::max(ready, ring::all_gather(tp, base, lanes, t, name));
}
template <RingKind K>
sim::TimeNs ring_ar(runtime::Transport& tp, const void* sendbuf, void* recvbuf, size_t count, DType t, ReduceOp op,
                    size_t chunk_bytes, sim::TimeNs ready, const std::string& name) {
  const Layout layout = Layout::from(Partition{count, static_cast<size_t>(tp.size())});
  check_fold_chunks(tp, layout, name);
  if (tp.size() > 1 && sendbuf != recvbuf) {
    // Out of place: read SENDBUF directly in the reduce-scatter pass (no initial copy of S bytes).
    auto lanes = ring::make_lanes(layout, runtime::dtype_size(t), ring_dirs(K, tp), chunk_bytes, ready);
    const sim::TimeNs mid = std::max(ready, ring::reduce_scatter(tp, recvbuf, lanes, t, op, name, sendbuf));
    // The all-gather pass runs on the same lanes (make_lanes of the same layout), all ready at MID.
    for (auto& lane : lanes) lane.t = mid;
    return std::max(mid, ring::all_gather(tp, recvbuf, lanes, t, name));
  }
  copy_in(tp, sendbuf, recvbuf, count, t);
  const sim::TimeNs mid = ring_rs<K>(tp, recvbuf, layout, t, op, chunk_bytes, ready, name);
  return ring_ag<K>(tp, recvbuf, layout, t, chunk_bytes, mid, name);
}
template <RingKind K>
double ring_cost(C c, const runtime::Transport& tp, double bytes, size_t chunk_bytes) {
  if (c == C::broadcast || c == C::reduce) return cost::chain(tp, bytes, chunk_bytes, c == C::reduce);
  if (K == multi || K == rail) return cost::ring_cycles(tp, bytes / tp.size(), passes(c), ring_dirs(K, tp), chunk_bytes);
  return cost::ring(tp, bytes / tp.size(), passes(c), K == bidir, chunk_bytes);
}
// The ring family's flat collectives and hooks (one implementation over lanes, RingKind K's directions).
template <RingKind K>
void set_ring_hooks(AlgorithmDescriptor& a) {
  a.collectives = kFlat;
  a.estimate_ns = ring_cost<K>;
  a.reduce_scatter = ring_rs<K>;
  a.all_gather = ring_ag<K>;
  a.all_reduce = ring_ar<K>;
}

// --- torus (torus.h) ---
sim::TimeNs torus_rs(runtime::Transport& tp, void* base, const Layout& layout, DType t, ReduceOp op,
                     size_t chunk_bytes, sim::TimeNs ready, const std::string& name) {
  return torus::reduce_scatter(tp, base, layout, t, op, ready, chunk_bytes, name);
}
sim::TimeNs torus_ag(runtime::Transport& tp, void* base, const Layout& layout, DType t, size_t chunk_bytes,
                     sim::TimeNs ready, const std::string& name) {
  return torus::all_gather(tp, base, layout, t, ready, chunk_bytes, name);
}
sim::TimeNs torus_ar(runtime::Transport& tp, const void* sendbuf, void* recvbuf, size_t count, DType t, ReduceOp op,
                     size_t chunk_bytes, sim::TimeNs ready, const std::string& name) {
  copy_in(tp, sendbuf, recvbuf, count, t);
  // Chunks in the algorithm's position order, so its passes run in place (torus.h).
  const Layout layout = torus::layout(tp, Partition{count, static_cast<size_t>(tp.size())});
  const sim::TimeNs mid = torus_rs(tp, recvbuf, layout, t, op, chunk_bytes, ready, name);
  return torus_ag(tp, recvbuf, layout, t, chunk_bytes, mid, name);
}

// --- halving_doubling (halving_doubling.h) ---
sim::TimeNs hd_rs(runtime::Transport& tp, void* base, const Layout& layout, DType t, ReduceOp op, size_t,
                  sim::TimeNs ready, const std::string& name) {
  return halving_doubling::reduce_scatter(tp, base, layout, t, op, ready, name);
}
sim::TimeNs hd_ag(runtime::Transport& tp, void* base, const Layout& layout, DType t, size_t, sim::TimeNs ready,
                  const std::string& name) {
  return halving_doubling::all_gather(tp, base, layout, t, ready, name);
}
sim::TimeNs hd_ar(runtime::Transport& tp, const void* sendbuf, void* recvbuf, size_t count, DType t, ReduceOp op,
                  size_t, sim::TimeNs ready, const std::string& name) {
  return halving_doubling::all_reduce(tp, sendbuf, recvbuf, count, t, op, ready, name);
}

sim::TimeNs rd_ar(runtime::Transport& tp, const void* sendbuf, void* recvbuf, size_t count, DType t, ReduceOp op,
                  size_t, sim::TimeNs ready, const std::string& name) {
  return halving_doubling::recursive_doubling_all_reduce(tp, sendbuf, recvbuf, count, t, op, ready, name);
}

// --- direct and dissemination (the one-algorithm collectives' own files) ---
double direct_cost(C c, const runtime::Transport& tp, double bytes, size_t) {
  const double per_peer = bytes / tp.size();
  switch (c) {
    case C::gather: return cost::direct(tp, per_peer, false, true);
    case C::scatter: return cost::direct(tp, per_peer, true, false);
    case C::send_recv: return cost::worst_step(tp, 1, bytes);
    default: return cost::direct(tp, per_peer, false, false);  // all_to_all(v)
  }
}
double dissemination_cost(C, const runtime::Transport& tp, double, size_t) {
  double t = 0;
  for (int dist = 1; dist < tp.size(); dist *= 2) t += cost::worst_step(tp, dist, 0);
  return t;
}

// double_binary_tree's auto rule: NCCL's Tree runs a chain through the GPUs of each node and binary trees only
// across nodes (NCCL src/graph/trees.cc; its tuning model charges the chain's nRanks/nNodes - 1 hops), so inside
// one node its tuner keeps Ring (tuning.cc: at 8 GPUs Ring wins at every size). A group inside one node: a grid
// topology whose innermost dimension is a switch or fully connected (an NVSwitch / NVLink node) and the group's
// chips differ in no other dimension. O(p x dimensions).
std::string inside_one_node(C, const runtime::Transport& tp) {
  const auto& topo = tp.topology();
  if (!topo.is_grid() || tp.size() < 2) return "";
  const auto& dims = topo.dim_specs();
  const auto inner = dims.back().kind;
  if (inner != topology::DimKind::switch_ && inner != topology::DimKind::fully_connected) return "";
  const auto& chips = tp.rank_to_chip();
  const std::vector<int> first = topo.coords(chips.front());
  for (int c : chips) {
    const std::vector<int> x = topo.coords(c);
    for (size_t d = 0; d + 1 < x.size(); ++d)
      if (x[d] != first[d]) return "";
  }
  return "the group is inside one node (its " + topology::dim_kind_name(inner) + " dimension): NCCL's Tree is a "
         "chain there and its tuning model keeps Ring";
}

// The registration, in groups; make_registry's order of the groups and of the entries in each is the tie-break
// order of "auto" within each collective.
// Rings: one-way, bidirectional, multi-channel (ring.h, multi_ring.h).
void add_rings(std::vector<AlgorithmDescriptor>& v) {
  {
    AlgorithmDescriptor a;
    a.name = "ring";
    a.aliases = {"chain"};
    a.summary = "one-way ring passes (ring.h); broadcast/reduce: pipelined chain along the ring (tree.h)";
    set_ring_hooks<one_way>(a);
    a.collectives.insert(a.collectives.end(), {C::broadcast, C::reduce});
    a.auto_for = a.collectives;
    a.nccl = "Ring (one channel; broadcast and reduce: NCCL's ring is this chain)";
    a.broadcast = tree::broadcast_chain;
    a.reduce = tree::reduce_chain;
    v.push_back(a);
  }
  {
    AlgorithmDescriptor a;
    a.name = "bidir_ring";
    a.aliases = {"bidirectional_ring"};
    a.summary = "ring with half of every chunk going each way (ring.h); needs distinct links to both neighbours";
    set_ring_hooks<bidir>(a);
    a.auto_for = kFlat;
    a.nccl = "Ring on two channels, one each way (NCCL builds several ring channels; this is two, reversed)";
    a.obstacle = [](C, const runtime::Transport& tp) { return ring::bidirectional_obstacle(tp); };
    v.push_back(a);
  }
  {
    AlgorithmDescriptor a;
    a.name = "multi_ring";
    a.aliases = {"channels", "multi_channel_ring"};
    a.summary = "one ring per stride s coprime with p (s < p/2), both ways, the data split over them, all at once "
                "(multi_ring.h); needs a direct link to every ring neighbour (a fully connected group)";
    set_ring_hooks<multi>(a);
    a.auto_for = kFlat;
    a.nccl = "Ring on several channels over different links (NCCL's ring channels on a fully connected node)";
    a.obstacle = [](C, const runtime::Transport& tp) { return multi_ring::obstacle(tp); };
    // In auto after bidir_ring: where it has only the strides +-1 (p = 3, 4, 6, or a ring of 3 / 4) it ties with
    // bidir_ring, which the tie-break keeps.
    v.push_back(a);
  }
  {
    AlgorithmDescriptor a;
    a.name = "rail_ring";
    a.aliases = {"nic_striped_ring", "rail_channels"};
    a.summary = "one ring per chip of a node, each crossing the nodes on other rails, the data split over them, all at "
                "once (rail_ring.h); needs an even number of nodes of a grid topology, the whole topology";
    set_ring_hooks<rail>(a);
    a.auto_for = kFlat;
    a.nccl = "Ring with one channel per NIC, each crossing the nodes on its own rail (NCCL's rail-aligned rings)";
    a.obstacle = [](C, const runtime::Transport& tp) { return rail_ring::obstacle(tp); };
    v.push_back(a);
  }
}

// Grid and switch algorithms: per-dimension rings, concurrent dimensions, in-network reduction.
void add_grids(std::vector<AlgorithmDescriptor>& v) {
  {
    AlgorithmDescriptor a;
    a.name = "torus";
    a.aliases = {"hierarchical", "multi_dim"};
    a.summary = "one ring per grid dimension, fastest dimension first (torus.h); needs a grid topology";
    a.collectives = kFlat;
    a.auto_for = kFlat;
    a.nccl = "departure: NCCL has no torus; on grids auto also weighs the per-dimension rings that torus machines' "
             "libraries run";
    a.obstacle = [](C, const runtime::Transport& tp) { return torus::obstacle(tp); };
    a.estimate_ns = [](C c, const runtime::Transport& tp, double bytes, size_t chunk) {
      return cost::torus(tp, bytes, passes(c), chunk);
    };
    a.reduce_scatter = torus_rs;
    a.all_gather = torus_ag;
    a.all_reduce = torus_ar;
    v.push_back(a);
  }
  {
    AlgorithmDescriptor a;
    a.name = "torus_concurrent";
    a.aliases = {"concurrent_torus", "torus_2d"};
    a.summary = "the data split by dimension, each part a torus pass in its own rotated dimension order, every "
                "dimension busy at once (torus_concurrent.h); needs a grid with 2+ dimensions";
    a.collectives = kFlat;
    a.auto_for = kFlat;
    a.nccl = "departure: NCCL has no torus; on grids auto also weighs the concurrent per-dimension rings";
    a.obstacle = [](C, const runtime::Transport& tp) { return torus_concurrent::obstacle(tp); };
    a.estimate_ns = [](C c, const runtime::Transport& tp, double bytes, size_t chunk) {
      return cost::torus_concurrent(tp, bytes, has_rs(c), has_ag(c), chunk);
    };
    a.reduce_scatter = torus_concurrent::reduce_scatter;
    a.all_gather = torus_concurrent::all_gather;
    a.all_reduce = torus_concurrent::all_reduce;
    v.push_back(a);
  }
  {
    AlgorithmDescriptor a;
    a.name = "in_switch";
    a.aliases = {"nvls", "sharp", "in_network"};
    a.summary = "every chip sends its data up once, the switch reduces (or multicasts) and sends the result down "
                "(NVLS / SHARP, in_switch.h); needs a switch with 'reduction: true' and the group on its chips";
    a.collectives = kFlat;
    a.auto_for = kFlat;
    a.nccl = "NVLS / CollNet (in-switch reduction and multicast)";
    a.obstacle = [](C, const runtime::Transport& tp) { return in_switch::obstacle(tp); };
    a.estimate_ns = [](C c, const runtime::Transport& tp, double bytes, size_t chunk) {
      return cost::in_switch(c, tp, bytes, chunk);
    };
    a.reduce_scatter = in_switch::reduce_scatter;
    a.all_gather = in_switch::all_gather;
    a.all_reduce = in_switch::all_reduce;
    v.push_back(a);
  }
}

// log2 p schedules: halving-doubling, recursive doubling, the double binary tree.
void add_logarithmic(std::vector<AlgorithmDescriptor>& v) {
  {
    AlgorithmDescriptor a;
    a.name = "halving_doubling";
    a.aliases = {"hd", "rabenseifner", "recursive_halving_doubling"};
    a.summary = "recursive halving / doubling, log2 p steps, Thakur's fold for non-powers of two (halving_doubling.h)";
    a.collectives = kFlat;
    // Not in auto: NCCL has no halving-doubling (reduce_scatter and all_gather run ring, NVLS, CollNet or PAT;
    // all_reduce ring, tree, NVLS or CollNet), so auto picking it would depart from what users calibrate against.
    a.nccl = "none (opt-in only: MPI's schedule; NCCL runs no halving-doubling)";
    a.estimate_ns = [](C c, const runtime::Transport& tp, double bytes, size_t) {
      return cost::halving_doubling(tp, bytes, has_rs(c), has_ag(c));
    };
    a.reduce_scatter = hd_rs;
    a.all_gather = hd_ag;
    a.all_reduce = hd_ar;
    v.push_back(a);
  }
  {
    AlgorithmDescriptor a;
    a.name = "recursive_doubling";
    a.aliases = {"rd"};
    a.summary = "all_reduce by log2 p whole-vector swaps at XOR distances 1, 2, 4, ... (halving_doubling.h); "
                "fewest steps; opt-in only, auto never picks it (MPI's small-message schedule)";
    a.collectives = {C::all_reduce};
    a.estimate_ns = [](C, const runtime::Transport& tp, double bytes, size_t) {
      return cost::recursive_doubling(tp, bytes);
    };
    a.all_reduce = rd_ar;
    // Not in auto: the link model charges no reduction compute, and this algorithm reduces the whole vector at
    // every step (log2 p times the ring's S/p), so its estimate is optimistic; and the vendor libraries users
    // calibrate against (NCCL, RCCL) never run it, so auto picking it would move every 2-chip all_reduce away
    // from what they measure. It is here to run MPI's small-message schedule on purpose (bench -a rd --vs-mpi).
    a.nccl = "none (opt-in only: MPI's small-message schedule)";
    v.push_back(a);
  }
  {
    AlgorithmDescriptor a;
    a.name = "double_binary_tree";
    a.aliases = {"dbt", "nccl_tree"};
    a.summary = "each half of the buffer reduced up and broadcast down one of two complementary binary trees, "
                "pipelined, both at once (NCCL's tree; double_binary_tree.h); O(log p) latency";
    a.collectives = {C::all_reduce};
    a.estimate_ns = [](C, const runtime::Transport& tp, double bytes, size_t chunk) {
      return cost::double_binary_tree(tp, bytes, chunk);
    };
    a.all_reduce = double_binary_tree::all_reduce;
    a.auto_for = {C::all_reduce};
    a.auto_obstacle = inside_one_node;
    a.nccl = "Tree (all_reduce only, as in NCCL; across nodes: inside one node NCCL's tree is a chain and auto "
             "weighs its Ring there)";
    // In auto after halving_doubling (a tie keeps halving_doubling: equal on a non-blocking switch at small sizes).
    // Its estimate replays every chip's pieces (O(p m) flows per size; auto's Replay books each receiver's own
    // flows, so 1 GiB on 512 chips costs auto about 0.5 s of host time for all its candidates together).
    v.push_back(a);
  }
}

// THE registration. Order = tie-break order of "auto" within each collective.
std::vector<AlgorithmDescriptor> make_registry() {
  std::vector<AlgorithmDescriptor> v;
  {
    AlgorithmDescriptor a;
    a.name = "binomial_tree";
    a.aliases = {"tree", "binomial"};
    a.summary = "binomial tree from/to the root, ceil(log2 p) rounds (tree.h); wins for small messages";
    a.collectives = {C::broadcast, C::reduce};
    a.estimate_ns = [](C c, const runtime::Transport& tp, double bytes, size_t chunk) {
      return cost::binomial(tp, bytes, chunk, c == C::reduce);
    };
    a.broadcast = tree::broadcast_binomial;
    a.reduce = tree::reduce_binomial;
    // Not in auto: NCCL's broadcast and reduce run Ring only (tuning.cc).
    a.nccl = "none (opt-in only: NCCL's broadcast and reduce run ring only)";
    v.push_back(a);
  }
  add_rings(v);
  add_grids(v);
  add_logarithmic(v);
  {
    AlgorithmDescriptor a;
    a.name = "direct";
    a.aliases = {"pairwise"};
    a.summary = "every rank sends to every peer at once (all_to_all.cpp, gather.cpp, send_recv.cpp)";
    a.collectives = {C::all_to_all, C::all_to_allv, C::gather, C::scatter, C::send_recv};
    a.estimate_ns = direct_cost;
    a.auto_for = a.collectives;
    a.nccl = "grouped send/recv (NCCL's all-to-all is ncclSend/ncclRecv to every peer)";
    v.push_back(a);
  }
  {
    AlgorithmDescriptor a;
    a.name = "dissemination";
    a.summary = "dissemination barrier: ceil(log2 p) rounds of empty messages at distances 1, 2, 4, ...";
    a.collectives = {C::barrier};
    a.estimate_ns = dissemination_cost;
    a.auto_for = a.collectives;
    a.nccl = "(a host-side barrier; NCCL has none)";
    v.push_back(a);
  }
  return v;
}

std::string us(double ns) {
  char b[32];
  std::snprintf(b, sizeof b, "%.3f us", ns / 1e3);
  return b;
}

}  // namespace

bool AlgorithmDescriptor::implements(Collective c) const {
  return std::find(collectives.begin(), collectives.end(), c) != collectives.end();
}

bool AlgorithmDescriptor::in_auto(Collective c) const {
  return std::find(auto_for.begin(), auto_for.end(), c) != auto_for.end();
}

const std::vector<AlgorithmDescriptor>& registered_algorithms() {
  static const std::vector<AlgorithmDescriptor> v = make_registry();
  return v;
}

const AlgorithmDescriptor* find_algorithm(const std::string& name) {
  for (const auto& a : registered_algorithms())
    if (a.name == name) return &a;
  for (const auto& a : registered_algorithms())
    if (std::find(a.aliases.begin(), a.aliases.end(), name) != a.aliases.end()) return &a;
  return nullptr;
}

const AlgorithmDescriptor& algorithm_of(Collective c, const std::string& name) {
  const AlgorithmDescriptor* a = find_algorithm(name);
  if (!a || !a->implements(c)) throw UsageError(collective_name(c) + ": " + not_an_algorithm_of(c, name));
  return *a;
}

std::string algorithm_name_error(Collective c, const std::string& name) {
  if (name == "auto" || !canonical_algorithm(c, name).empty()) return "";
  return not_an_algorithm_of(c, name);
}

std::string catalogue_text(const runtime::Transport* tp, double bytes, size_t chunk_bytes) {
  std::string out;
  for (const auto& a : registered_algorithms()) {
    out += a.name;
    if (!a.aliases.empty()) {
      out += " (aliases:";
      for (const auto& s : a.aliases) out += " " + s;
      out += ")";
    }
    out += "\n  " + a.summary + "\n  NCCL: " + a.nccl + "\n";
    for (Collective c : a.collectives) {
      char line[64];
      std::snprintf(line, sizeof line, "  %-15s", collective_name(c).c_str());
      out += line;
      if (tp) {
        const std::string why = obstacle(c, a.name, *tp);
        out += why.empty() ? " " + us(estimate_ns(c, a.name, *tp, bytes, chunk_bytes)) : " n/a (" + why + ")";
      }
      out += "\n";
    }
  }
  out += "per collective (auto's tie-break order):\n";
  for (Collective c : all_collectives()) {
    out += "  " + collective_name(c) + ":";
    std::string opt_in;
    for (const auto& n : algorithm_names(c)) (find_algorithm(n)->in_auto(c) ? out : opt_in) += " " + n;
    out += " auto";
    if (!opt_in.empty()) out += " (opt-in only:" + opt_in + ")";
    out += "\n";
  }
  return out;
}

}  // namespace shardsim::collectives

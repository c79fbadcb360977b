// The chip graph: chips (and switches), directed links and routes. No MPI, no time.
//
// Units: link bandwidth in GB/s with GB = 1e9 bytes, per direction; latency in ns (per hop).
// Links are directed: a bidirectional (full-duplex) connection between nodes a and b is two Links, a->b and
// b->a, each with the full bandwidth. Nodes 0..num_chips()-1 are chips; nodes from num_chips() on are switches
// (they forward, they do not compute and no rank lives on them).
//
// Grid topologies (ring, torus, mesh, fully-connected, switch, and stacks of these) are built from dimensions,
// as ASTRA-sim stacks Ring / FullyConnected / Switch: chips are numbered row-major over the dimension sizes
// (the last dimension varies fastest); along dimension d the chips that share all other coordinates form one
// "line" of size k, connected according to the dimension's kind:
//   ring             chip i -> i+1 and (bidirectional) i -> i-1, mod k. Size 2: one link each way.
//   line             a ring without the wrap-around link (a mesh dimension).
//   fully_connected  a direct link between every ordered pair of the line's chips.
//   switch           every chip of the line has one link up to the line's own switch and one back down; a
//                    chip-to-chip transfer crosses two links (up, down), as in ASTRA-sim's Switch.
// Kinds: ring = one ring dimension; torus = all ring dimensions; mesh = all line dimensions;
//   fully_connected / switch = one such dimension; stacked = anything else (e.g. [ring 4 x switch 8]).
// Graph topologies come from an explicit edge list (chips, optional switches, links between any nodes).
//
// Routing:
//   grids  dimension-order (dimension 0 first; Dally & Towles, "Principles and Practices of Interconnection
//          Networks", 2004, ch. 14). Within a ring the shorter direction, + on a tie (a unidirectional ring
//          only goes +); within a line towards the goal; fully-connected: the direct link; switch: up and down.
//   graph  shortest path by hop count; among equal-length paths the one taking the lowest link id at every hop
//          (deterministic). Links are traversed cut-through (see sim/cost.h).
// Errors: std::invalid_argument for impossible shapes and bad numbers (the YAML loader reports them as
// ConfigError naming the field); std::out_of_range for chip ids outside the topology.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace shardsim::topology {

// Accepted link parameters (everywhere: builders, YAML, ASTRA-sim files, --bandwidth/--latency). Values outside
// are almost certainly unit mistakes and would make simulated times overflow or vanish: bandwidth from 1 MB/s to
// 1 PB/s, latency from 0 to 1 s.
inline constexpr double kMinBandwidthGbps = 1e-3;
inline constexpr double kMaxBandwidthGbps = 1e6;
inline constexpr double kMaxLatencyNs = 1e9;
// "a finite number > 0 within 0.001..1e+06 GB/s" / "a finite number >= 0 within 0..1e+09 ns", for messages.
std::string bandwidth_range_text();
std::string latency_range_text();

struct LinkSpec {
  double bandwidth_gbps = 0;  // GB/s per direction, GB = 1e9 bytes; kMinBandwidthGbps..kMaxBandwidthGbps
  double latency_ns = 0;      // per hop; 0..kMaxLatencyNs
};

enum class DimKind { ring, line, fully_connected, switch_ };
std::string dim_kind_name(DimKind k);  // "ring", "line", "fully_connected", "switch"

// In-network reduction of a switch (NVIDIA NVLink SHARP "NVLS" inside a node, InfiniBand SHARP across nodes):
// the switch of every line of the dimension reduces the data its chips send up and multicasts the result down
// (collectives/in_switch.h runs it). BANDWIDTH: the rate at which one switch reduces the data of one collective
// (GB/s of result, GB = 1e9 B; its chips' links may be faster or slower: the slower of the two bounds the
// algorithm); LATENCY: added once per piece the switch reduces (ns). Only switch dimensions have it.
struct SwitchReduction {
  bool enabled = false;
  LinkSpec rate;  // bandwidth_gbps and latency_ns as above, in the ranges of LinkSpec
};

struct Dim {
  DimKind kind = DimKind::ring;
  int size = 1;
  LinkSpec link;
  bool bidirectional = true;  // ring only: false = only i -> i+1
  SwitchReduction reduction;  // switch only
};

struct Link {
  int id = 0;
  int src = 0;  // node ids (chips first, then switches)
  int dst = 0;
  double bandwidth_gbps = 0;
  double latency_ns = 0;
  int dim = 0;  // dimension this link belongs to (graphs: 0)
  int dir = 1;  // ring/line: +1 or -1 along the dimension; fully-connected 0; switch: +1 up, -1 down
};

// One edge of an explicit graph: a link A -> B (and B -> A when bidirectional).
struct Edge {
  int a = 0;
  int b = 0;
  LinkSpec link;
  bool bidirectional = true;
};

enum class Kind { ring, torus, mesh, fully_connected, switch_, stacked, graph };

// How a message uses the line rate of the links it crosses: NCCL's protocols in two classes (NCCL's Simple for
// bandwidth; LL/LL128 for latency: lower per-hop latency, but flags in every line cost part of the bandwidth).
// A message of S bytes with S <= low_latency_max_bytes (when that is > 0) travels with the low-latency protocol:
// per-hop latency x low_latency_latency_factor, occupancy S / (B x low_latency_efficiency); any other message
// occupies S / (B x efficiency) after the links' own latency. The defaults are the plain link model (every message
// at the full line rate), bit for bit. Set by the topology file's `protocol:` section or by `shardsim calibrate`.
//
// message_overhead_ns (o, either protocol): a fixed cost per message at its sender, charged once however many hops
// the message crosses (LogGP's o; e.g. a kernel's per-step flag handling or a proxy's per-send work). The sender's
// injection port is busy for o before the data enters the first link, so a message arrives o + sum of the hops'
// latencies + S / (B x efficiency) after it starts, and k messages from one port pay k overheads while their
// per-hop latencies overlap. Default 0: no charge, bit for bit.
//
// call_overhead_ns (c): a fixed cost per collective call (a kernel launch and its setup: the floor nccl-tests
// measures at small sizes, once per call however many steps the schedule has). Every collective on a group of
// p > 1 chips (all_reduce, reduce_scatter, all_gather(v), broadcast, reduce, all_to_all(v), gather, scatter; every
// algorithm) starts its first step c after its ready time on every participating chip; no engine or link is busy
// for it. Point-to-point (send, recv, send_recv) and the barrier do not pay it. collectives::estimate_ns adds the
// same c, so estimates still equal simulated times (collectives/algorithms.h). Default 0: no charge, bit for bit.
struct Protocol {
  double efficiency = 1;                  // bandwidth protocol: fraction of the line rate, (0, 1]
  double low_latency_max_bytes = 0;       // 0: no low-latency protocol
  double low_latency_efficiency = 1;      // (0, 1]
  double low_latency_latency_factor = 1;  // >= 0
  double message_overhead_ns = 0;         // per message at the sender, once (not per hop); ns, 0..1e9
  double call_overhead_ns = 0;            // per collective call, once, on every chip of the group; ns, 0..1e9
  bool is_default() const {
    return efficiency == 1 && low_latency_max_bytes == 0 && low_latency_efficiency == 1 &&
           low_latency_latency_factor == 1 && message_overhead_ns == 0 && call_overhead_ns == 0;
  }
  // std::invalid_argument naming the field when a value is outside its range (or not finite).
  void check() const;
  bool low_latency(double bytes) const { return low_latency_max_bytes > 0 && bytes <= low_latency_max_bytes; }
  // What a message of BYTES gets: the fraction of the line rate, and the factor on every per-hop latency
  // (exactly 1 and 1 with the default protocol).
  double efficiency_for(double bytes) const { return low_latency(bytes) ? low_latency_efficiency : efficiency; }
  double latency_factor_for(double bytes) const { return low_latency(bytes) ? low_latency_latency_factor : 1.0; }
};

class Topology {
 public:
  static Topology ring(int chips, LinkSpec link, bool bidirectional = true);
  // One LinkSpec for all dimensions, or one per dimension. Any number of dimensions, including 1.
  static Topology torus(const std::vector<int>& dims, const std::vector<LinkSpec>& per_dim);
  static Topology mesh(const std::vector<int>& dims, const std::vector<LinkSpec>& per_dim);
  static Topology fully_connected(int chips, LinkSpec link);
  static Topology switched(int chips, LinkSpec link);  // every chip to one switch (links chip<->switch)
  // Any stack of dimensions (dimension 0 outermost).
  static Topology stacked(const std::vector<Dim>& dims);
  // An explicit edge list over CHIPS chips and SWITCHES switches (switch i is node CHIPS + i). Every chip must
  // reach every other chip; errors name the edge index.
  static Topology graph(int chips, int switches, const std::vector<Edge>& edges);

  Kind kind() const { return kind_; }
  std::string kind_name() const;
  bool is_grid() const { return kind_ != Kind::graph; }
  int num_chips() const { return num_chips_; }
  int num_nodes() const { return static_cast<int>(out_.size()); }
  bool is_switch(int node) const { return node >= num_chips_; }
  // Grid dimension sizes (graphs: {num_chips}).
  const std::vector<int>& dims() const { return dims_; }
  const std::vector<Dim>& dim_specs() const { return dim_specs_; }
  // True when every ring dimension is bidirectional.
  bool bidirectional() const;
  const std::vector<Link>& links() const { return links_; }
  const Link& link(int id) const { return links_.at(static_cast<size_t>(id)); }

  // Link ids leaving NODE, in a fixed order (dimension, then +1 before -1).
  const std::vector<int>& out_links(int node) const { return out_.at(static_cast<size_t>(node)); }
  // Distinct chips reachable in one hop from CHIP (through no switch), ascending.
  std::vector<int> neighbors(int chip) const;
  std::optional<int> link_between(int src, int dst) const;  // node ids
  // "chip 3" or "switch 1" (switches numbered from 0 after the chips), and "chip 3 -> switch 1" for link ID.
  std::string node_name(int node) const;
  std::string link_name(int id) const;

  // Grid coordinates (graphs: {chip}).
  std::vector<int> coords(int chip) const;
  int chip_at(const std::vector<int>& coords) const;

  // Link ids of the route SRC -> DST between chips (empty when SRC == DST). One end may also be a switch node
  // directly linked to the other (a chip's up- or down-link: the in-switch collectives' route to and from their
  // switch); std::invalid_argument for any other switch end.
  std::vector<int> route(int src, int dst) const;
  // Grids: the switch node of CHIP's line along switch dimension DIM (std::invalid_argument when DIM is not a
  // switch dimension of size > 1).
  int switch_node(int dim, int chip) const;
  // route(src, dst).size() without building the route: O(dims) on grids, a table look-up on graphs.
  int hop_count(int src, int dst) const;
  // Largest hop count between two chips. Grids: sum of the per-dimension maxima, O(sum k_d); graphs: the
  // breadth-first distance table built with the topology (O(nodes x links) once), O(chips^2).
  int diameter() const;
  // Mean hop count over ordered pairs of distinct chips (0 for one chip). Grids: closed form, sum over dimensions
  // of (chips/k_d)^2 x (hops summed over ordered pairs of one line), O(sum k_d); graphs: the distance table.
  // Both equal the averages of route() lengths (checked in tests/unit/topology_kinds_test.cpp).
  double average_hop_count() const;

  // Bisection bandwidth per direction in GB/s: the least total bandwidth of the links from one half of the
  // chips to the other. Grids: the cheapest cut of one even-sized dimension into halves (the standard bisection
  // of tori and meshes); with no even dimension the exact search when it is small, else the cheapest odd cut
  // (halves differ by one line). Graphs: exact search over balanced cuts for up to 22 nodes; nullopt above.
  std::optional<double> bisection_bandwidth_gbps() const;
  // Exact search over balanced cuts (every assignment of switches too); nullopt above 22 nodes. Used for graphs
  // and by tests to check the grid formula.
  std::optional<double> bisection_bandwidth_exact_gbps() const;

  // Rank -> chip placement of a job on this topology: rank r runs on chip placement()[r]. Identity unless set;
  // set_placement needs a permutation of 0..num_chips()-1 (std::invalid_argument naming the problem otherwise).
  const std::vector<int>& placement() const { return placement_; }
  void set_placement(const std::vector<int>& rank_to_chip);
  bool identity_placement() const;

  // A copy with every link's latency set to LATENCY_FACTOR x its latency (or x LATENCY_BASE_NS when the
  // topology's latencies are all 0, so a fit can move a zero latency) and its bandwidth to BANDWIDTH_FACTOR x its
  // bandwidth; dimension specs follow. Not range-checked (calibration explores freely; the result is checked when
  // it is written to a file and loaded again).
  Topology scaled(double latency_factor, double bandwidth_factor, double latency_base_ns = 1.0) const;

  // The message protocol model (default: the plain link model).
  const Protocol& protocol() const { return protocol_; }
  void set_protocol(const Protocol& p);  // p.check() first

  // One line, e.g. "ring 8 chips, bidirectional, 100 GB/s, 500 ns per link" (plus the protocol when not default).
  std::string describe() const;
  // Graphviz (dot) text: chips as boxes, switches as ellipses, one edge per directed link (or one undirected
  // edge per full-duplex pair with equal specs), labelled with bandwidth and latency.
  std::string to_dot() const;

  Topology() = default;  // empty: 0 chips; use the builders

 private:
  void add_link(int src, int dst, LinkSpec spec, int dim, int dir);
  void check_chip(int chip) const;
  int switch_of(int dim, const std::vector<int>& xyz) const;
  int dim_hops(size_t dim, int a, int b) const;  // route hops from coordinate A to B along grid dimension DIM
  void build_graph_routes();

  Kind kind_ = Kind::ring;
  int num_chips_ = 0;
  std::vector<int> dims_;
  std::vector<Dim> dim_specs_;
  std::vector<int> switch_base_;  // per dimension: first switch node of that dimension (-1 if not a switch dim)
  std::vector<Link> links_;
  std::vector<std::vector<int>> out_;
  std::vector<std::vector<int>> dist_;
  Protocol protocol_;
  std::vector<int> placement_;  // graphs: hop distance node -> node (-1 unreachable)
};

}  // namespace shardsim::topology

#include "topology/topology.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <sstream>
#include <stdexcept>

namespace shardsim::topology {

std::string dim_kind_name(DimKind k) {
  switch (k) {
    case DimKind::ring: return "ring";
    case DimKind::line: return "line";
    case DimKind::fully_connected: return "fully_connected";
    case DimKind::switch_: return "switch";
  }
  return "?";
}

namespace {

std::string fmt(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

void check_spec(const LinkSpec& s, const std::string& where) {
  if (!(s.bandwidth_gbps >= kMinBandwidthGbps && s.bandwidth_gbps <= kMaxBandwidthGbps))
    throw std::invalid_argument(where + "bandwidth must be " + bandwidth_range_text() + " (got " +
                                fmt(s.bandwidth_gbps) + ")");
  if (!(s.latency_ns >= 0 && s.latency_ns <= kMaxLatencyNs))
    throw std::invalid_argument(where + "latency must be " + latency_range_text() + " (got " + fmt(s.latency_ns) + ")");
}

}  // namespace

std::string bandwidth_range_text() {
  return "a finite number > 0 within " + fmt(kMinBandwidthGbps) + ".." + fmt(kMaxBandwidthGbps) + " GB/s";
}
std::string latency_range_text() { return "a finite number >= 0 within 0.." + fmt(kMaxLatencyNs) + " ns"; }

void Topology::add_link(int src, int dst, LinkSpec spec, int dim, int dir) {
  Link l;
  l.id = static_cast<int>(links_.size());
  l.src = src;
  l.dst = dst;
  l.bandwidth_gbps = spec.bandwidth_gbps;
  l.latency_ns = spec.latency_ns;
  l.dim = dim;
  l.dir = dir;
  links_.push_back(l);
  out_[static_cast<size_t>(src)].push_back(l.id);
}

Topology Topology::stacked(const std::vector<Dim>& dims) {
  if (dims.empty()) throw std::invalid_argument("a topology needs at least one dimension");
  Topology t;
  int64_t n = 1;
  for (size_t d = 0; d < dims.size(); ++d) {
    if (dims[d].size < 1)
      throw std::invalid_argument("dimension " + std::to_string(d) + " has size " + std::to_string(dims[d].size) +
                                  " (must be >= 1)");
    check_spec(dims[d].link, "dimension " + std::to_string(d) + ": ");
    if (dims[d].reduction.enabled) {
      if (dims[d].kind != DimKind::switch_)
        throw std::invalid_argument("dimension " + std::to_string(d) + ": in-switch reduction needs a switch dimension");
      check_spec(dims[d].reduction.rate, "dimension " + std::to_string(d) + ": reduction ");
    }
    n *= dims[d].size;
    if (n > (int64_t{1} << 24)) throw std::invalid_argument("more than 2^24 chips");
    t.dims_.push_back(dims[d].size);
  }
  t.dim_specs_ = dims;
  t.num_chips_ = static_cast<int>(n);
  // Classify.
  auto all = [&](DimKind k) {
    return std::all_of(dims.begin(), dims.end(), [k](const Dim& d) { return d.kind == k; });
  };
  if (dims.size() == 1 && dims[0].kind == DimKind::ring) t.kind_ = Kind::ring;
  else if (dims.size() == 1 && dims[0].kind == DimKind::fully_connected) t.kind_ = Kind::fully_connected;
  else if (dims.size() == 1 && dims[0].kind == DimKind::switch_) t.kind_ = Kind::switch_;
  else if (all(DimKind::ring)) t.kind_ = Kind::torus;
  else if (all(DimKind::line)) t.kind_ = Kind::mesh;
  else t.kind_ = Kind::stacked;
  // Switch nodes: one per line of every switch dimension.
  int nodes = t.num_chips_;
  t.switch_base_.assign(dims.size(), -1);
  for (size_t d = 0; d < dims.size(); ++d)
    if (dims[d].kind == DimKind::switch_ && dims[d].size > 1) {
      t.switch_base_[d] = nodes;
      nodes += t.num_chips_ / dims[d].size;
    }
  t.out_.resize(static_cast<size_t>(nodes));
  for (int c = 0; c < t.num_chips_; ++c) {
    const auto xyz = t.coords(c);
    for (size_t d = 0; d < dims.size(); ++d) {
      const Dim& dim = dims[d];
      const int k = dim.size, x = xyz[d], di = static_cast<int>(d);
      if (k == 1) continue;
      auto at = [&](int v) {
        auto o = xyz;
        o[d] = v;
        return t.chip_at(o);
      };
      switch (dim.kind) {
        case DimKind::ring:
          t.add_link(c, at((x + 1) % k), dim.link, di, +1);
          if (dim.bidirectional && k > 2) t.add_link(c, at((x - 1 + k) % k), dim.link, di, -1);
          break;
        case DimKind::line:
          if (x + 1 < k) t.add_link(c, at(x + 1), dim.link, di, +1);
          if (x > 0) t.add_link(c, at(x - 1), dim.link, di, -1);
          break;
        case DimKind::fully_connected:
          for (int v = 0; v < k; ++v)
            if (v != x) t.add_link(c, at(v), dim.link, di, 0);
          break;
        case DimKind::switch_: {
          const int sw = t.switch_of(di, xyz);
          t.add_link(c, sw, dim.link, di, +1);
          t.add_link(sw, c, dim.link, di, -1);
          break;
        }
      }
    }
  }
  t.placement_.resize(static_cast<size_t>(t.num_chips_));
  for (int c = 0; c < t.num_chips_; ++c) t.placement_[static_cast<size_t>(c)] = c;
  return t;
}

void Topology::set_placement(const std::vector<int>& p) {
  if (static_cast<int>(p.size()) != num_chips_)
    throw std::invalid_argument("placement lists " + std::to_string(p.size()) + " chips for " +
                                std::to_string(num_chips_) + " ranks (one entry per rank)");
  std::vector<int> seen(p.size(), -1);
  for (size_t r = 0; r < p.size(); ++r) {
    if (p[r] < 0 || p[r] >= num_chips_)
      throw std::invalid_argument("placement[" + std::to_string(r) + "]: chip " + std::to_string(p[r]) +
                                  " does not exist (0.." + std::to_string(num_chips_ - 1) + ")");
    if (seen[static_cast<size_t>(p[r])] >= 0)
      throw std::invalid_argument("placement[" + std::to_string(r) + "]: chip " + std::to_string(p[r]) +
                                  " is already used by rank " + std::to_string(seen[static_cast<size_t>(p[r])]));
    seen[static_cast<size_t>(p[r])] = static_cast<int>(r);
  }
  placement_ = p;
}

bool Topology::identity_placement() const {
  for (size_t r = 0; r < placement_.size(); ++r)
    if (placement_[r] != static_cast<int>(r)) return false;
  return true;
}

int Topology::switch_of(int dim, const std::vector<int>& xyz) const {
  // Lines of dimension DIM are numbered by the chip ids with coordinate DIM removed.
  int line = 0;
  for (size_t d = 0; d < dims_.size(); ++d)
    if (static_cast<int>(d) != dim) line = line * dims_[d] + xyz[d];
  return switch_base_[static_cast<size_t>(dim)] + line;
}

Topology Topology::ring(int chips, LinkSpec link, bool bidirectional) {
  if (chips < 1) throw std::invalid_argument("a ring needs at least 1 chip");
  return stacked({Dim{DimKind::ring, chips, link, bidirectional, {}}});
}

namespace {
std::vector<Dim> uniform_dims(const std::vector<int>& dims, const std::vector<LinkSpec>& per_dim, DimKind kind,
                              const char* what) {
  if (dims.empty()) throw std::invalid_argument(std::string("a ") + what + " needs at least one dimension");
  if (per_dim.size() != 1 && per_dim.size() != dims.size())
    throw std::invalid_argument(std::string("give one link spec, or one per ") + what + " dimension");
  std::vector<Dim> out;
  for (size_t d = 0; d < dims.size(); ++d) {
    if (dims[d] < 1) throw std::invalid_argument(std::string(what) + " dimensions must be >= 1");
    out.push_back(Dim{kind, dims[d], per_dim.size() == 1 ? per_dim[0] : per_dim[d], true, {}});
  }
  return out;
}
}  // namespace

Topology Topology::torus(const std::vector<int>& dims, const std::vector<LinkSpec>& per_dim) {
  auto t = stacked(uniform_dims(dims, per_dim, DimKind::ring, "torus"));
  t.kind_ = Kind::torus;  // a 1-d torus is a ring, but the user asked for a torus
  return t;
}

Topology Topology::mesh(const std::vector<int>& dims, const std::vector<LinkSpec>& per_dim) {
  auto t = stacked(uniform_dims(dims, per_dim, DimKind::line, "mesh"));
  t.kind_ = Kind::mesh;
  return t;
}

Topology Topology::fully_connected(int chips, LinkSpec link) {
  if (chips < 1) throw std::invalid_argument("a fully-connected topology needs at least 1 chip");
  return stacked({Dim{DimKind::fully_connected, chips, link, true, {}}});
}

Topology Topology::switched(int chips, LinkSpec link) {
  if (chips < 1) throw std::invalid_argument("a switch topology needs at least 1 chip");
  return stacked({Dim{DimKind::switch_, chips, link, true, {}}});
}

Topology Topology::graph(int chips, int switches, const std::vector<Edge>& edges) {
  if (chips < 1) throw std::invalid_argument("a graph needs at least 1 chip");
  if (switches < 0) throw std::invalid_argument("switches must be >= 0");
  Topology t;
  t.kind_ = Kind::graph;
  t.num_chips_ = chips;
  t.dims_ = {chips};
  t.out_.resize(static_cast<size_t>(chips + switches));
  const int nodes = chips + switches;
  auto node_name = [&t](int v) { return t.node_name(v); };
  for (size_t i = 0; i < edges.size(); ++i) {
    const Edge& e = edges[i];
    const std::string where = "link " + std::to_string(i) + ": ";
    for (int v : {e.a, e.b})
      if (v < 0 || v >= nodes)
        throw std::invalid_argument(where + "node " + std::to_string(v) + " does not exist (" + std::to_string(chips) +
                                    " chips 0.." + std::to_string(chips - 1) +
                                    (switches ? ", " + std::to_string(switches) + " switches" : std::string()) + ")");
    if (e.a == e.b) throw std::invalid_argument(where + "connects " + node_name(e.a) + " to itself");
    check_spec(e.link, where);
    for (int id : t.out_[static_cast<size_t>(e.a)])
      if (t.links_[static_cast<size_t>(id)].dst == e.b)
        throw std::invalid_argument(where + "a second link " + node_name(e.a) + " -> " + node_name(e.b));
    t.add_link(e.a, e.b, e.link, 0, 1);
    if (e.bidirectional) {
      for (int id : t.out_[static_cast<size_t>(e.b)])
        if (t.links_[static_cast<size_t>(id)].dst == e.a)
          throw std::invalid_argument(where + "a second link " + node_name(e.b) + " -> " + node_name(e.a));
      t.add_link(e.b, e.a, e.link, 0, -1);
    }
  }
  t.build_graph_routes();
  for (int s = 0; s < chips; ++s)
    for (int d = 0; d < chips; ++d)
      if (t.dist_[static_cast<size_t>(s)][static_cast<size_t>(d)] < 0)
        throw std::invalid_argument("the graph is disconnected: chip " + std::to_string(s) + " cannot reach chip " +
                                    std::to_string(d));
  t.placement_.resize(static_cast<size_t>(chips));
  for (int c = 0; c < chips; ++c) t.placement_[static_cast<size_t>(c)] = c;
  return t;
}

void Topology::build_graph_routes() {
  // dist_[s][d] by a breadth-first search from every node.
  const size_t n = out_.size();
  dist_.assign(n, std::vector<int>(n, -1));
  for (size_t s = 0; s < n; ++s) {
    auto& dist = dist_[s];
    std::deque<int> q{static_cast<int>(s)};
    dist[s] = 0;
    while (!q.empty()) {
      const int v = q.front();
      q.pop_front();
      for (int id : out_[static_cast<size_t>(v)]) {
        const int w = links_[static_cast<size_t>(id)].dst;
        if (dist[static_cast<size_t>(w)] < 0) {
          dist[static_cast<size_t>(w)] = dist[static_cast<size_t>(v)] + 1;
          q.push_back(w);
        }
      }
    }
  }
}

std::string Topology::kind_name() const {
  switch (kind_) {
    case Kind::ring: return "ring";
    case Kind::torus: return "torus";
    case Kind::mesh: return "mesh";
    case Kind::fully_connected: return "fully_connected";
    case Kind::switch_: return "switch";
    case Kind::stacked: return "stacked";
    case Kind::graph: return "graph";
  }
  return "?";
}

bool Topology::bidirectional() const {
  return std::all_of(dim_specs_.begin(), dim_specs_.end(),
                     [](const Dim& d) { return d.kind != DimKind::ring || d.bidirectional; });
}

void Topology::check_chip(int chip) const {
  if (chip < 0 || chip >= num_chips_)
    throw std::out_of_range("chip " + std::to_string(chip) + " outside 0.." + std::to_string(num_chips_ - 1));
}

std::vector<int> Topology::neighbors(int chip) const {
  check_chip(chip);
  std::vector<int> n;
  for (int id : out_[static_cast<size_t>(chip)])
    if (!is_switch(links_[static_cast<size_t>(id)].dst)) n.push_back(links_[static_cast<size_t>(id)].dst);
  std::sort(n.begin(), n.end());
  n.erase(std::unique(n.begin(), n.end()), n.end());
  return n;
}

std::optional<int> Topology::link_between(int src, int dst) const {
  if (src < 0 || src >= num_nodes()) throw std::out_of_range("node " + std::to_string(src) + " does not exist");
  for (int id : out_[static_cast<size_t>(src)])
    if (links_[static_cast<size_t>(id)].dst == dst) return id;
  return std::nullopt;
}

std::vector<int> Topology::coords(int chip) const {
  check_chip(chip);
  std::vector<int> xyz(dims_.size());
  for (int d = static_cast<int>(dims_.size()) - 1; d >= 0; --d) {
    xyz[static_cast<size_t>(d)] = chip % dims_[static_cast<size_t>(d)];
    chip /= dims_[static_cast<size_t>(d)];
  }
  return xyz;
}

int Topology::chip_at(const std::vector<int>& xyz) const {
  if (xyz.size() != dims_.size()) throw std::invalid_argument("coordinate rank does not match topology");
  int c = 0;
  for (size_t d = 0; d < dims_.size(); ++d) {
    if (xyz[d] < 0 || xyz[d] >= dims_[d]) throw std::out_of_range("coordinate outside the topology");
    c = c * dims_[d] + xyz[d];
  }
  return c;
}

int Topology::switch_node(int dim, int chip) const {
  if (!is_grid() || dim < 0 || dim >= static_cast<int>(dims_.size()) || switch_base_[static_cast<size_t>(dim)] < 0)
    throw std::invalid_argument("dimension " + std::to_string(dim) + " is not a switch dimension of size > 1");
  return switch_of(dim, coords(chip));
}

std::vector<int> Topology::route(int src, int dst) const {
  if (src != dst && (is_switch(src) || is_switch(dst)) && src >= 0 && dst >= 0 && src < num_nodes() &&
      dst < num_nodes()) {
    if (auto id = link_between(src, dst)) return {*id};  // a chip's up- or down-link
    throw std::invalid_argument("route: node " + std::to_string(src) + " and node " + std::to_string(dst) +
                                " are not directly linked (only a chip and its own switch are)");
  }
  check_chip(src);
  check_chip(dst);
  std::vector<int> path;
  auto hop = [&](int from, int to) {
    auto id = link_between(from, to);
    if (!id) throw std::logic_error("route: no link " + std::to_string(from) + "->" + std::to_string(to));
    path.push_back(*id);
  };
  if (kind_ == Kind::graph) {
    int cur = src;
    while (cur != dst) {
      const int want = dist_[static_cast<size_t>(cur)][static_cast<size_t>(dst)] - 1;
      int next_link = -1;
      for (int id : out_[static_cast<size_t>(cur)])  // ascending ids: the lowest link on a shortest path
        if (dist_[static_cast<size_t>(links_[static_cast<size_t>(id)].dst)][static_cast<size_t>(dst)] == want) {
          next_link = id;
          break;
        }
      path.push_back(next_link);
      cur = links_[static_cast<size_t>(next_link)].dst;
    }
    return path;
  }
  auto cur = coords(src);
  const auto goal = coords(dst);
  for (size_t d = 0; d < dims_.size(); ++d) {
    const Dim& dim = dim_specs_[d];
    const int n = dims_[d];
    if (cur[d] == goal[d]) continue;
    auto next = cur;
    switch (dim.kind) {
      case DimKind::ring:
      case DimKind::line: {
        int fwd = ((goal[d] - cur[d]) % n + n) % n;  // hops in the + direction
        int bwd = (n - fwd) % n;
        bool go_up = dim.kind == DimKind::line ? goal[d] > cur[d] : (!dim.bidirectional || fwd <= bwd || n <= 2);
        const int hops = dim.kind == DimKind::line ? std::abs(goal[d] - cur[d]) : (go_up ? fwd : bwd);
        for (int h = 0; h < hops; ++h) {
          next = cur;
          next[d] = ((cur[d] + (go_up ? 1 : -1)) % n + n) % n;
          hop(chip_at(cur), chip_at(next));
          cur = next;
        }
        break;
      }
      case DimKind::fully_connected:
        next[d] = goal[d];
        hop(chip_at(cur), chip_at(next));
        cur = next;
        break;
      case DimKind::switch_: {
        next[d] = goal[d];
        const int sw = switch_of(static_cast<int>(d), cur);
        hop(chip_at(cur), sw);
        hop(sw, chip_at(next));
        cur = next;
        break;
      }
    }
  }
  return path;
}

// Hops of the route between coordinates A and B along one grid dimension (route() follows each dimension in
// turn, so a grid route's length is the sum of these).
int Topology::dim_hops(size_t d, int a, int b) const {
  if (a == b) return 0;
  const Dim& dim = dim_specs_[d];
  const int n = dims_[d];
  switch (dim.kind) {
    case DimKind::ring: {
      const int fwd = ((b - a) % n + n) % n, bwd = (n - fwd) % n;
      return !dim.bidirectional || n <= 2 ? fwd : std::min(fwd, bwd);
    }
    case DimKind::line: return std::abs(b - a);
    case DimKind::fully_connected: return 1;
    case DimKind::switch_: return 2;
  }
  return 0;
}

int Topology::hop_count(int src, int dst) const {
  check_chip(src);
  check_chip(dst);
  if (kind_ == Kind::graph) return dist_[static_cast<size_t>(src)][static_cast<size_t>(dst)];
  int hops = 0;
  for (int d = static_cast<int>(dims_.size()) - 1; d >= 0; --d) {  // coordinates, last dimension fastest
    const int k = dims_[static_cast<size_t>(d)];
    hops += dim_hops(static_cast<size_t>(d), src % k, dst % k);
    src /= k;
    dst /= k;
  }
  return hops;
}

// Grids: the per-dimension maxima add up (every combination of coordinates is a chip pair). Graphs: the largest
// entry of the breadth-first distance table between chips (built once, O(nodes x links)).
int Topology::diameter() const {
  int best = 0;
  if (kind_ == Kind::graph) {
    for (int s = 0; s < num_chips_; ++s)
      for (int d = 0; d < num_chips_; ++d) best = std::max(best, dist_[static_cast<size_t>(s)][static_cast<size_t>(d)]);
    return best;
  }
  for (size_t d = 0; d < dims_.size(); ++d) {
    int worst = 0;
    for (int delta = 1; delta < dims_[d]; ++delta)  // every dimension kind is translation invariant from 0,
      worst = std::max(worst, std::max(dim_hops(d, 0, delta), dim_hops(d, delta, 0)));  // except lines: 0..k-1
    best += worst;
  }
  return best;
}

// Grids: over all ordered chip pairs (including equal ones, which add 0) dimension d contributes
// (n/k_d)^2 x H_d hops, H_d = sum of dim_hops over ordered coordinate pairs of one line (O(k_d) each);
// divided by the n(n-1) ordered pairs of distinct chips. Graphs: the distance table.
double Topology::average_hop_count() const {
  if (num_chips_ < 2) return 0;
  const double n = num_chips_;
  double sum = 0;
  if (kind_ == Kind::graph) {
    for (int s = 0; s < num_chips_; ++s)
      for (int d = 0; d < num_chips_; ++d) sum += dist_[static_cast<size_t>(s)][static_cast<size_t>(d)];
    return sum / (n * (n - 1));
  }
  for (size_t d = 0; d < dims_.size(); ++d) {
    const int k = dims_[d];
    double h = 0;  // sum over ordered pairs (a, b) of one line
    if (dim_specs_[d].kind == DimKind::line) {
      for (int delta = 1; delta < k; ++delta) h += 2.0 * delta * (k - delta);  // k - delta pairs each way
    } else {
      for (int delta = 1; delta < k; ++delta) h += static_cast<double>(k) * dim_hops(d, 0, delta);  // translation
    }
    const double lines = n / k;
    sum += lines * lines * h;
  }
  return sum / (n * (n - 1));
}

std::optional<double> Topology::bisection_bandwidth_exact_gbps() const {
  const int n = num_nodes();
  if (n > 22 || num_chips_ < 2) return num_chips_ < 2 ? std::optional<double>(0.0) : std::nullopt;
  const int half = num_chips_ / 2;
  double best = std::numeric_limits<double>::infinity();
  const uint32_t chip_mask = (num_chips_ >= 32) ? ~0u : ((1u << num_chips_) - 1);
  for (uint32_t side = 0; side < (1u << n); ++side) {
    if (side & 1u) continue;  // chip 0 stays in half A: each cut once
    if (__builtin_popcount(side & chip_mask) != half) continue;
    double ab = 0, ba = 0;
    for (const auto& l : links_) {
      const bool s = (side >> l.src) & 1u, d = (side >> l.dst) & 1u;
      if (!s && d) ab += l.bandwidth_gbps;
      if (s && !d) ba += l.bandwidth_gbps;
    }
    best = std::min(best, std::min(ab, ba));
  }
  return best;
}

std::optional<double> Topology::bisection_bandwidth_gbps() const {
  if (kind_ == Kind::graph) return bisection_bandwidth_exact_gbps();
  if (num_chips_ < 2) return 0.0;
  // A cut across dimension d halves the chips only when its size is even. With no even dimension, search
  // exactly when small enough, else fall back to the odd cuts (halves differ by one line: an estimate).
  const bool any_even = std::any_of(dims_.begin(), dims_.end(), [](int k) { return k % 2 == 0; });
  if (!any_even && num_nodes() <= 22) return bisection_bandwidth_exact_gbps();
  double best = std::numeric_limits<double>::infinity();
  for (size_t d = 0; d < dims_.size(); ++d) {
    const int k = dims_[d];
    if (k < 2 || (any_even && k % 2 != 0)) continue;
    const Dim& dim = dim_specs_[d];
    const double lines = static_cast<double>(num_chips_ / k), a = k / 2, b = k - k / 2, bw = dim.link.bandwidth_gbps;
    double per_line = 0;  // links from one half of the line to the other, one direction
    switch (dim.kind) {
      case DimKind::ring: per_line = (k > 2 && dim.bidirectional ? 2 : 1) * bw; break;
      case DimKind::line: per_line = bw; break;
      case DimKind::fully_connected: per_line = a * b * bw; break;
      case DimKind::switch_: per_line = std::min(a, b) * bw; break;
    }
    best = std::min(best, lines * per_line);
  }
  return best;
}

namespace {
// ", protocol: efficiency 0.8; messages <= 65536 B low-latency (efficiency 0.5, latency x 0.3)"; "" by default.
std::string protocol_text(const Protocol& p) {
  if (p.is_default()) return "";
  std::string s = ", protocol: efficiency " + fmt(p.efficiency);
  if (p.low_latency_max_bytes > 0)
    s += "; messages <= " + fmt(p.low_latency_max_bytes) + " B low-latency (efficiency " +
         fmt(p.low_latency_efficiency) + ", latency x " + fmt(p.low_latency_latency_factor) + ")";
  if (p.message_overhead_ns > 0) s += "; " + fmt(p.message_overhead_ns) + " ns overhead per message";
  if (p.call_overhead_ns > 0) s += "; " + fmt(p.call_overhead_ns) + " ns overhead per collective call";
  return s;
}
}  // namespace

void Protocol::check() const {
  auto frac = [](double v, const char* name) {
    // At least 1 %: 1e-300 of the line rate would make a message's time 1e300 times its size's (not finite).
    if (!(v >= 0.01 && v <= 1)) throw std::invalid_argument(std::string(name) + " must be in [0.01, 1] (got " + fmt(v) + ")");
  };
  frac(efficiency, "efficiency");
  frac(low_latency_efficiency, "low_latency_efficiency");
  if (!(low_latency_max_bytes >= 0 && low_latency_max_bytes <= 1e15))
    throw std::invalid_argument("low_latency_max_bytes must be a byte count >= 0 (got " + fmt(low_latency_max_bytes) +
                                ")");
  if (!(low_latency_latency_factor >= 0 && low_latency_latency_factor <= 1e6))
    throw std::invalid_argument("low_latency_latency_factor must be a finite number >= 0 (got " +
                                fmt(low_latency_latency_factor) + ")");
  if (!(message_overhead_ns >= 0 && message_overhead_ns <= 1e9))
    throw std::invalid_argument("message_overhead_ns must be in [0, 1e9] ns (got " + fmt(message_overhead_ns) + ")");
  if (!(call_overhead_ns >= 0 && call_overhead_ns <= 1e9))
    throw std::invalid_argument("call_overhead_ns must be in [0, 1e9] ns (got " + fmt(call_overhead_ns) + ")");
}

void Topology::set_protocol(const Protocol& p) {
  p.check();
  protocol_ = p;
}

std::string Topology::describe() const {
  std::ostringstream os;
  auto dims_text = [&] {
    std::string s;
    for (size_t d = 0; d < dims_.size(); ++d) s += std::string(d ? "x" : "") + std::to_string(dims_[d]);
    return s;
  };
  switch (kind_) {
    case Kind::ring:
      os << "ring " << num_chips_ << " chips, " << (dim_specs_[0].bidirectional ? "bidirectional" : "unidirectional");
      break;
    case Kind::torus: os << "torus " << dims_text() << " (" << num_chips_ << " chips)"; break;
    case Kind::mesh: os << "mesh " << dims_text() << " (" << num_chips_ << " chips)"; break;
    case Kind::fully_connected: os << "fully_connected " << num_chips_ << " chips"; break;
    case Kind::switch_: os << "switch " << num_chips_ << " chips (one switch)"; break;
    case Kind::stacked: {
      os << "stacked ";
      for (size_t d = 0; d < dims_.size(); ++d)
        os << (d ? " x " : "") << dim_kind_name(dim_specs_[d].kind) << " " << dims_[d];
      os << " (" << num_chips_ << " chips";
      if (num_nodes() > num_chips_)
        os << ", " << num_nodes() - num_chips_ << (num_nodes() - num_chips_ == 1 ? " switch" : " switches");
      os << ")";
      break;
    }
    case Kind::graph: {
      os << "graph " << num_chips_ << " chips";
      if (num_nodes() > num_chips_)
        os << ", " << num_nodes() - num_chips_ << (num_nodes() - num_chips_ == 1 ? " switch" : " switches");
      os << ", " << links_.size() << (links_.size() == 1 ? " directed link" : " directed links");
      return os.str() + " (GB = 1e9 B, per direction)" + protocol_text(protocol_);
    }
  }
  bool uniform = true;
  for (const auto& s : dim_specs_)
    uniform = uniform && s.link.bandwidth_gbps == dim_specs_[0].link.bandwidth_gbps &&
              s.link.latency_ns == dim_specs_[0].link.latency_ns;
  if (uniform) {
    os << ", " << fmt(dim_specs_[0].link.bandwidth_gbps) << " GB/s, " << fmt(dim_specs_[0].link.latency_ns)
       << " ns per link";
  } else {
    for (size_t d = 0; d < dim_specs_.size(); ++d)
      os << ", dim" << d << " " << fmt(dim_specs_[d].link.bandwidth_gbps) << " GB/s "
         << fmt(dim_specs_[d].link.latency_ns) << " ns";
  }
  os << " (GB = 1e9 B, per direction)";
  for (size_t d = 0; d < dim_specs_.size(); ++d)
    if (dim_specs_[d].reduction.enabled)
      os << ", " << (dim_specs_.size() > 1 ? "dim" + std::to_string(d) + " " : std::string()) << "in-switch reduction "
         << fmt(dim_specs_[d].reduction.rate.bandwidth_gbps) << " GB/s, " << fmt(dim_specs_[d].reduction.rate.latency_ns)
         << " ns";
  return os.str() + protocol_text(protocol_);
}

std::string Topology::to_dot() const {
  std::ostringstream os;
  const bool directed = !std::all_of(links_.begin(), links_.end(), [&](const Link& l) {
    auto back = link_between(l.dst, l.src);
    return back && link(*back).bandwidth_gbps == l.bandwidth_gbps && link(*back).latency_ns == l.latency_ns;
  });
  os << (directed ? "digraph" : "graph") << " shardsim {\n";
  os << "  label=\"" << describe() << "\";\n  node [fontname=\"Helvetica\"];\n";
  for (int v = 0; v < num_nodes(); ++v) {
    if (is_switch(v)) {
      os << "  s" << v - num_chips_ << " [shape=ellipse, label=\"switch " << v - num_chips_ << "\"];\n";
    } else {
      std::string label = "chip " + std::to_string(v);
      if (is_grid() && dims_.size() > 1) {
        label += "\\n(";
        const auto xyz = coords(v);
        for (size_t d = 0; d < xyz.size(); ++d) label += std::string(d ? "," : "") + std::to_string(xyz[d]);
        label += ")";
      }
      os << "  c" << v << " [shape=box, label=\"" << label << "\"];\n";
    }
  }
  auto name = [&](int v) {
    std::string s(is_switch(v) ? "s" : "c");
    s += std::to_string(is_switch(v) ? v - num_chips_ : v);
    return s;
  };
  for (const auto& l : links_) {
    if (!directed && l.src > l.dst) continue;  // one undirected edge per full-duplex pair
    os << "  " << name(l.src) << (directed ? " -> " : " -- ") << name(l.dst) << " [label=\""
       << fmt(l.bandwidth_gbps) << " GB/s\\n" << fmt(l.latency_ns) << " ns\"";
    static const char* palette[] = {"black", "blue", "red", "darkgreen", "purple", "orange"};
    if (is_grid()) os << ", color=" << palette[l.dim % 6];
    os << "];\n";
  }
  os << "}\n";
  return os.str();
}

Topology Topology::scaled(double latency_factor, double bandwidth_factor, double latency_base_ns) const {
  bool all_zero = true;
  for (const auto& l : links_) all_zero = all_zero && l.latency_ns == 0;
  auto lat = [&](double ns) { return latency_factor * (all_zero ? latency_base_ns : ns); };
  Topology t = *this;
  for (auto& l : t.links_) {
    l.latency_ns = lat(l.latency_ns);
    l.bandwidth_gbps *= bandwidth_factor;
  }
  for (auto& d : t.dim_specs_) {
    d.link.latency_ns = lat(d.link.latency_ns);
    d.link.bandwidth_gbps *= bandwidth_factor;
  }
  return t;
}

std::string Topology::node_name(int node) const {
  return node < num_chips_ ? "chip " + std::to_string(node) : "switch " + std::to_string(node - num_chips_);
}

std::string Topology::link_name(int id) const {
  const Link& l = link(id);
  return node_name(l.src) + " -> " + node_name(l.dst);
}

}  // namespace shardsim::topology

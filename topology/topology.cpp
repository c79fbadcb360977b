#include "topology/topology.h"

#include <algorithm>
#include <sstream>
#include <stdexcept>

namespace shardsim::topology {

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
  out_[src].push_back(l.id);
}

static void check_spec(const LinkSpec& s) {
  if (!(s.bandwidth_gbps > 0)) throw std::invalid_argument("link bandwidth must be > 0 GB/s");
  if (!(s.latency_ns >= 0)) throw std::invalid_argument("link latency must be >= 0 ns");
}

Topology Topology::ring(int chips, LinkSpec link, bool bidirectional) {
  if (chips < 1) throw std::invalid_argument("a ring needs at least 1 chip");
  check_spec(link);
  Topology t;
  t.kind_ = Kind::ring;
  t.num_chips_ = chips;
  t.bidirectional_ = bidirectional;
  t.dims_ = {chips};
  t.dim_specs_ = {link};
  t.out_.resize(chips);
  if (chips == 1) return t;
  for (int c = 0; c < chips; ++c) {
    t.add_link(c, (c + 1) % chips, link, 0, +1);
    if (bidirectional && chips > 2) t.add_link(c, (c - 1 + chips) % chips, link, 0, -1);
  }
  return t;
}

Topology Topology::torus(const std::vector<int>& dims, const std::vector<LinkSpec>& per_dim) {
  if (dims.empty()) throw std::invalid_argument("a torus needs at least one dimension");
  if (per_dim.size() != 1 && per_dim.size() != dims.size())
    throw std::invalid_argument("give one link spec, or one per torus dimension");
  Topology t;
  t.kind_ = Kind::torus;
  t.dims_ = dims;
  t.num_chips_ = 1;
  for (int d : dims) {
    if (d < 1) throw std::invalid_argument("torus dimensions must be >= 1");
    t.num_chips_ *= d;
  }
  for (size_t d = 0; d < dims.size(); ++d) {
    t.dim_specs_.push_back(per_dim.size() == 1 ? per_dim[0] : per_dim[d]);
    check_spec(t.dim_specs_.back());
  }
  t.out_.resize(t.num_chips_);
  for (int c = 0; c < t.num_chips_; ++c) {
    auto xyz = t.coords(c);
    for (size_t d = 0; d < dims.size(); ++d) {
      if (dims[d] == 1) continue;
      auto up = xyz;
      up[d] = (xyz[d] + 1) % dims[d];
      t.add_link(c, t.chip_at(up), t.dim_specs_[d], static_cast<int>(d), +1);
      if (dims[d] > 2) {
        auto down = xyz;
        down[d] = (xyz[d] - 1 + dims[d]) % dims[d];
        t.add_link(c, t.chip_at(down), t.dim_specs_[d], static_cast<int>(d), -1);
      }
    }
  }
  return t;
}

std::string Topology::kind_name() const { return kind_ == Kind::ring ? "ring" : "torus"; }

void Topology::check_chip(int chip) const {
  if (chip < 0 || chip >= num_chips_)
    throw std::out_of_range("chip " + std::to_string(chip) + " outside 0.." + std::to_string(num_chips_ - 1));
}

std::vector<int> Topology::neighbors(int chip) const {
  check_chip(chip);
  std::vector<int> n;
  for (int id : out_[chip]) n.push_back(links_[id].dst);
  std::sort(n.begin(), n.end());
  n.erase(std::unique(n.begin(), n.end()), n.end());
  return n;
}

std::optional<int> Topology::link_between(int src, int dst) const {
  check_chip(src);
  for (int id : out_[src])
    if (links_[id].dst == dst) return id;
  return std::nullopt;
}

std::vector<int> Topology::coords(int chip) const {
  check_chip(chip);
  std::vector<int> xyz(dims_.size());
  for (int d = static_cast<int>(dims_.size()) - 1; d >= 0; --d) {
    xyz[d] = chip % dims_[d];
    chip /= dims_[d];
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

std::vector<int> Topology::route(int src, int dst) const {
  check_chip(src);
  check_chip(dst);
  std::vector<int> path;
  auto cur = coords(src);
  const auto goal = coords(dst);
  for (size_t d = 0; d < dims_.size(); ++d) {
    const int n = dims_[d];
    int fwd = ((goal[d] - cur[d]) % n + n) % n;  // hops in the + direction
    int bwd = (n - fwd) % n;
    // A unidirectional ring only has + links; otherwise the shorter way, + on a tie.
    bool go_up = !bidirectional_ || fwd <= bwd || n <= 2;
    int hops = go_up ? fwd : bwd;
    for (int h = 0; h < hops; ++h) {
      auto next = cur;
      next[d] = ((cur[d] + (go_up ? 1 : -1)) % n + n) % n;
      const int from = chip_at(cur);
      const int to = chip_at(next);
      auto id = link_between(from, to);
      if (!id) throw std::logic_error("route: no link " + std::to_string(from) + "->" + std::to_string(to));
      path.push_back(*id);
      cur = next;
    }
  }
  return path;
}

int Topology::diameter() const {
  int best = 0;
  for (int s = 0; s < num_chips_; ++s)
    for (int d = 0; d < num_chips_; ++d) best = std::max(best, hop_count(s, d));
  return best;
}

std::string Topology::describe() const {
  std::ostringstream os;
  if (kind_ == Kind::ring) {
    os << "ring " << num_chips_ << " chips, " << (bidirectional_ ? "bidirectional" : "unidirectional");
  } else {
    os << "torus ";
    for (size_t d = 0; d < dims_.size(); ++d) os << (d ? "x" : "") << dims_[d];
    os << " (" << num_chips_ << " chips)";
  }
  bool uniform = true;
  for (const auto& s : dim_specs_)
    uniform = uniform && s.bandwidth_gbps == dim_specs_[0].bandwidth_gbps && s.latency_ns == dim_specs_[0].latency_ns;
  if (uniform) {
    os << ", " << dim_specs_[0].bandwidth_gbps << " GB/s, " << dim_specs_[0].latency_ns << " ns per link";
  } else {
    for (size_t d = 0; d < dim_specs_.size(); ++d)
      os << ", dim" << d << " " << dim_specs_[d].bandwidth_gbps << " GB/s " << dim_specs_[d].latency_ns << " ns";
  }
  os << " (GB = 1e9 B, per direction)";
  return os.str();
}

}  // namespace shardsim::topology

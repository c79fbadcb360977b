// The chip graph: chips, directed links and routes. No MPI, no time.
//
// Units: link bandwidth in GB/s with GB = 1e9 bytes, per direction; latency in ns (per hop).
// Links are directed: a bidirectional (full-duplex) connection between chips a and b is two Links, a->b and
// b->a, each with the full bandwidth.
//
// Builders:
//   ring(n)       n chips, chip i linked to i+1 and i-1 (mod n); unidirectional: only i -> i+1.
//   torus(dims)   N-d torus, row-major chip numbering (the last dimension varies fastest); each chip has a
//                 +1 and a -1 link per dimension (one link when the dimension has size 2, none for size 1).
// Routing:
//   ring   shorter direction; on a tie (distance n/2) the +1 direction.
//   torus  dimension-order (dimension 0 first), shorter direction in each dimension, + on a tie.
//          (Dally & Towles, "Principles and Practices of Interconnection Networks", 2004, ch. 14.)
// Errors: std::invalid_argument for impossible shapes (the YAML loader reports them as ConfigError).
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace shardsim::topology {

struct LinkSpec {
  double bandwidth_gbps = 0;  // GB/s per direction, GB = 1e9 bytes
  double latency_ns = 0;      // per hop
};

struct Link {
  int id = 0;
  int src = 0;
  int dst = 0;
  double bandwidth_gbps = 0;
  double latency_ns = 0;
  int dim = 0;  // dimension this link belongs to
  int dir = 1;  // +1 or -1 along that dimension
};

enum class Kind { ring, torus };

class Topology {
 public:
  static Topology ring(int chips, LinkSpec link, bool bidirectional = true);
  // One LinkSpec for all dimensions, or one per dimension.
  static Topology torus(const std::vector<int>& dims, const std::vector<LinkSpec>& per_dim);

  Kind kind() const { return kind_; }
  std::string kind_name() const;
  int num_chips() const { return num_chips_; }
  const std::vector<int>& dims() const { return dims_; }
  bool bidirectional() const { return bidirectional_; }
  const std::vector<Link>& links() const { return links_; }
  const Link& link(int id) const { return links_.at(id); }

  // Link ids leaving CHIP, in a fixed order (dimension, then +1 before -1).
  const std::vector<int>& out_links(int chip) const { return out_.at(chip); }
  // Distinct chips reachable in one hop from CHIP, ascending.
  std::vector<int> neighbors(int chip) const;
  std::optional<int> link_between(int src, int dst) const;

  std::vector<int> coords(int chip) const;
  int chip_at(const std::vector<int>& coords) const;

  // Link ids of the route SRC -> DST (empty when SRC == DST).
  std::vector<int> route(int src, int dst) const;
  int hop_count(int src, int dst) const { return static_cast<int>(route(src, dst).size()); }
  int diameter() const;

  // One line, e.g. "ring 8 chips, bidirectional, 100 GB/s, 500 ns per link".
  std::string describe() const;

 Topology() = default;  // empty: 0 chips; use the builders

 private:
  void add_link(int src, int dst, LinkSpec spec, int dim, int dir);
  void check_chip(int chip) const;

  Kind kind_ = Kind::ring;
  int num_chips_ = 0;
  bool bidirectional_ = true;
  std::vector<int> dims_;
  std::vector<LinkSpec> dim_specs_;
  std::vector<Link> links_;
  std::vector<std::vector<int>> out_;
};

}  // namespace shardsim::topology

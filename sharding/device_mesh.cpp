#include "sharding/device_mesh.h"

#include "topology/symmetry.h"

#include "sharding/model_spec.h"
#include "sharding/plans/registry.h"

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <sstream>
#include <stdexcept>

namespace shardsim::sharding {

const std::vector<std::string>& DeviceMesh::axis_names() {
  static const std::vector<std::string> names = {"tp", "cp", "ep", "dp", "pp"};
  return names;
}

namespace {

double dim_bandwidth(const topology::Topology& t, size_t d) {
  return d < t.dim_specs().size() ? t.dim_specs()[d].link.bandwidth_gbps : 0.0;
}

// True when every cumulative product of AXIS_SIZES (innermost first) is a cumulative product of the dimension
// sizes taken in ORDER: each axis occupies whole dimensions.
bool aligned(const std::vector<int>& axis_sizes, const std::vector<int>& order, const std::vector<int>& dims) {
  std::vector<long> dim_products = {1};
  for (int d : order) dim_products.push_back(dim_products.back() * dims[static_cast<size_t>(d)]);
  long p = 1;
  for (int a : axis_sizes) {
    p *= a;
    if (std::find(dim_products.begin(), dim_products.end(), p) == dim_products.end()) return false;
  }
  return true;
}

}  // namespace

DeviceMesh::DeviceMesh(const std::map<std::string, int>& sizes, const topology::Topology& topo,
                       const std::vector<int>& dim_order) {
  for (const auto& [name, s] : sizes) {
    if (std::find(axis_names().begin(), axis_names().end(), name) == axis_names().end())
      throw std::invalid_argument("unknown mesh axis '" + name + "' (known: tp, cp, ep, dp, pp)");
    if (s < 1) throw std::invalid_argument("mesh axis " + name + ": size " + std::to_string(s) + " < 1");
  }
  size_ = 1;
  std::vector<int> big;  // sizes > 1, innermost first
  for (const auto& name : axis_names()) {
    const auto it = sizes.find(name);
    MeshAxis a;
    a.name = name;
    a.size = it == sizes.end() ? 1 : it->second;
    a.stride = size_;
    size_ *= a.size;
    if (a.size > 1) big.push_back(a.size);
    axes_.push_back(a);
  }
  const int chips = topo.num_chips();
  if (size_ != chips) {
    std::ostringstream os;
    os << "the device mesh " << describe() << " has " << size_ << " chips but the topology has " << chips;
    throw std::invalid_argument(os.str());
  }

  // Topology dimensions of size > 1 (a graph: one dimension of every chip).
  const std::vector<int> dims = topo.is_grid() ? topo.dims() : std::vector<int>{chips};
  dim_sizes_ = dims;
  std::vector<int> real;
  for (size_t d = 0; d < dims.size(); ++d)
    if (dims[d] > 1) real.push_back(static_cast<int>(d));
  for (size_t d = 0; d < dims.size(); ++d) {
    char b[128];
    const double bw = topo.is_grid() ? dim_bandwidth(topo, d) : 0.0;
    if (bw > 0)
      std::snprintf(b, sizeof b, "dim %zu (%d chips, %g GB/s links)", d, dims[d], bw);
    else
      std::snprintf(b, sizeof b, "dim %zu (%d chips)", d, dims[d]);
    dim_text_.push_back(b);
  }

  if (!dim_order.empty()) {
    std::vector<int> want = real, got = dim_order;
    std::sort(want.begin(), want.end());
    std::sort(got.begin(), got.end());
    if (want != got) {
      std::ostringstream os;
      os << "the dimension order [";
      for (size_t i = 0; i < dim_order.size(); ++i) os << (i ? ", " : "") << dim_order[i];
      os << "] must list each topology dimension of size > 1 once (here:";
      for (int d : real) os << ' ' << d;
      os << ")";
      throw std::invalid_argument(os.str());
    }
    dim_order_ = dim_order;
  } else {
    // Candidates: every order of the dimensions with non-increasing link bandwidth, enumerated starting from the
    // last dimension first. The first whose axis boundaries fall on dimension boundaries wins, else the first.
    std::vector<int> perm(real.rbegin(), real.rend());
    std::vector<std::vector<int>> candidates;
    auto by_index_desc = [](int a, int b) { return a > b; };
    std::sort(perm.begin(), perm.end(), by_index_desc);
    do {
      bool fastest_first = true;
      for (size_t i = 1; i < perm.size(); ++i)
        if (topo.is_grid() && dim_bandwidth(topo, size_t(perm[i])) > dim_bandwidth(topo, size_t(perm[i - 1])))
          fastest_first = false;
      if (fastest_first) candidates.push_back(perm);
    } while (std::next_permutation(perm.begin(), perm.end(), by_index_desc));
    dim_order_ = candidates.empty() ? std::vector<int>(real.rbegin(), real.rend()) : candidates.front();
    for (const auto& c : candidates)
      if (aligned(big, c, dims)) {
        dim_order_ = c;
        break;
      }
  }

  // Mesh rank -> chip.
  explicit_placement_ = !topo.identity_placement();
  if (explicit_placement_) {
    placement_ = topo.placement();
  } else {
    placement_.resize(static_cast<size_t>(chips));
    for (int r = 0; r < chips; ++r) {
      if (!topo.is_grid()) {
        placement_[static_cast<size_t>(r)] = r;
        continue;
      }
      std::vector<int> xyz(dims.size(), 0);
      int v = r;
      for (int d : dim_order_) {
        xyz[static_cast<size_t>(d)] = v % dims[static_cast<size_t>(d)];
        v /= dims[static_cast<size_t>(d)];
      }
      placement_[static_cast<size_t>(r)] = topo.chip_at(xyz);
    }
  }

  // Which factors of which dimensions each axis occupies (for the report).
  std::vector<int> left;  // remaining capacity of the ordered dimensions
  for (int d : dim_order_) left.push_back(dims[static_cast<size_t>(d)]);
  size_t cur = 0;
  for (auto& a : axes_) {
    int need = a.size;
    while (need > 1 && cur < left.size()) {
      if (left[cur] == 1) {
        ++cur;
        continue;
      }
      int f = std::gcd(need, left[cur]);
      if (f == 1) f = left[cur];  // sizes that do not factor: the axis spans this dimension unevenly
      a.on.push_back({dim_order_[cur], f});
      need = std::max(1, need / f);
      left[cur] /= f;
    }
  }
}

const MeshAxis& DeviceMesh::axis(const std::string& name) const {
  for (const auto& a : axes_)
    if (a.name == name) return a;
  throw std::invalid_argument("unknown mesh axis '" + name + "' (known: tp, cp, ep, dp, pp)");
}

int DeviceMesh::size(const std::string& name) const { return axis(name).size; }

int DeviceMesh::coordinate(const std::string& name, int rank) const {
  const auto& a = axis(name);
  return (rank / a.stride) % a.size;
}

std::string DeviceMesh::describe() const {
  std::ostringstream os;
  bool any = false;
  for (const auto& a : axes_)
    if (a.size > 1) {
      os << (any ? " x " : "") << a.name << "=" << a.size;
      any = true;
    }
  if (!any) os << "tp=1";
  return os.str();
}

std::string DeviceMesh::mapping_text() const {
  std::ostringstream os;
  os << describe();
  if (explicit_placement_) {
    os << "; ranks on chips from topology.placement";
    return os.str();
  }
  bool first = true;
  for (const auto& a : axes_) {
    if (a.size <= 1) continue;
    os << (first ? ": " : ", ") << a.name << " -> ";
    first = false;
    for (size_t i = 0; i < a.on.size(); ++i) {
      const auto& p = a.on[i];
      if (i) os << " x ";
      const std::string& t = dim_text_.at(static_cast<size_t>(p.dim));
      // A whole dimension is named as such; a factor of one says how much of it.
      if (p.size == dim_sizes_.at(static_cast<size_t>(p.dim))) {
        os << t;
      } else {
        os << p.size << " of " << t;
      }
    }
  }
  for (const auto& a : axes_)
    if (a.size > 1) {
      os << "; rank order " << a.name << " innermost";
      break;
    }
  return os.str();
}

runtime::Transport& DeviceMesh::operator[](const std::string& name) const {
  if (!world_) throw std::logic_error("DeviceMesh: bind() a world transport before asking for sub-groups");
  const auto& a = axis(name);
  const int r = world_->rank();
  const int c = (r / a.stride) % a.size;
  const int stride = a.stride, size = a.size;
  return world_->subgroup("mesh." + name, r - c * stride, c, [stride, size](int q) {
    const int cq = (q / stride) % size;
    return std::pair{q - cq * stride, cq};
  });
}

runtime::Transport& DeviceMesh::excluding(const std::string& name) const {
  if (!world_) throw std::logic_error("DeviceMesh: bind() a world transport before asking for sub-groups");
  const auto& a = axis(name);
  const int stride = a.stride, size = a.size;
  auto color_key = [stride, size](int q) {  // color: the AXIS coordinate; key: q with that coordinate removed
    return std::pair{(q / stride) % size, q % stride + (q / (stride * size)) * stride};
  };
  const auto [color, key] = color_key(world_->rank());
  return world_->subgroup("mesh.excluding." + name, color, key, color_key);
}

int DeviceMesh::rank() const {
  if (!world_) throw std::logic_error("DeviceMesh: bind() a world transport first");
  return world_->rank();
}

}  // namespace shardsim::sharding

namespace shardsim::sharding {

std::string DeviceMesh::replica_shift_check(const std::string& name, int period,
                                            const topology::Topology& topo) const {
  // The shift sigma: mesh rank r -> r with its NAME coordinate + PERIOD (mod the axis size), checked on chips by
  // topology::chip_map_obstacle (topology/symmetry.h: one map per dimension, of a kind that keeps its routes).
  const auto& a = axis(name);
  if (a.size < 2 || period < 1 || period >= a.size || a.size % period != 0) return name + ": no shift to fold";
  if (!topo.is_grid()) return "a graph topology (no symmetries known)";
  if (static_cast<int>(placement_.size()) != size_ || topo.num_chips() != size_)
    return "the mesh does not cover the topology";
  std::vector<int> from(static_cast<size_t>(size_)), to(static_cast<size_t>(size_));
  for (int r = 0; r < size_; ++r) {
    const int c = (r / a.stride) % a.size;
    const int s = r + ((c + period) % a.size - c) * a.stride;
    from[static_cast<size_t>(r)] = placement_[static_cast<size_t>(r)];
    to[static_cast<size_t>(r)] = placement_[static_cast<size_t>(s)];
  }
  return topology::chip_map_obstacle(topo, from, to, "the shift of " + name);
}

int DeviceMesh::replica_fold_period(const std::string& name, const topology::Topology& topo) const {
  const int n = size(name);
  for (int p = 1; p < n; ++p)
    if (n % p == 0 && replica_shift_check(name, p, topo).empty()) return p;
  return 0;
}

}  // namespace shardsim::sharding

namespace shardsim::sharding {

DeviceMesh build_mesh(const ParallelPlan& plan, const topology::Topology& topo) {
  const std::string w = "parallel.mesh_dims: ";
  const int dims = static_cast<int>(topo.dims().size());
  if (!plan.mesh_dims.empty() && !topo.is_grid())
    throw std::invalid_argument(w + "a graph topology has no dimensions to choose");
  for (int d : plan.mesh_dims)
    if (d < 0 || d >= dims)
      throw std::invalid_argument(w + "dimension " + std::to_string(d) + " is not one of the topology's " +
                                  std::to_string(dims) + " dimensions (0.." + std::to_string(dims - 1) + ")");
  try {
    return DeviceMesh(plans::mesh_axis_sizes(plan), topo, plan.mesh_dims);
  } catch (const std::invalid_argument& e) {
    if (plan.mesh_dims.empty()) throw;
    throw std::invalid_argument(w + e.what());
  }
}

}  // namespace shardsim::sharding

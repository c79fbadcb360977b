#include "topology/symmetry.h"

#include <vector>

namespace shardsim::topology {

std::string chip_map_obstacle(const Topology& topo, std::span<const int> from, std::span<const int> to,
                              const std::string& what) {
  if (!topo.is_grid()) return "a graph topology (no symmetries known)";
  if (from.size() != to.size()) return what + " maps " + std::to_string(from.size()) + " chips onto " +
                                       std::to_string(to.size());
  const auto& dims = topo.dim_specs();
  const size_t nd = dims.size();
  std::vector<std::vector<int>> f(nd), inv(nd);
  for (size_t i = 0; i < nd; ++i) {
    f[i].assign(static_cast<size_t>(dims[i].size), -1);
    inv[i].assign(static_cast<size_t>(dims[i].size), -1);
  }
  for (size_t k = 0; k < from.size(); ++k) {
    const auto x = topo.coords(from[k]);
    const auto y = topo.coords(to[k]);
    if (x.size() != nd || y.size() != nd) return "coordinates of another rank than the dimensions";
    for (size_t i = 0; i < nd; ++i) {
      int& img = f[i][static_cast<size_t>(x[i])];
      if (img >= 0 && img != y[i]) return what + " is not one map per dimension";
      int& pre = inv[i][static_cast<size_t>(y[i])];
      if (pre >= 0 && pre != x[i]) return what + " is not a permutation of dimension " + std::to_string(i);
      img = y[i];
      pre = x[i];
    }
  }
  for (size_t i = 0; i < nd; ++i) {
    const int n = dims[i].size;
    int shift = -1;  // ring dimensions: the one translation every mapped coordinate must follow
    for (int x = 0; x < n; ++x) {
      const int y = f[i][static_cast<size_t>(x)];
      if (y < 0) continue;  // not mapped: any extension that keeps the dimension's kind will do
      const int d = ((y - x) % n + n) % n;
      if (dims[i].kind == DimKind::ring) {
        if (shift >= 0 && d != shift) return what + " is not a translation of ring dimension " + std::to_string(i);
        shift = d;
      }
      if (dims[i].kind == DimKind::line && y != x) return what + " moves along line dimension " + std::to_string(i);
    }
  }
  return "";
}

}  // namespace shardsim::topology

#include "collectives/rail_ring.h"

#include "collectives/torus.h"

namespace shardsim::collectives::rail_ring {

namespace {
// The node shape's part of the obstacle (the group is the whole grid, one rank per chip).
std::string shape_obstacle(const topology::Topology& topo) {
  const auto& dims = topo.dims();
  if (dims.size() < 2)
    return "the topology has one dimension; the rail rings need nodes (the inner dimensions) and rails across them "
           "(the outermost)";
  const int n = dims.front(), g = topo.num_chips() / n;
  if (g < 2) return "the inner dimensions (the node) hold 1 chip: there is one rail, nothing to stripe over";
  if (n < 2 || n % 2 != 0)
    return "the group spans " + std::to_string(n) +
           " nodes; the rail rings need an even number of nodes (each ring closes on a rail)";
  return "";
}
}  // namespace

std::string obstacle(const runtime::Transport& tp) {
  if (const std::string why = torus::obstacle(tp); !why.empty()) return why;  // a grid, one rank on every chip
  return shape_obstacle(tp.topology());
}

std::string obstacle(const topology::Topology& topo, const std::vector<int>& rank_to_chip) {
  if (!topo.is_grid()) return "the topology is not a grid";
  if (static_cast<int>(rank_to_chip.size()) != topo.num_chips()) return "the group is not the whole topology";
  std::vector<char> hit(rank_to_chip.size(), 0);
  for (int c : rank_to_chip) {
    if (c < 0 || c >= topo.num_chips() || hit[static_cast<size_t>(c)]) return "not one rank on every chip";
    hit[static_cast<size_t>(c)] = 1;
  }
  return shape_obstacle(topo);
}

std::vector<ring::Cycle> cycles(const topology::Topology& topo, const std::vector<int>& rank_to_chip) {
  const int n = topo.dims().front(), g = topo.num_chips() / n;
  std::vector<int> rank_on(static_cast<size_t>(topo.num_chips()), 0);
  for (size_t r = 0; r < rank_to_chip.size(); ++r) rank_on[static_cast<size_t>(rank_to_chip[r])] = static_cast<int>(r);
  std::vector<ring::Cycle> out;
  for (int c = 0; c < g; ++c) {
    std::vector<int> order;
    order.reserve(static_cast<size_t>(n * g));
    for (int node = 0; node < n; ++node)
      for (int i = 0; i < g; ++i) {
        const int x = node % 2 == 0 ? c + i : c - 1 - i;  // even nodes up from c, odd nodes down from c - 1
        order.push_back(rank_on[static_cast<size_t>(node * g + ((x % g) + g) % g)]);
      }
    out.push_back(ring::Cycle::from_order(std::move(order)));
  }
  return out;
}

std::vector<ring::Cycle> cycles(const runtime::Transport& tp) { return cycles(tp.topology(), tp.rank_to_chip()); }

}  // namespace shardsim::collectives::rail_ring

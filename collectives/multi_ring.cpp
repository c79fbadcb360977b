#include "collectives/multi_ring.h"

#include <numeric>

namespace shardsim::collectives::multi_ring {

std::vector<int> directions(int p) {
  std::vector<int> dirs;
  for (int s = 1; 2 * s < p; ++s)
    if (std::gcd(s, p) == 1) {
      dirs.push_back(s);
      dirs.push_back(-s);
    }
  if (dirs.empty()) dirs.push_back(1);
  return dirs;
}

std::string obstacle(const runtime::Transport& tp) {
  const int p = tp.size();
  if (p == 1) return "";  // nothing moves
  const auto& topo = tp.topology();
  for (int d : directions(p))
    for (int r = 0; r < p; ++r) {
      const int c = tp.chip_of(r), n = tp.chip_of(((r + d) % p + p) % p);
      const auto route = topo.route(c, n);
      if (route.size() != 1)
        return "chip " + std::to_string(c) + " reaches chip " + std::to_string(n) + " (ring stride " +
               std::to_string(d) + ") in " + std::to_string(route.size()) +
               " links; every ring of the multi-ring needs a direct link (a fully connected group)";
    }
  return "";
}

}  // namespace shardsim::collectives::multi_ring

#include "collectives/multi_ring.h"

#include <algorithm>

namespace shardsim::collectives::multi_ring {

std::vector<ring::Cycle> cycles(int p) {
  if (p <= 3) return ring::stride_cycles(p == 3 ? std::vector<int>{1, -1} : std::vector<int>{1});
  // Circle ranks 0..q-1 (q = p - 1) and the hub p - 1 (multi_ring.h). Odd p: q even, q/2 cycles through every
  // link; even p: q odd, (q - 1)/2 cycles.
  const int q = p - 1, hub = p - 1, n = q / 2;
  std::vector<ring::Cycle> out;
  for (int k = 0; k < n; ++k) {
    std::vector<int> order;
    order.reserve(static_cast<size_t>(p));
    order.push_back(hub);
    for (int i = 0; i < q; ++i) {  // k, k+1, k-1, k+2, k-2, ...
      const int step = (i + 1) / 2, v = i % 2 ? k + step : k - step;
      order.push_back(((v % q) + q) % q);
    }
    std::vector<int> reverse(order.rbegin(), order.rend());
    out.push_back(ring::Cycle::from_order(std::move(order)));
    out.push_back(ring::Cycle::from_order(std::move(reverse)));
  }
  return out;
}

std::string obstacle(const runtime::Transport& tp) {
  const int p = tp.size();
  if (p == 1) return "";  // nothing moves
  const auto& topo = tp.topology();
  for (const auto& cycle : cycles(p))
    for (int r = 0; r < p; ++r) {
      const int n = cycle.at(r, 1, p);
      const int c = tp.chip_of(r), cn = tp.chip_of(n);
      if (topo.hop_count(c, cn) != 1)
        return "chip " + std::to_string(c) + " reaches chip " + std::to_string(cn) + " (ring neighbours, ranks " +
               std::to_string(r) + " -> " + std::to_string(n) + ") in " + std::to_string(topo.hop_count(c, cn)) +
               " links; every ring of the multi-ring needs a direct link (a fully connected group)";
    }
  return "";
}

}  // namespace shardsim::collectives::multi_ring

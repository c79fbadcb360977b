// Global flow patterns of exchange steps (transport.h, FlowPattern): the pairs each pattern expands to and their
// link sharing on a topology.
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "runtime/transport.h"

namespace shardsim::runtime {

namespace {
void expand_shift(int p, uint64_t arg, std::vector<std::pair<int, int>>& out) {
  const int d1 = static_cast<int16_t>(arg & 0xffff), d2 = static_cast<int16_t>((arg >> 16) & 0xffff);
  const int lanes = static_cast<int>(arg >> 32);
  for (int r = 0; r < p; ++r)
    for (int d : {d1, d2})
      if (d != 0)
        for (int l = 0; l < lanes; ++l) out.emplace_back(r, ((r + d) % p + p) % p);
}
void expand_all_pairs(int p, uint64_t, std::vector<std::pair<int, int>>& out) {
  for (int r = 0; r < p; ++r)
    for (int q = 0; q < p; ++q)
      if (q != r) out.emplace_back(r, q);
}
void expand_hd(int p, uint64_t arg, std::vector<std::pair<int, int>>& out) {
  const int dist = static_cast<int>(arg & 0xffffffff);
  const bool reverse = (arg >> 32) != 0;
  int pow2 = 1;
  while (pow2 * 2 <= p) pow2 *= 2;
  const int rem = p - pow2;
  if (dist == 0) {
    for (int i = 0; i < rem; ++i) out.emplace_back(reverse ? 2 * i + 1 : 2 * i, reverse ? 2 * i : 2 * i + 1);
    return;
  }
  auto real = [rem](int v) { return v < rem ? 2 * v + 1 : v + rem; };
  for (int v = 0; v < pow2; ++v)
    if ((v ^ dist) < pow2) out.emplace_back(real(v), real(v ^ dist));
}
void expand_binomial(int p, uint64_t arg, std::vector<std::pair<int, int>>& out) {
  const int mask = static_cast<int>(arg & 0xffffff), root = static_cast<int>((arg >> 24) & 0xffffff);
  const bool up = (arg >> 48) != 0;
  if (mask <= 0) return;
  for (int v = 0; v + mask < p; v += 2 * mask) {
    const int parent = (v + root) % p, child = (v + mask + root) % p;
    out.emplace_back(up ? child : parent, up ? parent : child);
  }
}
}  // namespace

FlowPattern FlowPattern::shift(int d1, int d2, int lanes) {
  const uint64_t arg = static_cast<uint64_t>(static_cast<uint16_t>(d1)) |
                       static_cast<uint64_t>(static_cast<uint16_t>(d2)) << 16 |
                       static_cast<uint64_t>(static_cast<uint32_t>(lanes)) << 32;
  return {arg * 4 + 1, &expand_shift, arg};
}
FlowPattern FlowPattern::all_pairs() { return {2, &expand_all_pairs, 0}; }
FlowPattern FlowPattern::halving_doubling(int dist, bool reverse) {
  const uint64_t arg = static_cast<uint64_t>(static_cast<uint32_t>(dist)) | (reverse ? uint64_t{1} << 32 : 0);
  return {arg * 4 + 3, &expand_hd, arg};
}
FlowPattern FlowPattern::binomial(int mask, int root, bool up) {
  const uint64_t arg = (static_cast<uint64_t>(mask) & 0xffffff) | (static_cast<uint64_t>(root) & 0xffffff) << 24 |
                       (up ? uint64_t{1} << 48 : 0);
  return {arg * 16 + 4, &expand_binomial, arg};
}
std::vector<std::pair<int, int>> FlowPattern::pairs(int p) const {
  std::vector<std::pair<int, int>> out;
  if (expand) expand(p, arg, out);
  return out;
}

std::shared_ptr<const sim::StepShare> FlowPattern::share_on(const topology::Topology& topo,
                                                            const std::vector<int>& rank_to_chip) const {
  auto flows = pairs(static_cast<int>(rank_to_chip.size()));
  for (auto& [a, b] : flows) {
    a = rank_to_chip[static_cast<size_t>(a)];
    b = rank_to_chip[static_cast<size_t>(b)];
  }
  auto share = std::make_shared<const sim::StepShare>(sim::StepShare::make(topo, flows));
  return share->any_shared ? share : nullptr;
}

}  // namespace shardsim::runtime

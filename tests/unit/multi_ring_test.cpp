// multi_ring::cycles (Walecki's decomposition, collectives/multi_ring.h): every directed ring visits every rank once,
// the undirected cycles share no link, and they use p - 1 links per rank for odd p and p - 2 for even p.
#include <gtest/gtest.h>

#include <set>
#include <utility>

#include "collectives/multi_ring.h"
#include "collectives/rail_ring.h"

using shardsim::collectives::multi_ring::cycles;

TEST(MultiRing, WaleckiCyclesAreHamiltonianAndEdgeDisjoint) {
  for (int p = 1; p <= 65; ++p) {
    const auto rings = cycles(p);
    std::set<std::pair<int, int>> edges;  // undirected, over the forward cycles
    std::set<std::pair<int, int>> directed;
    for (size_t i = 0; i < rings.size(); ++i) {
      std::set<int> seen;
      int r = 0;
      for (int s = 0; s < p; ++s) {
        seen.insert(r);
        const int n = rings[i].at(r, 1, p);
        ASSERT_EQ(rings[i].at(n, -1, p), r) << "p " << p << " ring " << i << ": at(+1) and at(-1) disagree";
        if (p > 1 && n != r) EXPECT_TRUE(directed.insert({r, n}).second) << "p " << p << ": directed link used twice";
        if (p > 2 && (p > 3 || i == 0)) edges.insert({std::min(r, n), std::max(r, n)});
        r = n;
      }
      EXPECT_EQ(r, 0) << "p " << p << " ring " << i << " does not close after p steps";
      EXPECT_EQ(static_cast<int>(seen.size()), p) << "p " << p << " ring " << i << " is not Hamiltonian";
    }
    if (p < 4) continue;
    const int want_cycles = (p - 1) / 2;  // odd p: (p-1)/2; even p: p/2 - 1
    EXPECT_EQ(static_cast<int>(rings.size()), 2 * want_cycles) << "p " << p;
    // Each undirected cycle has p links and no two cycles share one: p * cycles distinct links.
    EXPECT_EQ(static_cast<int>(edges.size()), p * want_cycles) << "p " << p;
    EXPECT_EQ(2 * want_cycles, p % 2 ? p - 1 : p - 2) << "links per rank";
  }
}

// A folded run's check (collectives/algorithms.cpp, fold_symmetric): the replica shift must map every directed ring
// onto itself. rail_ring's rings go up even nodes and down odd ones, so on 4 nodes of 4 chips a shift by one node
// maps them onto their reverses and a shift by two onto themselves; stride rings survive any rotation.
TEST(MultiRing, ShiftMapsRingsOntoThemselvesOnlyWhereTheyAreSymmetric) {
  using namespace shardsim;
  using topology::Dim;
  using topology::DimKind;
  using topology::LinkSpec;
  const auto topo = topology::Topology::stacked(
      {Dim{DimKind::switch_, 4, LinkSpec{50, 5000}, true}, Dim{DimKind::switch_, 4, LinkSpec{450, 1000}, true}});
  std::vector<int> chips(16);
  for (int r = 0; r < 16; ++r) chips[static_cast<size_t>(r)] = r;
  ASSERT_EQ(collectives::rail_ring::obstacle(topo, chips), "");
  const auto rails = collectives::rail_ring::cycles(topo, chips);
  ASSERT_EQ(rails.size(), 4u);
  const auto rotate = [](int by) {
    std::vector<int> image(16);
    for (int r = 0; r < 16; ++r) image[static_cast<size_t>(r)] = (r + by) % 16;
    return image;
  };
  EXPECT_FALSE(collectives::ring::maps_onto_itself(rails, rotate(4))) << "one node: each ring onto its reverse";
  EXPECT_TRUE(collectives::ring::maps_onto_itself(rails, rotate(8))) << "two nodes: each ring onto itself";
  EXPECT_TRUE(collectives::ring::maps_onto_itself(rails, rotate(0)));
  const auto both_ways = collectives::ring::stride_cycles({1, -1});
  EXPECT_TRUE(collectives::ring::maps_onto_itself(both_ways, rotate(3))) << "stride rings: any rotation";
  std::vector<int> swap = rotate(0);
  std::swap(swap[0], swap[1]);
  EXPECT_FALSE(collectives::ring::maps_onto_itself(both_ways, swap));
}

// Folded cost-model replays (collectives/cost/cost_model.cpp, ring_estimate): where a rank shift keeps the group's
// network and rings (topology/symmetry.h), replaying one period of ranks gives exactly the estimate of replaying
// every rank. Checked against the full replay, bit for bit, on a switch, a one-way ring, a torus, DGX-shaped
// stacked switches (rails) with the rail_ring channels, a switch of part of the chips, and pipelined pieces; and
// the symmetry rule itself on maps that must be refused (a line moved, a ring not translated, two maps per
// dimension).
#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <vector>

#include "collectives/cost/cost_model.h"
#include "collectives/rail_ring.h"
#include "collectives/ring.h"
#include "topology/symmetry.h"
#include "topology/topology.h"

using namespace shardsim;
using topology::Dim;
using topology::DimKind;
using topology::Topology;

namespace {

Dim dim(DimKind k, int n, double gbps, double ns, bool bidir = true) { return Dim{k, n, {gbps, ns}, bidir, {}}; }

std::vector<int> iota(int n, int from = 0, int step = 1) {
  std::vector<int> v(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) v[static_cast<size_t>(i)] = from + i * step;
  return v;
}

void expect_same(const Topology& topo, const std::vector<int>& chips, const std::vector<collectives::ring::Cycle>& cycles,
                 const std::string& what) {
  for (const size_t chunk_bytes : {size_t{0}, size_t{1} << 16})
    for (const int passes : {1, 2}) {
      const double chunk = 3.0e5;
      collectives::cost::set_replay_folding(false);
      const double full = collectives::cost::ring_cycles_on(topo, chips, chunk, passes, cycles, chunk_bytes);
      collectives::cost::set_replay_folding(true);
      const double folded = collectives::cost::ring_cycles_on(topo, chips, chunk, passes, cycles, chunk_bytes);
      EXPECT_GT(full, 0) << what;
      EXPECT_EQ(folded, full) << what << ", chunk_bytes " << chunk_bytes << ", passes " << passes;
    }
}

const std::vector<collectives::ring::Cycle> kOneWay = collectives::ring::stride_cycles({1});
const std::vector<collectives::ring::Cycle> kBidir = collectives::ring::stride_cycles({1, -1});

}  // namespace

TEST(ReplayFold, EqualsTheFullReplay) {
  const Topology sw = Topology::stacked({dim(DimKind::switch_, 24, 450, 1000)});
  expect_same(sw, iota(24), kOneWay, "switch 24, one-way ring");
  expect_same(sw, iota(12, 0, 2), kOneWay, "every second chip of a switch");
  const Topology ring = Topology::stacked({dim(DimKind::ring, 12, 100, 500)});
  expect_same(ring, iota(12), kBidir, "ring 12, bidirectional");
  const Topology oneway = Topology::stacked({dim(DimKind::ring, 10, 100, 500, false)});
  expect_same(oneway, iota(10), kOneWay, "one-way ring 10");
  const Topology torus = Topology::stacked({dim(DimKind::ring, 4, 100, 500), dim(DimKind::ring, 4, 100, 500)});
  expect_same(torus, iota(16), kBidir, "torus 4x4 in row order");
  const Topology rails = Topology::stacked({dim(DimKind::switch_, 6, 50, 5000), dim(DimKind::switch_, 4, 450, 1000)});
  expect_same(rails, iota(24), kOneWay, "6 nodes of 4 on rails, one-way ring");
  expect_same(rails, iota(24), collectives::rail_ring::cycles(rails, iota(24)),
              "6 nodes of 4 on rails, the rail_ring channels");
  expect_same(rails, iota(6, 1, 4), kOneWay, "one chip per node (a dp group across the rails)");
  const Topology line = Topology::stacked({dim(DimKind::line, 6, 100, 500)});
  expect_same(line, iota(6), kOneWay, "a line (no shift: every rank replayed)");
}

TEST(ReplayFold, SymmetryRule) {
  const Topology torus = Topology::stacked({dim(DimKind::ring, 4, 100, 500), dim(DimKind::line, 3, 100, 500)});
  // chip = x0 * 3 + x1 (the last dimension fastest)
  auto chip = [](int x0, int x1) { return x0 * 3 + x1; };
  EXPECT_EQ(topology::chip_map_obstacle(torus, std::vector<int>{chip(0, 0), chip(1, 2)},
                                        std::vector<int>{chip(1, 0), chip(2, 2)}, "s"), "");
  EXPECT_NE(topology::chip_map_obstacle(torus, std::vector<int>{chip(0, 0)}, std::vector<int>{chip(0, 1)}, "s")
                .find("moves along line dimension 1"), std::string::npos);
  EXPECT_NE(topology::chip_map_obstacle(torus, std::vector<int>{chip(0, 0), chip(1, 0)},
                                        std::vector<int>{chip(1, 0), chip(3, 0)}, "s")
                .find("not a translation of ring dimension 0"), std::string::npos);
  EXPECT_NE(topology::chip_map_obstacle(torus, std::vector<int>{chip(0, 0), chip(0, 1)},
                                        std::vector<int>{chip(1, 0), chip(2, 1)}, "s")
                .find("not one map per dimension"), std::string::npos);
}

// The fixture the collective MPI tests share: a Topology, this rank's Timeline and a Transport over
// MPI_COMM_WORLD; plus option and closed-form helpers.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "collectives/collectives.h"
#include "mpi/mpi_util.h"

// One chip per rank on TOPO; rank r sits on CHIPS[r] (default: chip r).
struct Fixture {
  shardsim::topology::Topology topo;
  shardsim::sim::Timeline tl;
  shardsim::runtime::Transport tp;
  explicit Fixture(shardsim::topology::Topology t, std::vector<int> chips = identity_chips(world_size()))
      : topo(std::move(t)),
        tl(chips.at(static_cast<size_t>(world_rank())), topo, shardsim::sim::device_preset("generic")),
        tp(MPI_COMM_WORLD, tl, std::move(chips)) {}
  Fixture(const Fixture&) = delete;
  Fixture& operator=(const Fixture&) = delete;
};

inline shardsim::collectives::CollectiveOptions opts(const std::string& algorithm, size_t chunk_bytes = 0,
                                                     int root = 0) {
  shardsim::collectives::CollectiveOptions o;
  o.algorithm = algorithm;
  o.chunk_bytes = chunk_bytes;
  o.root = root;
  return o;
}

// Closed forms: within 1% (relative).
inline void expect_time(double got, double want, const std::string& what) {
  EXPECT_NEAR(got, want, 0.01 * std::fabs(want) + 1e-6)
      << what << ": simulated " << got << " ns, expected " << want << " ns";
}

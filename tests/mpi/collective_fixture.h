// The fixture the collective MPI tests share: a Topology, this rank's Timeline and a Transport over
// MPI_COMM_WORLD; plus option and closed-form helpers.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "collectives/collectives.h"
#include "common/error.h"
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

// Runs FN, which must throw UsageError (exit code 2) whose message contains every string in NEEDLES.
inline void expect_usage_error(const std::function<void()>& fn, const std::vector<std::string>& needles,
                               const std::string& what) {
  try {
    fn();
    ADD_FAILURE() << what << ": no UsageError";
  } catch (const shardsim::UsageError& e) {
    const std::string msg = e.what();
    EXPECT_EQ(e.exit_code(), shardsim::kExitBadInput) << what;
    for (const auto& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << what << ": '" << n << "' not in: " << msg;
  } catch (const std::exception& e) {
    ADD_FAILURE() << what << ": threw something else: " << e.what();
  }
}

// Every rank checks the communicator still carries exactly the messages it should.
inline void expect_clean_communicator(shardsim::runtime::Transport& tp) {
  const int p = tp.size();
  std::vector<int32_t> buf(10, tp.rank() + 1);
  shardsim::collectives::all_reduce(tp, buf.data(), buf.data(), buf.size(), shardsim::runtime::DType::int32,
                                    shardsim::collectives::ReduceOp::sum, 0.0, opts("ring"));
  EXPECT_EQ(buf[9], p * (p + 1) / 2) << "communicator disturbed by a failed call";
}

// What tests/mpi/lm_tp_dp_test.cpp (the trainer on dp-only meshes: data parallelism, ZeRO, checkpoints,
// recomputation) and lm_tp_test.cpp (tp, sp, cp, Ulysses, fused) share: the small test model, the trainer on a
// dp-only mesh and the weight comparisons.
#pragma once

#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>
#include <cmath>
#include <cstdio>
#include <memory>
#include "common/error.h"
#include "models/lm_checkpoint.h"
#include "models/lm_data.h"
#include "models/lm_tp.h"
#include "models/lm_train.h"
#include "mpi_util.h"
#include "sim/cost.h"
#include "sim/kernel_model.h"
#include "tests/unit/small_lm.h"

using namespace shardsim;
using models::LmCache;
using sharding::ModelSpec;
using models::LmTrainConfig;

namespace lm_tp_test {

inline bool dp_size_tested() {
  const int p = world_size();
  return p == 1 || p == 2 || p == 4;
}

inline ModelSpec small_config() {
  ModelSpec c = test::small_lm();  // vocab 32, hidden 16, 2 layers, 4/2 heads of 4, ffn 32, seq 8
  c.batch = 4;
  return c;
}

inline models::LmTrainConfig train_config() {
  models::LmTrainConfig t;
  t.steps = 5;
  return t;
}

struct DpRun {
  std::vector<double> losses;
  models::LmWeights weights;
  models::LmDpMemory memory;
  std::vector<models::LmDpStepResult> results;
};

// The trainer on a dp-only mesh over COMM's ranks (tp = cp = 1): data parallelism alone, on a ring of LINK_GBPS.
struct DpTrainer {
  topology::Topology topo;
  sim::Timeline tl;
  runtime::Transport world;
  sharding::DeviceMesh mesh;
  std::unique_ptr<models::LmTpTrainer> tr;
  DpTrainer(MPI_Comm comm, int p, int rank, const ModelSpec& c, const LmTrainConfig& t, models::LmDpConfig dp,
            double link_gbps = 100)
      : topo(topology::Topology::ring(p, topology::LinkSpec{link_gbps, 1000})),
        tl(rank, topo, sim::device_preset("trainium1")),
        world(comm, tl, identity_chips(p)),
        mesh({{"dp", p}}, topo) {
    mesh.bind(world);
    tr = std::make_unique<models::LmTpTrainer>(c, t, mesh, world, tl, dp);
  }
};

inline DpRun run_dp(const ModelSpec& c, int zero, int64_t bucket_bytes, int steps, double link_gbps = 100,
            bool recompute = false) {
  DpTrainer d(MPI_COMM_WORLD, world_size(), world_rank(), c, train_config(), {zero, bucket_bytes, "auto", recompute},
              link_gbps);
  models::LmTpTrainer& tr = *d.tr;
  DpRun run;
  for (int i = 0; i < steps; ++i) {
    run.results.push_back(tr.step());
    run.losses.push_back(run.results.back().loss);
  }
  run.weights = tr.gather_master();
  run.memory = tr.memory();
  return run;
}

inline double max_abs_diff(const models::LmWeights& a, const models::LmWeights& b) {
  const auto na = a.named_weights(), nb = b.named_weights();
  double e = 0;
  for (size_t k = 0; k < na.size(); ++k)
    for (int64_t i = 0; i < na[k].second->numel(); ++i)
      e = std::max(e, std::fabs(double(na[k].second->get(i)) - nb[k].second->get(i)));
  return e;
}

inline bool bit_equal(const models::LmWeights& a, const models::LmWeights& b) {
  const auto na = a.named_weights(), nb = b.named_weights();
  for (size_t k = 0; k < na.size(); ++k)
    if (!na[k].second->bit_equal(*nb[k].second)) return false;
  return true;
}

// A path in /tmp for NAME, the same on every rank (rank 0's pid).
inline std::string resume_temp_path(const char* name) {
  int pid = static_cast<int>(getpid());  // same path on every rank: rank 0's pid
  MPI_Bcast(&pid, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return "/tmp/shardsim_test_" + std::to_string(pid) + "_" + name + ".h5";
}

}  // namespace lm_tp_test

using namespace lm_tp_test;

// Parameters for the per-collective MPI tests, taken from the algorithm registry (gloo's test/allreduce_test.cc
// style: TEST_P over (algorithm, count, dtype, op)), so a newly registered algorithm is tested by every
// collective it implements without editing a test.
//
// Each collective's file instantiates two suites from here:
//   <Collective>Matrix/DTypeOp : every algorithm of the registry x every dtype x every op (reductions;
//                                 data movement: op "sum" only) at one count not divisible by typical rank counts,
//                                 with special values (NaN, +-Inf, -0, subnormals, the largest finite value) where
//                                 they apply, in place and out of place alternating over dtype x op.
//   <Collective>Matrix/Count   : every algorithm (+ auto) x counts 0..9 and a large one, fp32 sum, in and out of
//                                 place, unpipelined and (large count) pipelined in small pieces.
// Every case runs through verification::run_case (verification/verify.h: inputs every rank can rebuild, and a
// bit-exact check against the single-device reference; any NaN matches any NaN) on a bidirectional ring of the
// world's size, where every registered algorithm but those needing two grid dimensions can run; those run on a
// 2-D torus of the world's size when it has one, and those needing in-network reduction on a reducing switch of
// the world's size, and those needing direct links between all chips on a fully connected one (an algorithm that can run on none is skipped on every rank alike, with the registry's reason). Rooted collectives run at root 0 and at the last rank.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include "collectives/collectives.h"
#include "collectives/registry.h"
#include "verification/verify.h"
#include "mpi/collective_fixture.h"
#include "mpi/mpi_util.h"

struct CollectiveParam {
  shardsim::collectives::Collective collective;
  std::string algorithm;  // canonical name from the registry, or "auto"
  size_t count = 0;
  shardsim::runtime::DType dtype = shardsim::runtime::DType::fp32;
  shardsim::collectives::ReduceOp op = shardsim::collectives::ReduceOp::sum;
  bool all_forms = false;  // the Count suite: in and out of place, pipelined too
};

// gtest prints a failing parameter with this (instead of its bytes).
inline void PrintTo(const CollectiveParam& p, std::ostream* os) {
  *os << shardsim::collectives::collective_name(p.collective) << ' ' << p.algorithm << ' '
      << shardsim::runtime::dtype_name(p.dtype) << ' ' << shardsim::collectives::reduce_op_name(p.op) << " count "
      << p.count << (p.all_forms ? " (all forms)" : "");
}

inline std::vector<std::string> registry_algorithms_and_auto(shardsim::collectives::Collective c) {
  auto v = shardsim::collectives::algorithm_names(c);
  if (v.size() > 1) v.push_back("auto");
  return v;
}

// Every algorithm x dtype x op (op: sum only for data movement) at COUNT.
inline std::vector<CollectiveParam> dtype_op_params(shardsim::collectives::Collective c, size_t count = 1031) {
  using namespace shardsim;
  std::vector<CollectiveParam> out;
  const std::vector<collectives::ReduceOp> ops =
      collectives::is_reduction(c) ? collectives::all_reduce_ops()
                                   : std::vector<collectives::ReduceOp>{collectives::ReduceOp::sum};
  for (const auto& a : collectives::algorithm_names(c))  // auto runs one of them: the Count suite covers it
    for (auto t : runtime::all_dtypes())
      for (auto op : ops) out.push_back({c, a, count, t, op, false});
  return out;
}

// Every algorithm x COUNTS, fp32 sum, all forms.
inline std::vector<CollectiveParam> count_params(shardsim::collectives::Collective c,
                                                 const std::vector<size_t>& counts = {0, 1, 2, 3, 7, 9, 4099}) {
  std::vector<CollectiveParam> out;
  for (const auto& a : registry_algorithms_and_auto(c))
    for (size_t n : counts) out.push_back({c, a, n, shardsim::runtime::DType::fp32,
                                           shardsim::collectives::ReduceOp::sum, true});
  return out;
}

inline std::string param_name(const ::testing::TestParamInfo<CollectiveParam>& info) {
  using namespace shardsim;
  const auto& p = info.param;
  std::string s = p.algorithm;
  s += '_';
  s += runtime::dtype_name(p.dtype);
  if (collectives::is_reduction(p.collective)) {
    s += '_';
    s += collectives::reduce_op_name(p.op);
  }
  s += "_n";
  s += std::to_string(p.count);
  return s;
}

inline bool has_in_place(shardsim::collectives::Collective c) {
  using C = shardsim::collectives::Collective;
  return c != C::all_to_allv && c != C::send_recv && c != C::barrier;
}

inline bool is_float(shardsim::runtime::DType t) {
  using T = shardsim::runtime::DType;
  return t == T::fp16 || t == T::bf16 || t == T::fp32 || t == T::fp64 || t == T::fp8_e4m3 || t == T::fp8_e5m2;
}

class CollectiveTest : public ::testing::TestWithParam<CollectiveParam> {
 protected:
  // Runs the parameter's cases on a bidirectional ring of the world's size and checks each against the reference.
  void run_matrix() {
    using namespace shardsim;
    const CollectiveParam& p = GetParam();
    // One fixture for every case of the binary (run_case starts each case from a fresh clock); never destroyed,
    // because its communicator must not be freed after MPI_Finalize.
    static Fixture* shared = new Fixture(topology::Topology::ring(world_size(), topology::LinkSpec{100, 500}));
    // Algorithms that need two or more grid dimensions (torus_concurrent) run on an a x b torus of the world's
    // size (p = 4: 2x2, p = 8: 2x4) when it has one.
    static Fixture* grid = [] {
      for (int a = 2; a * a <= world_size(); ++a)
        if (world_size() % a == 0)
          return new Fixture(topology::Topology::torus({a, world_size() / a}, {topology::LinkSpec{100, 500}}));
      return static_cast<Fixture*>(nullptr);
    }();
    // Algorithms that need a switch that reduces in the network (in_switch) run on one of the world's size.
    static Fixture* reducing = [] {
      topology::Dim d{topology::DimKind::switch_, world_size(), topology::LinkSpec{100, 500}, true, {}};
      d.reduction = {true, topology::LinkSpec{80, 300}};
      return new Fixture(topology::Topology::stacked({d}));
    }();
    // Algorithms that need a direct link between ring neighbours of every stride (multi_ring) run on a fully
    // connected topology of the world's size.
    static Fixture* connected = new Fixture(topology::Topology::fully_connected(world_size(), topology::LinkSpec{100, 500}));
    Fixture* chosen = shared;
    if (p.algorithm != "auto") {
      if (const std::string why = collectives::obstacle(p.collective, p.algorithm, shared->tp); !why.empty()) {
        if (grid && collectives::obstacle(p.collective, p.algorithm, grid->tp).empty()) chosen = grid;
        else if (collectives::obstacle(p.collective, p.algorithm, reducing->tp).empty()) chosen = reducing;
        else if (collectives::obstacle(p.collective, p.algorithm, connected->tp).empty()) chosen = connected;
        else GTEST_SKIP() << p.algorithm << " cannot run here: " << why;  // depends on the world size only
      }
    }
    Fixture& f = *chosen;
    std::vector<verification::Case> cases;
    verification::Case base;
    base.collective = p.collective;
    base.algorithm = p.algorithm;
    base.count = p.count;
    base.dtype = p.dtype;
    base.op = p.op;
    const bool rooted = collectives::is_rooted(p.collective);
    for (int root : {0, world_size() - 1}) {
      if (!rooted && root != 0) continue;
      base.root = root;
      if (p.all_forms) {
        for (bool in_place : {false, true}) {
          if (in_place && !has_in_place(p.collective)) continue;
          for (size_t chunk : {size_t(0), size_t(64)}) {
            if (chunk && p.count < 1000) continue;
            verification::Case c = base;
            c.in_place = in_place;
            c.chunk_bytes = chunk;
            cases.push_back(c);
          }
        }
      } else {
        // One case: special values (every element i % 8 != 0 of the input; verifiable ones in between) where they
        // apply, in place and out of place alternating over dtype x op, so both forms meet every dtype and op.
        verification::Case c = base;
        c.special_input = is_float(p.dtype) || collectives::is_reduction(p.collective);
        c.in_place = has_in_place(p.collective) && (static_cast<int>(p.dtype) + static_cast<int>(p.op)) % 2 == 1;
        cases.push_back(c);
      }
    }
    for (const auto& c : cases) {
      std::ostringstream what;
      what << collectives::collective_name(c.collective) << ' ' << c.algorithm << ' ' << runtime::dtype_name(c.dtype)
           << ' ' << collectives::reduce_op_name(c.op) << " count " << c.count << " root " << c.root
           << (c.in_place ? " in-place" : "") << (c.special_input ? " special" : "") << " chunk " << c.chunk_bytes;
      const verification::Outcome o = verification::run_case(f.tp, c);
      EXPECT_EQ(o.wrong, 0u) << what.str() << ": " << o.first_wrong;
      const auto& names = collectives::algorithm_names(c.collective);
      if (c.algorithm == "auto") {
        EXPECT_NE(std::find(names.begin(), names.end(), o.algorithm), names.end()) << what.str() << " ran " << o.algorithm;
      } else {
        EXPECT_EQ(o.algorithm, c.algorithm) << what.str();
      }
      EXPECT_GE(o.sim_time_ns, 0.0) << what.str();
    }
  }
};

// Instantiates SUITE (a CollectiveTest subclass with TEST_P(SUITE, MatchesReference) { run_matrix(); }) for C.
#define SHARDSIM_REGISTRY_SUITES(SUITE, C)                                                                   \
  INSTANTIATE_TEST_SUITE_P(DTypeOp, SUITE, ::testing::ValuesIn(dtype_op_params(C)), param_name);           \
  INSTANTIATE_TEST_SUITE_P(Count, SUITE, ::testing::ValuesIn(count_params(C)), param_name)

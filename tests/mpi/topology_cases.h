// What tests/mpi/topologies_test.cpp (the closed forms) and topologies_estimates_test.cpp (auto's estimates, the
// crossing links, results, determinism, the per-call overhead) share: the message size, the link settings, the stacked
// topologies with their per-dimension closed forms and the topologies every algorithm runs on.
#pragma once

#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "collectives/collectives.h"
#include "collectives/registry.h"
#include "common/error.h"
#include "mpi/collective_fixture.h"
#include "mpi/mpi_util.h"


using namespace shardsim;
using collectives::Collective;
using collectives::CollectiveOptions;
using collectives::ReduceOp;
using runtime::DType;
using topology::Dim;
using topology::DimKind;
using topology::LinkSpec;
using topology::Topology;

namespace topologies_test {

// Estimates are documented as equal to the simulated time: 1e-9 relative.
inline void expect_same_time(double estimate, double simulated, const std::string& what) {
  EXPECT_NEAR(estimate, simulated, 1e-9 * std::max(1.0, std::fabs(simulated)))
      << what << ": estimate_ns " << estimate << " ns, simulated " << simulated << " ns";
}

inline std::vector<int> reversed_chips(int p) {
  std::vector<int> v(static_cast<size_t>(p));
  for (int r = 0; r < p; ++r) v[static_cast<size_t>(r)] = p - 1 - r;
  return v;
}

// 262080 fp32 elements (~1 MiB): divisible by 2 lcm(1..8) = 1680 and by 64, so every ring chunk, every half of a
// bidirectional chunk and every per-dimension block has the same size at p = 1..8.
inline constexpr size_t kCount = 262080;
inline constexpr double kS = kCount * 4.0;

// Two link settings: a latency-visible one (B = 50 GB/s, alpha = 700 ns: alpha is ~15% of S/(8B)) and a
// bandwidth-light one with a small latency.
inline const LinkSpec kSpecs[] = {LinkSpec{50, 700}, LinkSpec{400, 150}};

inline std::string spec_name(const LinkSpec& l) {
  char b[64];
  std::snprintf(b, sizeof b, "B=%g GB/s a=%g ns", l.bandwidth_gbps, l.latency_ns);
  return b;
}

inline size_t count_mismatches(const std::vector<float>& got, const std::vector<float>& want) {
  size_t bad = got.size() == want.size() ? 0 : 1;
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) bad += std::memcmp(&got[i], &want[i], 4) != 0;
  return bad;
}

// ---- the stacked topologies tested at p = 4 and p = 8, with their per-dimension closed forms ----

struct StackCase {
  std::string name;
  std::vector<Dim> dims;
};

inline Dim dim(DimKind kind, int size, LinkSpec link) { return Dim{kind, size, link, true}; }

// Per-dimension link specs differ from each other so a wrong dimension order shows.
inline std::vector<StackCase> stacked_cases(int p, int set) {
  const LinkSpec a = set == 0 ? LinkSpec{50, 700} : LinkSpec{400, 150};
  const LinkSpec b = set == 0 ? LinkSpec{200, 300} : LinkSpec{100, 1000};
  const LinkSpec c = set == 0 ? LinkSpec{25, 50} : LinkSpec{300, 400};
  if (p == 8)
    return {{"switch2 x ring4", {dim(DimKind::switch_, 2, a), dim(DimKind::ring, 4, b)}},
            {"ring2 x switch4", {dim(DimKind::ring, 2, a), dim(DimKind::switch_, 4, b)}},
            {"fully_connected4 x switch2", {dim(DimKind::fully_connected, 4, a), dim(DimKind::switch_, 2, b)}},
            {"switch2 x line2 x fully_connected2",
             {dim(DimKind::switch_, 2, a), dim(DimKind::line, 2, b), dim(DimKind::fully_connected, 2, c)}}};
  if (p == 4)
    return {{"switch2 x ring2", {dim(DimKind::switch_, 2, a), dim(DimKind::ring, 2, b)}},
            {"fully_connected2 x switch2", {dim(DimKind::fully_connected, 2, a), dim(DimKind::switch_, 2, b)}},
            {"switch2 x switch2", {dim(DimKind::switch_, 2, a), dim(DimKind::switch_, 2, b)}}};
  return {};
}

// The torus (per-dimension) reduce-scatter on a stack, over the dimensions in ORDER, S_0 = S, S_{i+1} = S_i / k_i:
//   switch dim:           (k-1)(2 alpha + S_i/(k B))      every ring step goes up and down (2 links, cut-through);
//                                                         one direction only, both neighbours are behind the uplink
//   ring / fully_conn.:   (k-1)(alpha + S_i/(w k B))      w = 2 when k > 2 (distinct links to both neighbours)
//   line (k = 2 only):    alpha + S_i/(2B)                (k > 2 has multi-hop wrap-arounds: see TopologiesMesh)
// all_reduce = 2x (the all-gather mirrors it, dimensions in reverse order).
inline double stacked_rs_closed_form_in_order(const std::vector<Dim>& dims, const std::vector<size_t>& order, double S) {
  double t = 0, s = S;
  for (size_t i : order) {
    const Dim& d = dims[i];
    const double k = d.size, B = d.link.bandwidth_gbps, a = d.link.latency_ns;
    if (d.size > 1) {
      switch (d.kind) {
        case DimKind::switch_: t += (k - 1) * (2 * a + s / (k * B)); break;
        case DimKind::ring:
        case DimKind::fully_connected: t += (k - 1) * (a + s / ((k > 2 ? 2 : 1) * k * B)); break;
        case DimKind::line:
          if (d.size != 2) throw std::logic_error("closed form only for lines of 2");
          t += a + s / (2 * B);
          break;
      }
    }
    s /= k;
  }
  return t;
}

// The ring bandwidth c = w B one chip gets along a dimension (torus.h): 2B for bidirectional rings and fully
// connected lines of more than 2 chips, else B (switch: the one uplink; line: one direction at a time).
inline double ring_bandwidth(const Dim& d) {
  const bool both = (d.kind == DimKind::ring && d.bidirectional) || d.kind == DimKind::fully_connected;
  return (both && d.size > 2 ? 2 : 1) * d.link.bandwidth_gbps;
}

// torus.h's order: ring bandwidth descending, ties innermost (last-listed) dimension first.
inline std::vector<size_t> torus_order(const std::vector<Dim>& dims) {
  std::vector<size_t> order;
  for (size_t d = dims.size(); d-- > 0;) order.push_back(d);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return ring_bandwidth(dims[a]) > ring_bandwidth(dims[b]); });
  return order;
}

inline double stacked_rs_closed_form(const std::vector<Dim>& dims, double S) {
  return stacked_rs_closed_form_in_order(dims, torus_order(dims), S);
}

// ---- the topologies every algorithm is run on ----

struct TopoCase {
  std::string name;
  Topology topo;
  std::vector<int> chips;  // rank -> chip
};

inline std::vector<TopoCase> topo_cases(const LinkSpec& l, int set) {
  const int p = world_size();
  std::vector<TopoCase> v;
  v.push_back({"switch", Topology::switched(p, l), identity_chips(p)});
  v.push_back({"fully_connected", Topology::fully_connected(p, l), identity_chips(p)});
  v.push_back({"mesh line", Topology::mesh({p}, {l}), identity_chips(p)});
  for (const auto& sc : stacked_cases(p, set)) v.push_back({"stacked " + sc.name, Topology::stacked(sc.dims), identity_chips(p)});
  return v;
}

}  // namespace topologies_test

using namespace topologies_test;

// The collective-algorithm registry (collectives/registry.h): its invariants, and that the catalogue, the name
// checks and the estimates derive from it for every registered algorithm.
#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <string>

#include "collectives/registry.h"
#include "mpi/collective_fixture.h"
#include "mpi/mpi_util.h"

using namespace shardsim;
using collectives::Collective;

TEST(Registry, NamesAndAliasesAreUniqueAndEveryCollectiveHasAnAlgorithm) {
  std::set<std::string> seen;
  for (const auto& a : collectives::registered_algorithms()) {
    EXPECT_TRUE(seen.insert(a.name).second) << "duplicate name " << a.name;
    for (const auto& al : a.aliases) EXPECT_TRUE(seen.insert(al).second) << "alias " << al << " of " << a.name;
    EXPECT_NE(a.name, "auto");
    EXPECT_FALSE(a.summary.empty()) << a.name;
    EXPECT_FALSE(a.collectives.empty()) << a.name;
    EXPECT_NE(a.estimate_ns, nullptr) << a.name;
    for (Collective c : a.collectives) {
      // The run hooks the collective's file calls must be there.
      if (c == Collective::all_reduce) {
        EXPECT_NE(a.all_reduce, nullptr) << a.name;
      }
      if (c == Collective::reduce_scatter) {
        EXPECT_NE(a.reduce_scatter, nullptr) << a.name;
      }
      if (c == Collective::all_gather || c == Collective::all_gatherv) {
        EXPECT_NE(a.all_gather, nullptr) << a.name;
      }
      if (c == Collective::broadcast) {
        EXPECT_NE(a.broadcast, nullptr) << a.name;
      }
      if (c == Collective::reduce) {
        EXPECT_NE(a.reduce, nullptr) << a.name;
      }
    }
  }
  for (Collective c : collectives::all_collectives()) EXPECT_FALSE(collectives::algorithm_names(c).empty());
}

TEST(Registry, NamesResolveAndErrorsListTheRegisteredAlgorithms) {
  for (const auto& a : collectives::registered_algorithms())
    for (Collective c : collectives::all_collectives()) {
      const bool implements = a.implements(c);
      EXPECT_EQ(collectives::canonical_algorithm(c, a.name), implements ? a.name : "");
      for (const auto& al : a.aliases) EXPECT_EQ(collectives::canonical_algorithm(c, al), implements ? a.name : "");
      const std::string err = collectives::algorithm_name_error(c, a.name);
      if (implements) {
        EXPECT_EQ(err, "");
      } else {  // names what it is for and what C takes
        EXPECT_NE(err.find("not applicable to " + collectives::collective_name(c)), std::string::npos) << err;
        for (const auto& n : collectives::algorithm_names(c)) EXPECT_NE(err.find(n), std::string::npos) << err;
      }
    }
  const std::string err = collectives::algorithm_name_error(Collective::all_gather, "warp");
  EXPECT_NE(err.find("unknown algorithm 'warp' (known: "), std::string::npos) << err;
  for (const auto& n : collectives::algorithm_names(Collective::all_gather))
    EXPECT_NE(err.find(n), std::string::npos) << err;
  EXPECT_EQ(collectives::algorithm_name_error(Collective::all_gather, "auto"), "");
  expect_usage_error([] { collectives::algorithm_of(Collective::broadcast, "halving_doubling"); },
                     {"broadcast: ", "not applicable to broadcast", "binomial_tree, ring, auto"}, "algorithm_of");
}

TEST(Registry, CatalogueAndEstimatesCoverEveryAlgorithm) {
  Fixture f(topology::Topology::ring(world_size(), topology::LinkSpec{100, 500}));
  const std::string text = collectives::catalogue_text(&f.tp, 1 << 20);
  for (const auto& a : collectives::registered_algorithms()) {
    EXPECT_NE(text.find(a.name), std::string::npos) << a.name;
    for (const auto& al : a.aliases) EXPECT_NE(text.find(al), std::string::npos) << al;
    for (Collective c : a.collectives) {
      if (!collectives::obstacle(c, a.name, f.tp).empty()) continue;
      const double t = collectives::estimate_ns(c, a.name, f.tp, 1 << 20);
      EXPECT_TRUE(std::isfinite(t) && t >= 0) << a.name << " " << collectives::collective_name(c) << ": " << t;
      if (world_size() > 1 && c != Collective::barrier) {
        EXPECT_GT(t, 0) << a.name;
      }
    }
  }
}

// DeviceMesh: rank order, default placement onto the topology, explicit dimension orders; placements as types;
// the workload config schema and run's overrides (sharding/engine_config.h).
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "common/error.h"
#include "sharding/device_mesh.h"
#include "sharding/engine_config.h"
#include "sharding/placement.h"

using namespace shardsim;
using sharding::DeviceMesh;
using topology::LinkSpec;
using topology::Topology;

TEST(DeviceMesh, TpInnermostRankOrder) {
  const auto ring = Topology::ring(8, LinkSpec{100, 1000});
  const DeviceMesh m({{"tp", 2}, {"cp", 4}}, ring);
  EXPECT_EQ(m.size(), 8);
  EXPECT_EQ(m.size("dp"), 1);
  for (int r = 0; r < 8; ++r) {
    EXPECT_EQ(m.coordinate("tp", r), r % 2);
    EXPECT_EQ(m.coordinate("cp", r), r / 2);
  }
  // One dimension: the mesh lies along it in rank order (tp pairs are neighbours on the ring).
  for (int r = 0; r < 8; ++r) EXPECT_EQ(m.placement()[size_t(r)], r);
  EXPECT_EQ(m.describe(), "tp=2 x cp=4");
  EXPECT_THROW(DeviceMesh({{"tp", 3}}, ring), std::invalid_argument);
  EXPECT_THROW(DeviceMesh({{"xp", 8}}, ring), std::invalid_argument);
}

TEST(DeviceMesh, OneAxisIsTheIdentityOnEveryGrid) {
  for (const auto& t : {Topology::ring(8, LinkSpec{100, 1000}), Topology::torus({2, 4}, {LinkSpec{100, 1000}}),
                        Topology::torus({2, 2, 2}, {LinkSpec{100, 1000}})}) {
    const DeviceMesh m({{"tp", 8}}, t);
    for (int r = 0; r < 8; ++r) EXPECT_EQ(m.placement()[size_t(r)], r);
  }
}

TEST(DeviceMesh, TorusAxesOnWholeDimensions) {
  // Equal links: tp=2 x cp=4 on a 2x4 torus puts tp on the size-2 dimension and cp on the size-4 ring, so the
  // chip at coordinates (t, c) is t*4 + c whatever the rank order.
  const auto torus = Topology::torus({2, 4}, {LinkSpec{100, 1000}});
  const DeviceMesh m({{"tp", 2}, {"cp", 4}}, torus);
  for (int r = 0; r < 8; ++r) {
    const int t = m.coordinate("tp", r), c = m.coordinate("cp", r);
    EXPECT_EQ(m.placement()[size_t(r)], t * 4 + c);
  }
  EXPECT_NE(m.mapping_text().find("tp -> dim 0 (2 chips, 100 GB/s links), cp -> dim 1 (4 chips"), std::string::npos)
      << m.mapping_text();
}

TEST(DeviceMesh, FastestDimensionFirstAndExplicitOrder) {
  // Dimension 1 (size 4) has the fast links: tp=4 goes there by default.
  const auto torus = Topology::torus({2, 4}, {LinkSpec{25, 1000}, LinkSpec{200, 1000}});
  const DeviceMesh fast({{"tp", 4}, {"cp", 2}}, torus);
  EXPECT_EQ(fast.dim_order(), (std::vector<int>{1, 0}));
  for (int r = 0; r < 8; ++r)
    EXPECT_EQ(torus.coords(fast.placement()[size_t(r)])[1], fast.coordinate("tp", r));
  // Explicitly the slow dimension first: tp spans dim 0 and half of dim 1.
  const DeviceMesh slow({{"tp", 4}, {"cp", 2}}, torus, {0, 1});
  EXPECT_EQ(slow.dim_order(), (std::vector<int>{0, 1}));
  EXPECT_NE(slow.placement(), fast.placement());
  EXPECT_NE(slow.mapping_text().find("tp -> dim 0 (2 chips, 25 GB/s links) x 2 of dim 1"), std::string::npos)
      << slow.mapping_text();
  EXPECT_THROW(DeviceMesh({{"tp", 8}}, torus, {0}), std::invalid_argument);  // must name both dimensions
  // Every placement is a permutation.
  for (const auto* m : {&fast, &slow}) {
    auto p = m->placement();
    std::sort(p.begin(), p.end());
    for (int r = 0; r < 8; ++r) EXPECT_EQ(p[size_t(r)], r);
  }
}

TEST(Placement, NamesAndLocalShapes) {
  using namespace sharding;
  EXPECT_EQ(to_string(Placement{Shard{1}}), "Shard(1)");
  EXPECT_EQ(to_string(Placement{Replicate{}}), "Replicate");
  EXPECT_EQ(to_string(Placement{Partial{}}), "Partial(sum)");
  EXPECT_EQ(parallel_style(Shard{1}), "column-parallel");
  EXPECT_EQ(parallel_style(Shard{0}), "row-parallel");
  EXPECT_EQ(parallel_style(Replicate{}), "replicated");
  const auto ring = Topology::ring(8, LinkSpec{100, 1000});
  const DeviceMesh m({{"tp", 2}, {"cp", 4}}, ring);
  const TensorSpec w{"w", {10, 7}, {{"tp", Shard{1}}, {"cp", Shard{0}}}};
  EXPECT_EQ(w.describe(m), "Shard(1) over tp=2, Shard(0) over cp=4");
  std::vector<int64_t> off;
  // rank 3: tp 1 (columns 4..6 of 7), cp 1 (rows 3..5 of 10: sizes 3, 3, 2, 2).
  EXPECT_EQ(w.local_shape(m, 3, &off), (std::vector<int64_t>{3, 3}));
  EXPECT_EQ(off, (std::vector<int64_t>{3, 4}));
  EXPECT_EQ((TensorSpec{"x", {4, 4}, {}}.describe(m)), "Replicate");
}

namespace {
// NAME in a directory of this process's own under the system's temporary directory (not the working
// directory: a test binary run from the repository root must leave nothing there); returns the path.
// Removed with everything in it when the test binary exits.
struct TempDir {
  std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("shardsim_unit_" + std::to_string(::getpid()));
  TempDir() { std::filesystem::create_directories(path); }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};
std::string write(const std::string& name, const std::string& text) {
  static const TempDir dir;
  const std::string path = (dir.path / name).string();
  std::ofstream(path) << text;
  return path;
}
const char* kBlock = R"(name: b
topology: {kind: ring, chips: 4, bandwidth_gbps: 50, latency_ns: 700}
model:
  kind: transformer_block
  hidden: 64
  heads: 4
  ffn: 96
  seq: 16
parallel:
  tp: 4
)";
}  // namespace

TEST(EngineConfig, ModelSectionDevicePresetAndOverrides) {
  const auto file = write("engine_cfg_test.yaml", kBlock);
  const ConfigNode plain = sharding::load_workload_config(file);
  EXPECT_TRUE(plain.has("workload"));
  EXPECT_FALSE(plain.has("model"));
  EXPECT_EQ(sharding::load_workload_device(plain).name, sharding::kDefaultDevice);

  sharding::ConfigOverrides o;
  o.torus = "2x2";
  o.device = "h100";
  o.plan = "tp=2,cp=2";
  o.set = {"model.seq=32", "parallel.mesh_dims=[1, 0]"};
  const ConfigNode n = sharding::load_workload_config(file, o);
  EXPECT_NE(n.file().find("with command-line overrides"), std::string::npos);
  const auto topo = sharding::load_workload_topology(n);
  EXPECT_EQ(topo.dims(), (std::vector<int>{2, 2}));
  EXPECT_DOUBLE_EQ(topo.dim_specs()[0].link.bandwidth_gbps, 50);  // the config's link figures carry over
  EXPECT_EQ(sharding::load_workload_device(n).name, sim::device_preset("h100").name);
  EXPECT_EQ(n.child("parallel").get_int("tp"), 2);
  EXPECT_EQ(n.child("parallel").get_int("cp"), 2);
  EXPECT_EQ(n.child("workload").get_int("seq"), 32);
  EXPECT_EQ(n.child("parallel").get_int_list("mesh_dims"), (std::vector<int64_t>{1, 0}));

  sharding::ConfigOverrides bad;
  bad.device = "nope";
  EXPECT_THROW(sharding::load_workload_config(file, bad), UsageError);
  bad = {};
  bad.plan = "tp";
  EXPECT_THROW(sharding::load_workload_config(file, bad), UsageError);
  bad = {};
  bad.ring = 8;
  bad.torus = "2x4";
  EXPECT_THROW(sharding::load_workload_config(file, bad), UsageError);
}

// describe() names every override that is set (the report's and checkpoint's "run with overrides" line), each
// flag as the command line spells it, and nothing for overrides left at their defaults.
TEST(EngineConfig, OverridesDescribeEveryFlag) {
  EXPECT_EQ(sharding::ConfigOverrides{}.describe(), "");
  sharding::ConfigOverrides sw;
  sw.switched = true;
  EXPECT_EQ(sw.describe(), " --switch");
  sharding::ConfigOverrides fc;
  fc.fully_connected = true;
  fc.bandwidth_gbps = 25;
  EXPECT_EQ(fc.describe(), " --fully-connected --bandwidth 25");
  sharding::ConfigOverrides all;
  all.topology_file = "t.yaml";
  all.ring = 8;
  all.torus = "2x4";
  all.mesh = "2x2";
  all.switched = true;
  all.fully_connected = true;
  all.bandwidth_gbps = 50;
  all.latency_ns = 0;
  all.device = "h100";
  all.plan = "tp=2";
  all.set = {"model.seq=32"};
  EXPECT_EQ(all.describe(), " --topology t.yaml --ring 8 --torus 2x4 --mesh 2x2 --switch --fully-connected "
                            "--bandwidth 50 --latency 0 --device h100 --plan tp=2 --set model.seq=32");
}

TEST(EngineConfig, TopologyByPath) {
  write("engine_topo_test.yaml", "topology: {kind: torus, dims: [2, 2], bandwidth_gbps: 10}\n");
  const auto file = write("engine_cfg_path_test.yaml", std::string(kBlock).replace(
      std::string(kBlock).find("topology: {"), std::string(kBlock).find("\nmodel") - std::string(kBlock).find("topology: {"),
      "topology: engine_topo_test.yaml\ndevice: trainium1"));
  const ConfigNode n = sharding::load_workload_config(file);
  EXPECT_EQ(sharding::load_workload_topology(n).dims(), (std::vector<int>{2, 2}));
  EXPECT_EQ(sharding::load_workload_device(n).name, sim::device_preset("trainium1").name);
  const auto missing = write("engine_cfg_missing.yaml", "topology: no_such_file.yaml\n");
  EXPECT_THROW(sharding::load_workload_topology(sharding::load_workload_config(missing)),
               ConfigError);
}

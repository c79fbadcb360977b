#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <set>

#include "common/error.h"
#include "reporting/trace.h"
#include "sharding/device_mesh.h"
#include "topology/topology.h"

using namespace shardsim;

namespace {

// Parses the events as a viewer would (round trip through text) and indexes them.
struct Parsed {
  nlohmann::json events;
  std::map<long, std::string> thread_name;        // tid -> name
  std::map<long, int> thread_sort;                // tid -> sort_index
  std::map<int, std::string> process_name;        // pid -> name
  std::map<int, int> process_sort;                // pid -> sort_index
  std::map<long, std::vector<nlohmann::json>> x;  // tid -> X events
};

Parsed parse(const sim::Timeline& tl) {
  Parsed p;
  p.events = nlohmann::json::parse(reporting::trace_events(tl).dump());
  for (const auto& e : p.events) {
    const std::string ph = e.at("ph");
    const int pid = e.at("pid");
    if (ph == "M") {
      const std::string n = e.at("name");
      if (n == "process_name") p.process_name[pid] = e.at("args").at("name");
      if (n == "process_sort_index") p.process_sort[pid] = e.at("args").at("sort_index");
      if (n == "thread_name") p.thread_name[e.at("tid").get<long>()] = e.at("args").at("name");
      if (n == "thread_sort_index") p.thread_sort[e.at("tid").get<long>()] = e.at("args").at("sort_index");
    } else if (ph == "X") {
      p.x[e.at("tid").get<long>()].push_back(e);
    }
  }
  return p;
}

// Picoseconds of a ts/dur in us, as written (at most 6 decimals).
long long ps(const nlohmann::json& us) { return std::llround(us.get<double>() * 1e6); }

void expect_no_overlap(const Parsed& p) {
  for (const auto& [tid, v] : p.x) {
    std::vector<std::pair<long long, long long>> spans;
    for (const auto& e : v) spans.push_back({ps(e["ts"]), ps(e["ts"]) + ps(e["dur"])});
    std::sort(spans.begin(), spans.end());
    for (size_t i = 1; i < spans.size(); ++i)
      EXPECT_LE(spans[i - 1].second, spans[i].first) << p.thread_name.at(tid) << " (tid " << tid << ")";
  }
}

}  // namespace

TEST(Trace, ValidEventsAndNoOverlapPerEngine) {
  auto topo = topology::Topology::ring(4, topology::LinkSpec{10, 100});
  sim::Timeline tl(1, topo, sim::device_preset("generic"));
  double t = 0;
  for (int i = 0; i < 5; ++i) {
    t = tl.compute("gemm", 1e8, 1e6, sim::Precision::fp32, t - 500, {}).end;  // ready before the engine is free
    tl.send("to2", 2, 4096, t);
    tl.send("to2 again", 2, 4096, t);  // same port: must queue
    tl.send("to0", 0, 4096, t);
  }
  tl.record_region("all_reduce", "collective", {0, t});
  const Parsed p = parse(tl);
  ASSERT_TRUE(p.events.is_array());

  // One process: pid = chip + 1 (Perfetto treats pid 0 as the idle process), named and sorted by chip.
  for (const auto& e : p.events) EXPECT_EQ(e.at("pid"), 2);
  EXPECT_EQ(p.process_name.at(2), "chip 1");
  EXPECT_EQ(p.process_sort.at(2), 1);

  // Tracks: compute, two ports, collectives; every tid is named and sorted, and lies in this chip's tid range.
  EXPECT_EQ(p.thread_name.size(), 4u);
  EXPECT_EQ(p.thread_sort.size(), 4u);
  std::map<std::string, long> tid_of;
  for (const auto& [tid, name] : p.thread_name) {
    EXPECT_GE(tid, 2L * reporting::kTraceTidStride);
    EXPECT_LT(tid, 3L * reporting::kTraceTidStride);
    tid_of[name] = tid;
  }
  ASSERT_TRUE(tid_of.count("compute") && tid_of.count("collectives"));
  EXPECT_EQ(p.thread_sort.at(tid_of["compute"]), 0);
  EXPECT_EQ(p.thread_sort.at(tid_of["collectives"]), 3);

  int spans = 0;
  for (const auto& [tid, v] : p.x) {
    ASSERT_TRUE(p.thread_name.count(tid)) << "X event on an unnamed track " << tid;
    const std::string track = p.thread_name.at(tid);
    for (const auto& e : v) {
      ++spans;
      ASSERT_TRUE(e.contains("ts") && e.contains("dur") && e.contains("name") && e.contains("args"));
      EXPECT_GE(e["ts"].get<double>(), 0.0);
      EXPECT_GE(e["dur"].get<double>(), 0.0);
      const auto& a = e["args"];
      ASSERT_TRUE(a.contains("bytes"));
      if (e["cat"] == "compute") {
        EXPECT_EQ(track, "compute");
        EXPECT_EQ(a.at("flops"), 1e8);
        EXPECT_EQ(a.at("bytes"), 1e6);
      } else if (e["cat"] == "send") {
        EXPECT_EQ(track.rfind("link->", 0), 0u) << track;
        EXPECT_EQ(a.at("bytes"), 4096);
        EXPECT_EQ(track.rfind("link->" + std::to_string(a.at("peer").get<int>()), 0), 0u)
            << "a send to a neighbour goes out on the port towards it: " << track;
      } else {
        EXPECT_EQ(e["cat"], "collective");
        EXPECT_EQ(track, "collectives");
        EXPECT_FALSE(a.contains("peer"));
      }
    }
  }
  EXPECT_EQ(spans, 5 * 4 + 1);
  EXPECT_EQ(p.x.size(), 4u);  // compute, two ports, collectives
  expect_no_overlap(p);
}

TEST(Trace, ChipZeroIsPidOneAndTidsDoNotCollideAcrossChips) {
  auto topo = topology::Topology::ring(3, topology::LinkSpec{10, 100});
  std::set<long> tids;
  for (int chip = 0; chip < 3; ++chip) {
    sim::Timeline tl(chip, topo, sim::device_preset("generic"));
    tl.compute("k", 1e6, 1e3, sim::Precision::fp32, 0, {});
    const Parsed p = parse(tl);
    EXPECT_EQ(p.process_name.at(chip + 1), "chip " + std::to_string(chip));
    for (const auto& [tid, name] : p.thread_name) EXPECT_TRUE(tids.insert(tid).second) << "tid " << tid << " reused";
  }
  EXPECT_EQ(tids.size(), 3u * 4u);
}

TEST(Trace, OverlappingRegionsGetSeparateCollectiveTracks) {
  auto topo = topology::Topology::ring(2, topology::LinkSpec{10, 100});
  sim::Timeline tl(0, topo, sim::device_preset("generic"));
  tl.record_region("a", "collective", {0, 100});
  tl.record_region("b", "collective", {50, 150});  // overlaps a without nesting
  tl.record_region("c", "collective", {60, 70});   // inside both
  tl.record_region("d", "collective", {150, 200}); // after a: reuses its track
  tl.record_region("e", "collective", {200, 200}); // zero length, touching d
  const Parsed p = parse(tl);
  std::map<std::string, std::string> track_of;  // event -> track name
  for (const auto& [tid, v] : p.x)
    for (const auto& e : v) track_of[e["name"]] = p.thread_name.at(tid);
  EXPECT_EQ(track_of["a"], "collectives");
  EXPECT_EQ(track_of["b"], "collectives 2");
  EXPECT_EQ(track_of["c"], "collectives 3");
  EXPECT_EQ(track_of["d"], "collectives");
  EXPECT_EQ(track_of["e"], "collectives");
  // Tracks: compute, the ports, then three collectives tracks.
  EXPECT_EQ(p.thread_name.size(), static_cast<size_t>(tl.num_engines() + 3));
  EXPECT_EQ(p.thread_sort.size(), p.thread_name.size());
  expect_no_overlap(p);
}

TEST(Trace, TimesArePicosecondRoundedMicrosecondsThatPrintShort) {
  auto topo = topology::Topology::ring(2, topology::LinkSpec{10, 100});
  sim::Timeline tl(0, topo, sim::device_preset("generic"));
  // 0.1 + 0.2 ns is 0.30000000000000004 in binary: the trace says 0.0003 us.
  tl.record_region("r", "collective", {0.1 + 0.2, 1234.5678901});
  // Back-to-back compute spans with awkward ns values: they must still touch exactly in the file.
  double t = 0;
  for (int i = 0; i < 50; ++i) t = tl.compute("k", 12345.678 + i, 7.7, sim::Precision::fp32, t, {}).end;
  const std::string text = reporting::trace_events(tl).dump();
  EXPECT_NE(text.find("\"ts\":0.0003}"), std::string::npos) << text.substr(0, 2000);
  EXPECT_NE(text.find("\"dur\":1.234268,"), std::string::npos);  // 1234.568 ps - 0.3 ps, rounded each end
  const Parsed p = parse(tl);
  for (const auto& [tid, v] : p.x) {
    for (const auto& e : v) {
      // At most 6 decimals: the printed number is an exact count of picoseconds.
      for (const char* k : {"ts", "dur"}) {
        const double us = e[k].get<double>();
        EXPECT_EQ(static_cast<double>(std::llround(us * 1e6)) / 1e6, us) << k << " " << us;
      }
    }
    if (p.thread_name.at(tid) != "compute") continue;
    for (size_t i = 1; i < v.size(); ++i)
      EXPECT_EQ(ps(v[i - 1]["ts"]) + ps(v[i - 1]["dur"]), ps(v[i]["ts"])) << "compute spans " << i - 1 << ", " << i;
  }
  // The last end matches the timeline's end to the picosecond.
  long long last = 0;
  for (const auto& [tid, v] : p.x)
    for (const auto& e : v) last = std::max(last, ps(e["ts"]) + ps(e["dur"]));
  EXPECT_EQ(last, std::llround(tl.end_time() * 1e3));
}

TEST(Trace, NonFiniteTimeIsAnErrorNamingTheEvent) {
  auto topo = topology::Topology::ring(2, topology::LinkSpec{10, 100});
  sim::Timeline tl(1, topo, sim::device_preset("generic"));
  tl.record_region("broken", "collective", {0, std::numeric_limits<double>::infinity()});
  try {
    reporting::trace_events(tl);
    FAIL() << "expected RuntimeFault";
  } catch (const RuntimeFault& e) {
    EXPECT_NE(std::string(e.what()).find("chip 1, event 'broken'"), std::string::npos) << e.what();
  }
}

// Issue 46 (kind 13): the trace's filters (reporting/trace_filter.h) resolve against the topology and the mesh, and
// refuse what they cannot keep with the flag's name.
TEST(TraceFilter, ChipsAxisAndWindowResolveOrAreRefusedNamingTheFlag) {
  const auto topo = topology::Topology::ring(8, topology::LinkSpec{100, 1000});
  const sharding::DeviceMesh mesh({{"tp", 2}, {"pp", 4}}, topo);
  reporting::TraceOptions o;
  o.chips = "6,0-2";
  auto f = reporting::resolve_trace_filter(o, topo, &mesh);
  EXPECT_EQ(f.chips, (std::vector<int>{0, 1, 2, 6}));
  EXPECT_EQ(f.text, "chips 0-2,6");
  EXPECT_TRUE(f.keeps_chip(6));
  EXPECT_FALSE(f.keeps_chip(3));
  o = {};
  o.axis = "pp:3";  // tp innermost: chip 3 is tp 1 of pp stage 1; its pp group is chips 1, 3, 5, 7
  f = reporting::resolve_trace_filter(o, topo, &mesh);
  EXPECT_EQ(f.chips, (std::vector<int>{1, 3, 5, 7}));
  o.axis = "tp";
  EXPECT_EQ(reporting::resolve_trace_filter(o, topo, &mesh).chips, (std::vector<int>{0, 1}));
  o = {};
  o.window = "1.5:2.5";
  f = reporting::resolve_trace_filter(o, topo, &mesh);
  EXPECT_EQ(f.from_ns, 1500);
  EXPECT_EQ(f.to_ns, 2500);
  EXPECT_TRUE(f.keeps_span(0, 1500));
  EXPECT_FALSE(f.keeps_span(0, 1499));
  EXPECT_FALSE(f.keeps_span(2501, 3000));
  o.window = "100:";
  EXPECT_TRUE(std::isinf(reporting::resolve_trace_filter(o, topo, &mesh).to_ns));
  auto refused = [&](reporting::TraceOptions bad) {
    try {
      (void)reporting::resolve_trace_filter(bad, topo, &mesh);
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  // A chip given twice (`0,0`, `0-2,2`: it was merged silently) and a trailing comma are refused too.
  for (const char* chips : {"8", "0-8", "3-1", "", "a", "1,,2", "-1", "0x1", "99999999999999999999", "0,0", "0-2,2",
                            "1,", "+1"}) {
    reporting::TraceOptions bad;
    bad.chips = chips;
    if (*chips == 0) continue;  // empty: no filter
    EXPECT_EQ(refused(bad).rfind("--trace-chips: ", 0), 0u) << chips;
  }
  for (const char* axis : {"cp", "dp", "pp:8", "pp:x", "nonesuch"}) {
    reporting::TraceOptions bad;
    bad.axis = axis;
    EXPECT_EQ(refused(bad).rfind("--trace-axis: ", 0), 0u) << axis;
  }
  for (const char* w : {"2:1", "1:1", "nan:2", "1", "1:2:3", "-1:2", "inf:", "1e300:"}) {
    reporting::TraceOptions bad;
    bad.window = w;
    EXPECT_EQ(refused(bad).rfind("--trace-window: ", 0), 0u) << w;
  }
  reporting::TraceOptions both;
  both.chips = "0";
  both.axis = "tp";
  EXPECT_NE(refused(both).find("give one of them"), std::string::npos);
  reporting::TraceOptions axis;
  axis.axis = "tp";
  EXPECT_THROW((void)reporting::resolve_trace_filter(axis, topo, nullptr), UsageError);
}

// A window keeps exactly the events that overlap it (and their tracks); the rest of the chip's events are left out.
TEST(TraceFilter, AWindowKeepsOnlyTheEventsThatOverlapIt) {
  const auto topo = topology::Topology::ring(2, topology::LinkSpec{100, 1000});
  sim::DeviceSpec d;
  d.peak_tflops_fp32 = 1;
  d.peak_tflops_bf16 = 1;
  d.hbm_gbps = 100;
  d.hbm_gib = 1;
  sim::Timeline tl(0, topo, d);
  for (int i = 0; i < 10; ++i) tl.compute("k" + std::to_string(i), 1e6, 0, sim::Precision::fp32, 0, {});  // 1 us each
  sim::ChipEvents ce{tl.chip(), tl.events()};
  reporting::TraceFilter f;
  f.from_ns = 2500;
  f.to_ns = 4000;
  const auto ev = reporting::trace_events(ce, topo, {}, {}, f);
  std::set<std::string> kept;
  for (const auto& e : ev)
    if (e.at("ph") == "X") kept.insert(e.at("name").get<std::string>());
  EXPECT_EQ(kept, (std::set<std::string>{"k2", "k3", "k4"}));  // [2,3] us, [3,4], [4,5]: k4 touches 4 us
}

// Sweep grid expansion, keys, input errors and the results CSV (experiments/sweep.h). No MPI.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include <unistd.h>

#include "common/error.h"
#include "experiments/sweep.h"
#include "experiments/scheduler.h"
#include "common/config.h"

using namespace shardsim;
using namespace shardsim::experiments;

namespace {

const char* kGrid = R"(name: t
axes:
  topology:
    - {kind: ring, chips: 4, bandwidth_gbps: 100, latency_ns: 1000}
    - {kind: torus, dims: [2, 2], bandwidth_gbps: 100, latency_ns: 1000}
    - {kind: switch, chips: 8, bandwidth_gbps: 50}
  collective: [all_reduce, broadcast]
  algorithm: [auto, ring, binomial_tree]
  size: {from: 1K, to: 64K, factor: 4}
  dtype: [fp32, bf16]
)";

std::string error_of(const std::string& text) {
  try {
    parse_sweep(text, "s.yaml");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Sweep, BestPlanPerTopologyAndDeviceIsTheFastestPassingRow) {
  auto row = [](const char* kind, const char* topo, const char* dev, const char* plan, const char* us,
                const char* verdict, const char* reason = "") {
    Row r;
    r["kind"] = kind;
    r["workload"] = "w";
    r["topology"] = topo;
    r["device"] = dev;
    r["plan"] = plan;
    r["key"] = std::string(plan) + "@" + topo + "/" + dev;
    r["sim_time_us"] = us;
    r["verdict"] = verdict;
    r["reason"] = reason;
    return r;
  };
  const std::vector<Row> rows = {
      row("workload", "ring8", "h100", "tp8", "30.5", "pass"),
      row("workload", "ring8", "h100", "cp8", "20.25", "pass"),
      row("workload", "ring8", "h100", "ulysses8", "10", "fail", "relative error above tolerance"),  // not a winner
      row("workload", "ring8", "h100", "tp4+sp", "", "error", "does not fill 8 chips"),
      row("workload", "torus2x4", "h100", "tp8", "25", "not_validated"),
      row("workload", "ring8", "trainium1", "tp8", "", "error", "out of memory"),
      row("collective", "ring8", "h100", "", "1", "pass"),  // collective rows are not plans
  };
  const auto best = best_plans(rows);
  ASSERT_EQ(best.size(), 3u);
  EXPECT_EQ(best[0].topology, "ring8");
  EXPECT_EQ(best[0].device, "h100");
  EXPECT_EQ(best[0].best.at("plan"), "cp8");
  EXPECT_EQ(best[0].compared, 2);
  ASSERT_EQ(best[0].skipped.size(), 1u);
  EXPECT_EQ(best[0].skipped[0].first, "tp4+sp");
  ASSERT_EQ(best[0].failed.size(), 1u);
  EXPECT_EQ(best[0].failed[0].first, "ulysses8");
  EXPECT_EQ(best[1].topology, "torus2x4");
  EXPECT_EQ(best[1].best.at("plan"), "tp8");
  EXPECT_EQ(best[2].device, "trainium1");
  EXPECT_TRUE(best[2].best.empty());
  const std::string text = best_plans_text(best);
  EXPECT_NE(text.find("skipped tp4+sp on ring8 / h100: does not fill 8 chips"), std::string::npos) << text;
  EXPECT_NE(text.find("(none ran)"), std::string::npos) << text;
  const std::string json = rows_to_json("t", rows);
  EXPECT_NE(json.find("\"best_plan\": \"cp8\""), std::string::npos) << json;
  EXPECT_EQ(best_plans_text(best_plans({rows.back()})), "");
}

TEST(Sweep, TrainingPlansRankByTokensPerSecondAndPlansOverHbmAreMarkedNotRanked) {
  auto row = [](const char* topo, const char* plan, const char* us, const char* tps, const char* fits,
                const char* verdict = "not_validated", const char* reason = "") {
    Row r;
    r["kind"] = "workload";
    r["run_mode"] = "train";
    r["workload"] = "lm";
    r["topology"] = topo;
    r["device"] = "h100";
    r["plan"] = plan;
    r["key"] = std::string(plan) + "@" + topo;
    r["sim_time_us"] = us;
    r["tokens_per_s"] = tps;
    r["tokens_per_step"] = "8192";
    r["mfu"] = "0.4";
    r["peak_mem_bytes"] = fits[0] == 'y' ? "1073741824" : "107374182400";
    r["hbm_capacity_bytes"] = "85899345920";
    r["fits_hbm"] = fits;
    r["bubble_fraction"] = "0.25";
    r["micro_batches"] = "4";
    r["verdict"] = verdict;
    r["reason"] = reason;
    return r;
  };
  const std::vector<Row> rows = {
      row("ring4", "tp4", "300", "27306", "yes"),
      row("ring4", "dp4", "100", "81920", "no"),  // fastest, but over HBM: listed, never the winner
      row("ring4", "pp2xdp2-1f1b", "200", "40960", "yes"),
      row("ring4", "pp8", "", "", "", "error", "plan does not fit: parallel.pp: 8 stages > 4 layers"),
      row("ring8", "dp4", "100", "81920", "no"),  // nothing fits: no winner
  };
  const auto best = best_plans(rows);
  ASSERT_EQ(best.size(), 2u);
  EXPECT_TRUE(best[0].train);
  EXPECT_EQ(best[0].best.at("plan"), "pp2xdp2-1f1b");
  EXPECT_EQ(best[0].compared, 2);
  ASSERT_EQ(best[0].ranked.size(), 2u);
  EXPECT_EQ(best[0].ranked[1].at("plan"), "tp4");
  ASSERT_EQ(best[0].over_hbm.size(), 1u);
  EXPECT_EQ(best[0].over_hbm[0].at("plan"), "dp4");
  ASSERT_EQ(best[0].skipped.size(), 1u);
  EXPECT_TRUE(best[1].best.empty());
  const std::string text = best_plans_text(best);
  EXPECT_NE(text.find("best training plan per topology x device"), std::string::npos) << text;
  EXPECT_NE(text.find("over HBM dp4"), std::string::npos) << text;
  EXPECT_NE(text.find("(does not fit: 100.00 GiB > 80.00 GiB)"), std::string::npos) << text;
  EXPECT_NE(text.find("skipped pp8 on ring4 / h100: plan does not fit: parallel.pp"), std::string::npos) << text;
  EXPECT_NE(text.find("(none fits)"), std::string::npos) << text;
  EXPECT_EQ(text.find("best plan per topology x device (lowest"), std::string::npos) << text;  // no forward rows
  const std::string json = rows_to_json("t", rows);
  EXPECT_NE(json.find("\"best_plan\": \"pp2xdp2-1f1b\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"ranked_by\": \"tokens_per_s\""), std::string::npos) << json;
}

}  // namespace

TEST(Sweep, TrainingConfigsSweepPlansWithPipelinesAndSkipIllegalOnes) {
  const std::string text = std::string(R"(axes:
  workload: [{config: )") + SHARDSIM_CONFIG_DIR + R"(/lm_train_dp4.yaml, label: lm}]
  topology:
    - {kind: ring, chips: 4, bandwidth_gbps: 100}
  plan:
    - {dp: 4, zero: 1, bucket_bytes: 4096}
    - {pp: 2, dp: fill, schedule: 1f1b, micro_batch: 1, recompute: true}
    - {pp: 4, schedule: interleaved, virtual_stages: 1, micro_batch: 4}
    - {pp: 4, dp: 1, schedule: 1f1b, micro_batch: 1}
    - {pp: 2, tp: 2, schedule: gpipe}
    - {dp: 4, recompute: selective}
)";
  const auto s = parse_sweep(text, "w.yaml");
  ASSERT_EQ(s.points.size(), 6u);
  // Issue 46 (kind 8): a plan takes recompute: selective as the parser does.
  EXPECT_EQ(s.points[5].plan, "dp4+src");
  EXPECT_TRUE(s.points[5].error.empty()) << s.points[5].error;
  for (const auto& p : s.points) EXPECT_TRUE(p.train);
  EXPECT_EQ(s.points[0].plan, "dp4-z1-b4096");
  EXPECT_TRUE(s.points[0].error.empty()) << s.points[0].error;
  EXPECT_EQ(s.points[0].micro_batches, 1);
  EXPECT_EQ(s.points[1].plan, "pp2xdp2-1f1b-mb1+rc");
  EXPECT_TRUE(s.points[1].error.empty()) << s.points[1].error;
  EXPECT_EQ(s.points[1].micro_batches, 4);  // batch 8 / dp 2 / 1
  EXPECT_NE(s.points[1].config_yaml.find("micro_batch: 1"), std::string::npos) << s.points[1].config_yaml;
  // The workload file's keys other than the plan's carry over unless the plan sets them, as with train --plan:
  // its bucket_bytes (1 MiB) where the plan gives none, the plan's 4096 and ZeRO 1 where it does.
  EXPECT_NE(s.points[1].config_yaml.find("bucket_bytes: 1048576"), std::string::npos) << s.points[1].config_yaml;
  EXPECT_NE(s.points[0].config_yaml.find("bucket_bytes: 4096"), std::string::npos) << s.points[0].config_yaml;
  EXPECT_EQ(s.points[0].config_yaml.find("1048576"), std::string::npos) << s.points[0].config_yaml;
  EXPECT_NE(s.points[0].config_yaml.find("zero: 1"), std::string::npos) << s.points[0].config_yaml;
  // Interleaving with 2 micro-batches on 4 stages: skipped with the parser's one-line reason.
  EXPECT_NE(s.points[2].error.find("multiple of parallel.pp"), std::string::npos) << s.points[2].error;
  EXPECT_TRUE(s.points[3].error.empty()) << s.points[3].error;
  EXPECT_EQ(s.points[4].plan, "pp2xtp2-gpipe");
  EXPECT_TRUE(s.points[4].error.empty()) << s.points[4].error;
  EXPECT_EQ(base_row(s.points[0]).at("run_mode"), "train");
  // More stages than layers: skipped with the parser's reason naming parallel.pp.
  const std::string two_layers = std::string(R"(axes:
  workload: [{config: )") + SHARDSIM_CONFIG_DIR + R"(/lm_train_dp4.yaml, label: lm, set: {layers: 2}}]
  topology: [{kind: ring, chips: 4, bandwidth_gbps: 100}]
  plan: [{pp: 4}, {pp: 2, dp: 2}]
)";
  const auto t = parse_sweep(two_layers, "w.yaml");
  ASSERT_EQ(t.points.size(), 2u);
  EXPECT_NE(t.points[0].error.find("plan does not fit: parallel.pp"), std::string::npos) << t.points[0].error;
  EXPECT_TRUE(t.points[1].error.empty()) << t.points[1].error;
}

TEST(Sweep, WhatIfColumnsFollowTheFixedOnesAndRoundTrip) {
  Row r = base_row(parse_sweep(kGrid, "s.yaml").points[0]);
  r[what_if_column("link_bw=2x")] = "1.25";
  // Columns already in a results file come first, then the spec's new changes, each once.
  const auto extra = what_if_columns({r}, "peak=2x,link_bw=2x,hbm_bw=1.5x+peak=2x");
  ASSERT_EQ(extra, (std::vector<std::string>{"speedup[link_bw=2x]", "speedup[peak=2x]", "speedup[hbm_bw=1.5x+peak=2x]"}));
  const std::string text = csv_header(extra) + csv_row(r, extra);
  EXPECT_EQ(text.substr(0, csv_header().size() - 1), csv_header().substr(0, csv_header().size() - 1));
  const auto rows = parse_csv(text, "r.csv");
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].at("speedup[link_bw=2x]"), "1.25");
  EXPECT_EQ(rows[0].at("speedup[peak=2x]"), "");
  EXPECT_NE(rows_to_json("t", rows).find("\"speedup[link_bw=2x]\": 1.25"), std::string::npos);
  EXPECT_THROW(parse_csv("key,speedup[x\n", "r.csv"), ConfigError);  // not one of ours
}

TEST(Sweep, CollectiveGridIsTheCartesianProductInOrder) {
  const auto s = parse_sweep(kGrid, "s.yaml");
  // 3 topologies x 1 device x 2 collectives x 3 algorithms x 2 dtypes x 4 sizes (1K 4K 16K 64K)
  ASSERT_EQ(s.points.size(), 3u * 2 * 3 * 2 * 4);
  EXPECT_EQ(s.name, "t");
  EXPECT_EQ(s.output, "out/sweeps/t");
  // Innermost axis is size, then dtype, algorithm, collective, device, topology.
  EXPECT_EQ(s.points[0].topology, "ring4");
  EXPECT_EQ(s.points[0].collective, "all_reduce");
  EXPECT_EQ(s.points[0].algorithm, "auto");
  EXPECT_EQ(s.points[0].dtype, "fp32");
  EXPECT_EQ(s.points[0].size_bytes, 1024u);
  EXPECT_EQ(s.points[1].size_bytes, 4096u);
  EXPECT_EQ(s.points[3].size_bytes, 65536u);
  EXPECT_EQ(s.points[4].dtype, "bf16");
  EXPECT_EQ(s.points[8].algorithm, "ring");
  EXPECT_EQ(s.points[24].collective, "broadcast");
  EXPECT_TRUE(s.points[24 + 16].error.empty()) << "broadcast has a binomial_tree";
  EXPECT_EQ(s.points[48].topology, "torus2x2");
  EXPECT_EQ(s.points[96].topology, "switch8");
  EXPECT_EQ(s.points[96].chips, 8);
  EXPECT_EQ(s.points[0].chips, 4);
  EXPECT_EQ(s.points[0].device, "generic");
  std::set<std::string> keys;
  for (size_t i = 0; i < s.points.size(); ++i) {
    EXPECT_EQ(s.points[i].index, static_cast<int>(i));
    keys.insert(s.points[i].key);
  }
  EXPECT_EQ(keys.size(), s.points.size()) << "keys are unique";
  // binomial_tree is not an all_reduce algorithm: a recorded failure, not an input error.
  EXPECT_EQ(s.points[16].algorithm, "binomial_tree");
  EXPECT_NE(s.points[16].error.find("all_reduce: algorithm 'binomial_tree' is not applicable to all_reduce (it is an algorithm of broadcast, reduce)"), std::string::npos);
  EXPECT_TRUE(s.points[8].error.empty());
}

TEST(Sweep, KeysAreStableAndFollowTheSpec) {
  const auto a = parse_sweep(kGrid, "s.yaml");
  const auto b = parse_sweep(kGrid, "other.yaml");
  for (size_t i = 0; i < a.points.size(); ++i) EXPECT_EQ(a.points[i].key, b.points[i].key);
  EXPECT_EQ(a.points[0].key.substr(0, a.points[0].key.find('#')), "all_reduce|auto|ring4|generic|fp32|1024");
  // A different bandwidth on the same label gives a different key (so a resume does not reuse stale rows).
  std::string changed = kGrid;
  changed.replace(changed.find("bandwidth_gbps: 100"), 19, "bandwidth_gbps: 200");
  const auto c = parse_sweep(changed, "s.yaml");
  EXPECT_NE(c.points[0].key, a.points[0].key);
  EXPECT_EQ(c.points[48].key, a.points[48].key);  // the torus did not change
}

TEST(Sweep, SizeListsAndLabels) {
  const auto s = parse_sweep(R"(axes:
  topology: [{kind: ring, chips: 2, bandwidth_gbps: 100, label: r2}]
  collective: all_reduce
  size: [8, 1K, 3MiB, 1G]
)", "x/s.yaml");
  ASSERT_EQ(s.points.size(), 4u);
  EXPECT_EQ(s.name, "s");
  EXPECT_EQ(s.points[0].topology, "r2");
  EXPECT_EQ(s.points[2].size_bytes, 3u << 20);
  EXPECT_EQ(s.points[3].size_bytes, 1u << 30);
  EXPECT_EQ(size_label(1u << 30), "1GiB");
  EXPECT_EQ(size_label(1536), "1536B");
  EXPECT_EQ(parse_size("4KiB"), 4096u);
  EXPECT_THROW(parse_size("4X"), std::invalid_argument);
}

TEST(Sweep, WorkloadGridSubstitutesChipsAndRecordsBadPlans) {
  const std::string text = std::string(R"(axes:
  workload: [{config: )") + SHARDSIM_CONFIG_DIR + R"(/blocks/small_block.yaml, label: small, set: {seq: 32}}]
  topology:
    - {kind: ring, chips: 2, bandwidth_gbps: 100}
    - {kind: ring, chips: 4, bandwidth_gbps: 100}
  plan: [{tp: chips}, {tp: chips, sp: true}, {cp: chips}, {ulysses: chips}, {tp: 3}]
)";
  const auto s = parse_sweep(text, "w.yaml");
  ASSERT_EQ(s.points.size(), 10u);
  EXPECT_EQ(s.points[0].plan, "tp2");
  EXPECT_EQ(s.points[1].plan, "tp2+sp");
  EXPECT_EQ(s.points[2].plan, "cp2");
  EXPECT_EQ(s.points[3].plan, "ulysses2");
  EXPECT_EQ(s.points[5].plan, "tp4");
  EXPECT_EQ(s.points[5].chips, 4);
  EXPECT_EQ(s.points[0].workload, "small");
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(s.points[i].error.empty()) << s.points[i].error;
  // tp 3 on 2 chips: recorded as a failing point with the block parser's reason.
  EXPECT_NE(s.points[4].error.find("parallel"), std::string::npos) << s.points[4].error;
  EXPECT_NE(s.points[0].config_yaml.find("seq: 32"), std::string::npos);
  EXPECT_NE(s.points[5].config_yaml.find("tp: 4"), std::string::npos);
}

TEST(Sweep, DpFillReplicatesAPlanUntilItFillsTheChips) {
  const std::string text = std::string(R"(axes:
  workload: [{config: )") + SHARDSIM_CONFIG_DIR + R"(/blocks/small_block.yaml, label: small, set: {seq: 32}}]
  topology:
    - {kind: ring, chips: 8, bandwidth_gbps: 100}
    - {kind: ring, chips: 6, bandwidth_gbps: 100}
  plan: [{tp: 4, sp: true, dp: fill}, {tp: 2, cp: 2, dp: fill}]
)";
  const auto s = parse_sweep(text, "w.yaml");
  ASSERT_EQ(s.points.size(), 4u);
  EXPECT_EQ(s.points[0].plan, "tp4xdp2+sp");
  EXPECT_EQ(s.points[1].plan, "tp2xcp2xdp2");
  EXPECT_TRUE(s.points[0].error.empty()) << s.points[0].error;
  EXPECT_TRUE(s.points[1].error.empty()) << s.points[1].error;
  EXPECT_NE(s.points[0].config_yaml.find("dp: 2"), std::string::npos);
  // 6 chips are no multiple of tp 4: no dp fills them, the point is skipped with the parser's reason.
  EXPECT_EQ(s.points[2].plan, "tp4+sp");
  EXPECT_NE(s.points[2].error.find("does not match the job"), std::string::npos) << s.points[2].error;
}

TEST(Sweep, WorkloadFilesLoadAsRunLoadsThem) {
  // A workload file in the current schema (model:, topology: a path next to the file) loads through the same
  // loader as `run` (sharding/engine_config.h): the sweep used to require workload:, an inline topology and a
  // device map.
  const auto dir = std::filesystem::temp_directory_path() / ("shardsim_sweep_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  {
    std::ofstream(dir / "ring4.yaml") << "topology: {kind: ring, chips: 4, bandwidth_gbps: 100, latency_ns: 1000}\n";
    std::ofstream(dir / "block.yaml")
        << "topology: ring4.yaml\ndevice: h100\nmodel: {kind: transformer_block, hidden: 64, heads: 4, ffn: 128, "
           "seq: 16}\nparallel: {tp: 4}\n";
  }
  const std::string text = "axes:\n  workload: [{config: " + (dir / "block.yaml").string() +
                           ", label: b, set: {seq: 32}}]\n  plan: [{tp: chips}, {cp: chips}]\n";
  const auto s = parse_sweep(text, (dir / "s.yaml").string());
  std::filesystem::remove_all(dir);
  ASSERT_EQ(s.points.size(), 2u);
  for (const auto& p : s.points) {
    EXPECT_TRUE(p.error.empty()) << p.error;
    EXPECT_EQ(p.chips, 4);
    EXPECT_EQ(p.topology, "ring4");
    EXPECT_EQ(p.device, "h100");  // a preset name given as the device:, as `run` reads it
  }
  EXPECT_NE(s.points[0].config_yaml.find("seq: 32"), std::string::npos) << s.points[0].config_yaml;
}

TEST(Sweep, InputErrorsNameFileAndLine) {
  // Unknown axis.
  auto e = error_of("axes:\n  topology: [{kind: ring, chips: 2, bandwidth_gbps: 100}]\n  collective: [all_reduce]\n  size: [1K]\n  colour: [red]\n");
  EXPECT_NE(e.find("s.yaml:"), std::string::npos) << e;
  EXPECT_NE(e.find("colour"), std::string::npos) << e;
  // Empty axis.
  e = error_of("axes:\n  topology: [{kind: ring, chips: 2, bandwidth_gbps: 100}]\n  collective: []\n  size: [1K]\n");
  EXPECT_NE(e.find("s.yaml:3"), std::string::npos) << e;
  EXPECT_NE(e.find("empty axis"), std::string::npos) << e;
  e = error_of("axes:\n  topology: [{kind: ring, chips: 2, bandwidth_gbps: 100}]\n  collective: [all_reduce]\n  size:\n");
  EXPECT_NE(e.find("empty axis"), std::string::npos) << e;
  // Unknown top-level key, unknown collective, dtype, algorithm, bad size, bad topology, plan key.
  EXPECT_NE(error_of("nam: x\naxes: {}\n").find("s.yaml:1"), std::string::npos);
  e = error_of("axes:\n  topology: [{kind: ring, chips: 2, bandwidth_gbps: 100}]\n  collective: [all_reduse]\n  size: [1K]\n");
  EXPECT_NE(e.find("s.yaml:3"), std::string::npos) << e;
  e = error_of("axes:\n  topology: [{kind: ring, chips: 2, bandwidth_gbps: 100}]\n  collective: [all_reduce]\n  size: [1K]\n  dtype: [fp33]\n");
  EXPECT_NE(e.find("s.yaml:5"), std::string::npos) << e;
  e = error_of("axes:\n  topology: [{kind: ring, chips: 2, bandwidth_gbps: 100}]\n  collective: [all_reduce]\n  algorithm: [rign]\n  size: [1K]\n");
  EXPECT_NE(e.find("rign"), std::string::npos) << e;
  e = error_of("axes:\n  topology: [{kind: ring, chips: 2, bandwidth_gbps: 100}]\n  collective: [all_reduce]\n  size: [1Q]\n");
  EXPECT_NE(e.find("s.yaml:4"), std::string::npos) << e;
  e = error_of("axes:\n  topology: [{kind: rung, chips: 2, bandwidth_gbps: 100}]\n  collective: [all_reduce]\n  size: [1K]\n");
  EXPECT_NE(e.find("s.yaml:2"), std::string::npos) << e;
  e = error_of("axes:\n  topology: [{kind: ring, chips: 2, bandwidth_gbps: 100}, {kind: ring, chips: 2, bandwidth_gbps: 100}]\n  collective: [all_reduce]\n  size: [1K]\n");
  EXPECT_NE(e.find("label"), std::string::npos) << e;
  e = error_of("axes:\n  workload: [x.yaml]\n  plan: [{tq: 2}]\n");
  EXPECT_NE(e.find("s.yaml:2"), std::string::npos) << e;  // the workload file is read first: it is missing
  e = error_of(std::string("axes:\n  workload: [") + SHARDSIM_CONFIG_DIR + "/blocks/small_block.yaml]\n  plan: [{tq: 2}]\n");
  EXPECT_NE(e.find("s.yaml:3"), std::string::npos) << e;
  EXPECT_NE(e.find("tq"), std::string::npos) << e;
  // A list as a plan value (one plan entry is one point): exit 2 naming the key and line, not a point without a name.
  e = error_of(std::string("axes:\n  workload: [") + SHARDSIM_CONFIG_DIR + "/lm_train_dp4.yaml]\n  plan:\n    - {pp: 2, schedule: [1f1b]}\n");
  EXPECT_NE(e.find("s.yaml:4"), std::string::npos) << e;
  EXPECT_NE(e.find("schedule: one value, not a list"), std::string::npos) << e;
  // Axes that need a partner.
  EXPECT_NE(error_of("axes:\n  topology: [{kind: ring, chips: 2, bandwidth_gbps: 100}]\n  collective: [all_reduce]\n").find("size"),
            std::string::npos);
  EXPECT_NE(error_of("axes:\n  topology: [{kind: ring, chips: 2, bandwidth_gbps: 100}]\n").find("nothing to sweep"), std::string::npos);
}

TEST(Sweep, CsvRoundTripAndInterruptedLines) {
  const auto s = parse_sweep(kGrid, "s.yaml");
  Row r = base_row(s.points[0]);
  r["reason"] = "a, \"quoted\"\nreason";
  r["sim_time_us"] = "12.5";
  Row r2 = base_row(s.points[1]);
  std::string text = csv_header() + csv_row(r) + csv_row(r2);
  int dropped = -1;
  auto rows = parse_csv(text, "r.csv", &dropped);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(dropped, 0);
  EXPECT_EQ(rows[0]["reason"], "a, \"quoted\" reason");
  EXPECT_EQ(rows[0]["key"], s.points[0].key);
  EXPECT_EQ(rows[1]["key"], s.points[1].key);
  // A half-written last line is dropped, not misread.
  const std::string cut = text + csv_row(base_row(s.points[2])).substr(0, 20);
  rows = parse_csv(cut, "r.csv", &dropped);
  EXPECT_EQ(rows.size(), 2u);
  EXPECT_EQ(dropped, 1);
  EXPECT_THROW(parse_csv("a,b\n1,2\n", "r.csv"), ConfigError);
  // An older file without some columns still reads (by name); the missing ones are empty.
  auto old_rows = parse_csv("key,verdict\nk1,pass\n", "r.csv", &dropped);
  ASSERT_EQ(old_rows.size(), 1u);
  EXPECT_EQ(old_rows[0]["key"], "k1");
  EXPECT_EQ(old_rows[0]["verdict"], "pass");
  EXPECT_EQ(old_rows[0]["ranks"], "");
  const std::string json = rows_to_json("t", rows);
  EXPECT_NE(json.find("\"sim_time_us\": 12.5"), std::string::npos) << json;
}

TEST(Sweep, ValidateOnceShrinksEachDistinctPlanOnce) {
  // Two sizes of one block shrink to the same validation config: one validation per plan x topology; a 3-layer
  // block shrinks to 2 layers, a different validation.
  const std::string text = std::string(R"(axes:
  workload:
    - {config: )") + SHARDSIM_CONFIG_DIR + R"(/blocks/small_block.yaml, label: s64}
    - {config: )" + SHARDSIM_CONFIG_DIR + R"(/blocks/small_block.yaml, label: s256, set: {seq: 256}}
    - {config: )" + SHARDSIM_CONFIG_DIR + R"(/blocks/small_block.yaml, label: l3, set: {seq: 256, layers: 3}}
  topology:
    - {kind: ring, chips: 2, bandwidth_gbps: 100}
    - {kind: ring, chips: 4, bandwidth_gbps: 100}
  plan: [{tp: chips}, {cp: chips}]
)";
  const auto s = parse_sweep(text, "w.yaml");
  ASSERT_EQ(s.points.size(), 12u);
  EXPECT_FALSE(s.validate_every);
  std::set<std::string> keys;
  for (const auto& p : s.points) {
    ASSERT_TRUE(p.error.empty()) << p.key << ": " << p.error;
    ASSERT_FALSE(p.validation_config_yaml.empty()) << p.key;
    EXPECT_TRUE(validated_separately(p, s));
    const auto small = shardsim::ConfigNode::load_string(p.validation_config_yaml, "v.yaml").child("workload");
    EXPECT_EQ(small.get_int("hidden"), 64) << p.key;  // heads 8 x head_dim 8
    EXPECT_EQ(small.get_int("ffn"), 128) << p.key;
    EXPECT_EQ(small.get_int("seq"), 64) << p.key;
    const auto full = shardsim::ConfigNode::load_string(p.config_yaml, "p.yaml").child("workload");
    EXPECT_EQ(full.get_int("hidden"), 128) << p.key;  // the point itself stays full size
    keys.insert(p.validation_key);
  }
  EXPECT_EQ(keys.size(), 8u);  // 2 plans x 2 topologies, shared by s64 and s256; l3's own
  EXPECT_EQ(s.points[0].validation_dims, "hidden=64,ffn=128");
  EXPECT_EQ(s.points[4].validation_dims, "hidden=64,ffn=128,seq=64");
  EXPECT_EQ(s.points[8].validation_dims, "hidden=64,ffn=128,seq=64,layers=2");
  EXPECT_EQ(shardsim::ConfigNode::load_string(s.points[8].validation_config_yaml, "v.yaml").child("workload").get_int("layers"), 2);
  EXPECT_EQ(s.points[0].validation_key, s.points[4].validation_key);
  EXPECT_NE(s.points[0].validation_key, s.points[8].validation_key);

  // validate: every: the same points, each validated at full size; keys unchanged (old results files resume).
  const auto e = parse_sweep("validate: every\n" + text, "w.yaml");
  ASSERT_EQ(e.points.size(), 12u);
  EXPECT_TRUE(e.validate_every);
  for (size_t i = 0; i < e.points.size(); ++i) {
    EXPECT_FALSE(validated_separately(e.points[i], e));
    EXPECT_EQ(e.points[i].key, s.points[i].key);
  }
  const auto o = parse_sweep("validate: once\n" + text, "w.yaml");
  EXPECT_FALSE(o.validate_every);
}

TEST(Sweep, ValidateKeyRejectsOtherValuesWithFileAndLine) {
  const std::string axes = "axes:\n  topology: [{kind: ring, chips: 2, bandwidth_gbps: 100}]\n  collective: [all_reduce]\n  size: [1K]\n";
  std::string e = error_of("name: x\nvalidate: always\n" + axes);
  EXPECT_NE(e.find("s.yaml:2"), std::string::npos) << e;
  EXPECT_NE(e.find("'always'"), std::string::npos) << e;
  e = error_of("validate: {every: true}\n" + axes);
  EXPECT_NE(e.find("s.yaml:1"), std::string::npos) << e;
}

TEST(Sweep, ShapeOnlyRowsTakeTheirPlansValidationVerdict) {
  Row row;
  row["verdict"] = "not_validated";  // as a shape-only run reports itself
  row["validated_at"] = "hidden=64,ffn=128";
  Row v;
  v["verdict"] = "pass";
  v["max_rel_error"] = "2.5e-07";
  v["reason"] = "";
  Row r = apply_validation(row, &v);
  EXPECT_EQ(r["verdict"], "pass");
  EXPECT_EQ(r["max_rel_error"], "2.5e-07");
  EXPECT_EQ(r["validated_at"], "hidden=64,ffn=128");
  // A failed validation fails every point of the plan (exit 1), with the reason.
  v["verdict"] = "fail";
  v["reason"] = "relative error above tolerance 0.0001";
  r = apply_validation(row, &v);
  EXPECT_EQ(r["verdict"], "fail");
  EXPECT_NE(r["reason"].find("failed validation at hidden=64,ffn=128: relative error"), std::string::npos) << r["reason"];
  // A validation that could not run, or none: not validated, and validated_at says so (empty).
  v["verdict"] = "error";
  v["reason"] = "needs 8 chips";
  r = apply_validation(row, &v);
  EXPECT_EQ(r["verdict"], "not_validated");
  EXPECT_EQ(r["validated_at"], "");
  EXPECT_NE(r["reason"].find("could not run: needs 8 chips"), std::string::npos) << r["reason"];
  r = apply_validation(row, nullptr);
  EXPECT_EQ(r["verdict"], "not_validated");
  // The full-size point's own error (e.g. simulated out of memory) stays.
  Row err = row;
  err["verdict"] = "error";
  err["reason"] = "simulated out of memory";
  v["verdict"] = "pass";
  EXPECT_EQ(apply_validation(err, &v)["verdict"], "error");
}

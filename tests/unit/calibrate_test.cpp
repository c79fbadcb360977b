// nccl-tests log parsing for `shardsim calibrate` (calibration/calibrate.h): the formats nccl-tests has printed
// over its versions, mpirun's output prefixes, and the inputs that must be refused with FILE:LINE. No MPI.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "calibration/calibrate.h"
#include "calibration/fitter.h"
#include "common/error.h"
#include "topology/topology_yaml.h"

using namespace shardsim;
using namespace shardsim::collectives;
using namespace shardsim::calibration;

namespace {

std::string error_of(const std::string& text, const std::string& collective = "") {
  try {
    parse_nccl_tests_text(text, "t.log", collective);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(NcclTestsLog, CurrentFormatWithRootAndRanks) {
  const std::string text =
      "# nccl-tests version 2.17.6\n"
      "# Collective test starting: reduce_scatter_perf\n"
      "#  Rank  0 Group  0 Pid 1 on h device  0 [0x18] GPU\n"
      "#  Rank  1 Group  0 Pid 2 on h device  1 [0x19] GPU\n"
      "#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   "
      "busbw  #wrong\n"
      "NCCL INFO something 12 34\n"
      "     1048576        131072     float     sum      -1    20.50   51.15   25.58       0    20.10   52.17   26.08"
      "       0\n"
      "     2097152        262144     float     sum      -1    35.00   59.92   29.96     N/A    35.10   59.75   29.87"
      "     N/A\n";
  const NcclLog log = parse_nccl_tests_text(text, "t.log");
  EXPECT_EQ(log.collective, Collective::reduce_scatter);
  EXPECT_EQ(log.ranks, 2);
  ASSERT_EQ(log.rows.size(), 2u);
  EXPECT_EQ(log.rows[0].line, 7);
  EXPECT_DOUBLE_EQ(log.rows[0].bytes, 1048576);
  EXPECT_DOUBLE_EQ(log.rows[0].time_us, 20.5);
  EXPECT_DOUBLE_EQ(log.rows[1].busbw, 29.96);
}

TEST(NcclTestsLog, OldFormatWithoutRootAndTaggedLines) {
  // nccl-tests before 2.13: no root column, "error" instead of "#wrong"; mpirun --tag-output prefixes.
  const std::string text =
      "[1,0]<stdout>:#       size         count    type   redop     time   algbw   busbw  error     time   algbw   "
      "busbw  error\n"
      "[1,0]<stdout>:     4194304       1048576   float     sum    60.10   69.79  122.13  0e+00    59.80   70.14  "
      "122.74  0e+00\n"
      "[0]     8388608       2097152   float     sum    100.2   83.72  146.51  0e+00    99.90   83.97  146.95  0e+00\n";
  const NcclLog log = parse_nccl_tests_text(text, "t.log", "all_reduce");
  EXPECT_EQ(log.collective, Collective::all_reduce);
  ASSERT_EQ(log.rows.size(), 2u);
  EXPECT_DOUBLE_EQ(log.rows[1].time_us, 100.2);
}

TEST(NcclTestsLog, RefusesWithFileAndLine) {
  const std::string head = "# Collective test starting: all_reduce_perf\n";
  const std::string row = "  1024  256  float  sum  -1  10.0  0.10  0.18  0  10.0  0.10  0.18  0\n";
  EXPECT_NE(error_of(head + "  1024  256  float  sum  -1  10.0\n").find("t.log:2: expected 9 or 13 columns"),
            std::string::npos);
  EXPECT_NE(error_of(head + row + row).find("t.log:3: size 1024 does not grow"), std::string::npos);
  EXPECT_NE(error_of(head + "  1024  256  float  sum  -1  -3  0.10  0.18  0\n").find("t.log:2: time '-3'"),
            std::string::npos);
  EXPECT_NE(error_of(head + "  1024  256  float  sum  -1  nan  0.10  0.18  0\n").find("t.log:2: time"),
            std::string::npos);
  // A time below 1 ns (was accepted: the fit's error rms came out as 'inf%' with exit 0).
  EXPECT_NE(error_of(head + "  1024  256  float  sum  -1  1e-300  0.10  0.18  0\n").find("t.log:2: time '1e-300' us is below 1 ns"),
            std::string::npos);
  EXPECT_EQ(error_of(head + "  1024  256  float  sum  -1  0.01  0.10  0.18  0\n"), "");
  EXPECT_NE(error_of(head + "  1e300  256  float  sum  -1  10  0.10  0.18  0\n").find("t.log:2: size '1e300' is above 1e15 bytes"),
            std::string::npos);
  // Sizes that look like numbers but do not parse to a finite one are malformed rows, not skipped lines (they were
  // dropped silently, exit 0); a word of table width (an NCCL INFO line) is still skipped.
  for (const std::string size : {"1e400", "nan", "inf", "-Inf", "1.2.3"})
    EXPECT_NE(error_of(head + "  " + size + "  256  float  sum  -1  10  0.10  0.18  0\n" + row)
                  .find("t.log:2: size '" + size + "' is not a finite byte count"),
              std::string::npos)
        << size;
  EXPECT_EQ(error_of(head + "nanny:12:34 [0] NCCL INFO Using network Socket\n" + row), "");
  // A time above a day (1e308 was fitted, printing a 300-digit time at -100% error, exit 0).
  EXPECT_NE(error_of(head + "  1024  256  float  sum  -1  1e308  0.10  0.18  0\n").find("t.log:2: time '1e308' us is above one day"),
            std::string::npos);
  EXPECT_EQ(error_of(head + "  1024  256  float  sum  -1  8e10  0.10  0.18  0\n"), "");
  EXPECT_NE(error_of(head + "  1024  256  float  sum  -1  10  0.10  0.18  2\n").find("t.log:2: #wrong is '2'"),
            std::string::npos);
  EXPECT_NE(error_of(head + head + row).find("t.log:2: a second 'Collective test starting'"), std::string::npos);
  EXPECT_NE(error_of("# Collective test starting: hypercube_perf\n" + row).find("unknown nccl-tests program"),
            std::string::npos);
  EXPECT_NE(error_of(row).find("t.log: no '# Collective test starting"), std::string::npos);
  EXPECT_NE(error_of(head).find("t.log: no nccl-tests table rows"), std::string::npos);
  EXPECT_NE(error_of(row, "warp_drive").find("unknown collective"), std::string::npos);
}

// A log as nccl-tests prints it with -b 0 and NCCL_DEBUG=INFO: the 0-byte rows and NCCL's lines are skipped, each
// kind counted in a note (an unmodified log was refused for its 0-byte rows).
TEST(NcclTestsLog, TakesLogsAsPrinted) {
  const std::string text =
      "# Collective test starting: all_gather_perf\n"
      "#  Rank  0 Group  0 Pid 1 on h device  0 [0x18] GPU\n"
      "#  Rank  1 Group  0 Pid 2 on h device  1 [0x19] GPU\n"
      "h:1:1 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>\n"
      "h:1:1 [1] NCCL INFO comm 0x55 rank 1 nranks 2 - Init COMPLETE\n"
      "           0             0     float    none      -1     0.14    0.00    0.00      0     0.13    0.00    0.00      0\n"
      "           0             0     float    none      -1     0.15    0.00    0.00      0     0.14    0.00    0.00      0\n"
      "          32             4     float    none      -1    10.52    0.00    0.00      0    10.01    0.00    0.00      0\n"
      "Some other text\n"
      "          64             8     float    none      -1    10.01    0.01    0.00      0    10.07    0.01    0.00      0\n";
  const NcclLog log = parse_nccl_tests_text(text, "t.log");
  EXPECT_EQ(log.collective, Collective::all_gather);
  EXPECT_EQ(log.ranks, 2);
  ASSERT_EQ(log.rows.size(), 2u);
  EXPECT_EQ(log.rows[0].line, 8);
  ASSERT_EQ(log.notes.size(), 3u);
  EXPECT_NE(log.notes[0].find("2 row(s) of 0 bytes skipped (first on line 6)"), std::string::npos) << log.notes[0];
  EXPECT_NE(log.notes[1].find("2 NCCL log line(s)"), std::string::npos) << log.notes[1];
  EXPECT_NE(log.notes[2].find("1 other line(s) that are not table rows skipped (first on line 9)"), std::string::npos)
      << log.notes[2];
}

// "Rank" lines are parsed, not counted: a rank twice, a rank that is not a number, a gap are refused.
TEST(NcclTestsLog, RankLinesParsed) {
  const std::string head = "# Collective test starting: all_reduce_perf\n";
  const std::string row = "  1024  256  float  sum  -1  10.0  0.10  0.18  0  10.0  0.10  0.18  0\n";
  auto rank = [](const std::string& r) { return "#  Rank " + r + " Group  0 Pid 1 on h device  0 [0x18] GPU\n"; };
  EXPECT_NE(error_of(head + rank("0") + rank("0") + row).find("t.log:3: rank 0 is listed twice (first on line 2)"),
            std::string::npos);
  EXPECT_NE(error_of(head + rank("0") + rank("1e20") + row).find("t.log:3: rank '1e20' is not a rank number"),
            std::string::npos);
  EXPECT_NE(error_of(head + rank("-1") + row).find("rank '-1' is not a rank number"), std::string::npos);
  EXPECT_NE(error_of(head + rank("0") + rank("2") + row).find("t.log:3: rank 2 is listed but rank 1 is not"),
            std::string::npos);
  // Older nccl-tests print "#   Rank  1 Pid ..." without a group; the order of the lines does not matter.
  const NcclLog log = parse_nccl_tests_text(head + "#   Rank  1 Pid 2 on h\n#   Rank  0 Pid 1 on h\n" + row, "t.log");
  EXPECT_EQ(log.ranks, 2);
}

// The collective a log is read as must fit its table (an all_gather table was fitted as all_reduce, exit 0), and
// --collective FILE=NAME must agree with the log's own line.
TEST(NcclTestsLog, CollectiveMustFitTheTable) {
  const std::string header =
      "#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   "
      "busbw  #wrong\n";
  const std::string ag_row = "  64  8  float  none  -1  10.0  0.01  0.00  0  10.0  0.01  0.00  0\n";  // 2 ranks
  EXPECT_NE(error_of(header + ag_row, "all_reduce")
                .find("t.log:2: the table's op is 'none' (a collective without reduction, e.g. all_gather_perf) but "
                      "the log is read as all_reduce (named by --collective); name each log's collective with "
                      "--collective FILE=NAME"),
            std::string::npos);
  EXPECT_EQ(error_of(header + ag_row, "all_gather"), "");
  // reduce_scatter's size is count x 4 B x ranks; read as all_reduce (size = count x 4 B) it does not fit.
  const std::string rs_row = "  64  8  float  sum  -1  10.0  0.01  0.00  0  10.0  0.01  0.00  0\n";
  EXPECT_NE(error_of(header + rs_row, "all_reduce").find("t.log:2: size 64 is 2 x count x 4 B, but all_reduce's"),
            std::string::npos);
  EXPECT_EQ(error_of(header + rs_row, "reduce_scatter"), "");
  const std::string all_reduce = "# Collective test starting: all_reduce_perf\n" + header +
                                 "  1024  256  float  sum  -1  10.0  0.10  0.18  0  10.0  0.10  0.18  0\n";
  try {
    parse_nccl_tests_text(all_reduce, "t.log", "all_gather", /*named_for_file=*/true);
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("t.log:1: the log says all_reduce_perf but --collective t.log=all_gather"),
              std::string::npos)
        << e.what();
  }
  // A plain --collective NAME is only the default: the log's own line wins.
  EXPECT_EQ(parse_nccl_tests_text(all_reduce, "t.log", "all_gather").collective, Collective::all_reduce);
}

// Inputs are bounded: regular files only (a directory said as such, a FIFO never blocks), at most kMaxLogBytes,
// lines of at most 64 KiB.
TEST(NcclTestsLog, InputsBounded) {
  auto log_error = [](const std::string& path) {
    try {
      parse_nccl_tests_log(path, "all_reduce");
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const std::string dir = ::testing::TempDir() + "calibrate_inputs_" + std::to_string(::getpid());
  ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0);
  EXPECT_EQ(log_error(dir), dir + ": is a directory");
  const std::string fifo = dir + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_EQ(log_error(fifo), fifo + ": is not a regular file (a FIFO, device or socket)");
  EXPECT_EQ(log_error("/dev/zero"), "/dev/zero: is not a regular file (a FIFO, device or socket)");
  EXPECT_NE(log_error(dir + "/missing").find(dir + "/missing: cannot open: No such file or directory"),
            std::string::npos);
  const std::string big = dir + "/big.log";
  ASSERT_EQ(::truncate(big.c_str(), 0), -1);  // does not exist yet
  {
    FILE* f = std::fopen(big.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fclose(f);
    ASSERT_EQ(::truncate(big.c_str(), static_cast<off_t>(kMaxLogBytes + 1)), 0);  // sparse: nothing is written
  }
  EXPECT_NE(log_error(big).find(big + ": larger than 67108864 bytes, the limit for an nccl-tests log"),
            std::string::npos);
  EXPECT_NE(error_of(std::string(70000, 'x') + "\n").find("t.log:1: a line longer than 65536 bytes"),
            std::string::npos);
  std::remove(big.c_str());
  std::remove(fifo.c_str());
  ::rmdir(dir.c_str());
}

TEST(NcclTestsLog, FittedTopologyFileLoadsBack) {
  topology::Topology t = topology::Topology::torus({2, 4}, {{100, 1000}, {50, 3000}}).scaled(2.0, 0.5);
  const std::string yaml = topology_yaml(t);
  const auto back = topology::load_topology(ConfigNode::load_string(yaml, "fit.yaml").child("topology"));
  EXPECT_EQ(back.describe(), t.describe());
  ASSERT_EQ(back.links().size(), t.links().size());
  for (size_t i = 0; i < t.links().size(); ++i) {
    EXPECT_DOUBLE_EQ(back.links()[i].bandwidth_gbps, t.links()[i].bandwidth_gbps);
    EXPECT_DOUBLE_EQ(back.links()[i].latency_ns, t.links()[i].latency_ns);
  }
  EXPECT_DOUBLE_EQ(t.links()[0].bandwidth_gbps, 50);  // dimension 0: 100 GB/s x 0.5, 1000 ns x 2
  EXPECT_DOUBLE_EQ(t.links()[0].latency_ns, 2000);
}

// An 8-chip switch with in-switch reduction (H100 NVLS figures of configs/topologies/dgx_h100_nvls.yaml: 450 GB/s
// links, 1000 ns, reduction 275 GB/s and 1000 ns).
topology::Topology nvls_switch(double rate_gbps = 275, double latency_ns = 1000) {
  topology::Dim d;
  d.kind = topology::DimKind::switch_;
  d.size = 8;
  d.link = {450, 1000};
  d.reduction.enabled = true;
  d.reduction.rate = {rate_gbps, latency_ns};
  return topology::Topology::stacked({d});
}

TEST(NcclTestsLog, FittedTopologyFileKeepsTheReduction) {
  topology::Topology t = nvls_switch(274.998765, 1234.5);
  topology::Protocol p;
  p.efficiency = 0.821961;
  t.set_protocol(p);
  const std::string yaml = topology_yaml(t);
  EXPECT_NE(yaml.find("reduction: true, reduction_bandwidth_gbps: 274.998765, reduction_latency_ns: 1234.5"),
            std::string::npos)
      << yaml;
  const auto back = topology::load_topology(ConfigNode::load_string(yaml, "fit.yaml").child("topology"));
  ASSERT_EQ(back.dim_specs().size(), 1u);
  const auto& r = back.dim_specs()[0].reduction;
  EXPECT_TRUE(r.enabled);
  EXPECT_DOUBLE_EQ(r.rate.bandwidth_gbps, 274.998765);
  EXPECT_DOUBLE_EQ(r.rate.latency_ns, 1234.5);
  EXPECT_DOUBLE_EQ(back.protocol().efficiency, 0.821961);
  EXPECT_EQ(back.describe(), t.describe());
  // A topology without reduction writes none of its keys (files written before stay as they were).
  EXPECT_EQ(topology_yaml(topology::Topology::switched(8, {450, 1000})).find("reduction"), std::string::npos);
}

TEST(NcclTestsLog, WithReductionSetsEverySwitchAndKeepsTheRest) {
  topology::Topology t = nvls_switch(200, 0);
  topology::Protocol p;
  p.call_overhead_ns = 5000;
  t.set_protocol(p);
  t.set_placement({7, 6, 5, 4, 3, 2, 1, 0});
  const auto u = calibration::fit::with_reduction(t, 0.5, 700);  // rate / 0.5, latency 700 ns
  EXPECT_DOUBLE_EQ(u.dim_specs()[0].reduction.rate.bandwidth_gbps, 400);
  EXPECT_DOUBLE_EQ(u.dim_specs()[0].reduction.rate.latency_ns, 700);
  EXPECT_DOUBLE_EQ(u.protocol().call_overhead_ns, 5000);
  EXPECT_EQ(u.placement(), t.placement());
  EXPECT_DOUBLE_EQ(u.links()[0].bandwidth_gbps, 450);
  // Clamped to the link ranges a topology accepts (an unlimited rate, a negative latency).
  const auto v = calibration::fit::with_reduction(t, 1e-12, -5);
  EXPECT_DOUBLE_EQ(v.dim_specs()[0].reduction.rate.bandwidth_gbps, topology::kMaxBandwidthGbps);
  EXPECT_DOUBLE_EQ(v.dim_specs()[0].reduction.rate.latency_ns, 0);
  EXPECT_TRUE(calibration::fit::has_reduction(t));
  EXPECT_FALSE(calibration::fit::has_reduction(topology::Topology::switched(8, {450, 1000})));
}

TEST(NcclTestsLog, ReductionWarnings) {
  CalibrationOptions opt;
  opt.algorithm = "in_switch";
  Calibration cal;
  cal.reduction = true;
  cal.bandwidth_factor = 0.82;
  cal.fitted = nvls_switch(275, 1000);
  EXPECT_TRUE(physical_warnings(cal, opt).empty());
  // 8 ports x 450 GB/s = 3600 GB/s: a switch reducing faster than its ports feed it.
  cal.fitted = nvls_switch(3600 * 1.01, 1000);
  auto w = physical_warnings(cal, opt);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_NE(w[0].find("above the line-rate sum of the switch's 8 ports (3600 GB/s)"), std::string::npos) << w[0];
  cal.fitted = nvls_switch(3600, 1000);  // at the sum: possible
  EXPECT_TRUE(physical_warnings(cal, opt).empty());
  cal.fitted = nvls_switch(275, 0);  // the latency at its bound
  w = physical_warnings(cal, opt);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_NE(w[0].find("reduction latency 0 ns sits at its bound 0"), std::string::npos) << w[0];
  cal.reduction = false;  // not fitted (e.g. --algorithm ring on this switch): no reduction warning
  EXPECT_TRUE(physical_warnings(cal, opt).empty());
}

}  // namespace

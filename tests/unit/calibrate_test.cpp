// nccl-tests log parsing for `shardsim calibrate` (collectives/calibrate.h): the formats nccl-tests has printed
// over its versions, mpirun's output prefixes, and the inputs that must be refused with FILE:LINE. No MPI.
#include <gtest/gtest.h>

#include <string>

#include "collectives/calibrate.h"
#include "common/error.h"
#include "topology/topology_yaml.h"

using namespace shardsim;
using namespace shardsim::collectives;

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

}  // namespace

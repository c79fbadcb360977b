// The profile plots' data (reporting/profile_plots.h): kernels placed on the roofline by their arithmetic intensity
// (a large GEMM right of the ridge point, an elementwise add left of it, both from their FLOP and byte counts by
// hand), families summed over chips, kernels without FLOPs counted but not placed; and the utilisation bins of a
// hand-built timeline whose fractions follow from its intervals.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "reporting/profile_plots.h"

using namespace shardsim;
using sim::Bound;

namespace {

sim::Event kernel(const std::string& name, double start, double end, double flops, double bytes, Bound b) {
  sim::Event e;
  e.name = name;
  e.category = "compute";
  e.span = {start, end};
  e.flops = flops;
  e.bytes = bytes;
  e.bound = b;
  return e;
}

sim::Event send(double start, double end) {
  sim::Event e;
  e.name = "all_reduce.ring.step0";
  e.category = "send";
  e.engine = 1;
  e.span = {start, end};
  e.bytes = 1e6;
  e.bound = Bound::link;
  return e;
}

// H100 SXM's dense bf16 peak and HBM3 bandwidth (configs/devices.yaml): ridge 989e12 / 3.35e12 = 295 FLOP/byte.
const reporting::Roof kH100{989.0, 3350.0};

}  // namespace

TEST(Roofline, GemmRightOfRidgeElementwiseLeft) {
  // GEMM [4096 x 4096] x [4096 x 4096] in bf16: 2·4096³ FLOPs over A, B and C once each (3·4096²·2 bytes):
  // I = 4096/3 = 1365 FLOP/byte. An elementwise add of 2^20 bf16 values: 2^20 FLOPs over 3·2^20·2 bytes: I = 1/6.
  const double n = 4096, gemm_flops = 2 * n * n * n, gemm_bytes = 3 * n * n * 2;
  const double m = 1 << 20, add_flops = m, add_bytes = 3 * m * 2;
  std::vector<sim::ChipEvents> chips(2);
  for (int c = 0; c < 2; ++c) {
    chips[size_t(c)].chip = c;
    chips[size_t(c)].events = {kernel("gemm.layer" + std::to_string(c), 0, 150000, gemm_flops, gemm_bytes, Bound::compute),
                               kernel("add", 150000, 152000, add_flops, add_bytes, Bound::hbm),
                               kernel("copy", 152000, 153000, 0, add_bytes, Bound::hbm), send(0, 100)};
  }
  const auto r = reporting::roofline(chips, kH100);
  EXPECT_NEAR(r.roof.ridge(), 989e3 / 3350.0, 1e-9);
  ASSERT_EQ(r.points.size(), 2u);  // gemm.layerN (both chips' GEMMs, one family) and add; the copy has no FLOPs
  EXPECT_EQ(r.unplaced_calls, 2);
  const auto& g = r.points[0];  // largest time first
  EXPECT_EQ(g.op, "gemm.layerN");
  EXPECT_EQ(g.calls, 2);
  EXPECT_DOUBLE_EQ(g.intensity(), n / 3);
  EXPECT_GT(g.intensity(), r.roof.ridge());
  EXPECT_DOUBLE_EQ(g.achieved_tflops(), gemm_flops / 150000 / 1e3);
  EXPECT_DOUBLE_EQ(r.roof.attainable_tflops(g.intensity()), 989.0);
  const auto& a = r.points[1];
  EXPECT_EQ(a.op, "add");
  EXPECT_DOUBLE_EQ(a.intensity(), 1.0 / 6);
  EXPECT_LT(a.intensity(), r.roof.ridge());
  EXPECT_DOUBLE_EQ(r.roof.attainable_tflops(a.intensity()), 3350.0 / 6 / 1e3);
  EXPECT_THROW(reporting::roofline(chips, reporting::Roof{0, 3350}), std::invalid_argument);
  EXPECT_THROW(reporting::roofline(chips, reporting::Roof{989, std::nan("")}), std::invalid_argument);
}

TEST(Utilisation, FractionsFollowTheIntervals) {
  // chip 0: a compute-bound kernel [0, 50], an HBM-bound one [50, 60], a send [25, 100].
  // chip 1: idle until a send [80, 100].  Two bins of 50 ns.
  std::vector<sim::ChipEvents> chips(2);
  chips[0].chip = 0;
  chips[0].events = {kernel("gemm", 0, 50, 1, 1, Bound::compute), kernel("norm", 50, 60, 1, 1, Bound::hbm),
                     send(25, 100)};
  chips[1].chip = 1;
  chips[1].events = {send(80, 100)};
  const auto bins = reporting::utilisation(chips, 100, 2);
  ASSERT_EQ(bins.size(), 2u);
  EXPECT_EQ(bins[0].from, 0);
  EXPECT_EQ(bins[1].to, 100);
  // bin [0, 50): chip 0 computes all of it, sends half; chip 1 idles: of 100 chip-ns, 50 compute, 25 link, 50 idle.
  EXPECT_DOUBLE_EQ(bins[0].compute, 0.5);
  EXPECT_DOUBLE_EQ(bins[0].hbm, 0.0);
  EXPECT_DOUBLE_EQ(bins[0].link, 0.25);
  EXPECT_DOUBLE_EQ(bins[0].idle, 0.5);
  // bin [50, 100): chip 0: norm 10, send 50 (busy 50); chip 1: send 20 (busy 20): idle (100 - 70) / 100.
  EXPECT_DOUBLE_EQ(bins[1].compute, 0.0);
  EXPECT_DOUBLE_EQ(bins[1].hbm, 0.1);
  EXPECT_DOUBLE_EQ(bins[1].link, 0.7);
  EXPECT_DOUBLE_EQ(bins[1].idle, 0.3);
  EXPECT_TRUE(reporting::utilisation(chips, 0, 2).empty());
}

// Issue 46 (kind 15): crowded roofline labels do not overlap. Twelve kernel families on nearly one point and a
// column of close points: those within a marker share one label (at most three names and "+N more"), the other
// labels' text boxes (as roofline_labels estimates them) are disjoint.
TEST(Roofline, LabelsDoNotOverlap) {
  std::vector<sim::ChipEvents> chips(1);
  for (int i = 0; i < 12; ++i)  // ~1 % apart: one point on the plot
    chips[0].events.push_back(kernel("gemm" + std::string(1, char('a' + i)), 0, 1000 + 10 * i, 1e9, 1e6, Bound::compute));
  for (int i = 0; i < 8; ++i)  // a factor 1.3 apart in achieved rate: separate points, labels one line apart
    chips[0].events.push_back(kernel("norm" + std::string(1, char('a' + i)), 0, 1000 * std::pow(1.3, i), 1e7, 1e6,
                                     Bound::hbm));
  const auto r = reporting::roofline(chips, kH100);
  const auto labels = reporting::roofline_labels(r);
  ASSERT_FALSE(labels.empty());
  bool more = false;
  for (const auto& l : labels) more = more || l.text.find(" more") != std::string::npos;
  EXPECT_TRUE(more) << "the twelve GEMMs share one label";
  EXPECT_LT(labels.size(), r.points.size());
  const auto g = reporting::roofline_range(r);
  // The same pixel estimate as roofline_labels: 820 x 480 px over the log ranges, 5.5 px a character, 12 px a line.
  const double xs = 820 / std::log10(g.x_hi / g.x_lo), ys = 480 / std::log10(g.y_hi / g.y_lo);
  for (size_t a = 0; a < labels.size(); ++a)
    for (size_t b = a + 1; b < labels.size(); ++b) {
      const double ax = std::log10(labels[a].x / g.x_lo) * xs, ay = std::log10(labels[a].y / g.y_lo) * ys;
      const double bx = std::log10(labels[b].x / g.x_lo) * xs, by = std::log10(labels[b].y / g.y_lo) * ys;
      const bool x_overlap = ax < bx + 5.5 * labels[b].text.size() - 1e-6 && bx < ax + 5.5 * labels[a].text.size() - 1e-6;
      const bool y_overlap = std::fabs(ay - by) < 12 - 1e-6;
      EXPECT_FALSE(x_overlap && y_overlap) << labels[a].text << " / " << labels[b].text;
    }
}

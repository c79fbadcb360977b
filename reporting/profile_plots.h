// Profile plots (`--plots DIR` of run, profile and train; docs/PROFILE.md, "Plots"): a roofline of the run's kernels
// and a utilisation timeline of its chips, each as a data file, a gnuplot script and a PNG, drawn the way the
// sweep's plots are (common/gnuplot.h: no text from a config or results file is interpreted by gnuplot).
//
// Roofline (Williams, Waterman and Patterson, "Roofline: an insightful visual performance model for multicore
// architectures", CACM 52(4), 2009): each kernel family (op_family of sim/critical_path.h, summed over every call
// on every chip) at its arithmetic intensity I = FLOPs / HBM bytes (FLOP/byte) and its achieved rate FLOPs / busy
// time (TFLOP/s, simulated), under the device's roofs: attainable(I) = min(peak, I x HBM bandwidth); the ridge point
// is I* = peak / HBM bandwidth. A kernel left of the ridge is HBM-bound by the roofline, right of it compute-bound.
// Kernels with no FLOPs (copies, layout changes) cannot be placed on a log axis and are counted, not drawn.
//
// Utilisation: [0, end] cut into equal bins; per bin the fraction of chip-time, averaged over the chips, in which a
// chip's compute engine ran a compute-bound (or launch-latency-bound) kernel, an HBM-bound kernel, in which at
// least one of its link ports was sending, and in which it did neither (idle). Compute and link time overlap, so
// the four need not sum to 1; compute + hbm + idle + (link only) do.
//
// Units: simulated ns in, FLOP/byte, TFLOP/s and fractions out. Pure functions except write_profile_plots.
#pragma once

#include <string>
#include <vector>

#include "sim/critical_path.h"

namespace shardsim::reporting {

struct RooflinePoint {
  std::string op;        // op_family of the kernels
  int calls = 0;         // kernels of this family over all chips
  double flops = 0;      // summed
  double bytes = 0;      // HBM bytes, summed
  sim::TimeNs time = 0;  // summed busy time (ns)
  double intensity() const { return bytes > 0 ? flops / bytes : 0; }                   // FLOP per byte
  double achieved_tflops() const { return time > 0 ? flops / double(time) / 1e3 : 0; }  // FLOP/ns / 1e3
};

struct Roof {
  double peak_tflops = 0;  // at the run's precision
  double hbm_gbps = 0;     // GB/s = bytes per ns
  double ridge() const { return hbm_gbps > 0 ? peak_tflops * 1e3 / hbm_gbps : 0; }  // FLOP per byte
  double attainable_tflops(double intensity) const;
};

struct Roofline {
  Roof roof;
  std::vector<RooflinePoint> points;  // the kernel families with FLOPs and bytes, largest total time first
  int unplaced_calls = 0;             // kernels without FLOPs or without HBM bytes (not drawn)
};

// Throws std::invalid_argument if the roof is not positive.
Roofline roofline(const std::vector<sim::ChipEvents>& chips, const Roof& roof);

// The roofline plot's axes (data coordinates; roofline.gp sets them): x a factor 4 beyond the points and 100 around
// the ridge, y a factor 4 beyond the points and the peak.
struct RooflineRange {
  double x_lo = 0, x_hi = 0, y_lo = 0, y_hi = 0;
};
RooflineRange roofline_range(const Roofline& r);

// Where roofline.png's labels go, one per label drawn: points that would sit within a marker of each other share
// one label ("a, b, c", at most three names and "+N more"); each label starts right of its point and moves up or
// down a line at a time until its text box clears every label placed before it (larger total time first; boxes
// estimated for the 960x600 px plot and its 8 pt font on RooflineRange's log axes), so labels do not overlap.
struct RooflineLabel {
  size_t point = 0;       // index into Roofline::points
  std::string text;
  double x = 0, y = 0;    // the text's left end (data coordinates)
};
std::vector<RooflineLabel> roofline_labels(const Roofline& r);

struct UtilisationBin {
  sim::TimeNs from = 0, to = 0;
  double compute = 0, hbm = 0, link = 0, idle = 0;  // fractions of the bin's chip-time (see above)
};
// BINS >= 1 equal bins over [0, END]; END <= 0 gives none.
std::vector<UtilisationBin> utilisation(const std::vector<sim::ChipEvents>& chips, sim::TimeNs end, int bins);

// --plots DIR checked before a run: DIR is created if missing; UsageError (exit 2) naming --plots when DIR exists
// and is not a directory, cannot be created or is not writable. Nothing happens for "" (no plots). Returns the
// files the plots write ({"--plots DIR (NAME)", DIR/NAME} for roofline/utilisation .dat/.gp/.png), for the
// caller's check_outputs_distinct with its other outputs (`--plots pl --json pl/roofline.dat` is refused).
std::vector<std::pair<std::string, std::string>> check_plots_dir(const std::string& dir);

// Writes roofline.{dat,gp} and utilisation.{dat,gp} into DIR (created if missing; every file lands atomically) and
// draws roofline.png and utilisation.png with gnuplot. Returns "" or one line saying what was not drawn (gnuplot
// missing or failing: the data and scripts stay). Throws shardsim::Error (exit 3) if a file cannot be written.
// TITLE (the run's name) is quoted with gp_quote; op names go into the data file only.
std::string write_profile_plots(const std::string& dir, const std::string& title, const Roofline& r,
                                const std::vector<UtilisationBin>& bins, std::vector<std::string>* pngs);

}  // namespace shardsim::reporting

// The least-squares machinery of `shardsim calibrate` (calibration/calibrate.h describes the model and the
// options). Internal to calibration/: not a public interface.
//
// Fitter fits one parameter vector to the fitted rows (relative squared time errors): a weighted linear
// least-squares start on per-row basis columns, then Gauss-Newton with step halving on the full replay. The
// vector (x, in this order):
//   protocols 1: a, 1/b, c [, o]          protocols 2: a_lo, 1/b_lo, c, a, 1/b
//   then, when the rows run the in-switch reduction (collectives/in_switch.h): 1/r, alpha_R
// a: link latency factor; b: efficiency of the file's line rate; c, o: per-call and per-message overhead (us);
// r: the switch's reduction bandwidth as a factor of the file's reduction_bandwidth_gbps; alpha_R: the switch's
// reduction latency (us). A parameter can be pinned (held at a value, not fitted): c at 0 without
// fit_call_overhead; a at 1 when the rows cannot tell the link latency from the switch's (check_identifiable).
#pragma once

#include <cmath>
#include <cstddef>
#include <vector>

#include "calibration/calibrate.h"

namespace shardsim::calibration::fit {

struct Point {
  const NcclLog* log;
  NcclRow row;
  bool fitted;
};

using Matrix = std::vector<std::vector<double>>;

// Solves the NxN system M x = V (Gaussian elimination with partial pivoting); false when singular.
bool solve_n(Matrix m, std::vector<double> v, std::vector<double>& x);
// The part of column Q of the Gram matrix G that the other columns cannot express, relative to its length:
// 1 - R^2 of regressing column Q on the others (0: Q is a combination of them, so not identifiable).
double separation(const Matrix& g, size_t q);

// TOPO with link latencies x A and the protocol's efficiency B (the links keep their line rate; when B > 1 the
// measurement beat the file's line rate, so the links' bandwidth is raised instead and the efficiency is 1).
topology::Topology with_protocol(const topology::Topology& topo, double a, double b, const topology::Protocol* ll);
// TOPO with its protocol's per-message overhead O and per-call overhead C (ns).
topology::Topology with_costs(topology::Topology t, double o_ns, double c_ns);
// Whether TOPO has a switch dimension with in-switch reduction (grid topologies only).
bool has_reduction(const topology::Topology& topo);
// TOPO with every reduction switch's rate = its rate in TOPO / INV_FACTOR (GB/s) and its latency LATENCY_NS,
// both clamped to LinkSpec's ranges (topology.h). TOPO must be a grid topology whose links are unscaled (the
// topology is rebuilt from its dimensions; placement and protocol kept).
topology::Topology with_reduction(const topology::Topology& topo, double inv_factor, double latency_ns);

struct FitC {
  std::vector<double> x;
  double cost = 0;
  int iterations = 0;
  double split_lo = 0, split_hi = 0;  // protocols 2
  bool ok = false;
};

class Fitter {
 public:
  // REDUCTION: the rows run the in-switch reduction, so 1/r and alpha_R are parameters too.
  Fitter(const topology::Topology& topo, const std::vector<Point>& points, const std::vector<size_t>& idx,
         const CalibrationOptions& options, const EstimateGroup& tp, bool reduction);
  // Pins a at 1 when the rows cannot tell it from alpha_R (every in_switch row pays two link hops and one
  // reduction latency at every size); then ConfigError when c, o, alpha_R or 1/r cannot be told from the other
  // free parameters over every fitted row with one protocol (a split into two protocols only adds parameters).
  void check_identifiable();
  FitC fit() const;
  // Gauss-Newton from X (protocols 1), as fit() refines its linear start.
  FitC fit_from(const std::vector<double>& x) const;
  // The fitted topology of parameters X (protocols 2: with the low-latency protocol below F's split).
  topology::Topology build(const std::vector<double>& x, const FitC& f) const;
  bool latency_pinned() const { return !std::isnan(pin_[0]); }
  static constexpr size_t kC = 2;
  size_t rate_index() const { return base_params(); }  // 1/r (reduction only)
  size_t reduction_latency_index() const { return base_params() + 1; }  // alpha_R in us (reduction only)

 private:
  struct Basis {
    double L = 0, W = 0, M = 0, X = 0, D = 0;
  };
  size_t base_params() const { return opt_.protocols == 2 ? 5 : (opt_.fit_overhead ? 4 : 3); }
  size_t nparams() const { return base_params() + (reduction_ ? 2 : 0); }
  bool is_inverse_bandwidth(size_t i) const {
    return i == 1 || (opt_.protocols == 2 && i == 4) || (reduction_ && i == rate_index());
  }
  bool pinned(size_t i) const { return !std::isnan(pin_[i]); }
  Matrix rows(double split_size) const;
  Matrix gram(const std::vector<size_t>& cols) const;
  FitC linear(double split_size) const;
  double cost(const std::vector<double>& x, const FitC& f) const;
  void refine(FitC& f) const;

  const topology::Topology& topo_;
  const std::vector<Point>& points_;
  const std::vector<size_t>& idx_;
  const CalibrationOptions& opt_;
  const EstimateGroup& tp_;
  bool reduction_;
  std::vector<double> pin_;  // per parameter: its pinned value, NaN when free
  std::vector<Basis> basis_;
};

}  // namespace shardsim::calibration::fit

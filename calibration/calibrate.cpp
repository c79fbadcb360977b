#include "calibration/calibrate.h"
#include "calibration/fitter.h"
#include "collectives/multi_ring.h"
#include "collectives/rail_ring.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>

#include "common/error.h"
#include "sim/device_spec.h"
#include "sim/timeline.h"

namespace shardsim::calibration {

using namespace collectives;  // the collectives this room calibrates / verifies

namespace {

std::string algorithm_for(Collective c, const std::string& wanted) {
  if (wanted == "auto") return wanted;
  const std::string a = canonical_algorithm(c, wanted);
  return a.empty() ? algorithm_names(c).front() : a;
}

}  // namespace

namespace {

// The algorithm ALGORITHM (or `auto`'s choice) resolves to for C of BYTES on T; ConfigError when it cannot run.
std::string resolve(const runtime::Transport& t, const topology::Topology& topo, Collective c,
                    const std::string& algorithm, double bytes, size_t chunk_bytes) {
  std::string a = algorithm_for(c, algorithm);
  if (a == "auto") {
    CollectiveOptions o;
    o.chunk_bytes = chunk_bytes;
    return choose(c, o, t, bytes).algorithm;
  }
  if (const std::string why = obstacle(c, a, t); !why.empty())
    throw ConfigError(collective_name(c) + ": algorithm '" + a + "' cannot run on " + topo.describe() + ": " + why +
                      " (choose another with --algorithm)");
  return a;
}

}  // namespace

double predict_us(const topology::Topology& topo, Collective c, const std::string& algorithm, double bytes,
                  const EstimateGroup& tp, size_t chunk_bytes) {
  const int chip = tp.rank_to_chip.at(static_cast<size_t>(tp.world->rank()));
  sim::Timeline timeline(chip, topo, sim::device_preset("generic"), /*record_events=*/false);
  runtime::Transport t(*tp.world, timeline, tp.rank_to_chip);
  const std::string a = resolve(t, topo, c, algorithm, bytes, chunk_bytes);
  return estimate_ns(c, a, t, bytes, chunk_bytes) / 1e3;
}

AlgorithmUse resolve_algorithm(const topology::Topology& topo, Collective c, const std::string& algorithm,
                               double bytes, const EstimateGroup& tp, size_t chunk_bytes) {
  const int chip = tp.rank_to_chip.at(static_cast<size_t>(tp.world->rank()));
  sim::Timeline timeline(chip, topo, sim::device_preset("generic"), /*record_events=*/false);
  runtime::Transport t(*tp.world, timeline, tp.rank_to_chip);
  AlgorithmUse u;
  u.collective = c;
  u.bytes = bytes;
  u.algorithm = resolve(t, topo, c, algorithm, bytes, chunk_bytes);
  if (u.algorithm == "multi_ring") u.channels = static_cast<int>(multi_ring::cycles(t.size()).size());
  if (u.algorithm == "rail_ring") u.channels = static_cast<int>(rail_ring::cycles(t).size());
  return u;
}

namespace {

using fit::Point;
using fit::solve_n;
using fit::with_protocol;

struct Fit2 {
  double a = 1, inv_b = 1, cost = 0;
  int iterations = 0;
};

// Fits a (latency factor) and 1/b (inverse bandwidth factor) of TOPO to POINTS[i] for i in IDX: relative squared
// errors, weighted linear start, then Gauss-Newton with step halving on the full replay.
Fit2 fit_two(const topology::Topology& topo, const std::vector<Point>& points, const std::vector<size_t>& idx,
             const CalibrationOptions& options, const EstimateGroup& tp) {
  auto model = [&](double a, double b, const Point& p) {
    return predict_us(topo.scaled(a, b), p.log->collective, options.algorithm, p.row.bytes, tp, options.chunk_bytes);
  };
  // For ring-family schedules t = a * L(S) + (1/b) * W(S), L = the time at the file's latencies and unlimited
  // bandwidth, W = the time at zero latency.
  const double huge_bw = 1e12;
  double s_ll = 0, s_lw = 0, s_ww = 0, s_lt = 0, s_wt = 0;
  for (size_t i : idx) {
    const auto& p = points[i];
    const double L = model(1, huge_bw, p), W = model(0, 1, p), inv = 1 / p.row.time_us;
    const double l = L * inv, w = W * inv;  // relative weighting: residual (pred - t) / t
    s_ll += l * l, s_lw += l * w, s_ww += w * w, s_lt += l, s_wt += w;
  }
  Fit2 f;
  const double det = s_ll * s_ww - s_lw * s_lw;
  if (det > 0) {
    f.a = (s_lt * s_ww - s_wt * s_lw) / det;
    f.inv_b = (s_ll * s_wt - s_lw * s_lt) / det;
  }
  if (!(f.a >= 0)) {  // latency cannot be negative: refit bandwidth alone
    f.a = 0;
    f.inv_b = s_ww > 0 ? s_wt / s_ww : 1;
  }
  if (!(f.inv_b > 0)) f.inv_b = 1;
  auto cost = [&](double aa, double ib) {
    double sum = 0;
    for (size_t i : idx) {
      const auto& p = points[i];
      const double r = (model(aa, 1 / ib, p) - p.row.time_us) / p.row.time_us;
      sum += r * r;
    }
    return sum;
  };
  // Gauss-Newton (exact start when the schedule is linear; refines when a max over paths or `auto` makes it
  // piecewise).
  f.cost = cost(f.a, f.inv_b);
  for (int it = 0; it < 20; ++it) {
    const double ha = std::max(f.a, 1e-3) * 1e-4, hb = f.inv_b * 1e-4;
    double jtj[3] = {0, 0, 0}, jtr[2] = {0, 0};
    for (size_t i : idx) {
      const auto& p = points[i];
      const double t = p.row.time_us, v = model(f.a, 1 / f.inv_b, p);
      const double da = (model(f.a + ha, 1 / f.inv_b, p) - v) / ha / t;
      const double db = (model(f.a, 1 / (f.inv_b + hb), p) - v) / hb / t;
      const double r = (v - t) / t;
      jtj[0] += da * da, jtj[1] += da * db, jtj[2] += db * db;
      jtr[0] += da * r, jtr[1] += db * r;
    }
    const double d = jtj[0] * jtj[2] - jtj[1] * jtj[1];
    f.iterations = it + 1;
    if (!(d > 0)) break;
    const double step_a = -(jtj[2] * jtr[0] - jtj[1] * jtr[1]) / d;
    const double step_b = -(jtj[0] * jtr[1] - jtj[1] * jtr[0]) / d;
    bool improved = false;
    for (double k = 1; k > 1e-3; k /= 2) {
      const double na = std::max(0.0, f.a + k * step_a), nb = f.inv_b + k * step_b;
      if (!(nb > 0)) continue;
      const double c1 = cost(na, nb);
      if (c1 < f.cost) {
        improved = f.cost - c1 > 1e-12 * (1 + f.cost);
        f.a = na, f.inv_b = nb, f.cost = c1;
        break;
      }
    }
    if (!improved) break;
  }
  return f;
}

// TOPO with its protocol's per-message overhead set to O ns (TOPO itself when O is 0).
topology::Topology with_overhead(const topology::Topology& topo, double o) {
  if (o == 0) return topo;
  topology::Topology t = topo;
  topology::Protocol p = t.protocol();
  p.message_overhead_ns = o;
  t.set_protocol(p);
  return t;
}


std::vector<std::vector<double>> to_matrix(const double m[3][3]) {
  return {{m[0][0], m[0][1], m[0][2]}, {m[1][0], m[1][1], m[1][2]}, {m[2][0], m[2][1], m[2][2]}};
}

struct Fit3 {
  double a = 1, inv_b = 1, o = 0, cost = 0;
  int iterations = 0;
};

// Fits a, 1/b and the per-message overhead o (ns) to POINTS[i] for i in IDX: relative squared errors; the weighted
// linear start t = a L + o M + W / b (L: the file's latencies, unlimited bandwidth; M: per ns of overhead alone;
// W: zero latency), refused when L and M are proportional over the rows (o cannot be told from latency); then
// Gauss-Newton with step halving on the full replay, a and o kept >= 0.
Fit3 fit_three(const topology::Topology& topo, const std::vector<Point>& points, const std::vector<size_t>& idx,
               const CalibrationOptions& options, const EstimateGroup& tp) {
  auto model = [&](double a, double inv_b, double o, const Point& p) {
    return predict_us(with_overhead(topo.scaled(a, 1 / inv_b), o), p.log->collective, options.algorithm,
                      p.row.bytes, tp, options.chunk_bytes);
  };
  const double tiny_inv_b = 1e-12, o_unit = 1000;  // unlimited bandwidth; 1 us of overhead per message
  double g[3][3] = {}, v[3] = {};
  for (size_t i : idx) {
    const auto& p = points[i];
    const double inv = 1 / p.row.time_us;
    const double col[3] = {model(1, tiny_inv_b, 0, p) * inv, model(0, tiny_inv_b, o_unit, p) / o_unit * inv,
                           model(0, 1, 0, p) * inv};
    for (int r = 0; r < 3; ++r) {
      v[r] += col[r];
      for (int c = 0; c < 3; ++c) g[r][c] += col[r] * col[c];
    }
  }
  // Identifiable when the latency and overhead columns are not parallel: 1 - cos^2 of their angle.
  const double sep = g[0][0] > 0 && g[1][1] > 0 ? 1 - g[0][1] * g[0][1] / (g[0][0] * g[1][1]) : 0;
  if (!(sep > 1e-9))
    throw ConfigError(
        "calibrate --fit-overhead: the per-message overhead cannot be told from the latency in these rows: every "
        "fitted row charges messages and hop latencies in one ratio (e.g. unpipelined ring steps, one message per "
        "hop), so o and a are one parameter. Fit without --fit-overhead (the latency then absorbs the overhead) or "
        "give rows where the ratio differs (--chunk-bytes: pipelined pieces pay one overhead each but overlap their "
        "latencies)");
  Fit3 f;
  std::vector<double> x;
  if (solve_n(to_matrix(g), {v, v + 3}, x)) f.a = x[0], f.o = x[1] * o_unit, f.inv_b = x[2];
  f.a = std::max(0.0, f.a), f.o = std::max(0.0, f.o);
  if (!(f.inv_b > 0)) f.inv_b = 1;
  auto cost = [&](double a, double ib, double o) {
    double sum = 0;
    for (size_t i : idx) {
      const auto& p = points[i];
      const double r = (model(a, ib, o, p) - p.row.time_us) / p.row.time_us;
      sum += r * r;
    }
    return sum;
  };
  f.cost = cost(f.a, f.inv_b, f.o);
  for (int it = 0; it < 30; ++it) {
    const double h[3] = {std::max(f.a, 1e-3) * 1e-4, f.inv_b * 1e-4, std::max(f.o, 1.0) * 1e-4};
    double jtj[3][3] = {}, jtr[3] = {};
    for (size_t i : idx) {
      const auto& p = points[i];
      const double t = p.row.time_us, base = model(f.a, f.inv_b, f.o, p);
      const double d[3] = {(model(f.a + h[0], f.inv_b, f.o, p) - base) / h[0] / t,
                           (model(f.a, f.inv_b + h[1], f.o, p) - base) / h[1] / t,
                           (model(f.a, f.inv_b, f.o + h[2], p) - base) / h[2] / t};
      const double r = (base - t) / t;
      for (int q = 0; q < 3; ++q) {
        jtr[q] += d[q] * r;
        for (int c = 0; c < 3; ++c) jtj[q][c] += d[q] * d[c];
      }
    }
    std::vector<double> step;
    f.iterations = it + 1;
    for (double& s : jtr) s = -s;
    if (!solve_n(to_matrix(jtj), {jtr, jtr + 3}, step)) break;
    bool improved = false;
    for (double k = 1; k > 1e-3; k /= 2) {
      const double na = std::max(0.0, f.a + k * step[0]), nb = f.inv_b + k * step[1],
                   no = std::max(0.0, f.o + k * step[2]);
      if (!(nb > 0)) continue;
      const double c1 = cost(na, nb, no);
      if (c1 < f.cost) {
        improved = f.cost - c1 > 1e-14 * (1 + f.cost);
        f.a = na, f.inv_b = nb, f.o = no, f.cost = c1;
        break;
      }
    }
    if (!improved) break;
  }
  return f;
}


// An all_reduce through the switch cannot tell which of the links (effective rate E = b x line rate) and the
// switch (R) bounds it: with m pieces of P = S/m bytes it takes 2 P/E + S/R when R <= E and S/E + P/R + P/E when
// R >= E, so (E, R) and its mirror (E', R') with 2/E = 1/R' + 1/E' and E' = R give the same time at every size
// (collectives/in_switch.h's closed form). Refits from the mirror of F; ConfigError naming both when the mirror fits
// the rows as well and differs by more than 1 % (rows of a collective that moves no reduction, all_gather, or of
// another algorithm pin E and break the tie).
void refuse_mirror(const fit::Fitter& cf, const fit::FitC& f, const topology::Topology& topo, size_t rows) {
  const topology::Dim* dim = nullptr;
  for (const auto& d : topo.dim_specs())
    if (d.reduction.enabled && !dim) dim = &d;
  if (!dim) return;
  const double line = dim->link.bandwidth_gbps, r_file = dim->reduction.rate.bandwidth_gbps;
  const size_t ri = cf.rate_index();
  const double e = line / f.x[1], r = r_file / f.x[ri];
  double e2 = 0, r2 = 0;
  if (r >= e) e2 = 2 / (1 / r + 1 / e), r2 = e;             // link-bound: the switch-bound mirror
  else if (r > e / 2) e2 = r, r2 = 1 / (2 / e - 1 / r);     // switch-bound: the link-bound mirror
  else return;                                              // R < E/2: no mirror
  std::vector<double> x = f.x;
  x[1] = line / e2, x[ri] = r_file / r2;
  const fit::FitC g = cf.fit_from(x);
  const double n = static_cast<double>(std::max<size_t>(rows, 1));
  const double rms = std::sqrt(f.cost / n), rms2 = std::sqrt(g.cost / n);
  const double e3 = line / g.x[1], r3 = r_file / g.x[ri];
  const bool differs = std::fabs(e3 / e - 1) > 0.01 || std::fabs(r3 / r - 1) > 0.01;
  if (differs && rms2 <= 1.2 * rms + 1e-4)
    throw ConfigError("calibrate: the rows cannot tell whether the links or the switch's reduction bound them: links " +
                      format_number(e) + " GB/s with reduction " + format_number(r) + " GB/s (rms " +
                      format_number(100 * rms) + " %) and links " + format_number(e3) + " GB/s with reduction " +
                      format_number(r3) + " GB/s (rms " + format_number(100 * rms2) + " %) fit them alike (an "
                      "in_switch all_reduce takes 2P/E + S/R or S/E + P/R + P/E). Fit an all_gather log run through "
                      "the switch with it (it moves no reduction, so it pins the links)");
}

// Whether the fitted rows run the in-switch reduction (by --algorithm in_switch, or auto choosing it on the file's
// topology): its bandwidth and latency are then fitted too.
bool runs_in_switch(const topology::Topology& topo, const std::vector<Point>& points, const std::vector<size_t>& idx,
                    const CalibrationOptions& options, const EstimateGroup& tp) {
  if (!fit::has_reduction(topo)) return false;
  return std::any_of(idx.begin(), idx.end(), [&](size_t i) {
    return resolve_algorithm(topo, points[i].log->collective, options.algorithm, points[i].row.bytes, tp,
                             options.chunk_bytes)
               .algorithm == "in_switch";
  });
}

// What LOG's largest row ran on the fitted topology TOPO, with its channel count (calibrate.h, AlgorithmUse).
AlgorithmUse largest_row_algorithm(const topology::Topology& topo, const NcclLog& log,
                                   const CalibrationOptions& options, const EstimateGroup& tp) {
  double largest = 0;
  for (const auto& r : log.rows) largest = std::max(largest, r.bytes);
  AlgorithmUse u = resolve_algorithm(topo, log.collective, options.algorithm, largest, tp, options.chunk_bytes);
  u.file = log.file;
  return u;
}

}  // namespace

// What makes a fit physically impossible (calibrate.h, Calibration::warnings).
std::vector<std::string> physical_warnings(const Calibration& cal, const CalibrationOptions& options) {
  std::vector<std::string> out;
  const std::string models = "--algorithm " + options.algorithm;
  auto above_line_rate = [&](const std::string& what, double e) {
    out.push_back(what + " " + format_number(e) + " is above 1: the fit needs " + format_number(e) +
                  " x the topology file's line rate, which no link gives (the file's bandwidth is too low, or the "
                  "measured library used more links at once than " + models + " models: several channels or rails, "
                  "in-switch reduction)");
  };
  if (cal.bandwidth_factor > 1 + 1e-6) above_line_rate("efficiency b =", cal.bandwidth_factor);
  if (cal.low_latency && cal.low_latency_efficiency > 1 + 1e-6)
    above_line_rate("the low-latency protocol's efficiency", cal.low_latency_efficiency);
  if (cal.latency_factor < 1e-6)
    out.push_back("latency factor a = " + format_number(cal.latency_factor) +
                  " sits at its bound 0: the rows want a negative latency (the small sizes are faster than the "
                  "model's hops allow: check " + models + " and the topology's hop count)");
  if (cal.low_latency && !cal.fitted.links().empty()) {
    // At its own threshold the low-latency protocol must not be slower than the bandwidth protocol: a library
    // switches to it because it is faster there.
    const auto& p = cal.fitted.protocol();
    const auto& link = cal.fitted.link(0);
    const double m = p.low_latency_max_bytes, b = link.bandwidth_gbps;
    const double t_ll = link.latency_ns * p.low_latency_latency_factor + m / (b * p.low_latency_efficiency);
    const double t_bw = link.latency_ns + m / (b * p.efficiency);
    if (t_ll > t_bw * (1 + 1e-6))
      out.push_back("the low-latency protocol (efficiency " + format_number(cal.low_latency_efficiency) +
                    ") is slower than the bandwidth protocol at its own threshold (" + format_number(t_ll) + " ns vs " +
                    format_number(t_bw) + " ns per " + format_number(m) + "-byte message on one link): no library "
                    "would switch to it there, so the split is an artefact of the rows (fit with --protocols 1)");
  }
  if (cal.reduction && cal.fitted.is_grid())
    for (const auto& d : cal.fitted.dim_specs()) {
      if (!d.reduction.enabled) continue;
      // The switch cannot reduce faster than its ports can feed it: p ports at the line rate each.
      const double ports = d.size * d.link.bandwidth_gbps, r = d.reduction.rate.bandwidth_gbps;
      if (r > ports * (1 + 1e-6))
        out.push_back("reduction bandwidth " + format_number(r) + " GB/s is above the line-rate sum of the switch's " +
                      std::to_string(d.size) + " ports (" + format_number(ports) + " GB/s): no switch is fed that "
                      "fast, so the rows are not bounded by the reduction (the links bound them, or the measured "
                      "library did not reduce in the switch: check --algorithm)");
      if (d.reduction.rate.latency_ns < 1e-3)
        out.push_back("reduction latency " + format_number(d.reduction.rate.latency_ns) +
                      " ns sits at its bound 0: the rows want less than the links' own latency (the file's link "
                      "latency is too high for them, or the measured library took fewer hops)");
    }
  return out;
}

Calibration calibrate(const topology::Topology& topo, const std::vector<NcclLog>& fit,
                      const std::vector<NcclLog>& held_out, const CalibrationOptions& options,
                      const EstimateGroup& tp) {
  for (const auto* logs : {&fit, &held_out})
    for (const auto& log : *logs)
      if (log.ranks != 0 && log.ranks != topo.num_chips())
        throw ConfigError(log.file + ": the log lists " + std::to_string(log.ranks) + " ranks but the topology has " +
                          std::to_string(topo.num_chips()) + " chips");
  if (tp.size() != topo.num_chips())
    throw UsageError("calibrate: the topology has " + std::to_string(topo.num_chips()) +
                     " chips; run it with mpirun -np " + std::to_string(topo.num_chips()) + " or --chips " +
                     std::to_string(topo.num_chips()) + " (the job has " + std::to_string(tp.size()) + " ranks)");
  if (options.protocols != 1 && options.protocols != 2)
    throw UsageError("--protocols: 1 or 2 (got " + std::to_string(options.protocols) + ")");
  if (options.fit_overhead && options.protocols != 1)
    throw UsageError("--fit-overhead: with --protocols 1 only (one overhead for both protocols is not fitted yet)");
  if (options.fit_overhead && fit.empty()) throw UsageError("--fit-overhead: give a log to fit");
  if (options.fit_call_overhead && fit.empty()) throw UsageError("--fit-call-overhead: give a log to fit");
  if (!fit.empty() && !topo.protocol().is_default())  // --predict alone uses the topology as given, protocol and all
    throw ConfigError("calibrate: the topology already has a protocol section; give the plain link model to fit");

  std::vector<Point> points;
  for (const auto& log : fit)
    for (const auto& r : log.rows)
      points.push_back({&log, r, r.bytes >= options.min_bytes && (options.max_bytes <= 0 || r.bytes <= options.max_bytes)});
  for (const auto& log : held_out)
    for (const auto& r : log.rows) points.push_back({&log, r, false});
  std::vector<size_t> fitted;
  for (size_t i = 0; i < points.size(); ++i)
    if (points[i].fitted) fitted.push_back(i);
  const bool reduction = runs_in_switch(topo, points, fitted, options, tp);
  if (reduction && options.protocols != 1)
    throw UsageError("--protocols 2: not with an in-switch reduction fit yet (the rows run in_switch; fit with "
                     "--protocols 1)");
  const size_t need = (options.protocols == 1 ? 2 : 4) + (options.fit_overhead ? 1 : 0) +
                      (options.fit_call_overhead ? 1 : 0) + (reduction ? 2 : 0);
  Calibration out;
  if (fit.empty()) {
    // Prediction only: the topology as given (a = b = 1), every row held out.
    if (held_out.empty()) throw UsageError("calibrate: give a log to fit or one to predict");
    out.fitted = topo;
  } else if (fitted.size() < need)
    throw ConfigError("calibrate: " + std::to_string(fitted.size()) + " row(s) at or above " +
                      format_number(options.min_bytes) + " B" +
                      (options.max_bytes > 0 ? " and at or below " + format_number(options.max_bytes) + " B" : "") +
                      " to fit; need at least " + std::to_string(need));

  if (fit.empty()) {
  } else if (options.fit_call_overhead || reduction) {
    fit::Fitter cf(topo, points, fitted, options, tp, reduction);
    cf.check_identifiable();
    const fit::FitC f = cf.fit();
    out.call_overhead_ns = f.x[fit::Fitter::kC] * 1000;
    out.iterations = f.iterations;
    out.fitted = cf.build(f.x, f);
    if (reduction) refuse_mirror(cf, f, topo, fitted.size());
    out.reduction = reduction;
    out.link_latency_held = cf.latency_pinned();
    for (const auto& d : out.fitted.dim_specs())
      if (d.reduction.enabled) {
        out.reduction_bandwidth_gbps = d.reduction.rate.bandwidth_gbps;
        out.reduction_latency_ns = d.reduction.rate.latency_ns;
        break;
      }
    if (options.protocols == 1) {
      out.latency_factor = f.x[0];
      out.bandwidth_factor = 1 / f.x[1];
      if (options.fit_overhead) out.message_overhead_ns = f.x[3] * 1000;
    } else {
      out.latency_factor = std::max(f.x[3], 1e-9);
      out.bandwidth_factor = 1 / f.x[4];
      out.low_latency = true;
      out.low_latency_efficiency = 1 / f.x[1];
    }
  } else if (options.fit_overhead) {
    const Fit3 f = fit_three(topo, points, fitted, options, tp);
    out.latency_factor = f.a;
    out.bandwidth_factor = 1 / f.inv_b;
    out.message_overhead_ns = f.o;
    out.iterations = f.iterations;
    out.fitted = with_overhead(with_protocol(topo, f.a, out.bandwidth_factor, nullptr), f.o);
  } else if (options.protocols == 1) {
    const Fit2 f = fit_two(topo, points, fitted, options, tp);
    out.latency_factor = f.a;
    out.bandwidth_factor = 1 / f.inv_b;
    out.iterations = f.iterations;
    out.fitted = with_protocol(topo, f.a, out.bandwidth_factor, nullptr);
  } else {
    // Two protocols: the rows below a size use the low-latency one. Every split between distinct fitted sizes
    // with at least two rows on each side is fitted (each side is an independent two-parameter fit, since a
    // ring-family row's messages are all of one size); the split with the least total cost wins.
    std::vector<double> sizes;
    for (size_t i : fitted) sizes.push_back(points[i].row.bytes);
    std::sort(sizes.begin(), sizes.end());
    sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
    double best = std::numeric_limits<double>::infinity();
    Fit2 lo_best, hi_best;
    double split_lo = 0, split_hi = 0;
    for (size_t k = 1; k < sizes.size(); ++k) {
      std::vector<size_t> lo, hi;
      for (size_t i : fitted) (points[i].row.bytes < sizes[k] ? lo : hi).push_back(i);
      if (lo.size() < 2 || hi.size() < 2) continue;
      const Fit2 fl = fit_two(topo, points, lo, options, tp), fh = fit_two(topo, points, hi, options, tp);
      if (fl.cost + fh.cost < best) {
        best = fl.cost + fh.cost;
        lo_best = fl, hi_best = fh, split_lo = sizes[k - 1], split_hi = sizes[k];
      }
    }
    if (!std::isfinite(best))
      throw ConfigError("calibrate: --protocols 2 needs at least two fitted rows of distinct sizes on each side");
    out.latency_factor = hi_best.a;
    out.bandwidth_factor = 1 / hi_best.inv_b;
    out.iterations = lo_best.iterations + hi_best.iterations;
    topology::Protocol ll;
    // A ring-family row of S bytes sends messages of about S/p bytes: the threshold lies between the two rows.
    ll.low_latency_max_bytes = std::floor((split_lo + split_hi) / 2 / topo.num_chips());
    ll.low_latency_efficiency = 1 / lo_best.inv_b;
    const double a_hi = std::max(hi_best.a, 1e-9);
    ll.low_latency_latency_factor = lo_best.a / a_hi;
    out.fitted = with_protocol(topo, a_hi, out.bandwidth_factor, &ll);
    out.low_latency = true;
    out.low_latency_efficiency = ll.low_latency_efficiency;
  }
  if (!fit.empty()) out.warnings = physical_warnings(out, options);
  double sum = 0;
  for (const auto& p : points) {
    Prediction pr;
    pr.log = p.log;
    pr.row = p.row;
    pr.fitted = p.fitted;
    pr.predicted_us = predict_us(out.fitted, p.log->collective, options.algorithm, p.row.bytes, tp, options.chunk_bytes);
    if (p.fitted) sum += pr.rel_error() * pr.rel_error();
    out.predictions.push_back(pr);
  }
  out.rms_rel_error = fitted.empty() ? 0.0 : std::sqrt(sum / static_cast<double>(fitted.size()));
  for (const auto* logs : {&fit, &held_out})
    for (const auto& log : *logs)
      if (!log.rows.empty()) out.algorithms.push_back(largest_row_algorithm(out.fitted, log, options, tp));
  return out;
}

std::string topology_yaml(const topology::Topology& topo) {
  using topology::DimKind;
  if (!topo.is_grid()) throw std::invalid_argument("graph topologies cannot be written back yet");
  std::ostringstream o;
  o << "topology:\n  kind: stacked\n  dims:\n";
  for (const auto& d : topo.dim_specs()) {
    o << "    - {kind: " << topology::dim_kind_name(d.kind) << ", size: " << d.size
      << ", bandwidth_gbps: " << format_number(d.link.bandwidth_gbps)
      << ", latency_ns: " << format_number(d.link.latency_ns);
    if (d.kind == DimKind::ring) o << ", bidirectional: " << (d.bidirectional ? "true" : "false");
    if (d.reduction.enabled)
      o << ", reduction: true, reduction_bandwidth_gbps: " << format_number(d.reduction.rate.bandwidth_gbps)
        << ", reduction_latency_ns: " << format_number(d.reduction.rate.latency_ns);
    o << "}\n";
  }
  if (const auto& p = topo.protocol(); !p.is_default()) {
    o << "  protocol: {efficiency: " << format_number(p.efficiency);
    if (p.low_latency_max_bytes > 0)
      o << ", low_latency_max_bytes: " << format_number(p.low_latency_max_bytes) << ", low_latency_efficiency: "
        << format_number(p.low_latency_efficiency)
        << ", low_latency_latency_factor: " << format_number(p.low_latency_latency_factor);
    if (p.message_overhead_ns > 0) o << ", message_overhead_ns: " << format_number(p.message_overhead_ns);
    if (p.call_overhead_ns > 0) o << ", call_overhead_ns: " << format_number(p.call_overhead_ns);
    o << "}\n";
  }
  if (!topo.identity_placement()) {
    o << "  placement: [";
    for (size_t i = 0; i < topo.placement().size(); ++i) o << (i ? ", " : "") << topo.placement()[i];
    o << "]\n";
  }
  return o.str();
}

}  // namespace shardsim::calibration

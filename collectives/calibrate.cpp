#include "collectives/calibrate.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>

#include "common/error.h"
#include "sim/device_spec.h"
#include "sim/timeline.h"

namespace shardsim::collectives {

namespace {

std::string algorithm_for(Collective c, const std::string& wanted) {
  if (wanted == "auto") return wanted;
  const std::string a = canonical_algorithm(c, wanted);
  return a.empty() ? algorithm_names(c).front() : a;
}

}  // namespace

double predict_us(const topology::Topology& topo, Collective c, const std::string& algorithm, double bytes,
                  const EstimateGroup& tp, size_t chunk_bytes) {
  const int chip = tp.rank_to_chip.at(static_cast<size_t>(tp.world->rank()));
  sim::Timeline timeline(chip, topo, sim::device_preset("generic"), /*record_events=*/false);
  runtime::Transport t(*tp.world, timeline, tp.rank_to_chip);
  std::string a = algorithm_for(c, algorithm);
  if (a == "auto") {
    CollectiveOptions o;
    o.chunk_bytes = chunk_bytes;
    a = choose(c, o, t, bytes).algorithm;
  } else if (const std::string why = obstacle(c, a, t); !why.empty()) {
    throw ConfigError(collective_name(c) + ": algorithm '" + a + "' cannot run on " + topo.describe() + ": " + why +
                      " (choose another with --algorithm)");
  }
  return estimate_ns(c, a, t, bytes, chunk_bytes) / 1e3;
}

namespace {

struct Point {
  const NcclLog* log;
  NcclRow row;
  bool fitted;
};

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

// Solves the NxN system M x = V (Gaussian elimination with partial pivoting); false when singular.
bool solve_n(std::vector<std::vector<double>> m, std::vector<double> v, std::vector<double>& x) {
  const size_t n = v.size();
  for (size_t c = 0; c < n; ++c) {
    size_t piv = c;
    for (size_t r = c + 1; r < n; ++r)
      if (std::fabs(m[r][c]) > std::fabs(m[piv][c])) piv = r;
    if (!(std::fabs(m[piv][c]) > 1e-300)) return false;
    std::swap(m[piv], m[c]);
    std::swap(v[piv], v[c]);
    for (size_t r = c + 1; r < n; ++r) {
      const double f = m[r][c] / m[c][c];
      for (size_t k = c; k < n; ++k) m[r][k] -= f * m[c][k];
      v[r] -= f * v[c];
    }
  }
  x.assign(n, 0);
  for (size_t c = n; c-- > 0;) {
    double s = v[c];
    for (size_t k = c + 1; k < n; ++k) s -= m[c][k] * x[k];
    x[c] = s / m[c][c];
  }
  return std::all_of(x.begin(), x.end(), [](double y) { return std::isfinite(y); });
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

// TOPO with link latencies x A and the protocol's efficiency B (the links keep their line rate; when B > 1 the
// measurement beat the file's line rate, so the links' bandwidth is raised instead and the efficiency is 1).
topology::Topology with_protocol(const topology::Topology& topo, double a, double b, const topology::Protocol* ll) {
  double scale = std::max(1.0, b);
  if (ll) scale = std::max(scale, ll->low_latency_efficiency);
  topology::Topology t = topo.scaled(a, scale);
  topology::Protocol p;
  p.efficiency = b / scale;
  if (ll) {
    p.low_latency_max_bytes = ll->low_latency_max_bytes;
    p.low_latency_efficiency = ll->low_latency_efficiency / scale;
    p.low_latency_latency_factor = ll->low_latency_latency_factor;
  }
  t.set_protocol(p);
  return t;
}


using Matrix = std::vector<std::vector<double>>;

// The part of column Q of the Gram matrix G that the other columns cannot express, relative to its length:
// 1 - R^2 of regressing column Q on the others (0: Q is a combination of them, so not identifiable).
double separation(const Matrix& g, size_t q) {
  if (!(g[q][q] > 0)) return 0;
  Matrix m;
  std::vector<double> v, beta;
  for (size_t r = 0; r < g.size(); ++r) {
    if (r == q) continue;
    std::vector<double> row;
    for (size_t c = 0; c < g.size(); ++c)
      if (c != q) row.push_back(g[r][c]);
    m.push_back(row);
    v.push_back(g[r][q]);
  }
  if (m.empty()) return 1;
  if (!solve_n(m, v, beta)) return 0;  // the others are degenerate already
  double explained = 0;
  for (size_t i = 0; i < v.size(); ++i) explained += v[i] * beta[i];
  return std::max(0.0, 1 - explained / g[q][q]);
}

// TOPO with its protocol's per-message overhead O and per-call overhead C (ns).
topology::Topology with_costs(topology::Topology t, double o_ns, double c_ns) {
  topology::Protocol p = t.protocol();
  p.message_overhead_ns = o_ns;
  p.call_overhead_ns = c_ns;
  t.set_protocol(p);
  return t;
}

// The fit with the per-call overhead c (fit_call_overhead; calibrate.h). Parameters x: protocols 1: a, 1/b, c
// [, o]; protocols 2: a_lo, 1/b_lo, a, 1/b, c (lo: the rows below the split). o and c in us.
struct FitC {
  std::vector<double> x;
  double cost = 0;
  int iterations = 0;
  double split_lo = 0, split_hi = 0;  // protocols 2
  bool ok = false;
};

class CallFitter {
 public:
  CallFitter(const topology::Topology& topo, const std::vector<Point>& points, const std::vector<size_t>& idx,
             const CalibrationOptions& options, const EstimateGroup& tp)
      : topo_(topo), points_(points), idx_(idx), opt_(options), tp_(tp) {
    // The linear model's basis per fitted row (us): L = the file's latencies at unlimited bandwidth, W = zero
    // latency at the file's bandwidth, M = 1 us of overhead per message alone, per us; c's column is 1.
    const double huge_bw = 1e12, o_unit = 1000;
    for (size_t i : idx_) {
      const auto& p = points_[i];
      Basis b;
      b.L = predict_us(topo_.scaled(1, huge_bw), p.log->collective, opt_.algorithm, p.row.bytes, tp_, opt_.chunk_bytes);
      b.W = predict_us(topo_.scaled(0, 1), p.log->collective, opt_.algorithm, p.row.bytes, tp_, opt_.chunk_bytes);
      if (opt_.fit_overhead)
        b.M = predict_us(with_costs(topo_.scaled(0, huge_bw), o_unit, 0), p.log->collective, opt_.algorithm,
                         p.row.bytes, tp_, opt_.chunk_bytes);
      basis_.push_back(b);
    }
  }

  // Refuses (ConfigError) when c, or o, cannot be told from the other parameters over every fitted row with one
  // protocol (a split into two protocols only adds parameters).
  void check_identifiable() const {
    // One protocol's columns: L, W, 1 [, M].
    const size_t n = opt_.fit_overhead ? 4 : 3;
    Matrix g(n, std::vector<double>(n, 0));
    for (size_t k = 0; k < idx_.size(); ++k) {
      const double inv = 1 / points_[idx_[k]].row.time_us;
      const double r[4] = {basis_[k].L * inv, basis_[k].W * inv, inv, basis_[k].M * inv};
      for (size_t i = 0; i < n; ++i)
        for (size_t j = 0; j < n; ++j) g[i][j] += r[i] * r[j];
    }
    if (!(separation(g, 2) > 1e-9))
      throw ConfigError(
          "calibrate --fit-call-overhead: the per-call overhead cannot be told from the latency in these rows: every "
          "fitted row's latency term is the same multiple of the link latency (one unpipelined schedule of one "
          "collective at one chip count: steps x hops x alpha for every size), so c and a x L are one intercept. "
          "Fit logs of collectives with different step counts together (e.g. all_reduce_perf and all_gather_perf "
          "logs: 2(p-1) and p-1 ring steps), or fit without --fit-call-overhead (the latency then absorbs it)");
    if (opt_.fit_overhead && !(separation(g, 3) > 1e-9))
      throw ConfigError(
          "calibrate --fit-overhead: the per-message overhead cannot be told from the latency and the per-call "
          "overhead in these rows (every fitted row charges messages and hop latencies in one ratio); fit without "
          "--fit-overhead or give rows where the ratio differs (--chunk-bytes)");
  }

  FitC fit() const {
    FitC best;
    if (opt_.protocols == 1) {
      best = linear(0);
    } else {
      std::vector<double> sizes;
      for (size_t i : idx_) sizes.push_back(points_[i].row.bytes);
      std::sort(sizes.begin(), sizes.end());
      sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
      best.cost = std::numeric_limits<double>::infinity();
      for (size_t k = 1; k < sizes.size(); ++k) {
        size_t lo = 0;
        for (size_t i : idx_) lo += points_[i].row.bytes < sizes[k];
        if (lo < 2 || idx_.size() - lo < 2) continue;
        FitC f = linear(sizes[k]);
        if (f.ok && f.cost < best.cost) {
          best = f;
          best.split_lo = sizes[k - 1], best.split_hi = sizes[k];
        }
      }
      if (!best.ok)
        throw ConfigError("calibrate: --protocols 2 --fit-call-overhead needs at least two fitted rows of distinct "
                          "sizes on each side of some split where the per-call overhead is identifiable");
    }
    refine(best);
    return best;
  }

  // The fitted topology of parameters X (protocols 2: with the low-latency protocol below F's split).
  topology::Topology build(const std::vector<double>& x, const FitC& f) const {
    const double c_ns = x[kC] * 1000, o_ns = opt_.fit_overhead && opt_.protocols == 1 ? x[3] * 1000 : 0;
    if (opt_.protocols == 1) return with_costs(with_protocol(topo_, x[0], 1 / x[1], nullptr), o_ns, c_ns);
    topology::Protocol ll;
    ll.low_latency_max_bytes = std::floor((f.split_lo + f.split_hi) / 2 / topo_.num_chips());
    ll.low_latency_efficiency = 1 / x[1];
    const double a_hi = std::max(x[3], 1e-9);
    ll.low_latency_latency_factor = std::min(x[0] / a_hi, 1e6);
    return with_costs(with_protocol(topo_, a_hi, 1 / x[4], &ll), 0, c_ns);
  }

  static constexpr size_t kC = 2;  // protocols 1: a, 1/b, c, [o]; protocols 2: a_lo, 1/b_lo, c, a, 1/b

 private:
  struct Basis {
    double L = 0, W = 0, M = 0;
  };
  size_t nparams() const { return opt_.protocols == 2 ? 5 : (opt_.fit_overhead ? 4 : 3); }

  // Per fitted row its design row, divided by the measured time (relative errors). Protocols 2: rows below
  // SPLIT_SIZE use the low-latency columns.
  Matrix rows(double split_size) const {
    Matrix out;
    for (size_t k = 0; k < idx_.size(); ++k) {
      const auto& b = basis_[k];
      const double inv = 1 / points_[idx_[k]].row.time_us;
      std::vector<double> r(nparams(), 0);
      r[kC] = inv;
      if (opt_.protocols == 1) {
        r[0] = b.L * inv, r[1] = b.W * inv;
        if (opt_.fit_overhead) r[3] = b.M * inv;
      } else if (points_[idx_[k]].row.bytes < split_size) {
        r[0] = b.L * inv, r[1] = b.W * inv;
      } else {
        r[3] = b.L * inv, r[4] = b.W * inv;
      }
      out.push_back(r);
    }
    return out;
  }

  // Weighted linear least squares of the basis model (exact for ring-family schedules), parameters that come out
  // negative (a, c, o) fixed at 0 and the rest refitted.
  FitC linear(double split_size) const {
    const Matrix design = rows(split_size);
    const size_t n = nparams();
    std::vector<bool> fixed(n, false);
    FitC f;
    for (int round = 0; round < 8; ++round) {
      Matrix g;
      std::vector<double> v;
      std::vector<size_t> free;
      for (size_t i = 0; i < n; ++i)
        if (!fixed[i]) free.push_back(i);
      for (size_t i : free) {
        std::vector<double> row;
        double vi = 0;
        for (size_t j : free) {
          double s = 0;
          for (const auto& r : design) s += r[i] * r[j];
          row.push_back(s);
        }
        for (const auto& r : design) vi += r[i];
        g.push_back(row);
        v.push_back(vi);
      }
      std::vector<double> sol;
      if (!solve_n(g, v, sol)) return f;
      f.x.assign(n, 0);
      for (size_t k = 0; k < free.size(); ++k) f.x[free[k]] = sol[k];
      bool changed = false;
      for (size_t i = 0; i < n; ++i)
        if (!fixed[i] && !is_inverse_bandwidth(i) && f.x[i] < 0) fixed[i] = changed = true;
      if (!changed) break;
    }
    for (size_t i = 0; i < n; ++i) {
      if (is_inverse_bandwidth(i) && !(f.x[i] > 0)) f.x[i] = 1;
      if (!is_inverse_bandwidth(i)) f.x[i] = std::max(0.0, f.x[i]);
    }
    f.cost = 0;
    for (const auto& r : design) {
      double pred = 0;
      for (size_t i = 0; i < n; ++i) pred += r[i] * f.x[i];
      f.cost += (pred - 1) * (pred - 1);
    }
    f.ok = true;
    return f;
  }
  bool is_inverse_bandwidth(size_t i) const { return i == 1 || (opt_.protocols == 2 && i == 4); }

  double cost(const std::vector<double>& x, const FitC& f) const {
    const topology::Topology t = build(x, f);
    double sum = 0;
    for (size_t i : idx_) {
      const auto& p = points_[i];
      const double r =
          (predict_us(t, p.log->collective, opt_.algorithm, p.row.bytes, tp_, opt_.chunk_bytes) - p.row.time_us) /
          p.row.time_us;
      sum += r * r;
    }
    return sum;
  }

  // Gauss-Newton with step halving on the full replay (refines where a max over paths, `auto` or the protocol
  // threshold makes the model piecewise), a, c, o kept >= 0 and 1/b > 0.
  void refine(FitC& f) const {
    const size_t n = f.x.size();
    f.cost = cost(f.x, f);
    for (int it = 0; it < 30; ++it) {
      f.iterations = it + 1;
      const topology::Topology base_t = build(f.x, f);
      std::vector<topology::Topology> moved;
      std::vector<double> h(n);
      for (size_t q = 0; q < n; ++q) {
        h[q] = std::max(std::fabs(f.x[q]), 1e-3) * 1e-4;
        std::vector<double> y = f.x;
        y[q] += h[q];
        moved.push_back(build(y, f));
      }
      Matrix jtj(n, std::vector<double>(n, 0));
      std::vector<double> jtr(n, 0);
      for (size_t i : idx_) {
        const auto& p = points_[i];
        auto pred = [&](const topology::Topology& t) {
          return predict_us(t, p.log->collective, opt_.algorithm, p.row.bytes, tp_, opt_.chunk_bytes);
        };
        const double t = p.row.time_us, v = pred(base_t), r = (v - t) / t;
        std::vector<double> d(n);
        for (size_t q = 0; q < n; ++q) d[q] = (pred(moved[q]) - v) / h[q] / t;
        for (size_t q = 0; q < n; ++q) {
          jtr[q] -= d[q] * r;
          for (size_t c = 0; c < n; ++c) jtj[q][c] += d[q] * d[c];
        }
      }
      std::vector<double> step;
      if (!solve_n(jtj, jtr, step)) break;
      bool improved = false;
      for (double k = 1; k > 1e-3; k /= 2) {
        std::vector<double> y = f.x;
        bool valid = true;
        for (size_t q = 0; q < n; ++q) {
          y[q] += k * step[q];
          if (is_inverse_bandwidth(q)) valid = valid && y[q] > 0;
          else y[q] = std::max(0.0, y[q]);
        }
        if (!valid) continue;
        const double c1 = cost(y, f);
        if (c1 < f.cost) {
          improved = f.cost - c1 > 1e-14 * (1 + f.cost);
          f.x = y, f.cost = c1;
          break;
        }
      }
      if (!improved) break;
    }
  }

  const topology::Topology& topo_;
  const std::vector<Point>& points_;
  const std::vector<size_t>& idx_;
  const CalibrationOptions& opt_;
  const EstimateGroup& tp_;
  std::vector<Basis> basis_;
};

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
  return out;
}

}  // namespace

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
  const size_t need = (options.protocols == 1 ? 2 : 4) + (options.fit_overhead ? 1 : 0) +
                      (options.fit_call_overhead ? 1 : 0);
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
  } else if (options.fit_call_overhead) {
    const CallFitter cf(topo, points, fitted, options, tp);
    cf.check_identifiable();
    const FitC f = cf.fit();
    out.call_overhead_ns = f.x[CallFitter::kC] * 1000;
    out.iterations = f.iterations;
    out.fitted = cf.build(f.x, f);
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

}  // namespace shardsim::collectives

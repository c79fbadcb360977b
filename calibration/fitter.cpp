#include "calibration/fitter.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/error.h"

namespace shardsim::calibration::fit {

using namespace collectives;  // the collectives this room calibrates / verifies

// Solves the NxN system M x = V (Gaussian elimination with partial pivoting); false when singular.
bool solve_n(Matrix m, std::vector<double> v, std::vector<double>& x) {
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

bool has_reduction(const topology::Topology& topo) {
  if (!topo.is_grid()) return false;
  const auto& dims = topo.dim_specs();
  return std::any_of(dims.begin(), dims.end(), [](const topology::Dim& d) { return d.reduction.enabled; });
}

topology::Topology with_reduction(const topology::Topology& topo, double inv_factor, double latency_ns) {
  std::vector<topology::Dim> dims = topo.dim_specs();
  for (auto& d : dims) {
    if (!d.reduction.enabled) continue;
    d.reduction.rate.bandwidth_gbps =
        std::clamp(d.reduction.rate.bandwidth_gbps / inv_factor, topology::kMinBandwidthGbps, topology::kMaxBandwidthGbps);
    d.reduction.rate.latency_ns = std::clamp(latency_ns, 0.0, topology::kMaxLatencyNs);
  }
  topology::Topology t = topology::Topology::stacked(dims);
  if (!topo.identity_placement()) t.set_placement(topo.placement());
  t.set_protocol(topo.protocol());
  return t;
}

namespace {

constexpr double kHugeBw = 1e12;   // bandwidth factor standing for "unlimited" links
constexpr double kUnlimitedRate = 1e-6;  // 1/r for an unlimited reduction rate (clamped to kMaxBandwidthGbps)
constexpr double kUnitNs = 1000;   // 1 us of an overhead or latency, for a basis column per us

}  // namespace

Fitter::Fitter(const topology::Topology& topo, const std::vector<Point>& points, const std::vector<size_t>& idx,
               const CalibrationOptions& options, const EstimateGroup& tp, bool reduction)
    : topo_(topo), points_(points), idx_(idx), opt_(options), tp_(tp), reduction_(reduction) {
  pin_.assign(nparams(), std::numeric_limits<double>::quiet_NaN());
  if (!opt_.fit_call_overhead) pin_[kC] = 0;
  // The linear model's basis per fitted row (us): L = the file's latencies at unlimited bandwidth, W = zero
  // latency at the file's bandwidth, M = 1 us of overhead per message alone, per us; c's column is 1. With the
  // reduction (its rate unlimited in L, W, M): X = the file's reduction rate alone (links unlimited, no latency),
  // D = what 1 us of reduction latency adds (1 on rows that run in_switch, 0 on others).
  // Each row's columns come from the algorithm it runs on the file's topology (auto's choice there: the unlimited
  // rates below could change auto's choice, and the columns must be of one schedule).
  std::string alg;
  auto at = [&](const topology::Topology& t, const Point& p) {
    return predict_us(t, p.log->collective, alg, p.row.bytes, tp_, opt_.chunk_bytes);
  };
  const topology::Topology base = reduction_ ? with_reduction(topo_, kUnlimitedRate, 0) : topo_;
  for (size_t i : idx_) {
    const auto& p = points_[i];
    alg = opt_.algorithm == "auto"
              ? resolve_algorithm(topo_, p.log->collective, opt_.algorithm, p.row.bytes, tp_, opt_.chunk_bytes).algorithm
              : opt_.algorithm;
    Basis b;
    b.L = at(base.scaled(1, kHugeBw), p);
    b.W = at(base.scaled(0, 1), p);
    if (opt_.fit_overhead) b.M = at(with_costs(base.scaled(0, kHugeBw), kUnitNs, 0), p);
    if (reduction_) {
      b.X = at(with_reduction(topo_, 1, 0).scaled(0, kHugeBw), p);
      b.D = (at(with_reduction(topo_, kUnlimitedRate, kUnitNs).scaled(0, kHugeBw), p) - at(base.scaled(0, kHugeBw), p));
    }
    basis_.push_back(b);
  }
}

Matrix Fitter::gram(const std::vector<size_t>& cols) const {
  // Canonical columns of one protocol: 0 L (a), 1 W (1/b), 2 one (c), 3 M (o), 4 X (1/r), 5 D (alpha_R).
  Matrix g(cols.size(), std::vector<double>(cols.size(), 0));
  for (size_t k = 0; k < idx_.size(); ++k) {
    const auto& b = basis_[k];
    const double inv = 1 / points_[idx_[k]].row.time_us;
    const double r[6] = {b.L * inv, b.W * inv, inv, b.M * inv, b.X * inv, b.D * inv};
    for (size_t i = 0; i < cols.size(); ++i)
      for (size_t j = 0; j < cols.size(); ++j) g[i][j] += r[cols[i]] * r[cols[j]];
  }
  return g;
}

void Fitter::check_identifiable() {
  // The free parameters as one protocol's canonical columns (gram).
  auto free_cols = [&] {
    std::vector<size_t> cols;
    if (!(opt_.protocols == 1 && pinned(0))) cols.push_back(0);
    cols.push_back(1);
    if (opt_.fit_call_overhead) cols.push_back(2);
    if (opt_.fit_overhead) cols.push_back(3);
    if (reduction_) cols.push_back(4), cols.push_back(5);
    return cols;
  };
  auto separated = [&](size_t param) {  // PARAM: a canonical column
    const auto cols = free_cols();
    const auto it = std::find(cols.begin(), cols.end(), param);
    return separation(gram(cols), static_cast<size_t>(it - cols.begin())) > 1e-9;
  };
  if (reduction_ && !separated(5)) {
    pin_[0] = 1;  // the intercept goes to the switch; the links keep the file's latency
    if (!separated(5))
      throw ConfigError(
          opt_.fit_call_overhead
              ? "calibrate: the switch's reduction latency cannot be told from the per-call overhead in these rows: "
                "every in_switch row pays each once (both one constant per call). Fit without --fit-call-overhead "
                "(the reduction latency then absorbs the per-call cost)"
              : "calibrate: the switch's reduction latency cannot be told from the other parameters in these rows "
                "(no fitted row pays it in a different ratio to them)");
  }
  if (reduction_ && !separated(4))
    throw ConfigError(
        "calibrate: the switch's reduction bandwidth cannot be told from the links' efficiency in these rows: every "
        "fitted row's time grows with the size in one ratio of the two (e.g. only rows of 64 MiB or more, where "
        "the pieces no longer change). Give rows from below 1 MiB to above it (the pieces then differ)");
  if (opt_.fit_call_overhead && !separated(2))
    throw ConfigError(
        "calibrate --fit-call-overhead: the per-call overhead cannot be told from the latency in these rows: every "
        "fitted row's latency term is the same multiple of the link latency (one unpipelined schedule of one "
        "collective at one chip count: steps x hops x alpha for every size), so c and a x L are one intercept. "
        "Fit logs of collectives with different step counts together (e.g. all_reduce_perf and all_gather_perf "
        "logs: 2(p-1) and p-1 ring steps), or fit without --fit-call-overhead (the latency then absorbs it)");
  if (opt_.fit_overhead && !separated(3))
    throw ConfigError(
        "calibrate --fit-overhead: the per-message overhead cannot be told from the latency and the per-call "
        "overhead in these rows (every fitted row charges messages and hop latencies in one ratio); fit without "
        "--fit-overhead or give rows where the ratio differs (--chunk-bytes)");
}

FitC Fitter::fit() const {
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

FitC Fitter::fit_from(const std::vector<double>& x) const {
  FitC f;
  f.x = x;
  f.ok = true;
  refine(f);
  return f;
}

topology::Topology Fitter::build(const std::vector<double>& x, const FitC& f) const {
  const double c_ns = x[kC] * 1000, o_ns = opt_.fit_overhead && opt_.protocols == 1 ? x[3] * 1000 : 0;
  const topology::Topology& base =
      reduction_ ? with_reduction(topo_, x[rate_index()], x[reduction_latency_index()] * 1000) : topo_;
  if (opt_.protocols == 1) return with_costs(with_protocol(base, x[0], 1 / x[1], nullptr), o_ns, c_ns);
  topology::Protocol ll;
  ll.low_latency_max_bytes = std::floor((f.split_lo + f.split_hi) / 2 / topo_.num_chips());
  ll.low_latency_efficiency = 1 / x[1];
  const double a_hi = std::max(x[3], 1e-9);
  ll.low_latency_latency_factor = std::min(x[0] / a_hi, 1e6);
  return with_costs(with_protocol(base, a_hi, 1 / x[4], &ll), 0, c_ns);
}

// Per fitted row its design row, divided by the measured time (relative errors). Protocols 2: rows below
// SPLIT_SIZE use the low-latency columns.
Matrix Fitter::rows(double split_size) const {
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
    if (reduction_) r[rate_index()] = b.X * inv, r[reduction_latency_index()] = b.D * inv;
    out.push_back(r);
  }
  return out;
}

// Weighted linear least squares of the basis model (exact for ring-family schedules; a start for the in-switch
// reduction, whose time is a max of the links' and the switch's rates), pinned parameters held, free ones that
// come out negative (a, c, o, alpha_R) fixed at 0 and the rest refitted.
FitC Fitter::linear(double split_size) const {
  const Matrix design = rows(split_size);
  const size_t n = nparams();
  std::vector<bool> fixed(n, false);
  for (size_t i = 0; i < n; ++i) fixed[i] = pinned(i);
  std::vector<double> rhs;  // 1 minus what the pinned parameters explain
  for (const auto& r : design) {
    double s = 1;
    for (size_t i = 0; i < n; ++i)
      if (pinned(i)) s -= r[i] * pin_[i];
    rhs.push_back(s);
  }
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
      for (size_t k = 0; k < design.size(); ++k) vi += design[k][i] * rhs[k];
      g.push_back(row);
      v.push_back(vi);
    }
    std::vector<double> sol;
    if (!solve_n(g, v, sol)) return f;
    f.x.assign(n, 0);
    for (size_t i = 0; i < n; ++i)
      if (pinned(i)) f.x[i] = pin_[i];
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

double Fitter::cost(const std::vector<double>& x, const FitC& f) const {
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

// Gauss-Newton with step halving on the full replay (refines where a max over paths, `auto`, the protocol
// threshold or the in-switch pipeline makes the model piecewise) over the free parameters, a, c, o, alpha_R kept
// >= 0 and the inverse bandwidths > 0.
void Fitter::refine(FitC& f) const {
  std::vector<size_t> free;
  for (size_t q = 0; q < f.x.size(); ++q)
    if (!pinned(q)) free.push_back(q);
  const size_t n = free.size();
  f.cost = cost(f.x, f);
  for (int it = 0; it < 30; ++it) {
    f.iterations = it + 1;
    const topology::Topology base_t = build(f.x, f);
    std::vector<topology::Topology> moved;
    std::vector<double> h(n);
    for (size_t k = 0; k < n; ++k) {
      h[k] = std::max(std::fabs(f.x[free[k]]), 1e-3) * 1e-4;
      std::vector<double> y = f.x;
      y[free[k]] += h[k];
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
        const size_t i = free[q];
        y[i] += k * step[q];
        if (is_inverse_bandwidth(i)) valid = valid && y[i] > 0;
        else y[i] = std::max(0.0, y[i]);
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

}  // namespace shardsim::calibration::fit

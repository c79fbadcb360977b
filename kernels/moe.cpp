#include "kernels/moe.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>

#include "kernels/backward.h"
#include "kernels/gemm.h"

namespace shardsim::kernels {

using runtime::Tensor;

RouterScore parse_router_score(const std::string& name) {
  if (name == "softmax") return RouterScore::softmax;
  if (name == "sigmoid") return RouterScore::sigmoid;
  throw std::invalid_argument("unknown router score '" + name + "' (known: softmax, sigmoid)");
}
const char* router_score_name(RouterScore s) { return s == RouterScore::softmax ? "softmax" : "sigmoid"; }
DropPolicy parse_drop_policy(const std::string& name) {
  if (name == "position") return DropPolicy::position;
  if (name == "probs") return DropPolicy::probs;
  throw std::invalid_argument("unknown drop policy '" + name + "' (known: position, probs)");
}
const char* drop_policy_name(DropPolicy p) { return p == DropPolicy::position ? "position" : "probs"; }

int64_t CapacityOptions::capacity(int64_t tokens, int64_t top_k, int64_t experts) const {
  if (factor <= 0) return std::numeric_limits<int64_t>::max();
  return int64_t(std::ceil(factor * double(tokens) * double(top_k) / double(experts)));
}

Routing Routing::from_counts(int64_t tokens, int64_t top_k, std::vector<int64_t> counts) {
  Routing r;
  r.tokens = tokens;
  r.top_k = top_k;
  r.experts = int64_t(counts.size());
  r.has_values = false;
  r.counts = std::move(counts);
  return r;
}

std::vector<int64_t> Routing::offsets() const {
  std::vector<int64_t> o(counts.size() + 1, 0);
  for (size_t e = 0; e < counts.size(); ++e) o[e + 1] = o[e] + counts[e];
  return o;
}
int64_t Routing::rows() const { return std::accumulate(counts.begin(), counts.end(), int64_t{0}); }

namespace {

void check_options(const RouterOptions& o) {
  if (o.experts < 1 || o.top_k < 1 || o.top_k > o.experts)
    throw std::invalid_argument("router: want 1 <= top_k <= experts, got top_k " + std::to_string(o.top_k) +
                                ", experts " + std::to_string(o.experts));
  if (!o.bias.empty() && int64_t(o.bias.size()) != o.experts)
    throw std::invalid_argument("router: bias has " + std::to_string(o.bias.size()) + " entries for " +
                                std::to_string(o.experts) + " experts");
  if (o.groups < 1 || o.experts % o.groups != 0)
    throw std::invalid_argument("router: " + std::to_string(o.experts) + " experts do not split into " +
                                std::to_string(o.groups) + " equal expert groups");
  if (o.group_limit < 0 || o.group_top < 0 || o.group_top > o.experts / o.groups)
    throw std::invalid_argument("router: group_limit " + std::to_string(o.group_limit) + " and group_top " +
                                std::to_string(o.group_top) + " must be >= 0, group_top at most a group's " +
                                std::to_string(o.experts / o.groups) + " experts");
  if (o.group_limited() && o.top_k > o.group_limit * (o.experts / o.groups))
    throw std::invalid_argument("router: top_k " + std::to_string(o.top_k) + " above the " +
                                std::to_string(o.group_limit * (o.experts / o.groups)) + " experts of " +
                                std::to_string(o.group_limit) + " groups");
}

// Does choice key A (expert ia) rank above B (expert ib)? NaN above numbers (torch.topk), ties to the lower id.
bool ranks_above(float a, int64_t ia, float b, int64_t ib) {
  const bool na = std::isnan(a), nb = std::isnan(b);
  if (na || nb) return na && nb ? ia < ib : na;
  return a > b || (a == b && ia < ib);
}

// Node-limited routing: clears ELIGIBLE[e] for the experts outside the token's O.group_limit best groups by KEY
// (group score = the sum of its group_top best keys; NaN above numbers; ties to the lower group).
void limit_groups(const std::vector<float>& key, const RouterOptions& o, std::vector<uint8_t>& eligible) {
  const int64_t G = o.groups, n = o.experts / G;
  const int64_t top = o.group_top > 0 ? o.group_top : std::clamp<int64_t>(o.top_k / o.group_limit, 1, n);
  std::vector<float> score(static_cast<size_t>(G)), best(static_cast<size_t>(n));
  for (int64_t g = 0; g < G; ++g) {
    std::copy(key.begin() + g * n, key.begin() + (g + 1) * n, best.begin());
    std::partial_sort(best.begin(), best.begin() + top, best.end(), [](float a, float b) {
      return std::isnan(a) ? !std::isnan(b) : a > b;  // NaN first
    });
    float sum = 0.0f;
    for (int64_t i = 0; i < top; ++i) sum += best[size_t(i)];
    score[size_t(g)] = sum;
  }
  std::vector<uint8_t> chosen(static_cast<size_t>(G), 0);
  for (int64_t j = 0; j < o.group_limit; ++j) {
    int64_t b = -1;
    for (int64_t g = 0; g < G; ++g)
      if (!chosen[size_t(g)] && (b < 0 || ranks_above(score[size_t(g)], g, score[size_t(b)], b))) b = g;
    chosen[size_t(b)] = 1;
  }
  for (int64_t e = 0; e < o.experts; ++e) eligible[size_t(e)] = chosen[size_t(e / n)];
}

void scores_of(const float* l, int64_t E, RouterScore score, float* s) {
  if (score == RouterScore::sigmoid) {
    for (int64_t e = 0; e < E; ++e) s[e] = 1.0f / (1.0f + std::exp(-l[e]));
    return;
  }
  float m = -std::numeric_limits<float>::infinity();
  bool nan = false;
  for (int64_t e = 0; e < E; ++e) {
    nan = nan || std::isnan(l[e]);
    m = std::max(m, l[e]);
  }
  double sum = 0;
  for (int64_t e = 0; e < E; ++e) sum += std::exp(double(l[e]) - double(m));
  for (int64_t e = 0; e < E; ++e)
    s[e] = nan ? std::numeric_limits<float>::quiet_NaN() : float(std::exp(double(l[e]) - double(m)) / sum);
}

// The aux loss's probabilities p~ of one token: the softmax scores, or the sigmoid scores over their sum.
double aux_norm(const float* s, int64_t E, RouterScore score) {
  if (score == RouterScore::softmax) return 1.0;
  double sum = 0;
  for (int64_t e = 0; e < E; ++e) sum += s[e];
  return sum;
}

void check_rows(const Tensor& t, int64_t rows, int64_t cols, const char* what, const char* op) {
  if (t.rank() != 2 || t.dim(0) != rows || (cols >= 0 && t.dim(1) != cols))
    throw std::invalid_argument(std::string(op) + ": " + what + " is " + runtime::shape_str(t.shape()) + ", want [" +
                                std::to_string(rows) + ", " + (cols >= 0 ? std::to_string(cols) : "h") + "]");
}

void check_routing(const Routing& r, const char* op) {
  if (int64_t(r.counts.size()) != r.experts)
    throw std::invalid_argument(std::string(op) + ": routing has no counts (route and apply_capacity first)");
  if (r.has_values && int64_t(r.kept.size()) != r.tokens * r.top_k)
    throw std::invalid_argument(std::string(op) + ": routing has no capacity decision (apply_capacity first)");
}

double es(const Tensor& t) { return double(runtime::dtype_size(t.dtype())); }

}  // namespace

KernelCost route(const Tensor& logits, const RouterOptions& o, Routing& out) {
  check_options(o);
  if (logits.rank() != 2 || logits.dim(1) != o.experts)
    throw std::invalid_argument("route: logits " + runtime::shape_str(logits.shape()) + ", want [T, " +
                                std::to_string(o.experts) + "]");
  const int64_t T = logits.dim(0), E = o.experts, k = o.top_k;
  const double score_flops = o.score == RouterScore::softmax ? 5.0 : 4.0;
  const double group_flops = o.group_limited() ? 2.0 : 0.0;  // the group scores and the mask
  KernelCost cost{"moe.router", double(T) * double(E) * (score_flops + double(k) + group_flops) + double(T * k) * 3.0,
                  double(T * E) * (es(logits) + 4.0) + double(T * k) * 9.0, logits.dtype(), {}};
  if (!logits.has_storage()) {
    if (out.has_values || out.tokens != T || out.experts != E || out.top_k != k)
      throw std::invalid_argument("route: a shape-only route needs Routing::from_counts(" + std::to_string(T) +
                                  " tokens, top_k " + std::to_string(k) + ", " + std::to_string(E) + " counts)");
    return cost;
  }
  out = Routing{};
  out.tokens = T;
  out.experts = E;
  out.top_k = k;
  out.expert.assign(size_t(T * k), 0);
  out.weight.assign(size_t(T * k), 0.0f);
  out.scores.assign(size_t(T * E), 0.0f);
  const std::vector<float> l = logits.to_float();
  std::vector<float> key(static_cast<size_t>(E));
  std::vector<uint8_t> taken(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    float* s = out.scores.data() + t * E;
    scores_of(l.data() + t * E, E, o.score, s);
    for (int64_t e = 0; e < E; ++e) key[size_t(e)] = s[e] + (o.bias.empty() ? 0.0f : o.bias[size_t(e)]);
    std::fill(taken.begin(), taken.end(), 0);
    if (o.group_limited()) {  // the experts outside the token's groups count as taken
      limit_groups(key, o, taken);
      for (auto& v : taken) v = uint8_t(!v);
    }
    double sum = 0;
    for (int64_t j = 0; j < k; ++j) {
      int64_t best = -1;
      for (int64_t e = 0; e < E; ++e)
        if (!taken[size_t(e)] && (best < 0 || ranks_above(key[size_t(e)], e, key[size_t(best)], best))) best = e;
      taken[size_t(best)] = 1;
      out.expert[size_t(t * k + j)] = int32_t(best);
      sum += s[best];
    }
    for (int64_t j = 0; j < k; ++j) {
      const double sj = s[out.expert[size_t(t * k + j)]];
      out.weight[size_t(t * k + j)] = float(o.scale * (o.normalize ? sj / sum : sj));
    }
  }
  return cost;
}

KernelCost router_logits(const Tensor& x, const Tensor& w, Tensor& logits) {
  const auto shape_of = [](const Tensor& t) { return Tensor::make(t.dtype(), t.shape(), false); };
  Tensor xs = shape_of(x), ws = shape_of(w), ls = shape_of(logits);
  const KernelCost cost = gemm(xs, ws, ls);  // the shapes' checks and the GEMM's cost
  if (cost_only({&x, &w}, {&logits})) return cost;
  const int64_t T = x.dim(0), h = x.dim(1), E = w.dim(1);
  const std::vector<float> xv = x.to_float(), wv = w.to_float();
  std::vector<double> wt(size_t(E * h));  // W^T in fp64: expert e's column contiguous
  for (int64_t i = 0; i < h; ++i)
    for (int64_t e = 0; e < E; ++e) wt[size_t(e * h + i)] = double(wv[size_t(i * E + e)]);
  for (int64_t t = 0; t < T; ++t) {
    const float* xr = xv.data() + t * h;
    for (int64_t e = 0; e < E; ++e) {
      const double* wc = wt.data() + e * h;
      double acc = 0;
      for (int64_t i = 0; i < h; ++i) acc += double(xr[i]) * wc[i];
      logits.set(t * E + e, float(acc));
    }
  }
  return cost;
}

KernelCost apply_capacity(Routing& r, const CapacityOptions& c) {
  const int64_t T = r.tokens, k = r.top_k, E = r.experts, n = T * k;
  if (c.groups < 1 || T % c.groups != 0)
    throw std::invalid_argument("apply_capacity: " + std::to_string(T) + " tokens do not split into " +
                                std::to_string(c.groups) + " equal groups");
  const bool sort = c.factor > 0 && c.policy == DropPolicy::probs;
  KernelCost cost{"moe.capacity", 2.0 * double(n) + (sort && n > 1 ? double(n) * std::log2(double(n)) : 0.0),
                  14.0 * double(n), runtime::DType::fp32, {}};
  if (!r.has_values) return cost;  // shape-only: the declared counts are the kept rows
  const int64_t G = c.groups, Tg = T / G, S = std::max<int64_t>(c.split, 1);
  if (Tg % S != 0 || (!c.order.empty() && int64_t(c.order.size()) != Tg))
    throw std::invalid_argument("apply_capacity: a group of " + std::to_string(Tg) + " tokens does not split into " +
                                std::to_string(S) + " pieces (order of " + std::to_string(c.order.size()) + ")");
  for (const int64_t q : c.order)
    if (q < 0 || q >= Tg) throw std::invalid_argument("apply_capacity: order names token " + std::to_string(q) +
                                                      " of a group of " + std::to_string(Tg));
  const int64_t Tp = Tg / S, C = c.capacity(Tp, k, E);
  r.kept.assign(size_t(n), 1);
  r.chosen.assign(size_t(G * E), 0);
  r.counts.assign(size_t(E), 0);
  r.dropped = 0;
  std::vector<std::vector<int64_t>> of_expert(static_cast<size_t>(E));  // assignments (t·k + j) of a piece, its order
  for (int64_t gp = 0; gp < G * S; ++gp) {  // group g = gp / S, its piece gp % S
    const int64_t g = gp / S, piece = gp % S;
    for (auto& v : of_expert) v.clear();
    for (int64_t q = piece * Tp; q < (piece + 1) * Tp; ++q) {
      const int64_t t = g * Tg + (c.order.empty() ? q : c.order[size_t(q)]);
      for (int64_t i = t * k; i < (t + 1) * k; ++i) of_expert[size_t(r.expert[size_t(i)])].push_back(i);
    }
    for (int64_t e = 0; e < E; ++e) {
      auto& v = of_expert[size_t(e)];
      r.chosen[size_t(g * E + e)] += int64_t(v.size());
      if (int64_t(v.size()) <= C) continue;
      if (c.policy == DropPolicy::probs)
        std::stable_sort(v.begin(), v.end(), [&](int64_t a, int64_t b) {
          return ranks_above(r.weight[size_t(a)], a, r.weight[size_t(b)], b);
        });
      for (size_t i = size_t(C); i < v.size(); ++i) {
        r.kept[size_t(v[i])] = 0;
        r.weight[size_t(v[i])] = 0.0f;
        ++r.dropped;
      }
    }
  }
  for (int64_t i = 0; i < n; ++i)
    if (r.kept[size_t(i)]) ++r.counts[size_t(r.expert[size_t(i)])];
  return cost;
}

namespace {
// Whether R's aux group spans chips (Routing::span_chosen), checked: one local group, E counts, tokens >= T.
bool check_span(const Routing& r, int64_t groups, const char* what) {
  if (r.span_chosen.empty()) return false;
  if (groups != 1 || int64_t(r.span_chosen.size()) != r.experts || r.span_tokens < r.tokens)
    throw std::invalid_argument(std::string(what) + ": a spanning aux group needs one local group, " +
                                std::to_string(r.experts) + " counts and at least " + std::to_string(r.tokens) +
                                " tokens (got " + std::to_string(groups) + ", " +
                                std::to_string(r.span_chosen.size()) + ", " + std::to_string(r.span_tokens) + ")");
  return true;
}
}  // namespace

double aux_loss(const Routing& r, const RouterOptions& o, double coef, int64_t groups, std::vector<double>* per_group,
                KernelCost* cost) {
  const int64_t T = r.tokens, E = r.experts;
  if (cost) *cost = KernelCost{"moe.aux_loss", 2.0 * double(T * E), 4.0 * double(T * E), runtime::DType::fp32, {}};
  if (per_group) per_group->clear();
  if (!r.has_values) return 0;
  if (groups < 1 || T % groups != 0 || int64_t(r.chosen.size()) != groups * E)
    throw std::invalid_argument("aux_loss: routing's groups differ from " + std::to_string(groups));
  const bool span = check_span(r, groups, "aux_loss");
  const int64_t Tg = T / groups, Tc = span ? r.span_tokens : Tg;  // rows here, tokens of the loss's group
  double mean = 0;
  for (int64_t g = 0; g < groups; ++g) {
    std::vector<double> P(size_t(E), 0.0);
    for (int64_t t = g * Tg; t < (g + 1) * Tg; ++t) {
      const float* s = r.scores.data() + t * E;
      const double norm = aux_norm(s, E, o.score);
      for (int64_t e = 0; e < E; ++e) P[size_t(e)] += s[e] / norm;
    }
    const int64_t* c = span ? r.span_chosen.data() : r.chosen.data() + g * E;
    double sum = 0;
    for (int64_t e = 0; e < E; ++e) sum += double(c[e]) / double(Tc * r.top_k) * (P[size_t(e)] / double(Tc));
    const double aux = coef * double(E) * sum;
    if (per_group) per_group->push_back(aux);
    mean += aux / double(groups);
  }
  return mean;
}

std::vector<int64_t> permuted_rows(const Routing& r) {
  check_routing(r, "permuted_rows");
  if (!r.has_values) throw std::invalid_argument("permuted_rows: shape-only routing has no rows");
  std::vector<int64_t> row_of(size_t(r.tokens * r.top_k), -1);
  std::vector<int64_t> next = r.offsets();
  for (int64_t i = 0; i < r.tokens * r.top_k; ++i)
    if (r.kept[size_t(i)]) row_of[size_t(i)] = next[size_t(r.expert[size_t(i)])]++;
  return row_of;
}

KernelCost permute(const Tensor& x, const Routing& r, Tensor& xp) {
  check_routing(r, "permute");
  const int64_t N = r.rows();
  check_rows(x, r.tokens, -1, "X", "permute");
  check_rows(xp, N, x.dim(1), "XP", "permute");
  if (x.dtype() != xp.dtype()) throw std::invalid_argument("permute: X and XP dtypes differ");
  const int64_t h = x.dim(1);
  KernelCost cost{"moe.permute", 0, 2.0 * double(N * h) * es(x) + 8.0 * double(N), x.dtype(), {}};
  if (cost_only({&x}, {&xp}) || !r.has_values) {
    if (xp.has_storage()) xp.drop_storage();
    return cost;
  }
  const auto row_of = permuted_rows(r);
  const size_t row_bytes = size_t(h) * runtime::dtype_size(x.dtype());
  const auto* src = static_cast<const unsigned char*>(x.data());
  auto* dst = static_cast<unsigned char*>(xp.data());
  for (int64_t i = 0; i < r.tokens * r.top_k; ++i)
    if (row_of[size_t(i)] >= 0)
      std::copy_n(src + size_t(i / r.top_k) * row_bytes, row_bytes, dst + size_t(row_of[size_t(i)]) * row_bytes);
  return cost;
}

// Each token's kept rows of the permuted IN [N, h] summed into its row of a [T, h] result, in choice order, each
// times its routing weight (WEIGHT, T·k) or 1 (nullptr): unpermute's combine and permute's backward.
static std::vector<float> sum_kept_rows(const Tensor& in_t, const Routing& r, const float* weight) {
  const int64_t T = r.tokens, k = r.top_k, h = in_t.dim(1);
  const auto row_of = permuted_rows(r);
  const std::vector<float> in = in_t.to_float();
  std::vector<float> out(size_t(T * h), 0.0f);
  for (int64_t t = 0; t < T; ++t) {
    float* acc = out.data() + t * h;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t row = row_of[size_t(t * k + j)];
      if (row < 0) continue;
      const float w = weight ? weight[size_t(t * k + j)] : 1.0f;
      const float* src = in.data() + row * h;
      for (int64_t c = 0; c < h; ++c) acc[c] += w * src[c];
    }
  }
  return out;
}

KernelCost unpermute(const Tensor& yp, const Routing& r, Tensor& y) {
  check_routing(r, "unpermute");
  const int64_t N = r.rows();
  check_rows(y, r.tokens, -1, "Y", "unpermute");
  check_rows(yp, N, y.dim(1), "YP", "unpermute");
  if (y.dtype() != yp.dtype()) throw std::invalid_argument("unpermute: Y and YP dtypes differ");
  const int64_t h = y.dim(1), T = r.tokens;
  KernelCost cost{"moe.unpermute", 2.0 * double(N * h), double((N + T) * h) * es(y) + 12.0 * double(N), y.dtype(), {}};
  if (cost_only({&yp}, {&y}) || !r.has_values) {
    if (y.has_storage()) y.drop_storage();
    return cost;
  }
  y = Tensor::from_float(sum_kept_rows(yp, r, r.weight.data()), y.dtype(), y.shape());
  return cost;
}

KernelCost unpermute_backward(const Tensor& dy, const Tensor& yp, const Routing& r, Tensor& dyp,
                              std::vector<float>& dweight) {
  check_routing(r, "unpermute_backward");
  const int64_t N = r.rows(), T = r.tokens, k = r.top_k;
  check_rows(dy, T, -1, "dY", "unpermute_backward");
  const int64_t h = dy.dim(1);
  check_rows(yp, N, h, "YP", "unpermute_backward");
  check_rows(dyp, N, h, "dYP", "unpermute_backward");
  KernelCost cost{"moe.unpermute_backward", 4.0 * double(N * h), double((2 * N + T) * h) * es(dy) + 16.0 * double(N),
                  dy.dtype(), {}};
  if (cost_only({&dy, &yp}, {&dyp}) || !r.has_values) {
    if (dyp.has_storage()) dyp.drop_storage();
    dweight.clear();
    return cost;
  }
  const auto row_of = permuted_rows(r);
  const std::vector<float> g = dy.to_float(), y = yp.to_float();
  std::vector<float> out(size_t(N * h), 0.0f);
  dweight.assign(size_t(T * k), 0.0f);
  for (int64_t i = 0; i < T * k; ++i) {
    const int64_t row = row_of[size_t(i)], t = i / k;
    if (row < 0) continue;
    const float w = r.weight[size_t(i)];
    const float* gt = g.data() + t * h;
    const float* yr = y.data() + row * h;
    float* o = out.data() + row * h;
    double dot = 0;
    for (int64_t c = 0; c < h; ++c) {
      o[c] = w * gt[c];
      dot += double(gt[c]) * double(yr[c]);
    }
    dweight[size_t(i)] = float(dot);
  }
  dyp = Tensor::from_float(out, dyp.dtype(), dyp.shape());
  return cost;
}

KernelCost permute_backward(const Tensor& dxp, const Routing& r, Tensor& dx) {
  check_routing(r, "permute_backward");
  const int64_t N = r.rows(), T = r.tokens;
  check_rows(dx, T, -1, "dX", "permute_backward");
  const int64_t h = dx.dim(1);
  check_rows(dxp, N, h, "dXP", "permute_backward");
  KernelCost cost{"moe.permute_backward", double(N * h), double((N + T) * h) * es(dx) + 8.0 * double(N), dx.dtype(), {}};
  if (cost_only({&dxp}, {&dx}) || !r.has_values) {
    if (dx.has_storage()) dx.drop_storage();
    return cost;
  }
  dx = Tensor::from_float(sum_kept_rows(dxp, r, nullptr), dx.dtype(), dx.shape());
  return cost;
}

KernelCost router_backward(const Routing& r, const RouterOptions& o, const std::vector<float>& dweight,
                           double aux_grad, double coef, int64_t groups, Tensor& dlogits) {
  check_options(o);
  const int64_t T = r.tokens, E = r.experts, k = r.top_k;
  check_rows(dlogits, T, E, "dLogits", "router_backward");
  KernelCost cost{"moe.router_backward", 8.0 * double(T * E) + 6.0 * double(T * k),
                  double(T * E) * (4.0 + es(dlogits)) + 8.0 * double(T * k), dlogits.dtype(), {}};
  if (!r.has_values || !dlogits.has_storage()) {
    if (dlogits.has_storage()) dlogits.drop_storage();
    return cost;
  }
  if (int64_t(dweight.size()) != T * k)
    throw std::invalid_argument("router_backward: dweight has " + std::to_string(dweight.size()) + " entries, want " +
                                std::to_string(T * k));
  const bool aux = aux_grad != 0 && coef != 0;
  if (aux && (groups < 1 || T % groups != 0 || int64_t(r.chosen.size()) != groups * E))
    throw std::invalid_argument("router_backward: routing's groups differ from " + std::to_string(groups));
  const bool span = aux && check_span(r, groups, "router_backward");
  const int64_t Tg = aux ? T / groups : T, Tc = span ? r.span_tokens : Tg;  // rows here, the loss group's tokens
  std::vector<double> ds(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    const float* s = r.scores.data() + t * E;
    std::fill(ds.begin(), ds.end(), 0.0);
    // Through the combine weights: w_j = scale · m_j · u_j / U (normalised) or scale · m_j · u_j.
    double U = 0, gu = 0;
    for (int64_t j = 0; j < k; ++j) {
      const double u = s[r.expert[size_t(t * k + j)]];
      U += u;
      if (r.kept[size_t(t * k + j)]) gu += double(dweight[size_t(t * k + j)]) * u;
    }
    for (int64_t j = 0; j < k; ++j) {
      const int64_t i = t * k + j;
      const double g = r.kept[size_t(i)] ? double(dweight[size_t(i)]) : 0.0;
      ds[size_t(r.expert[size_t(i)])] += o.scale * (o.normalize ? g / U - gu / (U * U) : g);
    }
    // Through the aux loss's P term.
    if (aux) {
      const int64_t* c = span ? r.span_chosen.data() : r.chosen.data() + (t / Tg) * E;
      const double a0 = aux_grad * coef * double(E) / (double(Tc) * double(Tc) * double(k));
      if (o.score == RouterScore::softmax) {
        for (int64_t e = 0; e < E; ++e) ds[size_t(e)] += a0 * double(c[e]);
      } else {
        const double S = aux_norm(s, E, o.score);
        double ap = 0;
        for (int64_t e = 0; e < E; ++e) ap += a0 * double(c[e]) * s[e] / S;
        for (int64_t e = 0; e < E; ++e) ds[size_t(e)] += (a0 * double(c[e]) - ap) / S;
      }
    }
    // Through the scores.
    if (o.score == RouterScore::softmax) {
      double dot = 0;
      for (int64_t e = 0; e < E; ++e) dot += ds[size_t(e)] * s[e];
      for (int64_t e = 0; e < E; ++e) dlogits.set(t * E + e, float(s[e] * (ds[size_t(e)] - dot)));
    } else {
      for (int64_t e = 0; e < E; ++e) dlogits.set(t * E + e, float(ds[size_t(e)] * s[e] * (1.0 - s[e])));
    }
  }
  return cost;
}

MoeLoad moe_load(const std::vector<int64_t>& counts, int64_t dropped) {
  MoeLoad l;
  l.dropped = dropped;
  if (counts.empty()) return l;
  l.max = *std::max_element(counts.begin(), counts.end());
  l.min = *std::min_element(counts.begin(), counts.end());
  l.empty = std::count(counts.begin(), counts.end(), int64_t{0});
  l.mean = double(std::accumulate(counts.begin(), counts.end(), int64_t{0})) / double(counts.size());
  return l;
}

NodeFanout node_fanout(const Routing& r, int64_t nodes, int64_t own_node) {
  if (!r.has_values || nodes < 1 || r.experts % nodes != 0 || int64_t(r.kept.size()) != r.tokens * r.top_k)
    throw std::invalid_argument("node_fanout: needs a routed (values, capacity applied) routing whose " +
                                std::to_string(r.experts) + " experts split into " + std::to_string(nodes) + " nodes");
  const int64_t per = r.experts / nodes, k = r.top_k;
  NodeFanout f;
  std::vector<int64_t> seen(static_cast<size_t>(nodes), -1);  // last token that reached the node
  for (int64_t t = 0; t < r.tokens; ++t)
    for (int64_t j = 0; j < k; ++j) {
      if (!r.kept[size_t(t * k + j)]) continue;
      const int64_t node = r.expert[size_t(t * k + j)] / per;
      if (node == own_node) continue;
      ++f.remote_rows;
      if (seen[size_t(node)] != t) seen[size_t(node)] = t, ++f.remote_tokens;
    }
  return f;
}

double expected_remote_nodes(int64_t experts, int64_t top_k, int64_t nodes, int64_t limit) {
  if (nodes < 1 || experts % nodes != 0 || top_k < 1 || top_k > experts)
    throw std::invalid_argument("expected_remote_nodes: " + std::to_string(experts) + " experts, top_k " +
                                std::to_string(top_k) + ", " + std::to_string(nodes) + " nodes");
  double reached = 0;
  if (limit > 0 && limit < nodes) {
    reached = double(limit);
  } else {  // n·(1 - C(E - E/n, k) / C(E, k)): P(a node gets none of the k) as a product
    double none = 1;
    const int64_t other = experts - experts / nodes;
    for (int64_t i = 0; i < top_k; ++i) none *= other - i <= 0 ? 0.0 : double(other - i) / double(experts - i);
    reached = double(nodes) * (1.0 - none);
  }
  return reached * double(nodes - 1) / double(nodes);
}

std::vector<int64_t> declared_node_tokens(const RouterOptions& o, const std::vector<int64_t>& counts, int64_t tokens) {
  check_options(o);
  if (!o.group_limited() || int64_t(counts.size()) != o.experts || tokens < 0)
    throw std::invalid_argument("declared_node_tokens: needs node-limited routing (group_limit " +
                                std::to_string(o.group_limit) + " of " + std::to_string(o.groups) + " groups), " +
                                std::to_string(o.experts) + " counts (got " + std::to_string(counts.size()) +
                                ") and tokens >= 0");
  const int64_t G = o.groups, n = o.experts / G, per = std::min(o.top_k, n);
  std::vector<double> q(static_cast<size_t>(G), 0.0);
  for (int64_t e = 0; e < o.experts; ++e) q[size_t(e / n)] += double(std::max<int64_t>(counts[size_t(e)], 0));
  std::vector<int64_t> lo(static_cast<size_t>(G)), hi(static_cast<size_t>(G));
  int64_t sum_lo = 0, sum_hi = 0;
  for (int64_t g = 0; g < G; ++g) {
    hi[size_t(g)] = std::min<int64_t>(tokens, int64_t(q[size_t(g)]));
    lo[size_t(g)] = std::min(hi[size_t(g)], int64_t(std::ceil(q[size_t(g)] / double(per))));
    sum_lo += lo[size_t(g)];
    sum_hi += hi[size_t(g)];
  }
  const int64_t total = std::clamp(tokens * std::min(o.top_k, o.group_limit), sum_lo, sum_hi);
  // clamp(λ·Q_g, lo_g, hi_g) sums to TOTAL for some λ in [0, 1] (λ = 1 gives every hi_g <= Q_g): bisection.
  const auto reach = [&](double lambda, int64_t g) {
    return std::clamp(lambda * q[size_t(g)], double(lo[size_t(g)]), double(hi[size_t(g)]));
  };
  double a = 0, b = 1;
  for (int i = 0; i < 100; ++i) {
    const double m = 0.5 * (a + b);
    double sum = 0;
    for (int64_t g = 0; g < G; ++g) sum += reach(m, g);
    (sum < double(total) ? a : b) = m;
  }
  std::vector<int64_t> d(static_cast<size_t>(G));
  std::vector<double> frac(static_cast<size_t>(G));
  int64_t left = total;
  for (int64_t g = 0; g < G; ++g) {
    const double x = reach(b, g);
    d[size_t(g)] = std::clamp(int64_t(std::floor(x)), lo[size_t(g)], hi[size_t(g)]);
    frac[size_t(g)] = x - std::floor(x);
    left -= d[size_t(g)];
  }
  std::vector<int64_t> order(static_cast<size_t>(G));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t x, int64_t y) { return frac[size_t(x)] > frac[size_t(y)]; });
  for (size_t i = 0; left != 0 && i < 2 * order.size(); ++i) {  // largest remainder first; back off the smallest
    const int64_t g = left > 0 ? order[i % order.size()] : order[order.size() - 1 - i % order.size()];
    if (left > 0 && d[size_t(g)] < hi[size_t(g)]) ++d[size_t(g)], --left;
    else if (left < 0 && d[size_t(g)] > lo[size_t(g)]) --d[size_t(g)], ++left;
  }
  return d;
}

void update_expert_bias(std::vector<float>& bias, const std::vector<int64_t>& load, double gamma) {
  if (bias.size() != load.size())
    throw std::invalid_argument("update_expert_bias: " + std::to_string(bias.size()) + " biases for " +
                                std::to_string(load.size()) + " loads");
  if (load.empty()) return;
  const double mean = double(std::accumulate(load.begin(), load.end(), int64_t{0})) / double(load.size());
  for (size_t e = 0; e < bias.size(); ++e) {
    const double d = mean - double(load[e]);
    bias[e] += float(gamma * double((d > 0) - (d < 0)));
  }
}

// ---- grouped GEMM ----

KernelCost GroupedCost::total() const {
  KernelCost t{groups.empty() ? "grouped_gemm" : groups.front().name, 0, 0,
               groups.empty() ? runtime::DType::fp32 : groups.front().dtype, {}};
  auto work = std::make_shared<std::vector<sim::KernelWork>>();
  for (const auto& g : groups) {
    t.flops += g.flops;
    t.bytes += g.bytes;
    if (g.flops <= 0) continue;
    work->push_back({g.flops, g.bytes, g.shape});
    if (work->size() == 1) t.shape = sim::KernelShape{g.shape.cls, 0, g.shape.n, g.shape.k, g.shape.batch, nullptr};
    t.shape.m += g.shape.m;
  }
  if (!work->empty()) t.shape.groups = std::move(work);
  return t;
}
void GroupedCost::add(const GroupedCost& o) { groups.insert(groups.end(), o.groups.begin(), o.groups.end()); }

namespace {

void check_groups(size_t n, const std::vector<int64_t>& offsets, int64_t rows, const char* op) {
  if (offsets.size() != n + 1 || offsets.front() != 0 || offsets.back() != rows)
    throw std::invalid_argument(std::string(op) + ": " + std::to_string(n) + " groups need " + std::to_string(n + 1) +
                                " offsets from 0 to " + std::to_string(rows));
  for (size_t g = 0; g < n; ++g)
    if (offsets[g + 1] < offsets[g]) throw std::invalid_argument(std::string(op) + ": offsets decrease");
}

KernelCost named(KernelCost c, const char* name) {
  c.name = name;
  return c;
}

// Adds SRC's values to rows [R0, R0 + SRC.rows) of DST in fp32 (both stored).
void add_rows(Tensor& dst, int64_t r0, const Tensor& src) {
  const int64_t n = src.numel(), off = r0 * (src.rank() == 2 ? src.dim(1) : 0);
  for (int64_t i = 0; i < n; ++i) dst.set(off + i, dst.get(off + i) + src.get(i));
}

}  // namespace

GroupedCost grouped_gemm_rows_in(const Tensor& a, const std::vector<int64_t>& offsets,
                                 const std::vector<const Tensor*>& b, std::vector<Tensor>& c) {
  check_groups(b.size(), offsets, a.rank() == 2 ? a.dim(0) : -1, "grouped_gemm");
  if (c.size() != b.size()) throw std::invalid_argument("grouped_gemm: want one output per group");
  GroupedCost cost;
  for (size_t g = 0; g < b.size(); ++g) {
    const Tensor ag = a.rows(offsets[g], offsets[g + 1] - offsets[g]);
    cost.groups.push_back(named(gemm(ag, *b[g], c[g]), "grouped_gemm"));
  }
  return cost;
}

GroupedCost grouped_gemm_rows_out(const std::vector<Tensor>& a, const std::vector<const Tensor*>& b,
                                  const std::vector<int64_t>& offsets, Tensor& c) {
  check_groups(b.size(), offsets, c.rank() == 2 ? c.dim(0) : -1, "grouped_gemm");
  if (a.size() != b.size()) throw std::invalid_argument("grouped_gemm: want one input per group");
  GroupedCost cost;
  bool stored = c.has_storage();
  for (size_t g = 0; g < b.size(); ++g) {
    const int64_t rows = offsets[g + 1] - offsets[g];
    Tensor cg = Tensor::make(c.dtype(), {rows, c.dim(1)}, stored);
    cost.groups.push_back(named(gemm(a[g], *b[g], cg), "grouped_gemm"));
    stored = stored && cg.has_storage();
    if (stored) c.set_rows(offsets[g], cg);
  }
  if (!stored && c.has_storage()) c.drop_storage();
  return cost;
}

GroupedCost grouped_gemm_rows_in_backward(const Tensor& a, const std::vector<int64_t>& offsets,
                                          const std::vector<const Tensor*>& b, const std::vector<Tensor>& dc,
                                          Tensor* da, bool accumulate, const std::vector<Tensor*>& db) {
  check_groups(b.size(), offsets, a.rank() == 2 ? a.dim(0) : -1, "grouped_gemm_backward");
  if (dc.size() != b.size() || db.size() != b.size())
    throw std::invalid_argument("grouped_gemm_backward: want one dC and one dB entry per group");
  GroupedCost cost;
  bool stored = da && da->has_storage();
  for (size_t g = 0; g < b.size(); ++g) {
    const int64_t rows = offsets[g + 1] - offsets[g];
    const Tensor ag = a.rows(offsets[g], rows);
    Tensor dag = Tensor::make(a.dtype(), {rows, a.dim(1)}, stored);
    cost.groups.push_back(named(gemm_backward(ag, *b[g], dc[g], da ? &dag : nullptr, db[g]), "grouped_gemm_backward"));
    stored = stored && dag.has_storage();
    if (!stored || !da) continue;
    if (accumulate) add_rows(*da, offsets[g], dag);
    else da->set_rows(offsets[g], dag);
  }
  if (da && !stored && da->has_storage()) da->drop_storage();
  return cost;
}

GroupedCost grouped_gemm_rows_out_backward(const std::vector<Tensor>& a, const std::vector<const Tensor*>& b,
                                           const std::vector<int64_t>& offsets, const Tensor& dc,
                                           std::vector<Tensor>& da, const std::vector<Tensor*>& db) {
  check_groups(b.size(), offsets, dc.rank() == 2 ? dc.dim(0) : -1, "grouped_gemm_backward");
  if (a.size() != b.size() || da.size() != b.size() || db.size() != b.size())
    throw std::invalid_argument("grouped_gemm_backward: want one A, dA and dB entry per group");
  GroupedCost cost;
  for (size_t g = 0; g < b.size(); ++g) {
    const Tensor dcg = dc.rows(offsets[g], offsets[g + 1] - offsets[g]);
    cost.groups.push_back(named(gemm_backward(a[g], *b[g], dcg, &da[g], db[g]), "grouped_gemm_backward"));
  }
  return cost;
}

}  // namespace shardsim::kernels

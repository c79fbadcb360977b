#include "kernels/moe_mlp.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <stdexcept>

#include "kernels/backward.h"
#include "kernels/fp8.h"
#include "kernels/gemm.h"
#include "kernels/norm.h"

namespace shardsim::kernels {

using runtime::Tensor;

void MoeSpec::check() const {
  if (hidden < 1) throw std::invalid_argument("moe: hidden must be >= 1");
  if (router.experts < 1 || router.top_k < 1 || router.top_k > router.experts)
    throw std::invalid_argument("moe: want 1 <= top_k <= experts, got top_k " + std::to_string(router.top_k) +
                                ", experts " + std::to_string(router.experts));
  if (int64_t(expert_ffn.size()) != router.experts)
    throw std::invalid_argument("moe: expert_ffn has " + std::to_string(expert_ffn.size()) + " sizes for " +
                                std::to_string(router.experts) + " experts");
  for (int64_t f : expert_ffn)
    if (f < 1) throw std::invalid_argument("moe: every expert_ffn must be >= 1");
  if (shared_ffn < 0) throw std::invalid_argument("moe: shared_ffn must be >= 0");
  if (capacity.groups < 1) throw std::invalid_argument("moe: capacity groups must be >= 1");
  if (router.groups < 1 || router.experts % router.groups != 0)
    throw std::invalid_argument("moe: " + std::to_string(router.experts) + " experts do not split into " +
                                std::to_string(router.groups) + " expert groups");
}

namespace {

// A uniform(-a, a) tensor, a = 1/sqrt(fan_in), from its own stream (SEED, TAG), so any subset draws the same values.
Tensor seeded(runtime::DType dt, runtime::Shape shape, uint64_t seed, uint64_t tag, bool storage) {
  Tensor t = Tensor::make(dt, shape, storage);
  if (!storage) return t;
  std::mt19937_64 gen(seed * 0x9E3779B97F4A7C15ULL + tag * 0xBF58476D1CE4E5B9ULL + 1);
  const float a = 1.0f / std::sqrt(float(shape[0]));
  std::uniform_real_distribution<float> u(-a, a);
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, u(gen));
  return t;
}

ExpertWeights expert_weights(const MoeSpec& s, int64_t f, uint64_t seed, uint64_t tag, bool storage) {
  ExpertWeights w;
  const int64_t h = s.hidden;
  if (s.gated) w.w_gate = seeded(s.dtype, {h, f}, seed, tag * 4 + 1, storage);
  w.w_up = seeded(s.dtype, {h, f}, seed, tag * 4 + 2, storage);
  w.w_down = seeded(s.dtype, {f, h}, seed, tag * 4 + 3, storage);
  return w;
}

Tensor zeros_like(const Tensor& t) { return Tensor::make(t.dtype(), t.shape(), t.has_storage()); }
ExpertWeights zeros_like(const ExpertWeights& w) {
  return {w.w_gate.rank() == 2 ? zeros_like(w.w_gate) : Tensor{}, zeros_like(w.w_up), zeros_like(w.w_down)};
}

Tensor copy_of(const Tensor& t) {
  Tensor c = Tensor::make(t.dtype(), t.shape(), t.has_storage());
  if (t.has_storage() && t.numel()) c.set_rows(0, t);
  return c;
}

void add_cost(KernelCost& total, const KernelCost& c) {
  if (total.name.empty()) {
    total = c;
    total.shape = {};
    return;
  }
  total.flops += c.flops;
  total.bytes += c.bytes;
}

std::vector<const Tensor*> ptrs(const std::vector<ExpertWeights>& w, Tensor ExpertWeights::*m) {
  std::vector<const Tensor*> v;
  for (const auto& e : w) v.push_back(&(e.*m));
  return v;
}
std::vector<Tensor*> ptrs(std::vector<ExpertWeights>& w, Tensor ExpertWeights::*m) {
  std::vector<Tensor*> v;
  for (auto& e : w) v.push_back(&(e.*m));
  return v;
}

}  // namespace

MoeParams moe_params(const MoeSpec& s) {
  const double mats = s.gated ? 3.0 : 2.0, h = double(s.hidden);
  double experts = 0;
  for (int64_t f : s.expert_ffn) experts += mats * h * double(f);
  const double router = h * double(s.experts()), shared = mats * h * double(s.shared_ffn);
  const double mean = s.expert_ffn.empty() ? 0.0 : experts / double(s.expert_ffn.size());
  return {router + experts + shared, router + shared + double(s.router.top_k) * mean};
}

MoeWeights make_moe_weights(const MoeSpec& s, uint64_t seed, int64_t first_expert, int64_t count, bool storage) {
  s.check();
  if (first_expert < 0 || count < 0 || first_expert + count > s.experts())
    throw std::invalid_argument("make_moe_weights: experts [" + std::to_string(first_expert) + ", +" +
                                std::to_string(count) + ") outside [0, " + std::to_string(s.experts()) + ")");
  MoeWeights w;
  w.router = seeded(s.dtype, {s.hidden, s.experts()}, seed, 0, storage);
  w.first_expert = first_expert;
  for (int64_t e = first_expert; e < first_expert + count; ++e)
    w.experts.push_back(expert_weights(s, s.expert_ffn[size_t(e)], seed, uint64_t(e) + 2, storage));
  if (s.shared_ffn > 0) w.shared = expert_weights(s, s.shared_ffn, seed, 1, storage);
  return w;
}

MoeWeights zero_like(const MoeWeights& w) {
  MoeWeights g;
  g.router = zeros_like(w.router);
  g.first_expert = w.first_expert;
  for (const auto& e : w.experts) g.experts.push_back(zeros_like(e));
  if (w.shared.w_up.rank() == 2) g.shared = zeros_like(w.shared);
  return g;
}

void MoeCharge::grouped(const GroupedCost& g) const {
  const KernelCost c = g.total();
  if (c.flops > 0) (*this)(c);
}

Tensor experts_forward(const MoeSpec& s, const std::vector<ExpertWeights>& w, const Tensor& xp,
                       const std::vector<int64_t>& offsets, ExpertActs* keep, const MoeCharge& charge) {
  const bool stored = xp.has_storage();
  const size_t G = w.size();
  std::vector<Tensor> gate, up(G), act(G);
  for (size_t g = 0; g < G; ++g) {
    const int64_t rows = offsets.at(g + 1) - offsets.at(g), f = w[g].w_up.dim(1);
    up[g] = Tensor::make(s.dtype, {rows, f}, stored);
    if (s.gated) gate.push_back(Tensor::make(s.dtype, {rows, f}, stored));
  }
  // FP8 (model.fp8): the grouped GEMMs' inputs cast by their own kernels (kernels/fp8.h, fp8_grouped_cast_cost).
  double act_elements = 0;
  for (size_t g = 0; g < G; ++g) act_elements += double(up[g].numel());
  auto fp8_cast = [&](double elements, bool backward) {
    const KernelCost k = fp8_grouped_cast_cost(elements, s.dtype, fp8_recipe(), backward);
    if (k.bytes > 0) charge(k);
  };
  fp8_cast(double(xp.numel()), false);
  if (s.gated) charge.grouped(grouped_gemm_rows_in(xp, offsets, ptrs(w, &ExpertWeights::w_gate), gate));
  charge.grouped(grouped_gemm_rows_in(xp, offsets, ptrs(w, &ExpertWeights::w_up), up));
  KernelCost act_cost;
  for (size_t g = 0; g < G; ++g) {
    if (s.gated) {
      act[g] = copy_of(gate[g]);
      add_cost(act_cost, glu_inplace(act[g], up[g], s.activation));
    } else {
      act[g] = copy_of(up[g]);
      add_cost(act_cost, activation_inplace(act[g], Activation::gelu));
    }
  }
  if (!act_cost.name.empty()) charge(act_cost);  // one elementwise kernel over every expert's rows
  fp8_cast(act_elements, false);
  Tensor yp = Tensor::make(s.dtype, {xp.dim(0), s.hidden}, stored);
  charge.grouped(grouped_gemm_rows_out(act, ptrs(w, &ExpertWeights::w_down), offsets, yp));
  if (keep) *keep = ExpertActs{std::move(gate), std::move(up), std::move(act)};
  return yp;
}

Tensor experts_backward(const MoeSpec& s, const std::vector<ExpertWeights>& w, const Tensor& xp,
                        const std::vector<int64_t>& offsets, const ExpertActs& keep, const Tensor& dyp,
                        std::vector<ExpertWeights>& grads, const MoeCharge& charge) {
  const size_t G = w.size();
  if (grads.size() != G || keep.up.size() != G)
    throw std::invalid_argument("experts_backward: want one gradient and one activation entry per expert");
  const bool stored = xp.has_storage() && dyp.has_storage();
  std::vector<Tensor> dact(G), dgate(G), dup(G);
  for (size_t g = 0; g < G; ++g) dact[g] = Tensor::make(s.dtype, keep.act[g].shape(), stored);
  // FP8 (model.fp8): each grouped GEMM's output gradient cast and transposed by its own kernel (kernels/fp8.h).
  double fc1_out = 0;
  for (size_t g = 0; g < G; ++g) fc1_out += double(keep.up[g].numel()) * (s.gated ? 2.0 : 1.0);
  auto fp8_cast = [&](double elements) {
    const KernelCost k = fp8_grouped_cast_cost(elements, s.dtype, fp8_recipe(), true);
    if (k.bytes > 0) charge(k);
  };
  fp8_cast(double(dyp.numel()));
  charge.grouped(grouped_gemm_rows_out_backward(keep.act, ptrs(w, &ExpertWeights::w_down), offsets, dyp, dact,
                                                ptrs(grads, &ExpertWeights::w_down)));
  KernelCost act_cost;
  for (size_t g = 0; g < G; ++g) {
    const auto& shape = keep.up[g].shape();
    dup[g] = Tensor::make(s.dtype, shape, stored);
    if (!s.gated) {
      add_cost(act_cost, gelu_backward(keep.up[g], dact[g], dup[g]));
      continue;
    }
    dgate[g] = Tensor::make(s.dtype, shape, stored);
    if (s.activation == Activation::silu) {
      add_cost(act_cost, swiglu_backward(keep.gate[g], keep.up[g], dact[g], dgate[g], dup[g]));
    } else {  // geglu: out = gelu(g)·u -> dU = dOut·gelu(g), dG = gelu'(g)·(dOut·u)
      Tensor a = copy_of(keep.gate[g]), du = copy_of(dact[g]);
      add_cost(act_cost, activation_inplace(a, Activation::gelu));
      add_cost(act_cost, mul_inplace(du, keep.up[g]));
      add_cost(act_cost, gelu_backward(keep.gate[g], du, dgate[g]));
      Tensor d2 = copy_of(dact[g]);
      add_cost(act_cost, mul_inplace(d2, a));
      dup[g] = std::move(d2);
    }
  }
  if (!act_cost.name.empty()) charge(act_cost);
  Tensor dxp = Tensor::make(s.dtype, xp.shape(), stored);
  fp8_cast(fc1_out);
  if (s.gated)
    charge.grouped(grouped_gemm_rows_in_backward(xp, offsets, ptrs(w, &ExpertWeights::w_gate), dgate, &dxp, false,
                                                 ptrs(grads, &ExpertWeights::w_gate)));
  charge.grouped(grouped_gemm_rows_in_backward(xp, offsets, ptrs(w, &ExpertWeights::w_up), dup, &dxp, s.gated,
                                               ptrs(grads, &ExpertWeights::w_up)));
  return dxp;
}

Tensor shared_forward(const MoeSpec& s, const ExpertWeights& w, const Tensor& x, ExpertActs* keep,
                      const MoeCharge& charge) {
  return experts_forward(s, {w}, x, {0, x.dim(0)}, keep, charge);
}

Tensor shared_backward(const MoeSpec& s, const ExpertWeights& w, const Tensor& x, const ExpertActs& keep,
                       const Tensor& dy, ExpertWeights& grads, const MoeCharge& charge) {
  std::vector<ExpertWeights> g(1);
  g[0] = std::move(grads);
  Tensor dx = experts_backward(s, {w}, x, {0, x.dim(0)}, keep, dy, g, charge);
  grads = std::move(g[0]);
  return dx;
}

Routing router_forward(const MoeSpec& s, const MoeWeights& w, const Tensor& x, const Routing* declared,
                       Tensor* logits_out, double* aux, const MoeCharge& charge) {
  const Tensor& router_w = w.router;
  if (x.rank() != 2 || x.dim(1) != s.hidden)
    throw std::invalid_argument("moe: X is " + runtime::shape_str(x.shape()) + ", want [T, " +
                                std::to_string(s.hidden) + "]");
  Tensor logits = Tensor::make(s.dtype, {x.dim(0), s.experts()}, x.has_storage());
  charge(router_logits(x, router_w, logits));
  Routing r;
  if (!logits.has_storage()) {
    if (!declared) throw std::invalid_argument("moe: a shape-only forward needs a declared routing");
    r = *declared;
  }
  if (w.bias.empty()) {
    charge(route(logits, s.router, r));
  } else {  // this layer's own selection bias
    RouterOptions o = s.router;
    o.bias = w.bias;
    charge(route(logits, o, r));
  }
  charge(apply_capacity(r, s.capacity));
  KernelCost aux_cost;
  const double a = s.aux_coef != 0 ? aux_loss(r, s.router, s.aux_coef, s.capacity.groups, nullptr, &aux_cost) : 0.0;
  if (s.aux_coef != 0) charge(aux_cost);
  if (aux) *aux = a;
  if (logits_out) *logits_out = std::move(logits);
  return r;
}

void router_backward_pass(const MoeSpec& s, const Tensor& router_w, const Tensor& x, const Routing& r,
                          const std::vector<float>& dweight, double aux_grad, Tensor& dx, Tensor& drouter,
                          const MoeCharge& charge) {
  Tensor dlogits = Tensor::make(s.dtype, {x.dim(0), s.experts()}, x.has_storage() && r.has_values);
  charge(router_backward(r, s.router, dweight, aux_grad, s.aux_coef, s.capacity.groups, dlogits));
  Tensor dxr = Tensor::make(s.dtype, x.shape(), dlogits.has_storage());
  charge(gemm_backward(x, router_w, dlogits, &dxr, &drouter));
  charge(add_inplace(dx, dxr));
}

Tensor moe_forward(const MoeSpec& s, const MoeWeights& w, const Tensor& x, MoeActivations& keep,
                   const MoeCharge& charge, const Routing* declared) {
  s.check();
  if (int64_t(w.experts.size()) != s.experts() || w.first_expert != 0)
    throw std::invalid_argument("moe_forward: the single-device MoE holds every expert");
  keep.routing = router_forward(s, w, x, declared, nullptr, &keep.aux, charge);
  const Routing& r = keep.routing;
  keep.xp = Tensor::make(s.dtype, {r.rows(), s.hidden}, x.has_storage());
  charge(permute(x, r, keep.xp));
  keep.yp = experts_forward(s, w.experts, keep.xp, r.offsets(), &keep.experts, charge);
  Tensor y = Tensor::make(s.dtype, x.shape(), x.has_storage());
  charge(unpermute(keep.yp, r, y));
  if (s.shared_ffn > 0) charge(add_inplace(y, shared_forward(s, w.shared, x, &keep.shared, charge)));
  return y;
}

Tensor moe_backward(const MoeSpec& s, const MoeWeights& w, const Tensor& x, const MoeActivations& keep,
                    const Tensor& dy, double aux_grad, MoeWeights& grads, const MoeCharge& charge) {
  const Routing& r = keep.routing;
  Tensor dyp = Tensor::make(s.dtype, keep.yp.shape(), dy.has_storage());
  std::vector<float> dweight;
  charge(unpermute_backward(dy, keep.yp, r, dyp, dweight));
  const Tensor dxp = experts_backward(s, w.experts, keep.xp, r.offsets(), keep.experts, dyp, grads.experts, charge);
  Tensor dx = Tensor::make(s.dtype, x.shape(), dxp.has_storage());
  charge(permute_backward(dxp, r, dx));
  router_backward_pass(s, w.router, x, r, dweight, aux_grad, dx, grads.router, charge);
  if (s.shared_ffn > 0) charge(add_inplace(dx, shared_backward(s, w.shared, x, keep.shared, dy, grads.shared, charge)));
  return dx;
}

namespace {

// Expert -> popularity rank and expert -> share of the assignments (unnormalised) of distribution D for LAYER.
void declared_shares(const RoutingDistribution& d, int64_t E, uint64_t stream, int64_t layer,
                     std::vector<int64_t>& rank, std::vector<double>& share) {
  rank.resize(size_t(E));
  share.resize(size_t(E));
  std::iota(rank.begin(), rank.end(), 0);
  if (const std::vector<double>* row = d.row(layer)) {
    if (int64_t(row->size()) != E)
      throw std::invalid_argument("routing histogram: layer " + std::to_string(layer) + " has " +
                                  std::to_string(row->size()) + " weights for " + std::to_string(E) + " experts");
    std::vector<int64_t> order(static_cast<size_t>(E));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return (*row)[size_t(a)] > (*row)[size_t(b)]; });
    for (int64_t r = 0; r < E; ++r) rank[size_t(order[size_t(r)])] = r;
    share = *row;
    return;
  }
  const uint64_t key = d.seed * 0x9E3779B97F4A7C15ULL ^ (stream + 1) * 0xD1B54A32D192ED03ULL;
  if (d.skew > 0) {  // Zipf: which expert is hot
    std::mt19937_64 gen(key);
    std::shuffle(rank.begin(), rank.end(), gen);
  } else {  // uniform: which experts take the +1 of an uneven split, rotated per stream (else every rank and layer
            // would round up the same lowest ids: experts 0.. on ep rank 0); a rotation costs no generator draw
    uint64_t z = key + 0x9E3779B97F4A7C15ULL;  // splitmix64's finaliser
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    const int64_t off = int64_t((z ^ (z >> 31)) % uint64_t(E));
    for (int64_t e = 0; e < E; ++e) rank[size_t(e)] = (e + off) % E;
  }
  for (int64_t e = 0; e < E; ++e) share[size_t(e)] = std::pow(double(rank[size_t(e)] + 1), -d.skew);
}

}  // namespace

Routing declared_routing(const MoeSpec& s, int64_t tokens, const RoutingDistribution& d, uint64_t stream,
                         int64_t layer) {
  s.check();
  const int64_t E = s.experts(), k = s.router.top_k, n = tokens * k;
  if (d.skew < 0) throw std::invalid_argument("routing skew must be >= 0");
  std::vector<int64_t> rank;  // expert -> popularity rank
  std::vector<double> share;
  declared_shares(d, E, stream, layer, rank, share);
  double sum = 0;
  for (double w : share) {
    if (!(w >= 0) || !std::isfinite(w)) throw std::invalid_argument("routing histogram: a weight is negative or not finite");
    sum += w;
  }
  if (!(sum > 0)) throw std::invalid_argument("routing histogram: layer " + std::to_string(layer) + "'s weights sum to 0");
  // Largest remainder, in expert-rank order on ties; each expert at most TOKENS; the excess to the next ranks.
  std::vector<int64_t> counts(static_cast<size_t>(E));
  std::vector<std::pair<double, int64_t>> rem;
  int64_t left = n;
  for (int64_t e = 0; e < E; ++e) {
    const double want = double(n) * share[size_t(e)] / sum;
    counts[size_t(e)] = std::min<int64_t>(tokens, int64_t(std::floor(want)));
    left -= counts[size_t(e)];
    rem.push_back({want - std::floor(want), rank[size_t(e)]});
  }
  std::vector<int64_t> by_rank(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) by_rank[size_t(rank[size_t(e)])] = e;
  std::vector<int64_t> order(static_cast<size_t>(E));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return rem[size_t(a)].first > rem[size_t(b)].first ||
           (rem[size_t(a)].first == rem[size_t(b)].first && rem[size_t(a)].second < rem[size_t(b)].second);
  });
  for (int64_t e : order)  // an expert of weight 0 gets nothing here; only the rank fill below may reach it
    if (left > 0 && counts[size_t(e)] < tokens && share[size_t(e)] > 0) ++counts[size_t(e)], --left;
  for (int64_t r = 0; left > 0 && r < E; ++r) {
    const int64_t e = by_rank[size_t(r)], add = std::min(left, tokens - counts[size_t(e)]);
    counts[size_t(e)] += add;
    left -= add;
  }
  const int64_t G = s.capacity.groups * std::max<int64_t>(s.capacity.split, 1);  // capacity pieces
  const int64_t C = s.capacity.capacity(tokens / G, k, E);
  int64_t dropped = 0;
  if (s.capacity.factor > 0)
    for (auto& c : counts)
      if (c > G * C) dropped += c - G * C, c = G * C;
  Routing r = Routing::from_counts(tokens, k, std::move(counts));
  r.dropped = dropped;
  return r;
}

}  // namespace shardsim::kernels

#include "sharding/plans/expert_parallel.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <stdexcept>

#include "collectives/all_reduce.h"
#include "collectives/all_to_all.h"
#include "collectives/reduce_scatter.h"
#include "kernels/norm.h"
#include "sim/kernel_model.h"
#include "sharding/plans/expert_parallel_config.h"

namespace shardsim::sharding::plans {

using kernels::MoeCharge;
using kernels::MoeSpec;
using kernels::MoeWeights;
using kernels::Routing;

EpShard ep_shard(int64_t experts, int ep, int rank) {
  if (const std::string why = ep_obstacle(experts, ep); !why.empty())
    throw std::invalid_argument("expert parallel: " + why);
  const int64_t n = experts / ep;
  return {int64_t(rank) * n, n};
}

std::vector<int64_t> placement_by_load(const std::vector<double>& load, int ep, int first_rank) {
  const int64_t E = int64_t(load.size());
  if (const std::string why = ep_obstacle(E, ep); !why.empty()) throw std::invalid_argument("expert placement: " + why);
  if (first_rank < 0 || first_rank >= ep) throw std::invalid_argument("expert placement: first rank out of range");
  const int64_t L = E / ep;
  std::vector<int64_t> order(static_cast<size_t>(E));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return load[size_t(a)] > load[size_t(b)]; });
  std::vector<double> sum(static_cast<size_t>(ep), 0.0);
  std::vector<std::vector<int64_t>> held(static_cast<size_t>(ep));
  for (const int64_t e : order) {
    int best = -1;
    for (int i = 0; i < ep; ++i) {
      const int r = (first_rank + i) % ep;
      if (int64_t(held[size_t(r)].size()) < L && (best < 0 || sum[size_t(r)] < sum[size_t(best)])) best = r;
    }
    held[size_t(best)].push_back(e);
    sum[size_t(best)] += load[size_t(e)];
  }
  std::vector<int64_t> placement;
  for (auto& h : held) {
    std::sort(h.begin(), h.end());
    placement.insert(placement.end(), h.begin(), h.end());
  }
  return placement;
}

std::vector<int64_t> placement_by_layer_load(const std::vector<Routing>& declared, int ep, int64_t layer) {
  if (declared.empty()) throw std::invalid_argument("expert placement: no routing to take the load from");
  std::vector<double> load(declared.front().counts.size(), 0.0);
  for (const Routing& r : declared)
    for (size_t e = 0; e < load.size() && e < r.counts.size(); ++e) load[e] += double(r.counts[e]);
  return placement_by_load(load, ep, int(((layer % ep) + ep) % ep));
}

int EpGroups::etp_size() const { return etp ? etp->size() : 1; }
int EpGroups::etp_rank() const { return etp ? etp->rank() : 0; }

namespace {

// Columns [c0, c0 + n) of A [rows, cols] (shape-only in, shape-only out).
Tensor columns(const Tensor& a, int64_t c0, int64_t n) {
  Tensor out = Tensor::make(a.dtype(), {a.dim(0), n}, a.has_storage());
  if (!a.has_storage()) return out;
  const size_t es = runtime::dtype_size(a.dtype());
  const auto* src = static_cast<const unsigned char*>(a.data());
  auto* dst = static_cast<unsigned char*>(out.data());
  for (int64_t r = 0; r < a.dim(0); ++r)
    std::memcpy(dst + size_t(r * n) * es, src + size_t(r * a.dim(1) + c0) * es, size_t(n) * es);
  return out;
}

kernels::ExpertWeights shard_expert(const kernels::ExpertWeights& w, int etp, int rank) {
  const collectives::Partition part{size_t(w.w_up.dim(1)), size_t(etp)};
  const int64_t c0 = int64_t(part.offset(size_t(rank))), n = int64_t(part.size(size_t(rank)));
  kernels::ExpertWeights out;
  if (w.w_gate.rank() == 2) out.w_gate = columns(w.w_gate, c0, n);
  out.w_up = columns(w.w_up, c0, n);
  out.w_down = w.w_down.rows(c0, n);
  return out;
}

// Sums BUF (COUNT elements of DTYPE; null when shape-only) over the etp group, charged from CHIP.t on.
void etp_sum(runtime::Transport& etp, void* buf, size_t count, runtime::DType dtype, const std::string& what,
             const EpOptions& o, Chip& chip, Comm& comm) {
  const auto r = collectives::all_reduce(etp, buf, buf, count, dtype, collectives::ReduceOp::sum, chip.t,
                                         ring_opts("etp all_reduce (" + what + ")", o.algorithm));
  const double p = etp.size();
  comm.add("etp all_reduce", r.bytes_sent, 2.0 * (p - 1) / p * double(count * runtime::dtype_size(dtype)),
           r.span.end - r.span.start, r.algorithm);
  chip.t = r.span.end;
}

// The etp group's partial sums X [T, h] reduce_scattered to this chip's T / etp rows (etp with sp), charged from
// CHIP.t on.
Tensor etp_scatter(runtime::Transport& etp, const Tensor& x, const std::string& what, const EpOptions& o, Chip& chip,
                   Comm& comm) {
  const int p = etp.size();
  if (x.dim(0) % p != 0)
    throw std::invalid_argument("expert tensor parallel: " + std::to_string(x.dim(0)) + " rows do not split over etp " +
                                std::to_string(p) + " (sequence parallelism)");
  Tensor out = Tensor::make(x.dtype(), {x.dim(0) / p, x.dim(1)}, x.has_storage());
  const auto r = collectives::reduce_scatter(etp, x.data_if_stored(), out.data_if_stored(), size_t(x.numel()), x.dtype(),
                                             collectives::ReduceOp::sum, chip.t,
                                             ring_opts("etp reduce_scatter (" + what + ")", o.algorithm));
  comm.add("etp reduce_scatter", r.bytes_sent, double(p - 1) / p * double(x.nbytes()), r.span.end - r.span.start,
           r.algorithm);
  chip.t = r.span.end;
  return out;
}

}  // namespace

MoeWeights shard_etp(const MoeWeights& w, int etp, int rank) {
  if (etp < 1 || rank < 0 || rank >= etp)
    throw std::invalid_argument("expert tensor parallel: rank " + std::to_string(rank) + " of etp " + std::to_string(etp));
  MoeWeights out;
  out.router = w.router.rows(0, w.router.dim(0));
  out.first_expert = w.first_expert;
  for (const auto& e : w.experts) out.experts.push_back(shard_expert(e, etp, rank));
  if (w.shared.w_up.rank() == 2) out.shared = shard_expert(w.shared, etp, rank);
  return out;
}

std::vector<Routing> declared_ep_routing(const MoeSpec& s, int64_t tokens, const kernels::RoutingDistribution& d, int ep,
                                         int64_t layer) {
  return declared_ep_routing(s, std::vector<int64_t>(size_t(ep), tokens), d, layer);
}

std::vector<Routing> declared_ep_routing(const MoeSpec& s, const std::vector<int64_t>& tokens_per_rank,
                                         const kernels::RoutingDistribution& d, int64_t layer) {
  MoeSpec local = s;
  local.capacity = s.capacity.one_group();
  const int64_t ep = int64_t(tokens_per_rank.size());
  std::vector<Routing> out;
  // Zipf draws each layer's hot experts (stream LAYER·ep + rank); uniform routing's stream only rotates the extra
  // assignments of an uneven split, and is the rank alone: every layer of a rank then routes the same counts (a
  // rounding is not a per-layer effect), so the blocks of a stage run alike and serving repeats one block's span.
  const bool per_layer = d.skew > 0;
  for (int64_t r = 0; r < ep; ++r)
    out.push_back(kernels::declared_routing(local, tokens_per_rank[size_t(r)], d,
                                            uint64_t(per_layer ? layer * ep + r : r), layer));
  return out;
}

namespace {

// Rows grouped by (source s, local expert e) blocks, COUNTS [P x L] row-major; TO_EXPERT_MAJOR: from (s, e) order to
// (e, s) order, else back. Megatron's sort_chunks_by_idxs; charged as an HBM-bound copy.
Tensor sort_chunks(const Tensor& in, const std::vector<int64_t>& counts, int P, int64_t L, bool to_expert_major,
                   kernels::KernelCost& cost) {
  const int64_t M = in.dim(0), h = in.dim(1);
  cost = kernels::KernelCost{"moe.sort_chunks", 0, 2.0 * double(M * h) * double(runtime::dtype_size(in.dtype())),
                             in.dtype(), {}};
  Tensor out = Tensor::make(in.dtype(), in.shape(), in.has_storage());
  if (!in.has_storage() || M == 0) return out;
  auto block = [&](int s, int64_t e) { return counts[size_t(int64_t(s) * L + e)]; };
  // Offsets of each block in source-major and expert-major order.
  std::vector<int64_t> src_off(static_cast<size_t>(P * L)), exp_off(static_cast<size_t>(P * L));
  int64_t o = 0;
  for (int s = 0; s < P; ++s)
    for (int64_t e = 0; e < L; ++e) src_off[size_t(s * L + e)] = o, o += block(s, e);
  o = 0;
  for (int64_t e = 0; e < L; ++e)
    for (int s = 0; s < P; ++s) exp_off[size_t(s * L + e)] = o, o += block(s, e);
  const size_t row = size_t(h) * runtime::dtype_size(in.dtype());
  const auto* src = static_cast<const unsigned char*>(in.data());
  auto* dst = static_cast<unsigned char*>(out.data());
  for (size_t b = 0; b < src_off.size(); ++b) {
    const int64_t from = to_expert_major ? src_off[b] : exp_off[b], to = to_expert_major ? exp_off[b] : src_off[b];
    std::memcpy(dst + size_t(to) * row, src + size_t(from) * row, size_t(counts[b]) * row);
  }
  return out;
}

// Rows of SRC to each ep peer (SEND_ROWS) and from each (RECV_ROWS), [rows, h] each side, charged to the links.
Tensor exchange_rows(runtime::Transport& ep, const Tensor& src, const std::vector<size_t>& send_rows,
                     const std::vector<size_t>& recv_rows, const std::string& name, const EpOptions& o, Chip& chip,
                     Comm& comm, double* bytes, sim::TimeNs* ns) {
  const int64_t h = src.dim(1);
  const size_t P = send_rows.size(), es = runtime::dtype_size(src.dtype());
  std::vector<size_t> sc(P), sd(P), rc(P), rd(P);
  size_t so = 0, ro = 0;
  double expected = 0;
  for (size_t j = 0; j < P; ++j) {
    sc[j] = send_rows[j] * size_t(h), sd[j] = so, so += sc[j];
    rc[j] = recv_rows[j] * size_t(h), rd[j] = ro, ro += rc[j];
    if (int(j) != ep.rank()) expected += double(sc[j] * es);
  }
  Tensor out = Tensor::make(src.dtype(), {int64_t(ro) / std::max<int64_t>(h, 1), h}, src.has_storage());
  const auto r = collectives::all_to_allv(ep, src.data_if_stored(), sc, sd, out.data_if_stored(), rc, rd, src.dtype(),
                                          chip.t, ring_opts("ep all_to_allv (" + name + ")", o.algorithm));
  comm.add("ep all_to_allv", r.bytes_sent, expected, r.span.end - r.span.start, r.algorithm);
  if (bytes) *bytes = r.bytes_sent;
  if (ns) *ns = r.span.end - r.span.start;
  chip.t = r.span.end;
  return out;
}

// Rows per ep peer of COUNTS [P x L] (a routing's counts [E] grouped by the experts' owners, or the received
// counts by source).
std::vector<size_t> rows_per_peer(const std::vector<int64_t>& counts, int P, int64_t L) {
  std::vector<size_t> rows(size_t(P), 0);
  for (int j = 0; j < P; ++j)
    for (int64_t e = 0; e < L; ++e) rows[size_t(j)] += size_t(counts[size_t(int64_t(j) * L + e)]);
  return rows;
}

// The aux loss of a group spanning SPAN's chips: the counts before dropping summed over them, then this chip's
// share (kernels::aux_loss with Routing::span_chosen).
double span_aux(const MoeSpec& s, Routing& rt, const std::vector<runtime::Transport*>& span, const EpOptions& o,
                Chip& chip, Comm& comm) {
  const bool real = rt.has_values;
  rt.span_chosen = real ? rt.chosen : std::vector<int64_t>();
  rt.span_tokens = rt.tokens;
  for (runtime::Transport* t : span) {
    if (t->size() == 1) continue;
    const auto c = collectives::all_reduce(*t, real ? rt.span_chosen.data() : nullptr,
                                           real ? rt.span_chosen.data() : nullptr, size_t(s.experts()),
                                           runtime::DType::int64, collectives::ReduceOp::sum, chip.t,
                                           ring_opts("aux all_reduce (counts)", o.algorithm));
    comm.add("aux all_reduce (counts)", c.bytes_sent, double(s.experts() * 8), c.span.end - c.span.start,
             c.algorithm);
    chip.t = c.span.end;
    rt.span_tokens *= t->size();
  }
  kernels::KernelCost cost;
  const double aux = kernels::aux_loss(rt, s.router, s.aux_coef, 1, nullptr, &cost);
  chip.charge(cost, cost.name);
  return aux;
}

// R with its experts renamed to slots (PLACEMENT[slot] = expert): the destination-major order the permute and the
// exchanges need; checks PLACEMENT is a permutation of the E experts and the experts share one inner size.
Routing slot_routing(const Routing& r, const std::vector<int64_t>& placement, const MoeSpec& s) {
  const int64_t E = r.experts;
  std::vector<int64_t> slot_of(static_cast<size_t>(E), -1);
  bool ok = int64_t(placement.size()) == E;
  for (size_t i = 0; ok && i < placement.size(); ++i) {
    ok = placement[i] >= 0 && placement[i] < E && slot_of[size_t(placement[i])] < 0;
    if (ok) slot_of[size_t(placement[i])] = int64_t(i);
  }
  if (!ok) throw std::invalid_argument("expert placement: not a permutation of the " + std::to_string(E) + " experts");
  for (int64_t f : s.expert_ffn)
    if (f != s.expert_ffn.front())
      throw std::invalid_argument("expert placement: needs experts of one inner size (model.moe.expert_ffn)");
  std::vector<int64_t> counts(static_cast<size_t>(E));
  for (int64_t q = 0; q < E; ++q) counts[size_t(q)] = r.counts[size_t(placement[size_t(q)])];
  Routing out = Routing::from_counts(r.tokens, r.top_k, std::move(counts));
  out.dropped = r.dropped;
  if (!r.has_values) return out;
  out.has_values = true;
  out.expert.resize(r.expert.size());
  for (size_t i = 0; i < r.expert.size(); ++i) out.expert[i] = int32_t(slot_of[size_t(r.expert[i])]);
  out.weight = r.weight;
  out.kept = r.kept;
  return out;
}

// The simulated time of the local experts' forward kernels over rows grouped by OFFSETS (sim's kernel model, as
// Timeline::compute charges them; nothing charged).
sim::TimeNs experts_time(const MoeSpec& s, const MoeWeights& w, const std::vector<int64_t>& offsets, const Chip& chip) {
  if (!chip.tl) return 0;
  sim::TimeNs ns = 0;
  const MoeCharge sum{[&](const kernels::KernelCost& c) {
    ns += sim::kernel_time_ns(chip.tl->device(), c.flops, c.bytes, runtime::precision_of(c.dtype), c.shape);
  }};
  std::vector<kernels::ExpertWeights> shapes;
  for (const auto& e : w.experts)
    shapes.push_back({e.w_gate.rank() == 2 ? Tensor::make(e.w_gate.dtype(), e.w_gate.shape(), false) : Tensor{},
                      Tensor::make(e.w_up.dtype(), e.w_up.shape(), false),
                      Tensor::make(e.w_down.dtype(), e.w_down.shape(), false)});
  const Tensor xr = Tensor::make(s.dtype, {offsets.back(), s.hidden}, false);
  kernels::experts_forward(s, shapes, xr, offsets, nullptr, sum);
  return ns;
}

}  // namespace

Tensor ep_moe_forward(const EpGroups& g, const MoeSpec& spec, const MoeWeights& w, const Tensor& x, Chip& chip,
                      Comm& comm, EpActivations& keep, const std::vector<Routing>* declared, const EpOptions& o) {
  runtime::Transport& ep = g.ep;
  MoeSpec s = spec;
  s.capacity = spec.capacity.one_group();
  s.check();
  const int P = ep.size(), r = ep.rank();
  const EpShard shard = ep_shard(s.experts(), P, r);
  const int64_t L = shard.count;
  if (w.first_expert != shard.first || int64_t(w.experts.size()) != L)
    throw std::invalid_argument("expert parallel: rank " + std::to_string(r) + " must hold experts [" +
                                std::to_string(shard.first) + ", +" + std::to_string(L) + "), its weights hold [" +
                                std::to_string(w.first_expert) + ", +" + std::to_string(w.experts.size()) + ")");
  const bool real = x.has_storage();
  if (!real && (!declared || int(declared->size()) != P))
    throw std::invalid_argument("expert parallel: a shape-only forward needs every ep rank's declared routing");
  const MoeCharge charge{[&](const kernels::KernelCost& c) { chip.charge(c, c.name); }};

  MoeSpec rs = s;  // with a spanning aux group, the router leaves the aux loss to span_aux
  if (!g.span.empty()) rs.aux_coef = 0;
  keep.routing = kernels::router_forward(rs, w, x, real ? nullptr : &(*declared)[size_t(r)], nullptr, &keep.aux,
                                         charge);
  if (!g.span.empty() && s.aux_coef != 0) keep.aux = span_aux(s, keep.routing, g.span, o, chip, comm);
  const bool placed = !o.placement.empty();
  if (placed) keep.slots = slot_routing(keep.routing, o.placement, s);
  const Routing& rt = placed ? keep.slots : keep.routing;  // destination-major: slots (experts when not placed)
  Tensor xp = Tensor::make(s.dtype, {rt.rows(), s.hidden}, real);
  charge(kernels::permute(x, rt, xp));

  // Counts: rank j learns how many rows of each of its experts every source sends.
  keep.recv_counts.assign(size_t(P * L), 0);
  const auto c = collectives::all_to_all(ep, real ? rt.counts.data() : nullptr,
                                         real ? keep.recv_counts.data() : nullptr, size_t(P * L), runtime::DType::int64,
                                         chip.t, ring_opts("ep all_to_all (counts)", o.algorithm));
  comm.add("ep all_to_all (counts)", c.bytes_sent, double((P - 1) * L * 8), c.span.end - c.span.start, c.algorithm);
  chip.t = c.span.end;
  if (!real)
    for (int src = 0; src < P; ++src)
      for (int64_t e = 0; e < L; ++e)
        keep.recv_counts[size_t(src * L + e)] =
            (*declared)[size_t(src)].counts[size_t(placed ? o.placement[size_t(shard.first + e)] : shard.first + e)];
  keep.send_rows = rows_per_peer(rt.counts, P, L);
  const std::vector<size_t> recv_rows = rows_per_peer(keep.recv_counts, P, L);

  // Dispatch, with the shared experts on the compute engine meanwhile.
  const sim::TimeNs t0 = chip.t;
  const Tensor xr_src = exchange_rows(ep, xp, keep.send_rows, recv_rows, "dispatch", o, chip, comm,
                                      &keep.dispatch_bytes, &keep.dispatch_ns);
  Tensor ys;
  if (s.shared_ffn > 0 && o.overlap_shared) {
    const sim::TimeNs t_disp = chip.t;
    chip.t = t0;
    ys = kernels::shared_forward(s, w.shared, x, &keep.shared, charge);
    chip.t = std::max(chip.t, t_disp);
  }
  kernels::KernelCost sort_cost;
  keep.xr = sort_chunks(xr_src, keep.recv_counts, P, L, true, sort_cost);
  charge(sort_cost);
  keep.local_offsets.assign(size_t(L + 1), 0);
  for (int64_t e = 0; e < L; ++e) {
    int64_t n = 0;
    for (int src = 0; src < P; ++src) n += keep.recv_counts[size_t(src * L + e)];
    keep.local_offsets[size_t(e + 1)] = keep.local_offsets[size_t(e)] + n;
  }
  const sim::TimeNs t_experts = chip.t;
  const Tensor yr = kernels::experts_forward(s, w.experts, keep.xr, keep.local_offsets, &keep.experts, charge);
  keep.expert_ns = chip.t - t_experts;
  {  // perfect balance: the group's N rows (this chip's kept assignments times ep) spread evenly over the E experts,
     // the N mod E extra rows one per chip in turn (local expert e of chip 0 takes one when e·ep < N mod E): the
     // busiest chip of the most even split; an expert with no row launches nothing, as in the real run.
    const int64_t N = rt.rows() * P, E = s.experts(), base = N / E, extra = N % E;
    std::vector<int64_t> offsets(size_t(L + 1), 0);
    for (int64_t e = 0; e < L; ++e) offsets[size_t(e + 1)] = offsets[size_t(e)] + base + (e * P < extra ? 1 : 0);
    keep.balanced_expert_ns = experts_time(s, w, offsets, chip);
  }
  const Tensor yr_src = sort_chunks(yr, keep.recv_counts, P, L, false, sort_cost);
  charge(sort_cost);
  keep.yp = exchange_rows(ep, yr_src, recv_rows, keep.send_rows, "combine", o, chip, comm, &keep.combine_bytes,
                          &keep.combine_ns);
  Tensor y = Tensor::make(s.dtype, x.shape(), real);
  charge(kernels::unpermute(keep.yp, rt, y));
  if (s.shared_ffn > 0) {
    if (!o.overlap_shared) ys = kernels::shared_forward(s, w.shared, x, &keep.shared, charge);
    charge(kernels::add_inplace(y, ys));
  }
  if (g.etp_size() > 1 && o.etp_scatter) return etp_scatter(*g.etp, y, "output", o, chip, comm);
  if (g.etp_size() > 1) etp_sum(*g.etp, y.data_if_stored(), size_t(y.numel()), y.dtype(), "output", o, chip, comm);
  return y;
}

Tensor ep_moe_backward(const EpGroups& g, const MoeSpec& spec, const MoeWeights& w, const Tensor& x,
                       const EpActivations& keep, const Tensor& dy, double aux_grad, MoeWeights& grads, Chip& chip,
                       Comm& comm, const EpOptions& o) {
  runtime::Transport& ep = g.ep;
  MoeSpec s = spec;
  s.capacity = spec.capacity.one_group();
  const int P = ep.size();
  const int64_t L = int64_t(w.experts.size());
  const MoeCharge charge{[&](const kernels::KernelCost& c) { chip.charge(c, c.name); }};
  const Routing& rt = o.placement.empty() ? keep.routing : keep.slots;  // destination-major, as the forward's
  const bool real = dy.has_storage() && x.has_storage();
  const std::vector<size_t> recv_rows = rows_per_peer(keep.recv_counts, P, L);

  Tensor dyp = Tensor::make(s.dtype, keep.yp.shape(), real);
  std::vector<float> dweight;
  charge(kernels::unpermute_backward(dy, keep.yp, rt, dyp, dweight));
  if (g.etp_size() > 1)  // the experts' outputs were partial sums over etp, so are these
    etp_sum(*g.etp, real ? dweight.data() : nullptr, size_t(rt.tokens * rt.top_k), runtime::DType::fp32,
            "combine weights' gradient", o, chip, comm);
  // The combine's gradient goes to the experts' ranks; the shared experts' backward meanwhile.
  const sim::TimeNs t0 = chip.t;
  const Tensor dyr_src = exchange_rows(ep, dyp, keep.send_rows, recv_rows, "combine backward", o, chip, comm,
                                       nullptr, nullptr);
  Tensor dxs;
  if (s.shared_ffn > 0 && o.overlap_shared) {
    const sim::TimeNs t_x = chip.t;
    chip.t = t0;
    dxs = kernels::shared_backward(s, w.shared, x, keep.shared, dy, grads.shared, charge);
    chip.t = std::max(chip.t, t_x);
  }
  kernels::KernelCost sort_cost;
  const Tensor dyr = sort_chunks(dyr_src, keep.recv_counts, P, L, true, sort_cost);
  charge(sort_cost);
  const Tensor dxr = kernels::experts_backward(s, w.experts, keep.xr, keep.local_offsets, keep.experts, dyr,
                                               grads.experts, charge);
  const Tensor dxr_src = sort_chunks(dxr, keep.recv_counts, P, L, false, sort_cost);
  charge(sort_cost);
  const Tensor dxp = exchange_rows(ep, dxr_src, recv_rows, keep.send_rows, "dispatch backward", o, chip, comm,
                                   nullptr, nullptr);
  Tensor dx = Tensor::make(s.dtype, x.shape(), real);
  charge(kernels::permute_backward(dxp, rt, dx));
  if (s.shared_ffn > 0) {
    if (!o.overlap_shared) dxs = kernels::shared_backward(s, w.shared, x, keep.shared, dy, grads.shared, charge);
    charge(kernels::add_inplace(dx, dxs));
  }
  if (g.etp_size() > 1 && o.etp_scatter) {  // this chip's rows of the sum, then of the router's part (every chip's)
    Tensor mine = etp_scatter(*g.etp, dx, "input gradient", o, chip, comm);
    Tensor dr = Tensor::make(s.dtype, x.shape(), real);
    if (real) std::memset(dr.data(), 0, dr.nbytes());
    kernels::router_backward_pass(s, w.router, x, keep.routing, dweight, aux_grad, dr, grads.router, charge);
    charge(kernels::add_inplace(mine, dr.rows(g.etp_rank() * mine.dim(0), mine.dim(0))));
    return mine;
  }
  if (g.etp_size() > 1) etp_sum(*g.etp, dx.data_if_stored(), size_t(dx.numel()), dx.dtype(), "input gradient", o, chip, comm);
  kernels::router_backward_pass(s, w.router, x, keep.routing, dweight, aux_grad, dx, grads.router, charge);
  return dx;
}

}  // namespace shardsim::sharding::plans

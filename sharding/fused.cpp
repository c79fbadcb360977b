#include "sharding/fused.h"

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unordered_map>

#include "collectives/algorithms.h"
#include "collectives/async.h"
#include "collectives/collectives.h"
#include "common/error.h"
#include "common/number.h"
#include "kernels/gemm.h"
#include "kernels/norm.h"
#include "runtime/chips.h"
#include "runtime/world.h"
#include "sim/cost.h"

namespace shardsim::sharding {

using collectives::Collective;
using runtime::Tensor;

namespace {

// A GEMM of A·B on the chip's compute engine after READY; returns C and its span.
Tensor gemm_on(runtime::Transport& tp, const Tensor& a, const Tensor& b, sim::TimeNs ready, const std::string& name,
               sim::Span& span) {
  Tensor c = Tensor::make(a.dtype(), {a.dim(0), b.dim(1)}, a.has_storage() && b.has_storage());
  const auto cost = kernels::gemm(a, b, c);
  span = tp.timeline().compute(name, cost.flops, cost.bytes, runtime::precision_of(cost.dtype), ready, cost.shape);
  return c;
}

// The simulated time of one [M, K] x [K, N] GEMM kernel on this chip (kernels/gemm.h's cost).
double gemm_ns(runtime::Transport& tp, runtime::DType dt, int64_t m, int64_t k, int64_t n) {
  const double es = static_cast<double>(runtime::dtype_size(dt));
  return sim::kernel_time_ns(tp.timeline().device(), 2.0 * double(m) * double(k) * double(n),
                             (double(m) * double(k) + double(k) * double(n) + double(m) * double(n)) * es,
                             runtime::precision_of(dt), sim::KernelShape{sim::KernelClass::gemm, m, n, k, 1});
}

// The unfused GEMMs X·W_i of the weights WS (X: [M, K]) as the block charges them (sharding/plans/block_ops.h,
// column_gemms): one GEMM over their concatenated columns on a device issuing fused kernels, else one each.
double column_gemms_ns(runtime::Transport& tp, runtime::DType dt, int64_t m, int64_t k,
                       const std::vector<const Tensor*>& ws) {
  if (ws.size() > 1 && !tp.timeline().device().eager_kernels) {
    int64_t n = 0;
    for (const Tensor* w : ws) n += w->dim(1);
    return gemm_ns(tp, dt, m, k, n);
  }
  double ns = 0;
  for (const Tensor* w : ws) ns += gemm_ns(tp, dt, m, k, w->dim(1));
  return ns;
}

// The collective C alone on TP for a per-rank buffer of BYTES (nccl-tests sizing), ALGORITHM resolved as the
// collective itself resolves it ("auto" = the lowest estimate).
double collective_ns(runtime::Transport& tp, Collective c, const std::string& algorithm, double bytes) {
  if (tp.size() == 1) return 0;
  collectives::CollectiveOptions o;
  o.algorithm = algorithm;
  const std::string a = collectives::choose(c, o, tp, bytes).algorithm;
  return collectives::estimate_ns(c, a, tp, bytes);
}

// Host buffers for the pieces, kept across calls (grow-only, per thread): a fresh tensor per piece and call
// costs its first-touch page faults, which on this kind of host cost more than the GEMM (docs/performance/host.md, "Async engine").
// Returns a tensor of DTYPE and SHAPE whose contents are unspecified.
Tensor& pooled(std::vector<Tensor>& pool, size_t i, runtime::DType dtype, const runtime::Shape& shape) {
  if (pool.size() <= i) pool.resize(i + 1);
  Tensor& t = pool[i];
  if (t.dtype() != dtype || t.shape() != shape) t = Tensor(dtype, shape);
  return t;
}
// One pair of pools per chip: with several chips per rank (runtime/chips.h) the chips are fibers of one thread,
// and a chip switches away inside a piece's all_reduce while its output still sits in the pool, so a shared
// thread_local pool let another chip overwrite it (wrong results with fused: true at K > 1).
struct PiecePools {
  std::vector<Tensor> b, c;
};
PiecePools& piece_pools() {
  thread_local std::unordered_map<int, PiecePools> pools;  // chip-level world rank (-1: one chip per rank)
  return pools[runtime::chips::current()];
}

// Columns [c0, c0+n) of the 2-D tensor T into OUT ([rows, n]), and the reverse.
void columns_into(const Tensor& t, int64_t c0, int64_t n, Tensor& out) {
  const size_t es = runtime::dtype_size(t.dtype());
  for (int64_t r = 0; r < t.dim(0); ++r)
    std::memcpy(static_cast<unsigned char*>(out.data()) + static_cast<size_t>(r * n) * es,
                static_cast<const unsigned char*>(t.data()) + static_cast<size_t>(r * t.dim(1) + c0) * es,
                static_cast<size_t>(n) * es);
}
void set_columns(Tensor& t, int64_t c0, const Tensor& src) {
  const size_t es = runtime::dtype_size(t.dtype());
  const int64_t n = src.dim(1);
  for (int64_t r = 0; r < t.dim(0); ++r)
    std::memcpy(static_cast<unsigned char*>(t.data()) + static_cast<size_t>(r * t.dim(1) + c0) * es,
                static_cast<const unsigned char*>(src.data()) + static_cast<size_t>(r * n) * es,
                static_cast<size_t>(n) * es);
}

void check(bool ok, const std::string& what) {
  if (!ok) throw UsageError(what);
}

std::string shape(const Tensor& t) { return runtime::shape_str(t.shape()); }

}  // namespace

double overlap_efficiency(double compute_ns, double comm_ns, double fused_ns) {
  const double m = std::min(compute_ns, comm_ns);
  return m > 0 ? (compute_ns + comm_ns - fused_ns) / m : 0.0;
}

double FusedTiming::overlap_efficiency() const { return sharding::overlap_efficiency(compute_ns, comm_ns, fused_ns); }

FusedTiming gemm_all_reduce(runtime::Transport& tp, const Tensor& a, const Tensor& b, Tensor& c, int chunks,
                            sim::TimeNs ready, const std::string& name, const std::string& algorithm) {
  check(a.rank() == 2 && b.rank() == 2 && a.dim(1) == b.dim(0) && c.shape() == runtime::Shape{a.dim(0), b.dim(1)},
        name + ": A " + shape(a) + " x B " + shape(b) + " -> C " + shape(c) + " do not fit");
  const int64_t M = a.dim(0), K = a.dim(1), N = b.dim(1);
  const bool by_cols = N > M;  // cut the longer side: the other operand is what each piece re-reads
  const int64_t len = by_cols ? N : M;
  check(chunks >= 0 && chunks <= std::max<int64_t>(1, len),
        name + ": chunks " + std::to_string(chunks) + " must be in 0 (auto).." + std::to_string(std::max<int64_t>(1, len)) +
            " (the " + (by_cols ? "columns" : "rows") + " of C " + shape(c) + ")");
  const auto dt = a.dtype();
  const double es = static_cast<double>(runtime::dtype_size(dt));
  auto piece_gemm_ns = [&](int64_t l) { return by_cols ? gemm_ns(tp, dt, M, K, l) : gemm_ns(tp, dt, l, K, N); };
  auto piece_bytes = [&](int64_t l) { return double(by_cols ? M : N) * double(l) * es; };
  FusedTiming t;
  t.cut = by_cols ? "columns" : "rows";
  if (chunks == 0) {  // the model picks; ranks may differ (uneven K_r), so the max over ranks decides
    std::vector<double> est;
    for (int64_t n = 1; n <= std::min<int64_t>(64, std::max<int64_t>(1, len)); n *= 2) {
      const collectives::Partition part{static_cast<size_t>(len), static_cast<size_t>(n)};
      double g_end = 0, c_end = 0;
      for (int64_t i = 0; i < n; ++i) {
        const auto l = static_cast<int64_t>(part.size(static_cast<size_t>(i)));
        g_end += piece_gemm_ns(l);
        c_end = std::max(g_end, c_end) + collective_ns(tp, Collective::all_reduce, algorithm, piece_bytes(l));
      }
      est.push_back(c_end);
    }
    std::vector<double> worst = est;
    tp.allreduce(std::span<double>(worst), runtime::Reduce::max, name + ": choosing chunks");
    const auto best = std::min_element(worst.begin(), worst.end()) - worst.begin();
    chunks = 1 << best;
    t.auto_chunks = true;
  }
  t.chunks = chunks;
  const collectives::Partition part{static_cast<size_t>(len), static_cast<size_t>(chunks)};
  sim::TimeNs compute_at = ready, end = ready;
  // On the host too the pieces overlap: with several large pieces each all_reduce is issued on the chip's
  // communication engine (collectives/async.h) and the next GEMM runs on this thread meanwhile. The simulated
  // spans are those of the synchronous calls (async.h), so the choice changes wall time only.
  // Only for pieces of 1 MiB or more: below that the engine's per-op cost (a sequence-number exchange, a thread
  // hand-off) outweighs what there is to overlap. Not when one rank hosts several chips (the engine needs one chip
  // per rank): the pieces then run synchronously, with the same simulated spans.
  const bool host_async =
      !tp.chip_mode() && tp.size() > 1 && chunks > 1 && piece_bytes(len / chunks) >= double(1 << 20);
  // Piece i's output lives in c_pool[i] until its all_reduce is done (the engine holds pointers into it); the
  // pool is only resized before any is issued.
  std::vector<Tensor>& c_pool = piece_pools().c;
  std::vector<Tensor>& b_pool = piece_pools().b;
  if (c_pool.size() < static_cast<size_t>(chunks)) c_pool.resize(static_cast<size_t>(chunks));
  // Shape-only operands (runtime/tensor.h): shape-only pieces, no copies, null collective buffers.
  const bool real = a.has_storage() && b.has_storage() && c.has_storage();
  std::vector<Tensor*> pieces;
  std::vector<collectives::AsyncHandle> inflight;
  std::vector<int64_t> offsets;
  auto finish = [&](const collectives::CollectiveResult& r, size_t k) {
    end = std::max(end, r.span.end);
    t.bytes_sent += r.bytes_sent;
    if (pieces[k] && real) set_columns(c, offsets[k], *pieces[k]);  // row pieces are already in C
  };
  for (int i = 0; i < chunks; ++i) {
    const auto off = static_cast<int64_t>(part.offset(static_cast<size_t>(i)));
    const auto l = static_cast<int64_t>(part.size(static_cast<size_t>(i)));
    if (l == 0) continue;
    const std::string gname = name + ".gemm" + std::to_string(i);
    const size_t slot = pieces.size();
    kernels::KernelCost cost;
    void* buf = nullptr;  // the piece's all_reduce buffer
    size_t count = 0;
    if (by_cols) {  // a column block of C is strided: compute it into a pooled [M, l] tensor
      Tensor meta_b, meta_c;
      if (!real) {
        meta_b = Tensor::shape_only({K, l}, dt);
        meta_c = Tensor::shape_only({M, l}, dt);
      }
      Tensor& ci = real ? pooled(c_pool, slot, dt, {M, l}) : meta_c;
      Tensor& bi = real ? pooled(b_pool, 0, dt, {K, l}) : meta_b;
      if (real) columns_into(b, off, l, bi);
      cost = kernels::gemm(a, bi, ci);
      pieces.push_back(real ? &ci : nullptr);
      buf = ci.data_if_stored();
      count = static_cast<size_t>(ci.numel());
    } else {  // a row block of C is contiguous: compute and all_reduce it in place
      cost = kernels::gemm_rows(a, off, l, b, c, off);
      pieces.push_back(nullptr);
      buf = real ? static_cast<unsigned char*>(c.data()) + static_cast<size_t>(off * N) * runtime::dtype_size(dt)
                 : nullptr;
      count = static_cast<size_t>(l * N);
    }
    const sim::Span span =
        tp.timeline().compute(gname, cost.flops, cost.bytes, runtime::precision_of(cost.dtype), compute_at, cost.shape);
    offsets.push_back(off);
    compute_at = span.end;  // the next piece's GEMM does not wait for this piece's all_reduce
    t.compute_ns += span.duration();
    collectives::CollectiveOptions o;
    o.algorithm = algorithm;
    o.name = name + ".all_reduce" + std::to_string(i);
    if (host_async) {
      inflight.push_back(
          collectives::all_reduce_async(tp, buf, buf, count, dt, collectives::ReduceOp::sum, span.end, o));
    } else {
      finish(collectives::all_reduce(tp, buf, buf, count, dt, collectives::ReduceOp::sum, span.end, o), slot);
    }
  }
  for (size_t k = 0; k < inflight.size(); ++k) finish(inflight[k].wait(), k);
  t.fused_ns = std::max(end, compute_at) - ready;
  t.comm_ns = collective_ns(tp, Collective::all_reduce, algorithm, double(M) * double(N) * es);
  t.unfused_ns = gemm_ns(tp, dt, M, K, N) + t.comm_ns;
  return t;
}

namespace {
// Every ring step of a fused op sends to r + 1 and receives from r - 1: the global pattern of the step is the
// ring shift (crossing flows, docs/MODEL.md), as collectives/ring.cpp passes it.
const runtime::FlowPattern kRingShift = runtime::FlowPattern::shift(1, 0, 1);

// The ring all_gather a fused op overlaps with its compute: at step s this rank holds the rows of rank
// (r - s) mod p (its own, OWN, at s = 0), sends them on to r + 1 first, so the transfer overlaps the work, then
// calls ON_SHARD(src, shard, shard_ready) and takes the next shard from r - 1. Received shards have storage if
// STORAGE. Returns the last arrival (READY when p == 1).
template <class OnShard>
sim::TimeNs ring_all_gather_overlapped(runtime::Transport& tp, const Tensor& own, bool storage, sim::TimeNs ready,
                                       const std::string& name, OnShard&& on_shard) {
  const int p = tp.size(), r = tp.rank();
  const size_t bytes = own.nbytes();
  Tensor cur = own;
  sim::TimeNs cur_ready = ready, last_arrival = ready;
  for (int s = 0; s < p; ++s) {
    Tensor next;
    sim::TimeNs next_ready = cur_ready;
    if (s + 1 < p) {
      next = Tensor::make(own.dtype(), own.shape(), storage);
      next_ready = tp.sendrecv(cur.data_if_stored(), bytes, (r + 1) % p, next.data_if_stored(), bytes, (r - 1 + p) % p,
                               cur_ready, name + ".all_gather.step" + std::to_string(s), &kRingShift);
      last_arrival = std::max(last_arrival, next_ready);
    }
    on_shard((r - s + p) % p, static_cast<const Tensor&>(cur), cur_ready);
    if (s + 1 < p) {
      cur = std::move(next);
      cur_ready = next_ready;
    }
  }
  return last_arrival;
}
}  // namespace

FusedTiming all_gather_gemm(runtime::Transport& tp, const Tensor& x, const Tensor& w, Tensor& c, sim::TimeNs ready,
                            const std::string& name) {
  return all_gather_gemm(tp, x, std::vector<const Tensor*>{&w}, std::vector<Tensor*>{&c}, ready, name);
}

FusedTiming all_gather_gemm(runtime::Transport& tp, const Tensor& x, const std::vector<const Tensor*>& ws,
                            const std::vector<Tensor*>& cs, sim::TimeNs ready, const std::string& name) {
  const int p = tp.size();
  const int64_t m = x.dim(0);
  check(!ws.empty() && ws.size() == cs.size(), name + ": needs one output per weight");
  for (size_t j = 0; j < ws.size(); ++j) {
    const Tensor& w = *ws[j];
    const Tensor& c = *cs[j];
    check(x.rank() == 2 && w.rank() == 2 && x.dim(1) == w.dim(0) && c.shape() == runtime::Shape{m * p, w.dim(1)},
          name + ": X " + shape(x) + " (this rank's rows) x W " + shape(w) + " -> C " + shape(c) + " do not fit " +
              std::to_string(p) + " ranks");
  }
  FusedTiming t;
  t.cut = "ring shards";
  t.chunks = p;
  sim::TimeNs compute_at = ready;
  const size_t bytes = x.nbytes();
  const sim::TimeNs last_arrival = ring_all_gather_overlapped(
      tp, x, x.has_storage(), ready, name, [&](int src, const Tensor& cur, sim::TimeNs cur_ready) {
        for (size_t j = 0; j < ws.size(); ++j) {
          sim::Span span;
          Tensor part = gemm_on(tp, cur, *ws[j], std::max(compute_at, cur_ready),
                                name + ".gemm" + (ws.size() > 1 ? std::to_string(j) : "") + ".rows_of_" +
                                    std::to_string(src),
                                span);
          compute_at = span.end;
          t.compute_ns += span.duration();
          cs[j]->set_rows(src * m, part);
        }
      });
  t.bytes_sent = static_cast<double>(bytes) * (p - 1);
  if (p > 1) tp.timeline().record_region(name + ".all_gather", "collective", {ready, last_arrival}, t.bytes_sent);
  t.fused_ns = std::max(compute_at, last_arrival) - ready;
  t.comm_ns = collective_ns(tp, Collective::all_gather, "ring", static_cast<double>(bytes) * p);
  t.unfused_ns = column_gemms_ns(tp, x.dtype(), m * p, x.dim(1), ws) + t.comm_ns;
  return t;
}

FusedTiming gemm_reduce_scatter(runtime::Transport& tp, const Tensor& a, const Tensor& b, Tensor& c,
                                sim::TimeNs ready, const std::string& name) {
  const int p = tp.size(), r = tp.rank();
  check(a.rank() == 2 && b.rank() == 2 && a.dim(1) == b.dim(0) && a.dim(0) % p == 0 &&
            c.shape() == runtime::Shape{a.dim(0) / p, b.dim(1)},
        name + ": A " + shape(a) + " x B " + shape(b) + " -> C " + shape(c) + " (rows / " + std::to_string(p) +
            " ranks) do not fit");
  FusedTiming t;
  t.cut = "ring shards";
  t.chunks = p;
  const int64_t m = a.dim(0) / p;
  sim::TimeNs compute_at = ready, acc_ready = ready, last_arrival = ready;
  Tensor incoming;
  for (int s = 0; s < p; ++s) {
    const int chunk = ((r - s - 1) % p + p) % p;  // s = p-1: this rank's own chunk
    sim::Span span;
    Tensor part = gemm_on(tp, a.rows(chunk * m, m), b, compute_at, name + ".gemm.rows_of_" + std::to_string(chunk), span);
    compute_at = span.end;
    t.compute_ns += span.duration();
    sim::TimeNs part_ready = span.end;
    if (s > 0) {
      // Add the accumulator of this chunk that arrived from r-1. Not charged: like the collectives' own
      // reductions, the add is fused into the data movement (docs/MODEL.md); it only waits for the arrival.
      kernels::add_inplace(part, incoming);
      part_ready = std::max(part_ready, acc_ready);
    }
    if (s + 1 < p) {
      incoming = Tensor::make(part.dtype(), part.shape(), part.has_storage());
      acc_ready = tp.sendrecv(part.data_if_stored(), part.nbytes(), (r + 1) % p, incoming.data_if_stored(),
                              incoming.nbytes(),
                              (r - 1 + p) % p, part_ready, name + ".reduce_scatter.step" + std::to_string(s),
                              &kRingShift);
      last_arrival = std::max(last_arrival, acc_ready);
      t.bytes_sent += static_cast<double>(part.nbytes());
    } else {
      c = std::move(part);
    }
  }
  if (p > 1) tp.timeline().record_region(name + ".reduce_scatter", "collective", {ready, last_arrival}, t.bytes_sent);
  t.fused_ns = std::max(compute_at, last_arrival) - ready;
  t.comm_ns = collective_ns(tp, Collective::reduce_scatter, "ring",
                            double(a.dim(0)) * double(b.dim(1)) * double(runtime::dtype_size(a.dtype())));
  t.unfused_ns = gemm_ns(tp, a.dtype(), a.dim(0), a.dim(1), b.dim(1)) + t.comm_ns;
  return t;
}

FusedTiming all_gather_gemm_backward(runtime::Transport& tp, const Tensor& dy, const Tensor& x, const Tensor& w,
                                     Tensor& dx, Tensor& dw, sim::TimeNs ready, const std::string& name) {
  const int p = tp.size();
  const int64_t m = dy.dim(0);
  check(dy.rank() == 2 && x.rank() == 2 && w.rank() == 2 && x.dim(0) == m * p && x.dim(1) == w.dim(0) &&
            dy.dim(1) == w.dim(1) && dx.shape() == x.shape() && dw.shape() == w.shape(),
        name + ": dY " + shape(dy) + " (this rank's rows) with X " + shape(x) + ", W " + shape(w) + " -> dX " +
            shape(dx) + ", dW " + shape(dw) + " do not fit " + std::to_string(p) + " ranks");
  const bool real = dy.has_storage() && x.has_storage() && w.has_storage();
  if (!real) {  // shape-only: the outputs carry no values (kernels/kernel_cost.h's rule)
    if (dx.has_storage()) dx.drop_storage();
    if (dw.has_storage()) dw.drop_storage();
  }
  FusedTiming t;
  t.cut = "ring shards";
  t.chunks = p;
  Tensor dy_full = Tensor::make(dy.dtype(), {m * p, dy.dim(1)}, real);
  sim::TimeNs compute_at = ready;
  const size_t bytes = dy.nbytes();
  const sim::TimeNs last_arrival = ring_all_gather_overlapped(
      tp, dy, real, ready, name, [&](int src, const Tensor& cur, sim::TimeNs cur_ready) {
        Tensor part = Tensor::make(dx.dtype(), {m, dx.dim(1)}, real);
        const auto cost = kernels::gemm(cur, w, part, {.trans_a = false, .trans_b = true});  // dY_src · Wᵀ
        const sim::Span span = tp.timeline().compute(name + ".gemm_dx.rows_of_" + std::to_string(src), cost.flops,
                                                     cost.bytes, runtime::precision_of(cost.dtype),
                                                     std::max(compute_at, cur_ready), cost.shape);
        compute_at = span.end;
        t.compute_ns += span.duration();
        dx.set_rows(src * m, part);
        dy_full.set_rows(src * m, cur);
      });
  // dW = Xᵀ · dY over the whole gathered dY: one GEMM, as unfused (the same call, the same values).
  const auto cost = kernels::gemm(x, dy_full, dw, {.trans_a = true, .trans_b = false});
  const sim::Span span = tp.timeline().compute(name + ".gemm_dw", cost.flops, cost.bytes,
                                               runtime::precision_of(cost.dtype), std::max(compute_at, last_arrival),
                                               cost.shape);
  compute_at = span.end;
  t.compute_ns += span.duration();
  t.bytes_sent = static_cast<double>(bytes) * (p - 1);
  if (p > 1) tp.timeline().record_region(name + ".all_gather", "collective", {ready, last_arrival}, t.bytes_sent);
  t.fused_ns = compute_at - ready;
  t.comm_ns = collective_ns(tp, Collective::all_gather, "ring", static_cast<double>(bytes) * p);
  t.unfused_ns = 2 * gemm_ns(tp, dy.dtype(), m * p, x.dim(1), w.dim(1)) + t.comm_ns;
  return t;
}

FusedTiming gemm_reduce_scatter_backward(runtime::Transport& tp, const Tensor& x,
                                         const std::vector<const Tensor*>& ws, const std::vector<const Tensor*>& dys,
                                         Tensor& dx, const std::vector<Tensor*>& dws, sim::TimeNs ready,
                                         const std::string& name) {
  const int p = tp.size(), r = tp.rank();
  const int64_t m = x.dim(0);
  check(!ws.empty() && ws.size() == dys.size() && ws.size() == dws.size(), name + ": needs one dY and dW per weight");
  bool real = x.has_storage();
  for (size_t j = 0; j < ws.size(); ++j) {
    const Tensor &w = *ws[j], &g = *dys[j];
    check(x.rank() == 2 && w.rank() == 2 && g.rank() == 2 && x.dim(1) == w.dim(0) &&
              g.shape() == runtime::Shape{m * p, w.dim(1)} && dws[j]->shape() == w.shape() && dx.shape() == x.shape(),
          name + ": X " + shape(x) + " (this rank's rows), W " + shape(w) + ", dY " + shape(g) + " -> dX " +
              shape(dx) + ", dW " + shape(*dws[j]) + " do not fit " + std::to_string(p) + " ranks");
    real = real && w.has_storage() && g.has_storage();
  }
  if (!real) {
    if (dx.has_storage()) dx.drop_storage();
    for (Tensor* d : dws)
      if (d->has_storage()) d->drop_storage();
  }
  FusedTiming t;
  t.cut = "ring shards";
  t.chunks = p;
  const auto dt = x.dtype();
  const size_t xbytes = x.nbytes();
  Tensor x_full = Tensor::make(dt, {m * p, x.dim(1)}, real);
  x_full.set_rows(r * m, x);
  Tensor xcur = x, incoming;
  sim::TimeNs xcur_ready = ready, x_arrival = ready, compute_at = ready, acc_ready = ready, rs_arrival = ready;
  double rs_bytes = 0;
  for (int s = 0; s < p; ++s) {
    // The all_gather of X: shard (r - s) mod P is here; pass it on (it is only needed by the dW GEMMs at the end).
    if (s + 1 < p) {
      Tensor next = Tensor::make(dt, x.shape(), real);
      xcur_ready = tp.sendrecv(xcur.data_if_stored(), xbytes, (r + 1) % p, next.data_if_stored(), xbytes,
                               (r - 1 + p) % p, xcur_ready, name + ".all_gather.step" + std::to_string(s),
                               &kRingShift);
      x_arrival = std::max(x_arrival, xcur_ready);
      xcur = std::move(next);
      x_full.set_rows(((r - s - 1) % p + p) % p * m, xcur);
    }
    // The reduce_scatter of dX (gemm_reduce_scatter's ring): the partial of row chunk (r - s - 1) mod P.
    const int chunk = ((r - s - 1) % p + p) % p;  // s = p-1: this rank's own chunk
    Tensor part = Tensor::make(dt, {m, x.dim(1)}, real);
    auto charge = [&](const kernels::KernelCost& cost, const std::string& what) {
      const sim::Span span = tp.timeline().compute(name + what + ".rows_of_" + std::to_string(chunk), cost.flops,
                                                   cost.bytes, runtime::precision_of(cost.dtype), compute_at, cost.shape);
      compute_at = span.end;
      t.compute_ns += span.duration();
    };
    for (size_t j = 0; j < ws.size(); ++j) {
      const Tensor rows = dys[j]->rows(chunk * m, m);
      const std::string g = ".gemm_dx" + (ws.size() > 1 ? std::to_string(j) : std::string());
      if (j == 0) {
        charge(kernels::gemm(rows, *ws[j], part, {.trans_a = false, .trans_b = true}), g);
      } else {  // the next weight's contribution, added as the unfused path adds the whole tensors
        Tensor more = Tensor::make(dt, {m, x.dim(1)}, real);
        charge(kernels::gemm(rows, *ws[j], more, {.trans_a = false, .trans_b = true}), g);
        charge(kernels::add_inplace(part, more), ".add_dx");
      }
    }
    sim::TimeNs part_ready = compute_at;
    if (s > 0) {  // the accumulator from r - 1 (the add is fused into the data movement: not charged)
      kernels::add_inplace(part, incoming);
      part_ready = std::max(part_ready, acc_ready);
    }
    if (s + 1 < p) {
      incoming = Tensor::make(dt, part.shape(), real);
      acc_ready = tp.sendrecv(part.data_if_stored(), part.nbytes(), (r + 1) % p, incoming.data_if_stored(),
                              incoming.nbytes(), (r - 1 + p) % p, part_ready,
                              name + ".reduce_scatter.step" + std::to_string(s), &kRingShift);
      rs_arrival = std::max(rs_arrival, acc_ready);
      rs_bytes += static_cast<double>(part.nbytes());
    } else {
      dx = std::move(part);
      rs_arrival = std::max(rs_arrival, part_ready);
    }
  }
  // dW_j = all_gather(X)ᵀ · dY_j once X is whole: the unfused path's GEMMs (the same values).
  for (size_t j = 0; j < ws.size(); ++j) {
    const auto cost = kernels::gemm(x_full, *dys[j], *dws[j], {.trans_a = true, .trans_b = false});
    const sim::Span span =
        tp.timeline().compute(name + ".gemm_dw" + (ws.size() > 1 ? std::to_string(j) : ""), cost.flops, cost.bytes,
                              runtime::precision_of(cost.dtype), std::max(compute_at, x_arrival), cost.shape);
    compute_at = span.end;
    t.compute_ns += span.duration();
  }
  t.bytes_sent = static_cast<double>(xbytes) * (p - 1) + rs_bytes;
  if (p > 1) {
    tp.timeline().record_region(name + ".all_gather", "collective", {ready, x_arrival},
                                static_cast<double>(xbytes) * (p - 1));
    tp.timeline().record_region(name + ".reduce_scatter", "collective", {ready, rs_arrival}, rs_bytes);
  }
  t.fused_ns = std::max(compute_at, rs_arrival) - ready;
  t.comm_ns = collective_ns(tp, Collective::all_gather, "ring", static_cast<double>(xbytes) * p) +
              collective_ns(tp, Collective::reduce_scatter, "ring", static_cast<double>(xbytes) * p);
  t.unfused_ns = 2 * column_gemms_ns(tp, dt, m * p, x.dim(1), ws) + t.comm_ns;
  return t;
}

// ------------------------------------------------------------------------------------------------ plans

std::string FusedPlan::describe() const {
  if (!enabled) return "";
  return "chunks " + (chunks == 0 ? std::string("auto") : std::to_string(chunks));
}

FusedPlan parse_fused_plan(const ConfigNode& par, int tp, int64_t out_rows, int64_t out_cols) {
  FusedPlan f;
  f.enabled = par.get_bool("fused", false);
  if (par.has("chunks")) {
    if (!f.enabled) par.child("chunks").fail("parallel.chunks: only used with fused: true");
    const std::string v = par.get_string("chunks");
    if (v != "auto") {
      const int64_t n = decimal_int(v).value_or(0);  // decimal only (common/number.h)
      if (n < 1 || n > 4096)
        par.child("chunks").fail("parallel.chunks: '" + v + "' (auto, or a piece count 1..4096)");
      f.chunks = static_cast<int>(n);
    }
  }
  if (const int64_t longest = std::max(out_rows, out_cols); f.chunks > longest)
    par.child("chunks").fail("parallel.chunks: " + std::to_string(f.chunks) + " pieces of an output [" +
                             std::to_string(out_rows) + ", " + std::to_string(out_cols) +
                             "] cut along its longer side (at most " + std::to_string(longest) + ")");
  if (f.enabled && tp < 2)
    par.child("fused").fail("parallel.fused: needs tp > 1 (it overlaps the tensor-parallel collectives with their "
                            "GEMMs; tp is " + std::to_string(tp) + ")");
  return f;
}

// ------------------------------------------------------------------------------------------------ reports

std::vector<double> pack(const std::vector<FusedOp>& ops) {
  std::vector<double> v;
  for (const auto& o : ops) {
    const double cut = o.t.cut == "rows" ? 0 : o.t.cut == "columns" ? 1 : 2;
    for (double x : {o.t.compute_ns, o.t.comm_ns, o.t.fused_ns, o.t.unfused_ns, o.t.bytes_sent, double(o.t.chunks),
                     o.t.auto_chunks ? 1.0 : 0.0, cut})
      v.push_back(x);
  }
  return v;
}

std::vector<FusedOp> unpack(const double* v, const std::vector<FusedOp>& names) {
  std::vector<FusedOp> out;
  for (size_t i = 0; i < names.size(); ++i, v += kFusedFields) {
    FusedOp o{names[i].name, {}};
    o.t.compute_ns = v[0];
    o.t.comm_ns = v[1];
    o.t.fused_ns = v[2];
    o.t.unfused_ns = v[3];
    o.t.bytes_sent = v[4];
    o.t.chunks = static_cast<int>(v[5]);
    o.t.auto_chunks = v[6] != 0;
    o.t.cut = v[7] == 0 ? "rows" : v[7] == 1 ? "columns" : "ring shards";
    out.push_back(o);
  }
  return out;
}

namespace {
FusedTiming sum_of(const std::vector<FusedOp>& ops) {
  FusedTiming s;
  for (const auto& o : ops) {
    s.compute_ns += o.t.compute_ns;
    s.comm_ns += o.t.comm_ns;
    s.fused_ns += o.t.fused_ns;
    s.unfused_ns += o.t.unfused_ns;
    s.bytes_sent += o.t.bytes_sent;
  }
  return s;
}
}  // namespace

std::string fused_text(const std::vector<FusedOp>& ops, double total_ns) {
  if (ops.empty()) return "";
  std::string out =
      "fused collectives (critical chip; T_comm = the collective alone, unfused = whole GEMMs then the collective)\n";
  char b[320];
  std::snprintf(b, sizeof b, "  %-34s %-17s %11s %11s %11s %11s %8s %8s\n", "op", "chunks", "T_compute", "T_comm",
                "T_fused", "unfused", "overlap", "speedup");
  out += b;
  auto row = [&](const std::string& name, const std::string& chunks, const FusedTiming& t) {
    const double eff = std::fabs(t.overlap_efficiency()) < 0.005 ? 0.0 : t.overlap_efficiency();  // no "-0.00"
    std::snprintf(b, sizeof b, "  %-34s %-17s %8.3f us %8.3f us %8.3f us %8.3f us %8.2f %7.2fx\n", name.c_str(),
                  chunks.c_str(), t.compute_ns / 1e3, t.comm_ns / 1e3, t.fused_ns / 1e3, t.unfused_ns / 1e3, eff,
                  t.speedup());
    out += b;
  };
  for (const auto& o : ops)
    row(o.name, std::to_string(o.t.chunks) + (o.t.auto_chunks ? " auto" : "") + " " + o.t.cut, o.t);
  const FusedTiming s = sum_of(ops);
  if (ops.size() > 1) row("all fused ops", "", s);
  const double unfused_total = total_ns - s.fused_ns + s.unfused_ns;
  std::snprintf(b, sizeof b, "  run with these ops unfused      %.3f us -> fused speedup %.2fx\n", unfused_total / 1e3,
                total_ns > 0 ? unfused_total / total_ns : 0.0);
  out += b;
  return out;
}

nlohmann::json fused_json(const std::vector<FusedOp>& ops, double total_ns) {
  nlohmann::json arr = nlohmann::json::array();
  auto obj = [](const FusedTiming& t) {
    return nlohmann::json{{"compute_ns", t.compute_ns},         {"comm_ns", t.comm_ns},
                          {"fused_ns", t.fused_ns},             {"unfused_ns", t.unfused_ns},
                          {"overlap_efficiency", t.overlap_efficiency()}, {"speedup", t.speedup()},
                          {"bytes_sent", t.bytes_sent}};
  };
  for (const auto& o : ops) {
    auto j = obj(o.t);
    j["name"] = o.name;
    j["chunks"] = o.t.chunks;
    j["auto_chunks"] = o.t.auto_chunks;
    j["cut"] = o.t.cut;
    arr.push_back(j);
  }
  const FusedTiming s = sum_of(ops);
  const double unfused_total = total_ns - s.fused_ns + s.unfused_ns;
  return {{"ops", arr},
          {"sum", obj(s)},
          {"run_unfused_ns", unfused_total},
          {"run_speedup", total_ns > 0 ? unfused_total / total_ns : 0.0}};
}

}  // namespace shardsim::sharding

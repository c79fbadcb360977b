#include "sharding/fused.h"

#include <algorithm>
#include <cstring>

#include "collectives/collectives.h"
#include "common/error.h"
#include "kernels/gemm.h"
#include "kernels/norm.h"

namespace shardsim::sharding {

using runtime::Tensor;

namespace {



// A GEMM of A·B on the chip's compute engine after READY; returns C and its span.
Tensor gemm_on(runtime::Transport& tp, const Tensor& a, const Tensor& b, sim::TimeNs ready, const std::string& name,
               sim::Span& span) {
  Tensor c(a.dtype(), {a.dim(0), b.dim(1)});
  const auto cost = kernels::gemm(a, b, c);
  span = tp.timeline().compute(name, cost.flops, cost.bytes, runtime::precision_of(cost.dtype), ready);
  return c;
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

FusedTiming gemm_all_reduce(runtime::Transport& tp, const Tensor& a, const Tensor& b, Tensor& c, int chunks,
                            sim::TimeNs ready, const std::string& name) {
  check(a.rank() == 2 && b.rank() == 2 && a.dim(1) == b.dim(0) && c.shape() == runtime::Shape{a.dim(0), b.dim(1)},
        name + ": A " + shape(a) + " x B " + shape(b) + " -> C " + shape(c) + " do not fit");
  check(chunks >= 1 && chunks <= std::max<int64_t>(1, a.dim(0)),
        name + ": chunks " + std::to_string(chunks) + " must be in 1.." + std::to_string(a.dim(0)));
  FusedTiming t;
  const collectives::Partition rows{static_cast<size_t>(a.dim(0)), static_cast<size_t>(chunks)};
  sim::TimeNs compute_at = ready, end = ready;
  for (int i = 0; i < chunks; ++i) {
    const auto off = static_cast<int64_t>(rows.offset(static_cast<size_t>(i)));
    const auto len = static_cast<int64_t>(rows.size(static_cast<size_t>(i)));
    if (len == 0) continue;
    sim::Span span;
    Tensor ci = gemm_on(tp, a.rows(off, len), b, compute_at, name + ".gemm" + std::to_string(i), span);
    compute_at = span.end;  // the next chunk's GEMM does not wait for this chunk's all_reduce
    t.compute_ns += span.duration();
    collectives::CollectiveOptions o;
    o.algorithm = "ring";
    o.name = name + ".all_reduce" + std::to_string(i);
    const auto r = collectives::all_reduce(tp, ci.data(), ci.data(), static_cast<size_t>(ci.numel()), ci.dtype(),
                                           collectives::ReduceOp::sum, span.end, o);
    end = std::max(end, r.span.end);
    t.bytes_sent += r.bytes_sent;
    c.set_rows(off, ci);
  }
  t.fused_ns = std::max(end, compute_at) - ready;
  return t;
}

FusedTiming all_gather_gemm(runtime::Transport& tp, const Tensor& x, const Tensor& w, Tensor& c, sim::TimeNs ready,
                            const std::string& name) {
  const int p = tp.size(), r = tp.rank();
  const int64_t m = x.dim(0);
  check(x.rank() == 2 && w.rank() == 2 && x.dim(1) == w.dim(0) && c.shape() == runtime::Shape{m * p, w.dim(1)},
        name + ": X " + shape(x) + " (this rank's rows) x W " + shape(w) + " -> C " + shape(c) + " do not fit " +
            std::to_string(p) + " ranks");
  FusedTiming t;
  Tensor cur = x;
  sim::TimeNs cur_ready = ready, compute_at = ready, last_arrival = ready;
  const size_t bytes = cur.nbytes();
  for (int s = 0; s < p; ++s) {
    const int src = (r - s + p) % p;  // whose rows CUR holds
    Tensor next;
    sim::TimeNs next_ready = cur_ready;
    if (s + 1 < p) {  // forward first: the transfer overlaps this step's GEMM
      next = Tensor(x.dtype(), x.shape());
      next_ready = tp.sendrecv(cur.data(), bytes, (r + 1) % p, next.data(), bytes, (r - 1 + p) % p, cur_ready,
                               name + ".all_gather.step" + std::to_string(s));
      last_arrival = std::max(last_arrival, next_ready);
    }
    sim::Span span;
    Tensor part = gemm_on(tp, cur, w, std::max(compute_at, cur_ready), name + ".gemm.rows_of_" + std::to_string(src), span);
    compute_at = span.end;
    t.compute_ns += span.duration();
    c.set_rows(src * m, part);
    if (s + 1 < p) {
      cur = std::move(next);
      cur_ready = next_ready;
    }
  }
  t.bytes_sent = static_cast<double>(bytes) * (p - 1);
  if (p > 1) tp.timeline().record_region(name + ".all_gather", "collective", {ready, last_arrival}, t.bytes_sent);
  t.fused_ns = std::max(compute_at, last_arrival) - ready;
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
    if (s > 0) {  // add the accumulator of this chunk that arrived from r-1
      const auto cost = kernels::add_inplace(part, incoming);
      const auto add = tp.timeline().compute(name + ".accumulate", cost.flops, cost.bytes,
                                             runtime::precision_of(cost.dtype), std::max(compute_at, acc_ready));
      compute_at = add.end;
      part_ready = add.end;
    }
    if (s + 1 < p) {
      incoming = Tensor(part.dtype(), part.shape());
      acc_ready = tp.sendrecv(part.data(), part.nbytes(), (r + 1) % p, incoming.data(), incoming.nbytes(),
                              (r - 1 + p) % p, part_ready, name + ".reduce_scatter.step" + std::to_string(s));
      last_arrival = std::max(last_arrival, acc_ready);
      t.bytes_sent += static_cast<double>(part.nbytes());
    } else {
      c = std::move(part);
    }
  }
  if (p > 1) tp.timeline().record_region(name + ".reduce_scatter", "collective", {ready, last_arrival}, t.bytes_sent);
  t.fused_ns = std::max(compute_at, last_arrival) - ready;
  return t;
}

}  // namespace shardsim::sharding

#include "sharding/mlp.h"

#include <cmath>
#include <cstdio>

#include "common/error.h"

#include "collectives/all_reduce.h"
#include "kernels/gemm.h"
#include "sharding/init.h"

namespace shardsim::sharding {

using runtime::Tensor;

Tensor make_mlp_input(const MlpShape& s) {
  Tensor x(s.dtype, {s.tokens, s.hidden});
  fill_uniform_block(x, InitSpec{s.seed, 1, -1.0f, 1.0f}, s.hidden, 0, 0);
  return x;
}

MlpWeights make_mlp_weights(const MlpShape& s, int64_t ffn_offset, int64_t ffn_size) {
  MlpWeights w;
  w.ffn_offset = ffn_offset;
  w.ffn_size = ffn_size;
  const float a_in = 1.0f / std::sqrt(static_cast<float>(s.hidden));
  const float a_ffn = 1.0f / std::sqrt(static_cast<float>(s.ffn));
  w.w_gate = Tensor(s.dtype, {s.hidden, ffn_size});
  w.w_up = Tensor(s.dtype, {s.hidden, ffn_size});
  w.w_down = Tensor(s.dtype, {ffn_size, s.hidden});
  fill_uniform_block(w.w_gate, InitSpec{s.seed, 2, -a_in, a_in}, s.ffn, 0, ffn_offset);
  fill_uniform_block(w.w_up, InitSpec{s.seed, 3, -a_in, a_in}, s.ffn, 0, ffn_offset);
  fill_uniform_block(w.w_down, InitSpec{s.seed, 4, -a_ffn, a_ffn}, s.hidden, ffn_offset, 0);
  return w;
}

collectives::Partition ffn_partition(const MlpShape& s, int tp) {
  return collectives::Partition{static_cast<size_t>(s.ffn), static_cast<size_t>(tp)};
}

double mlp_tp_peak_bytes(const MlpShape& s, int tp, int rank) {
  const auto part = ffn_partition(s, tp);
  const double ffn_r = double(part.size(static_cast<size_t>(rank)));
  const double h = double(s.hidden), t = double(s.tokens);
  const collectives::Partition chunks{static_cast<size_t>(s.tokens * s.hidden), static_cast<size_t>(tp)};
  const double ring_buffer = tp > 1 ? double(chunks.max_size()) : 0.0;
  const double elements = 3.0 * h * ffn_r + 2.0 * t * h + 2.0 * t * ffn_r + ring_buffer;
  return elements * double(runtime::dtype_size(s.dtype));
}

void check_mlp_fits(const MlpShape& s, int tp, double capacity_gib) {
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  for (int r = 0; r < tp; ++r) {
    const double need = mlp_tp_peak_bytes(s, tp, r);
    if (need > capacity_gib * kGiB) {
      char buf[200];
      std::snprintf(buf, sizeof buf, "simulated out of memory on chip %d: needs %.3f GiB, has %.3f GiB", r,
                    need / kGiB, capacity_gib);
      throw ConfigError(buf);
    }
  }
}

namespace {

// Runs the local part: returns y_partial = glu(x W_gate, x W_up) W_down; charges each kernel after READY.
Tensor local_mlp(const MlpShape& s, const Tensor& x, const MlpWeights& w, sim::Timeline* tl, sim::TimeNs ready,
                 MlpTiming* timing, const std::string& prefix) {
  sim::TimeNs t = ready;
  auto charge = [&](const kernels::KernelCost& c, const std::string& name) {
    if (timing) timing->flops += c.flops;
    if (tl) t = tl->compute(prefix + name, c.flops, c.bytes, runtime::precision_of(c.dtype), t).end;
  };
  Tensor gate(s.dtype, {s.tokens, w.ffn_size});
  Tensor up(s.dtype, {s.tokens, w.ffn_size});
  Tensor y(s.dtype, {s.tokens, s.hidden});
  charge(kernels::gemm(x, w.w_gate, gate), "gemm.gate (column-parallel)");
  charge(kernels::gemm(x, w.w_up, up), "gemm.up (column-parallel)");
  charge(kernels::glu_inplace(gate, up, s.activation), s.activation == kernels::Activation::silu ? "swiglu" : "geglu");
  charge(kernels::gemm(gate, w.w_down, y), "gemm.down (row-parallel)");
  if (timing) timing->end = t;
  return y;
}

}  // namespace

Tensor mlp_forward(const MlpShape& s, const Tensor& x, const MlpWeights& w, sim::Timeline* timeline,
                   MlpTiming* timing) {
  return local_mlp(s, x, w, timeline, 0.0, timing, "");
}

Tensor mlp_forward_tp(runtime::Transport& tp, const MlpShape& s, const Tensor& x, const MlpWeights& w,
                      sim::TimeNs ready, MlpTiming* timing, const std::string& all_reduce_algorithm) {
  MlpTiming local;
  Tensor y = local_mlp(s, x, w, &tp.timeline(), ready, &local, "");
  collectives::AllReduceOptions opt;
  opt.algorithm = all_reduce_algorithm;
  opt.name = "all_reduce (row-parallel output)";
  const auto r = collectives::all_reduce(tp, y.data(), y.data(), static_cast<size_t>(y.numel()), s.dtype,
                                         collectives::ReduceOp::sum, local.end, opt);
  if (timing) {
    *timing = local;
    timing->end = r.span.end;
    timing->all_reduce_ns = r.span.duration();
    timing->all_reduce_bytes_sent = r.bytes_sent;
    timing->all_reduce_algorithm = r.algorithm;
  }
  return y;
}

}  // namespace shardsim::sharding

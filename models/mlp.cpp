#include "models/mlp.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>

#include "common/error.h"

#include "collectives/all_reduce.h"
#include "kernels/gemm.h"
#include "models/init.h"

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

namespace {

uint64_t tensor_bytes(const MlpShape& s, int64_t rows, int64_t cols) {
  return static_cast<uint64_t>(rows) * static_cast<uint64_t>(cols) * runtime::dtype_size(s.dtype);
}
std::string dims(const char* name, int64_t rows, int64_t cols) {
  return std::string(name) + " [" + std::to_string(rows) + ", " + std::to_string(cols) + "]";
}

// The forward's own allocations, shared by the real forward and the plan so their names, sizes and order cannot
// drift apart. Allocated in host order (gate, up, y), like the Tensors in local_mlp.
struct LocalAllocations {
  sim::Memory::Scoped gate, up, y;
};
LocalAllocations allocate_local(sim::Memory& m, const MlpShape& s, int64_t ffn_size) {
  LocalAllocations a;
  a.gate = m.scoped(dims("gate", s.tokens, ffn_size), tensor_bytes(s, s.tokens, ffn_size));
  a.up = m.scoped(dims("up", s.tokens, ffn_size), tensor_bytes(s, s.tokens, ffn_size));
  a.y = m.scoped(dims("y", s.tokens, s.hidden), tensor_bytes(s, s.tokens, s.hidden));
  return a;
}

// One ring chunk of y (the largest, ceil(tokens x hidden / tp) elements); nothing for tp = 1.
uint64_t ring_buffer_elements(const MlpShape& s, int tp) {
  if (tp <= 1) return 0;
  const collectives::Partition chunks{static_cast<size_t>(s.tokens * s.hidden), static_cast<size_t>(tp)};
  return chunks.max_size();
}
sim::Memory::Scoped allocate_ring_buffer(sim::Memory& m, const MlpShape& s, int tp) {
  if (tp <= 1) return {};
  return m.scoped("all_reduce ring buffer", ring_buffer_elements(s, tp) * runtime::dtype_size(s.dtype));
}

}  // namespace

MlpResident allocate_mlp_resident(sim::Memory& m, const MlpShape& s, int64_t ffn_size) {
  MlpResident r;
  r.x = m.scoped(dims("x", s.tokens, s.hidden), tensor_bytes(s, s.tokens, s.hidden));
  r.w_gate = m.scoped(dims("w_gate", s.hidden, ffn_size), tensor_bytes(s, s.hidden, ffn_size));
  r.w_up = m.scoped(dims("w_up", s.hidden, ffn_size), tensor_bytes(s, s.hidden, ffn_size));
  r.w_down = m.scoped(dims("w_down", ffn_size, s.hidden), tensor_bytes(s, ffn_size, s.hidden));
  return r;
}

sim::Memory plan_mlp_tp_memory(const MlpShape& s, int tp, int rank, double capacity_bytes) {
  const auto ffn_r = static_cast<int64_t>(ffn_partition(s, tp).size(static_cast<size_t>(rank)));
  sim::Memory m(rank, capacity_bytes);
  {
    const MlpResident resident = allocate_mlp_resident(m, s, ffn_r);
    LocalAllocations local = allocate_local(m, s, ffn_r);  // the local forward: gemm gate, up, glu, gemm down
    local.gate.release();                                   // local_mlp returns: gate and up go
    local.up.release();
    const auto ring = allocate_ring_buffer(m, s, tp);       // the all_reduce
  }
  return m;
}

double mlp_tp_peak_bytes(const MlpShape& s, int tp, int rank) {
  const auto part = ffn_partition(s, tp);
  const double ffn_r = double(part.size(static_cast<size_t>(rank)));
  const double h = double(s.hidden), t = double(s.tokens);
  const double elements = 3.0 * h * ffn_r + 2.0 * t * h + std::max(2.0 * t * ffn_r, double(ring_buffer_elements(s, tp)));
  return elements * double(runtime::dtype_size(s.dtype));
}

void check_mlp_fits(const MlpShape& s, int tp, double capacity_gib) {
  for (int r = 0; r < tp; ++r) plan_mlp_tp_memory(s, tp, r, capacity_gib * sim::Memory::kGiB);
}

namespace {

// Runs the local part: returns y_partial = glu(x W_gate, x W_up) W_down; charges each kernel after READY. With
// MEMORY, gate and up are allocated for the duration of this function and y's allocation goes to Y_ALLOCATION.
// With ACTIVATION_ONLY the down projection is left out and the GLU activation [tokens, ffn_r] is returned (the
// fused path multiplies it by W_down itself).
Tensor local_mlp(const MlpShape& s, const Tensor& x, const MlpWeights& w, sim::Timeline* tl, sim::TimeNs ready,
                 MlpTiming* timing, const std::string& prefix, sim::Memory* memory,
                 sim::Memory::Scoped* y_allocation, bool activation_only = false) {
  sim::TimeNs t = ready;
  auto charge = [&](const kernels::KernelCost& c, const std::string& name) {
    if (timing) timing->flops += c.flops;
    if (tl) t = tl->compute(prefix + name, c.flops, c.bytes, runtime::precision_of(c.dtype), t).end;
  };
  LocalAllocations held;
  if (memory) held = allocate_local(*memory, s, w.ffn_size);
  Tensor gate(s.dtype, {s.tokens, w.ffn_size});
  Tensor up(s.dtype, {s.tokens, w.ffn_size});
  Tensor y(s.dtype, {s.tokens, s.hidden});
  charge(kernels::gemm(x, w.w_gate, gate), "gemm.gate (column-parallel)");
  charge(kernels::gemm(x, w.w_up, up), "gemm.up (column-parallel)");
  charge(kernels::glu_inplace(gate, up, s.activation), s.activation == kernels::Activation::silu ? "swiglu" : "geglu");
  if (y_allocation) *y_allocation = std::move(held.y);
  if (activation_only) {
    if (timing) timing->end = t;
    return gate;
  }
  charge(kernels::gemm(gate, w.w_down, y), "gemm.down (row-parallel)");
  if (timing) timing->end = t;
  return y;
}

}  // namespace

Tensor mlp_forward(const MlpShape& s, const Tensor& x, const MlpWeights& w, sim::Timeline* timeline,
                   MlpTiming* timing, sim::Memory* memory) {
  return local_mlp(s, x, w, timeline, 0.0, timing, "", memory, nullptr);
}

Tensor mlp_forward_tp(runtime::Transport& tp, const MlpShape& s, const Tensor& x, const MlpWeights& w,
                      sim::TimeNs ready, MlpTiming* timing, const std::string& all_reduce_algorithm,
                      sim::Memory* memory, const FusedPlan& fused) {
  MlpTiming local;
  sim::Memory::Scoped y_allocation;  // the output, held until this forward returns
  if (fused.enabled) {
    // gate, up and the GLU as usual; then the down projection fused with the all_reduce (sharding/fused.h).
    Tensor act = local_mlp(s, x, w, &tp.timeline(), ready, &local, "", memory, &y_allocation, true);
    Tensor y(s.dtype, {s.tokens, s.hidden});
    sim::Memory::Scoped ring;
    if (memory) ring = allocate_ring_buffer(*memory, s, tp.size());
    const FusedTiming f = gemm_all_reduce(tp, act, w.w_down, y, fused.chunks, local.end,
                                          "gemm.down + all_reduce (fused)", all_reduce_algorithm);
    if (timing) {
      *timing = local;
      timing->flops += 2.0 * double(s.tokens) * double(w.ffn_size) * double(s.hidden);
      timing->end = local.end + f.fused_ns;
      timing->all_reduce_ns = f.comm_ns;
      timing->all_reduce_bytes_sent = f.bytes_sent;
      timing->all_reduce_algorithm = all_reduce_algorithm + " per piece (fused)";
      timing->fused = f;
      timing->fused_used = true;
    }
    return y;
  }
  Tensor y = local_mlp(s, x, w, &tp.timeline(), ready, &local, "", memory, &y_allocation);
  collectives::AllReduceOptions opt;
  opt.algorithm = all_reduce_algorithm;
  opt.name = "all_reduce (row-parallel output)";
  sim::Memory::Scoped ring;
  if (memory) ring = allocate_ring_buffer(*memory, s, tp.size());
  const auto r = collectives::all_reduce(tp, y.data(), y.data(), static_cast<size_t>(y.numel()), s.dtype,
                                         collectives::ReduceOp::sum, local.end, opt);
  ring.release();
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

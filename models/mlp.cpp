#include "models/mlp.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>

#include "common/error.h"

#include "collectives/all_reduce.h"
#include "kernels/gemm.h"
#include "models/init.h"
#include "sharding/plans/block.h"
#include "models/transformer.h"

namespace shardsim::sharding {

using runtime::Tensor;

Tensor make_mlp_input(const MlpShape& s, bool storage) {
  if (!storage) return Tensor::shape_only({s.tokens, s.hidden}, s.dtype);
  Tensor x(s.dtype, {s.tokens, s.hidden});
  fill_uniform_block(x, InitSpec{s.seed, 1, -1.0f, 1.0f}, s.hidden, 0, 0);
  return x;
}

MlpWeights make_mlp_weights(const MlpShape& s, int64_t ffn_offset, int64_t ffn_size, bool storage) {
  MlpWeights w;
  w.ffn_offset = ffn_offset;
  w.ffn_size = ffn_size;
  if (!storage) {
    w.w_gate = Tensor::shape_only({s.hidden, ffn_size}, s.dtype);
    w.w_up = Tensor::shape_only({s.hidden, ffn_size}, s.dtype);
    w.w_down = Tensor::shape_only({ffn_size, s.hidden}, s.dtype);
    return w;
  }
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

ModelSpec mlp_block_shape(const MlpShape& s) {
  ModelSpec b;
  b.attention = false;
  b.heads = b.kv_heads = 0;
  b.hidden = s.hidden;
  b.ffn = s.ffn;
  b.seq = s.tokens;
  b.dtype = s.dtype;
  b.seed = s.seed;
  b.mlp = s.activation == kernels::Activation::gelu ? MlpKind::geglu : MlpKind::swiglu;
  return b;
}

MlpShape mlp_shape_of(const ModelSpec& b) {
  MlpShape s;
  s.tokens = b.seq;
  s.hidden = b.hidden;
  s.ffn = b.ffn;
  s.activation = b.glu_activation();
  s.dtype = b.dtype;
  s.seed = b.seed;
  return s;
}

Tensor mlp_forward(const MlpShape& s, const Tensor& x, const MlpWeights& w, sim::Timeline* timeline,
                   MlpTiming* timing, sim::Memory* memory) {
  LocalAllocations held;  // gate, up and y for the duration of the forward
  if (memory) held = allocate_local(*memory, s, w.ffn_size);
  plans::Chip chip{timeline, 0.0, 0.0};
  Tensor y = plans::mlp_layer(chip, nullptr, x, {.w_gate = &w.w_gate, .w_up = &w.w_up, .w_down = &w.w_down}, s.activation);
  if (timing) {
    timing->end = chip.t;
    timing->flops = timeline ? timeline->breakdown().flops : 0;
  }
  return y;
}

Tensor mlp_forward_tp(runtime::Transport& tp, const MlpShape& s, const Tensor& x, const MlpWeights& w,
                      sim::TimeNs ready, MlpTiming* timing, const std::string& all_reduce_algorithm,
                      sim::Memory* memory, const FusedPlan& fused) {
  const ModelSpec shape = mlp_block_shape(s);
  ParallelPlan plan;
  plan.tp = tp.size();
  plan.fused = fused;
  plan.tp_all_reduce = all_reduce_algorithm;
  plans::Chip chip{&tp.timeline(), ready, 0.0};
  plans::Comm comm;
  std::vector<FusedOp> fused_ops;
  plans::PlanContext ctx{shape, plan, tp, tp, chip, comm, fused_ops, s.tokens, s.tokens};
  // Simulated HBM: gate, up and y during the local part, then y and one ring chunk during the all_reduce (the
  // peak is the same as holding them in that order: see mlp.h).
  sim::Memory::Scoped y_allocation, ring;
  if (memory) {
    LocalAllocations local = allocate_local(*memory, s, w.ffn_size);
    y_allocation = std::move(local.y);
    local.gate.release();
    local.up.release();
    ring = allocate_ring_buffer(*memory, s, tp.size());
  }
  const double flops0 = tp.timeline().breakdown().flops;
  Tensor y = plans::mlp_layer(chip, &ctx, x, {.w_gate = &w.w_gate, .w_up = &w.w_up, .w_down = &w.w_down}, s.activation);
  ring.release();
  if (timing) {
    *timing = MlpTiming{};
    timing->end = chip.t;
    timing->flops = tp.timeline().breakdown().flops - flops0;
    const auto it = comm.stats.find("tp all_reduce");
    if (it != comm.stats.end()) {
      timing->all_reduce_ns = it->second.ns;
      timing->all_reduce_bytes_sent = it->second.bytes;
      timing->all_reduce_algorithm = it->second.algorithm;
    }
    if (!fused_ops.empty()) {
      timing->fused_used = true;
      timing->fused = fused_ops.back().t;
    }
  }
  return y;
}

}  // namespace shardsim::sharding

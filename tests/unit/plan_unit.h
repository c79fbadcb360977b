// What the per-unit plan tests (tests/unit/plan_*_test.cpp) share: the plan of a parallel: section parsed by the
// one parser (so the cases are the registry's keys, sharding/plans/registry.h), N simulated chips run as fibers of
// this one process (runtime/chips.h, run_chips) on a ring with a device mesh bound, seeded tensors, and
// comparisons against a single-device result (largest deviation relative to the reference's largest magnitude,
// NaN / inf positions compared exactly).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/config.h"
#include "runtime/chips.h"
#include "runtime/tensor.h"
#include "runtime/transport.h"
#include "runtime/world.h"
#include "sharding/device_mesh.h"
#include "sharding/model_spec.h"
#include "sharding/plans/block.h"
#include "sharding/plans/block_ops.h"
#include "sharding/plans/registry.h"
#include "sim/device_spec.h"
#include "sim/timeline.h"
#include "topology/topology.h"

namespace shardsim::test {

// The test model of the plan tests: 8 query heads, 4 KV heads of 4, hidden 32, ffn 64, 4 sequences of 16 tokens.
inline std::string unit_test_model() {
  return "model: {vocab: 64, hidden: 32, layers: 1, heads: 8, kv_heads: 4, head_dim: 4, ffn: 64, seq: 16, "
         "batch: 4}\n";
}

// PAR (the parallel: section's items, "tp: 2, sp: true") on CHIPS chips, parsed as the executor's loader parses it
// for training (FORWARD: for its forward mode, which also runs what only the forward implements). ConfigError when
// the registry refuses the plan.
inline sharding::ParallelPlan parse_plan(const std::string& par, int64_t chips, sharding::ModelSpec* model = nullptr,
                                         bool forward = false) {
  const ConfigNode root = ConfigNode::load_string(unit_test_model() + "parallel: {" + par + "}\n", "plan_test.yaml");
  const sharding::ModelSpec m = sharding::parse_model_spec(root.child("model"), sharding::SpecUse::train);
  if (model) *model = m;
  return sharding::parse_parallel_plan(root, m, sharding::SpecUse::train, chips, false, forward);
}

// The plan units registered on mesh axis AXIS (tp: tp, sp, fused; cp: cp, ulysses): the registry's descriptors.
inline std::vector<const sharding::plans::PlanDescriptor*> units_on_axis(const std::string& axis) {
  std::vector<const sharding::plans::PlanDescriptor*> v;
  for (const auto& d : sharding::plans::registered_plans())
    if (d.unit && d.axis == axis) v.push_back(&d);
  return v;
}

// One chip of a run: its mesh (bound to its transport), its timeline and its compute clock.
struct ChipEnv {
  sharding::DeviceMesh& mesh;
  runtime::Transport& world;
  sharding::plans::Chip chip;
  sharding::plans::Comm comm;
  std::vector<sharding::FusedOp> fused_ops;
  int rank() const { return world.rank(); }
};

// Runs BODY on every chip of PLAN's mesh (plan.chips() fibers of this process on a 100 GB/s ring).
inline void on_chips(const sharding::ParallelPlan& plan, const std::function<void(ChipEnv&)>& body) {
  const int n = plan.chips();
  const auto topo = topology::Topology::ring(n, topology::LinkSpec{100, 500});
  const int code = runtime::run_chips(n, [&](const runtime::World& w) {
    sharding::DeviceMesh mesh = sharding::build_mesh(plan, topo);
    sim::Timeline tl(mesh.placement().at(size_t(w.rank())), topo, sim::device_preset("generic"));
    runtime::Transport t(w, tl, mesh.placement());
    t.set_plan_algorithms(true);
    mesh.bind(t);
    ChipEnv env{mesh, t, sharding::plans::Chip{&tl}, {}, {}};
    body(env);
    return 0;
  });
  ASSERT_EQ(code, 0);
}

// Seeded uniform fp32 values in [-1, 1] of SHAPE (SALT picks the stream).
inline runtime::Tensor seeded(runtime::Shape shape, uint32_t salt) {
  runtime::Tensor t(runtime::DType::fp32, std::move(shape));
  std::mt19937 gen(salt);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, u(gen));
  return t;
}

// Columns [c0, c0 + n) of a 2-D tensor.
inline runtime::Tensor cols(const runtime::Tensor& t, int64_t c0, int64_t n) {
  runtime::Tensor out(t.dtype(), {t.dim(0), n});
  for (int64_t r = 0; r < t.dim(0); ++r)
    for (int64_t c = 0; c < n; ++c) out.set(r * n + c, t.get(r * t.dim(1) + c0 + c));
  return out;
}

// max |got - want| / max(|want|, 1e-6) over the finite elements, and whether the non-finite elements (NaN, +inf,
// -inf) sit at the same positions with the same kind. GOT and WANT have the same element count.
struct Deviation {
  double rel = 0;
  bool same_nonfinite = true;
  int64_t nonfinite = 0;  // non-finite elements of WANT
};
inline Deviation deviation(const runtime::Tensor& got, const runtime::Tensor& want) {
  Deviation d;
  EXPECT_EQ(got.numel(), want.numel());
  double e = 0, m = 1e-6;
  for (int64_t i = 0; i < std::min(got.numel(), want.numel()); ++i) {
    const double g = got.get(i), w = want.get(i);
    if (!std::isfinite(w) || !std::isfinite(g)) {
      d.nonfinite += !std::isfinite(w);
      const bool same = std::isnan(w) ? std::isnan(g) : g == w;
      d.same_nonfinite = d.same_nonfinite && same;
      continue;
    }
    e = std::max(e, std::fabs(g - w));
    m = std::max(m, std::fabs(w));
  }
  d.rel = e / m;
  return d;
}

// Asserts GOT equals WANT within TOL relative (fp32 sums in another order) with the same non-finite elements.
inline void expect_close(const runtime::Tensor& got, const runtime::Tensor& want, double tol, const std::string& what) {
  const Deviation d = deviation(got, want);
  EXPECT_LT(d.rel, tol) << what;
  EXPECT_TRUE(d.same_nonfinite) << what << ": NaN / inf elements differ from the single device's";
}

// Whether any element of T is NaN.
inline bool any_nan(const runtime::Tensor& t) {
  for (int64_t i = 0; i < t.numel(); ++i)
    if (std::isnan(t.get(i))) return true;
  return false;
}

// Attention of BATCH sequences of SEQ tokens (HEADS query heads, KV_HEADS of HEAD_DIM; causal per CAUSAL) on one
// device (sharding/plans/block.h's local_attention: the flash core the plans run per chip) and its backward from a
// seeded dO. NAN_KEY: a NaN in the key of sequence 0, position NAN_POS, KV head 0. (Where a causal NaN key lands
// in dQ depends on the tiling: a query before NAN_POS in a tile holding it multiplies the NaN by its masked zero,
// as a GPU's tile GEMM does. At position 0 every query sees the key, so its reach is the same on any tiling.)
struct AttentionReference {
  sharding::ModelSpec s;
  runtime::Tensor q, k, v, o, dout, dq, dk, dv;
  std::vector<runtime::Tensor> lse;
};
inline AttentionReference attention_reference(const sharding::ModelSpec& spec, bool nan_key, int64_t nan_pos = 5) {
  AttentionReference r;
  r.s = spec;
  const int64_t N = spec.batch * spec.seq, hq = spec.heads, hkv = spec.kv_heads, d = spec.head_dim;
  r.q = seeded({N, hq, d}, 11);
  r.k = seeded({N, hkv, d}, 12);
  r.v = seeded({N, hkv, d}, 13);
  if (nan_key) r.k.set(nan_pos * hkv * d, std::numeric_limits<float>::quiet_NaN());
  r.dout = seeded({N, hq, d}, 14);
  sharding::plans::Chip none;  // charges nothing
  r.o = sharding::plans::local_attention(none, spec, r.q, r.k, r.v, spec.batch, spec.seq, r.lse);
  r.dq = runtime::Tensor(runtime::DType::fp32, {N, hq, d});
  r.dk = runtime::Tensor(runtime::DType::fp32, {N, hkv, d});
  r.dv = runtime::Tensor(runtime::DType::fp32, {N, hkv, d});
  sharding::plans::local_attention_backward(none, spec, r.q, r.k, r.v, r.o, r.lse, r.dout, r.dq, r.dk, r.dv,
                                            spec.batch, spec.seq);
  return r;
}
// The rows of WHOLE ([batch·seq, ...], sequence-major) a chip of LAYOUT holds, in its local order.
inline runtime::Tensor layout_rows(const runtime::Tensor& whole, const sharding::plans::TokenLayout& layout,
                                   int64_t seq) {
  runtime::Shape shape = whole.shape();
  shape[0] = layout.batch * layout.seq_local;
  runtime::Tensor out(whole.dtype(), shape);
  for (int64_t b = 0; b < layout.batch; ++b)
    for (int64_t i = 0; i < layout.seq_local; ++i) {
      const int64_t r = b * layout.seq_local + i;
      out.set_rows(r, whole.rows(b * seq + layout.pos[size_t(r)], 1));
    }
  return out;
}

}  // namespace shardsim::test

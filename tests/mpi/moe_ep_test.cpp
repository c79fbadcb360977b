// Expert parallelism (sharding/plans/expert_parallel.h) over real ranks, and over 8 chips of one rank, against the
// single-device MoE MLP (kernels/moe_mlp.h) computed on every chip for all ranks' tokens with capacity groups = ep:
// outputs, each rank's aux loss, token counts and dropped tokens, the input gradients, every expert's weight
// gradient, and the router's and shared experts' gradients summed over ep. Dispatch bytes equal their closed form
// (uniform declared routing, shape-only: T·k·h·bytes·(ep-1)/ep per chip) and the simulated dispatch time is not
// below the bytes that must cross the ring's bisection.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>

#include "collectives/all_reduce.h"
#include "mpi_util.h"
#include "runtime/chips.h"
#include "runtime/world.h"
#include "sharding/device_mesh.h"
#include "sharding/plans/expert_parallel.h"
#include "sim/device_spec.h"
#include "topology/topology.h"

using namespace shardsim;
using kernels::MoeSpec;
using runtime::DType;
using runtime::Tensor;

namespace {

struct EpCase {
  const char* name;
  kernels::RouterScore score = kernels::RouterScore::softmax;
  double capacity = 0;
  int64_t shared = 0;
  bool skewed = false;  // router bias that crowds most tokens onto a few experts (imbalance, empty experts)
  bool gated = true;
  int64_t groups = 1, group_limit = 0;  // node-limited routing: 24 experts in GROUPS groups, GROUP_LIMIT per token
  bool placed = false;                  // experts placed by a skewed load (placement_by_load), one inner size
};

constexpr int64_t kTokens = 12;  // per rank

MoeSpec spec_of(const EpCase& c, int ep) {
  MoeSpec s;
  s.hidden = 8;
  s.router.experts = 24;
  s.router.top_k = 3;
  s.router.score = c.score;
  for (int64_t e = 0; e < 24; ++e) s.expert_ffn.push_back(c.placed ? 4 : 3 + e % 4);
  s.router.groups = c.groups;
  s.router.group_limit = c.group_limit;
  s.shared_ffn = c.shared;
  s.gated = c.gated;
  s.activation = c.gated ? kernels::Activation::silu : kernels::Activation::gelu;
  s.capacity.factor = c.capacity;
  s.capacity.groups = ep;
  s.aux_coef = 0.01;
  if (c.skewed) {
    s.router.bias.assign(24, 0.0f);
    s.router.bias[5] = 2.0f, s.router.bias[17] = 1.5f, s.router.bias[2] = 1.0f;
  }
  return s;
}

Tensor tokens_of(int rank, int64_t h, uint32_t salt) {
  Tensor x(DType::fp32, {kTokens, h});
  std::mt19937 gen(1000u * salt + uint32_t(rank));
  std::uniform_real_distribution<float> u(-1.5f, 1.5f);
  for (int64_t i = 0; i < x.numel(); ++i) x.set(i, u(gen));
  return x;
}

double rel_dev(const Tensor& got, const Tensor& want, int64_t want_row0 = 0) {
  double e = 0, m = 1e-6;
  const int64_t n = got.numel(), off = want_row0 * (want.rank() == 2 ? want.dim(1) : 0);
  for (int64_t i = 0; i < n; ++i) {
    e = std::max(e, std::fabs(double(got.get(i)) - want.get(off + i)));
    m = std::max(m, std::fabs(double(want.get(off + i))));
  }
  return e / m;
}

struct Outcome {
  double y = 0, dx = 0, experts = 0, router = 0, shared = 0, aux = 0;
  bool counts_equal = false;
  int64_t dropped = 0, ref_dropped = 0;
  double dispatch_bytes = 0, dispatch_expected = 0;
};

// One chip's forward and backward on an ep x etp mesh (etp innermost: the mesh's tp axis) against the reference
// (every chip computes the reference).
Outcome run_case(const EpCase& c, runtime::Transport& world, int P, int etp) {
  sharding::DeviceMesh mesh({{"tp", etp}, {"ep", P}}, world.timeline().topology());
  mesh.bind(world);
  runtime::Transport& t = mesh["ep"];
  runtime::Transport& tp = mesh["tp"];
  const int r = t.rank();
  const MoeSpec s = spec_of(c, P);
  const auto shard = sharding::plans::ep_shard(s.experts(), P, r);
  const kernels::MoeWeights w_all = kernels::make_moe_weights(s, 17, 0, s.experts());
  sharding::plans::EpOptions opts;
  std::vector<int64_t> slot_expert(static_cast<size_t>(s.experts()));  // the expert at each slot
  std::iota(slot_expert.begin(), slot_expert.end(), 0);
  if (c.placed) {  // a skewed load: expert e's load (e * 7) % 24
    std::vector<double> load;
    for (int64_t e = 0; e < s.experts(); ++e) load.push_back(double((e * 7) % 24));
    opts.placement = slot_expert = sharding::plans::placement_by_load(load, P);
  }
  kernels::MoeWeights placed = kernels::make_moe_weights(s, 17, shard.first, c.placed ? 0 : shard.count);
  for (int64_t q = shard.first; c.placed && q < shard.first + shard.count; ++q)
    placed.experts.push_back(kernels::make_moe_weights(s, 17, slot_expert[size_t(q)], 1).experts[0]);
  const kernels::MoeWeights w = sharding::plans::shard_etp(placed, etp, tp.rank());
  Tensor x_all(DType::fp32, {P * kTokens, s.hidden}), dy_all(DType::fp32, {P * kTokens, s.hidden});
  for (int q = 0; q < P; ++q) {
    x_all.set_rows(q * kTokens, tokens_of(q, s.hidden, 1));
    dy_all.set_rows(q * kTokens, tokens_of(q, s.hidden, 2));
  }
  const double aux_grad = 0.5;
  kernels::MoeActivations ref_keep;
  const Tensor y_ref = kernels::moe_forward(s, w_all, x_all, ref_keep, {});
  kernels::MoeWeights g_ref = kernels::zero_like(w_all);
  const Tensor dx_ref = kernels::moe_backward(s, w_all, x_all, ref_keep, dy_all, aux_grad, g_ref, {});
  std::vector<double> ref_aux;
  kernels::aux_loss(ref_keep.routing, s.router, s.aux_coef, P, &ref_aux);
  // The reference's gradients of this chip's shard.
  kernels::MoeWeights ref_local;
  ref_local.router = g_ref.router;
  ref_local.first_expert = shard.first;
  for (int64_t e = 0; e < shard.count; ++e) ref_local.experts.push_back(g_ref.experts[size_t(slot_expert[size_t(shard.first + e)])]);
  ref_local.shared = g_ref.shared;
  const kernels::MoeWeights ref_shard = sharding::plans::shard_etp(ref_local, etp, tp.rank());

  sharding::plans::Chip chip{&world.timeline()};
  sharding::plans::Comm comm;
  sharding::plans::EpActivations keep;
  const sharding::plans::EpGroups groups{t, etp > 1 ? &tp : nullptr};
  const Tensor x = tokens_of(r, s.hidden, 1), dy = tokens_of(r, s.hidden, 2);
  const Tensor y = sharding::plans::ep_moe_forward(groups, s, w, x, chip, comm, keep, nullptr, opts);
  kernels::MoeWeights g = kernels::zero_like(w);
  const Tensor dx = sharding::plans::ep_moe_backward(groups, s, w, x, keep, dy, aux_grad, g, chip, comm, opts);

  Outcome out;
  out.y = rel_dev(y, y_ref, r * kTokens);
  out.dx = rel_dev(dx, dx_ref, r * kTokens);
  for (int64_t e = 0; e < shard.count; ++e) {
    const auto& a = g.experts[size_t(e)];
    const auto& b = ref_shard.experts[size_t(e)];
    out.experts = std::max({out.experts, rel_dev(a.w_up, b.w_up), rel_dev(a.w_down, b.w_down),
                            s.gated ? rel_dev(a.w_gate, b.w_gate) : 0.0});
  }
  // Router and shared gradients: partial per ep rank, summed over ep.
  auto summed = [&](Tensor& part) {
    collectives::all_reduce(t, part.data(), part.data(), size_t(part.numel()), DType::fp32, collectives::ReduceOp::sum,
                            chip.t);
  };
  summed(g.router);
  out.router = rel_dev(g.router, ref_shard.router);
  if (s.shared_ffn > 0) {
    summed(g.shared.w_up);
    summed(g.shared.w_down);
    out.shared = std::max(rel_dev(g.shared.w_up, ref_shard.shared.w_up), rel_dev(g.shared.w_down, ref_shard.shared.w_down));
  }
  out.aux = std::fabs(keep.aux - ref_aux[size_t(r)]) / std::max(1e-9, std::fabs(ref_aux[size_t(r)]));
  // Token counts and kept slots: this rank's routing is the reference's group r.
  out.counts_equal = true;
  for (int64_t e = 0; e < s.experts(); ++e)
    out.counts_equal = out.counts_equal && keep.routing.chosen[size_t(e)] == ref_keep.routing.chosen[size_t(r * s.experts() + e)];
  for (int64_t i = 0; i < kTokens * s.router.top_k; ++i)
    out.counts_equal = out.counts_equal && keep.routing.kept[size_t(i)] == ref_keep.routing.kept[size_t(r * kTokens * s.router.top_k + i)];
  out.dropped = tp.rank() == 0 ? keep.routing.dropped : 0;  // count each ep rank's tokens once
  out.ref_dropped = ref_keep.routing.dropped;
  const auto& st = comm.stats["ep all_to_allv"];
  out.dispatch_bytes = st.bytes;
  out.dispatch_expected = st.expected;
  return out;
}

void expect_close(const Outcome& o, const char* name, int chip) {
  EXPECT_LT(o.y, 1e-5) << name << " chip " << chip;
  EXPECT_LT(o.dx, 1e-5) << name << " chip " << chip;
  EXPECT_LT(o.experts, 1e-5) << name << " chip " << chip;
  EXPECT_LT(o.router, 1e-4) << name << " chip " << chip;
  EXPECT_LT(o.shared, 1e-5) << name << " chip " << chip;
  EXPECT_LT(o.aux, 1e-6) << name << " chip " << chip;
  EXPECT_TRUE(o.counts_equal) << name << " chip " << chip;
  EXPECT_DOUBLE_EQ(o.dispatch_bytes, o.dispatch_expected) << name << " chip " << chip;
}

const EpCase kCases[] = {
    {"dropless_softmax"},
    {"capacity_drops_shared", kernels::RouterScore::softmax, 1.0, 5},
    {"sigmoid_skewed_capacity", kernels::RouterScore::sigmoid, 1.25, 0, true},
    {"skewed_dropless_gelu_shared", kernels::RouterScore::softmax, 0, 4, true, false},
    {"node_limited_sigmoid_capacity", kernels::RouterScore::sigmoid, 1.25, 0, true, true, 4, 2},
    {"placed_capacity_shared", kernels::RouterScore::softmax, 1.0, 5, false, true, 1, 0, true},
};

class MoeEp : public ::testing::TestWithParam<EpCase> {};

// ep = every rank (1, 2, 3, 4, 8), and at 4 and 8 ranks also ep x etp (etp 2).
TEST_P(MoeEp, MatchesSingleDevice) {
  const EpCase& c = GetParam();
  const int n = world_size(), rank = world_rank();
  for (int etp : {1, 2}) {
    if (n % etp != 0 || (etp > 1 && n < 4)) continue;
    const int P = n / etp;
    if (24 % P != 0) continue;
    const auto topo = topology::Topology::ring(n, topology::LinkSpec{100, 500});
    sim::Timeline tl(rank, topo, sim::device_preset("generic"));
    runtime::Transport world(MPI_COMM_WORLD, tl, identity_chips(n));
    const Outcome o = run_case(c, world, P, etp);
    expect_close(o, c.name, rank);
    if (c.capacity > 0) EXPECT_GT(o.ref_dropped, 0) << c.name << ": the case should drop tokens";
    long long dropped = o.dropped, total = 0;
    MPI_Allreduce(&dropped, &total, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
    EXPECT_EQ(total, o.ref_dropped) << c.name << " etp " << etp;  // the dropped tokens are the reference's
  }
}

// 8 chips of one rank: ep 8, ep 4 x etp 2, ep 2 x etp 4.
TEST_P(MoeEp, EightChipsOfOneRank) {
  const EpCase& c = GetParam();
  if (world_size() != 1) GTEST_SKIP() << "one rank hosting 8 chips";
  for (int etp : {1, 2, 4}) {
    std::vector<Outcome> got(8);
    const int code = runtime::run_chips(8, [&](const runtime::World& w) {
      const auto topo = topology::Topology::ring(8, topology::LinkSpec{100, 500});
      sim::Timeline tl(w.rank(), topo, sim::device_preset("generic"));
      runtime::Transport world(w, tl, identity_chips(8));
      got[size_t(w.rank())] = run_case(c, world, 8 / etp, etp);
      return 0;
    });
    ASSERT_EQ(code, 0);
    int64_t dropped = 0;
    for (int i = 0; i < 8; ++i) {
      expect_close(got[size_t(i)], c.name, i);
      dropped += got[size_t(i)].dropped;
    }
    EXPECT_EQ(dropped, got[0].ref_dropped) << c.name << " etp " << etp;
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, MoeEp, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<EpCase>& i) { return std::string(i.param.name); });

// Shape-only, uniform declared routing: each chip sends T·k·h·bytes·(ep-1)/ep in the dispatch (and again in the
// combine), and the dispatch takes at least the bisection bound: half the chips' traffic to the other half over
// the ring's 2 cut links per direction... stated per direction: (ep/2)·(ep/2)·(T·k/ep)·h·bytes / (2 links · B).
TEST(MoeEpShapeOnly, UniformDispatchBytesAndBisectionBound) {
  const int P = world_size(), r = world_rank();
  if (24 % P != 0 || P < 2) GTEST_SKIP() << "needs ep >= 2 dividing 24";
  MoeSpec s = spec_of(EpCase{"uniform"}, P);
  s.hidden = 4096;  // large rows: bandwidth dominates the latency
  const int64_t T = 48;  // T·k / E = 6 rows per expert per rank
  auto topo = topology::Topology::ring(P, topology::LinkSpec{100, 500});
  sim::Timeline tl(r, topo, sim::device_preset("generic"));
  runtime::Transport t(MPI_COMM_WORLD, tl, identity_chips(P));
  t.set_shape_only(true);
  const auto shard = sharding::plans::ep_shard(s.experts(), P, r);
  const auto w = kernels::make_moe_weights(s, 1, shard.first, shard.count, false);
  const auto declared = sharding::plans::declared_ep_routing(s, T, {0, 1}, P, 0);
  sharding::plans::Chip chip{&tl};
  sharding::plans::Comm comm;
  sharding::plans::EpActivations keep;
  const Tensor x = Tensor::shape_only({T, s.hidden}, DType::fp32);
  const Tensor y = sharding::plans::ep_moe_forward({t}, s, w, x, chip, comm, keep, &declared);
  t.set_shape_only(false);
  EXPECT_FALSE(y.has_storage());
  const double closed = double(T * s.router.top_k * s.hidden * 4) * (P - 1) / P;
  EXPECT_DOUBLE_EQ(keep.dispatch_bytes, closed);
  EXPECT_DOUBLE_EQ(keep.combine_bytes, closed);
  // Bisection: the P/2 chips on one side send (P/2)·(T·k/P)·h·4 bytes each to the other side over 2 cut links
  // per direction (bidirectional ring) at 100 GB/s.
  const double cross = double(P / 2) * double(P - P / 2) * double(T * s.router.top_k / P) * double(s.hidden) * 4.0;
  const double bound_ns = cross / (2.0 * 100.0);
  const double slowest = max_over_ranks(double(keep.dispatch_ns));
  EXPECT_GE(slowest, bound_ns * (1 - 1e-9)) << "P=" << P;
  if (r == 0)
    std::printf("[moe_ep] ep=%d uniform dispatch: %.0f bytes per chip (closed form %.0f), %.3f us (bisection bound "
                "%.3f us)\n", P, keep.dispatch_bytes, closed, slowest / 1e3, bound_ns / 1e3);
}

}  // namespace

namespace {

// One chip's ep x etp forward + backward on a fresh clock: real data, or shape-only with DECLARED routings; the
// chip's simulated end time.
double step_end(const EpCase& c, int P, int etp, const std::vector<kernels::Routing>* declared) {
  const int n = world_size(), rank = world_rank();
  const auto topo = topology::Topology::ring(n, topology::LinkSpec{100, 500});
  sim::Timeline tl(rank, topo, sim::device_preset("trainium1"));
  runtime::Transport world(MPI_COMM_WORLD, tl, identity_chips(n));
  sharding::DeviceMesh mesh({{"tp", etp}, {"ep", P}}, topo);
  mesh.bind(world);
  runtime::Transport& t = mesh["ep"];
  runtime::Transport& tp = mesh["tp"];
  const MoeSpec s = spec_of(c, P);
  const auto shard = sharding::plans::ep_shard(s.experts(), P, t.rank());
  const bool real = declared == nullptr;
  const auto w = sharding::plans::shard_etp(kernels::make_moe_weights(s, 17, shard.first, shard.count, real), etp,
                                            tp.rank());
  world.set_shape_only(!real);
  const Tensor x = real ? tokens_of(t.rank(), s.hidden, 1) : Tensor::shape_only({kTokens, s.hidden}, DType::fp32);
  sharding::plans::Chip chip{&tl};
  sharding::plans::Comm comm;
  sharding::plans::EpActivations keep;
  const sharding::plans::EpGroups groups{t, etp > 1 ? &tp : nullptr};
  sharding::plans::ep_moe_forward(groups, s, w, x, chip, comm, keep, declared);
  kernels::MoeWeights g = kernels::zero_like(w);
  sharding::plans::ep_moe_backward(groups, s, w, x, keep, x, 0.5, g, chip, comm);
  world.set_shape_only(false);
  return double(tl.end_time());
}

}  // namespace

// A shape-only step whose declared routing is the real run's (each rank's kept counts) has the same simulated end
// time on every chip, bit for bit, as the real-data step: the costs never depend on values.
TEST(MoeEpShapeOnly, SameSimulatedTimeAsRealDataWithItsCounts) {
  const int n = world_size();
  const int etp = n >= 4 ? 2 : 1, P = n / etp;
  if (24 % P != 0) GTEST_SKIP() << "24 experts do not split over " << P;
  const EpCase c{"capacity_skewed_shared", kernels::RouterScore::softmax, 1.0, 4, true};
  const MoeSpec s = spec_of(c, P);
  // Every rank's kept counts, from the single-device routing with groups = ep (what each rank routes).
  Tensor x_all(DType::fp32, {P * kTokens, s.hidden});
  for (int q = 0; q < P; ++q) x_all.set_rows(q * kTokens, tokens_of(q, s.hidden, 1));
  kernels::MoeActivations ref;
  kernels::moe_forward(s, kernels::make_moe_weights(s, 17, 0, s.experts()), x_all, ref, {});
  std::vector<kernels::Routing> declared;
  const int64_t k = s.router.top_k;
  for (int q = 0; q < P; ++q) {
    std::vector<int64_t> counts(static_cast<size_t>(s.experts()), 0);
    for (int64_t i = q * kTokens * k; i < (q + 1) * kTokens * k; ++i)
      if (ref.routing.kept[size_t(i)]) ++counts[size_t(ref.routing.expert[size_t(i)])];
    declared.push_back(kernels::Routing::from_counts(kTokens, k, counts));
  }
  const double real = step_end(c, P, etp, nullptr);
  const double meta = step_end(c, P, etp, &declared);
  EXPECT_GT(real, 0);
  EXPECT_EQ(real, meta) << "ep " << P << " etp " << etp;
}

namespace {

// The slowest chip's simulated end of a shape-only ep forward + backward on h100 (the tile model: every expert's
// GEMM tiled at its own token count inside one grouped kernel) under declared routing D, TOKENS per rank.
double slowest_step(const MoeSpec& s, int64_t tokens, const kernels::RoutingDistribution& d) {
  const int P = world_size(), r = world_rank();
  const auto topo = topology::Topology::ring(P, topology::LinkSpec{100, 500});
  sim::Timeline tl(r, topo, sim::device_preset("h100"));
  runtime::Transport t(MPI_COMM_WORLD, tl, identity_chips(P));
  t.set_shape_only(true);
  const auto shard = sharding::plans::ep_shard(s.experts(), P, r);
  const auto w = kernels::make_moe_weights(s, 1, shard.first, shard.count, false);
  const auto declared = sharding::plans::declared_ep_routing(s, tokens, d, P, 0);
  sharding::plans::Chip chip{&tl};
  sharding::plans::Comm comm;
  sharding::plans::EpActivations keep;
  const Tensor x = Tensor::shape_only({tokens, s.hidden}, DType::bf16);
  sharding::plans::ep_moe_forward({t}, s, w, x, chip, comm, keep, &declared);
  kernels::MoeWeights g = kernels::zero_like(w);
  sharding::plans::ep_moe_backward({t}, s, w, x, keep, x, 0.5, g, chip, comm);
  t.set_shape_only(false);
  return max_over_ranks(double(tl.end_time()));
}

}  // namespace

// Imbalance costs step time: the same tokens routed by a Zipf-skewed router (the hot experts' grouped GEMMs get
// more rows, and with ep > 1 their chips receive more, so everyone waits at the combine) take longer than under
// uniform routing, on every ep from 1 (one chip, one grouped kernel per GEMM) to 8.
TEST(MoeEpShapeOnly, SkewedRoutingCostsMoreThanUniform) {
  const int P = world_size();
  if (24 % P != 0) GTEST_SKIP() << "24 experts do not split over " << P;
  MoeSpec s = spec_of(EpCase{"uniform"}, P);
  s.dtype = DType::bf16;
  s.hidden = 1024;
  s.expert_ffn.assign(24, 512);
  s.capacity.factor = 0;  // dropless: every token reaches its experts
  const int64_t T = 8192;
  const double uniform = slowest_step(s, T, {0, 1});
  const double zipf = slowest_step(s, T, {1.2, 1});
  // ep 1: only the partial tiles of uneven experts (and their extra waves) cost; ep > 1: the hot chip's rows.
  EXPECT_GT(zipf, uniform * (P == 1 ? 1.0 : 1.05)) << "ep " << P;
  if (world_rank() == 0)
    std::printf("[moe_ep] ep=%d %lld tokens/rank: uniform %.1f us, Zipf 1.2 %.1f us (+%.0f %%)\n", P, (long long)T,
                uniform / 1e3, zipf / 1e3, 100.0 * (zipf / uniform - 1));
}

// The serving mode of the executor (models/lm_tp.h serve_step, sharding/plans/kv_attention.h), issue 50's first
// must-show: greedy decoding of k tokens with the KV cache equals recomputing the whole sequence each step on one
// device (lm_forward on the prompt and the tokens so far): every chosen token is the reference's argmax and every
// logit is within 1e-4 (fp32; only summation orders differ). Eight sequences with prompts of 3..6 tokens are
// prefilled in one ragged batch, then decoded 4 steps, one token per sequence per step. Plans: tp (heads and kv
// heads split, GQA groups local; one kv head per chip at tp 8; tp above the kv heads, each chip holding its query
// heads' kv head: 2 kv heads at tp 8, MQA at tp 2), pp, tp x pp, and dp replicas taking the
// remaining chips; the Llama block and the GPT block (layernorm, gelu, learned positions, tied embeddings); a
// mixture of experts (8 experts top-2, dropless) at ep 2 and 4, ep x tp (experts whole or split over tp by etp), ep
// x pp and ep x dp, each ep chip attending its own sequences (models/lm_tp.h LmServeBatch). Each case at one chip
// per rank on the MPI world and, on one rank, with 8 chips on that rank (runtime/chips.h).
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "models/lm_tp.h"
#include "models/lm_tp_decode.h"
#include "mpi_util.h"
#include "runtime/chips.h"
#include "runtime/world.h"
#include "sim/device_spec.h"
#include "topology/topology.h"
#include "tests/unit/small_lm.h"

using namespace shardsim;

namespace {

struct ServeCase {
  const char* name;
  int tp = 1, pp = 1;
  int64_t kv_heads = 8;
  bool gpt = false;
  int ep = 0, etp = 1;  // ep > 0: the MoE model, its experts over ep chips
};

std::ostream& operator<<(std::ostream& os, const ServeCase& c) { return os << c.name; }

const ServeCase kCases[] = {
    {"one_device"}, {"tp2", 2}, {"tp4", 4}, {"tp8_one_kv_head_each", 8}, {"tp2_kv2", 2, 1, 2},
    {"tp8_kv2_replicated", 8, 1, 2}, {"mqa_tp2", 2, 1, 1}, {"mqa_tp2_x_pp2", 2, 2, 1},
    {"pp2", 1, 2},  {"pp4", 1, 4}, {"tp2_x_pp2", 2, 2}, {"tp4_x_pp2", 4, 2}, {"gpt_tp2", 2, 1, 8, true},
    {"moe_one_device", 1, 1, 8, false, 1}, {"moe_ep2", 1, 1, 8, false, 2}, {"moe_ep4", 1, 1, 8, false, 4},
    {"moe_ep2_x_tp2", 2, 1, 8, false, 2}, {"moe_ep2_x_tp2_etp2", 2, 1, 8, false, 2, 2},
    {"moe_ep4_x_tp2_etp2", 2, 1, 8, false, 4, 2}, {"moe_ep2_x_pp2", 1, 2, 8, false, 2},
};

constexpr int kSeqs = 8;       // sequences (dp replicas split them)
constexpr int kDecode = 4;     // greedy decode steps after the prefill

sharding::ModelSpec config_of(const ServeCase& k) {
  sharding::ModelSpec c = test::small_lm();  // vocab 32, hidden 16, head_dim 4, ffn 32
  c.layers = 4;
  c.heads = 16;
  c.kv_heads = k.kv_heads;
  c.seq = 16;  // the longest sequence served (learned positions: the table's rows)
  c.batch = kSeqs;
  if (k.gpt) {
    c.norm = sharding::NormKind::layernorm;
    c.mlp = sharding::MlpKind::gelu;
    c.position = sharding::PositionKind::learned;
    c.tied_embeddings = true;
  }
  if (k.ep > 0) {  // Mixtral's MoE MLP in small: 8 SwiGLU experts of inner size 8, top-2, dropless
    kernels::MoeConfig m;
    m.spec.hidden = c.hidden;
    m.spec.router.experts = 8;
    m.spec.router.top_k = 2;
    m.spec.expert_ffn.assign(8, 8);
    m.spec.aux_coef = 0.01;
    m.spec.gated = true;
    m.spec.activation = kernels::Activation::silu;
    c.moe = m;
  }
  return c;
}

std::vector<int64_t> prompt(int i) {
  std::vector<int64_t> p;
  for (int j = 0; j < 3 + i % 4; ++j) p.push_back((7 * i + 5 * j + 3) % 32);
  return p;
}

// The single-device logits of the next token after TOKENS: the whole sequence recomputed (no cache).
std::vector<float> reference_logits(const sharding::ModelSpec& c, const models::LmWeights& w,
                                    const std::vector<int64_t>& tokens) {
  sharding::ModelSpec rc = c;
  rc.batch = 1;
  rc.seq = int64_t(tokens.size());
  rc.shard.positions = c.seq;
  models::LmBatch b;
  b.inputs = tokens;
  b.targets.assign(tokens.size(), 0);
  models::LmCache cache;
  (void)models::lm_forward(rc, w, b, &cache);
  std::vector<float> out(size_t(c.vocab));
  for (int64_t j = 0; j < c.vocab; ++j) out[size_t(j)] = cache.logits.get((rc.seq - 1) * c.vocab + j);
  return out;
}

int inner(const ServeCase& k) { return k.tp * k.pp * std::max(k.ep, 1); }  // the chips of one dp replica

int64_t argmax(const std::vector<float>& v) { return std::max_element(v.begin(), v.end()) - v.begin(); }

struct Deviation {
  double logits = 0;
  int token_mismatches = 0;
  int checked = 0;
};

// Prefill + kDecode steps of case K on N chips (this chip = RANK of WORLD), this replica's sequences checked
// against the reference at every step. Collective.
template <class World>
Deviation serve_case(const ServeCase& k, const World& world, int n, int rank) {
  const sharding::ModelSpec c = config_of(k);
  const int dp = n / inner(k);
  auto topo = topology::Topology::ring(n, topology::LinkSpec{100, 1000});
  sharding::DeviceMesh mesh({{"tp", k.tp}, {"cp", 1}, {"ep", std::max(k.ep, 1)}, {"dp", dp}, {"pp", k.pp}}, topo);
  sim::Timeline tl(mesh.placement()[size_t(rank)], topo, sim::device_preset("h100"));
  runtime::Transport t(world, tl, mesh.placement());
  mesh.bind(t);
  models::LmDpConfig dpc;
  dpc.etp = k.etp;
  dpc.forward_only = true;  // as `serve` builds it: the serving mode is forward only (kv heads replicated above their count)
  models::LmTpTrainer tr(c, models::LmTrainConfig{}, mesh, t, tl, dpc);
  const models::LmWeights ref_w = models::lm_compute_copy(c, models::lm_init(c));
  auto cache = tr.make_kv_cache(c.seq);
  const int d = mesh.coordinate("dp", rank), per = kSeqs / dp;
  std::vector<std::vector<int64_t>> seqs;
  models::LmServeBatch batch;
  for (int i = d * per; i < (d + 1) * per; ++i) {
    seqs.push_back(prompt(i));
    batch.seqs.push_back({i, 0, int64_t(seqs.back().size())});
    batch.tokens.insert(batch.tokens.end(), seqs.back().begin(), seqs.back().end());
  }
  Deviation dev;
  for (int step = 0; step <= kDecode; ++step) {
    const models::LmServeResult r = tr.serve_step(batch, cache);
    EXPECT_GT(r.ns, 0);
    if (r.logits.size() != seqs.size()) {
      ++dev.token_mismatches;
      return dev;
    }
    models::LmServeBatch next;
    for (size_t s = 0; s < seqs.size(); ++s) {
      const auto ref = reference_logits(c, ref_w, seqs[s]);
      for (size_t j = 0; j < ref.size(); ++j)
        dev.logits = std::max(dev.logits, std::fabs(double(ref[j]) - double(r.logits[s][j])));
      const int64_t tok = argmax(r.logits[s]);
      dev.token_mismatches += tok != argmax(ref);
      ++dev.checked;
      next.seqs.push_back({batch.seqs[s].slot, int64_t(seqs[s].size()), 1});
      next.tokens.push_back(tok);
      seqs[s].push_back(tok);
    }
    batch = std::move(next);
  }
  return dev;
}

bool fits(const ServeCase& k, int n) { return n % inner(k) == 0 && kSeqs % (n / inner(k)) == 0; }

}  // namespace

class ServeDecode : public ::testing::TestWithParam<ServeCase> {};

TEST_P(ServeDecode, CachedDecodeEqualsRecomputingOneChipPerRank) {
  const ServeCase& k = GetParam();
  const int p = world_size();
  if (!fits(k, p)) GTEST_SKIP() << k.name << " does not fit " << p << " ranks";
  const Deviation d = serve_case(k, MPI_COMM_WORLD, p, world_rank());
  const double worst = max_over_ranks(d.logits);
  const double mismatches = max_over_ranks(double(d.token_mismatches));
  if (world_rank() == 0)
    std::printf("[serve_decode] %s on %d ranks: max |logit - ref| = %.3g over %d checks per rank, %g token mismatches\n",
                k.name, p, worst, d.checked, mismatches);
  EXPECT_EQ(d.checked, (kSeqs / (p / inner(k))) * (kDecode + 1));
  EXPECT_LT(worst, 1e-4);
  EXPECT_EQ(mismatches, 0);
}

TEST_P(ServeDecode, CachedDecodeEqualsRecomputingEightChipsOnOneRank) {
  const ServeCase& k = GetParam();
  if (world_size() != 1) GTEST_SKIP() << "one rank hosting 8 chips";
  if (!fits(k, 8)) GTEST_SKIP() << k.name << " does not fit 8 chips";
  std::vector<Deviation> devs(8);
  const int code = runtime::run_chips(8, [&](const runtime::World& w) {
    devs[size_t(w.rank())] = serve_case(k, w, w.size(), w.rank());
    return 0;
  });
  ASSERT_EQ(code, 0);
  for (int i = 0; i < 8; ++i) {
    EXPECT_LT(devs[size_t(i)].logits, 1e-4) << "chip " << i;
    EXPECT_EQ(devs[size_t(i)].token_mismatches, 0) << "chip " << i;
    EXPECT_EQ(devs[size_t(i)].checked, (kSeqs / (8 / inner(k))) * (kDecode + 1)) << "chip " << i;
  }
  std::printf("[serve_decode] %s on 8 chips of one rank: max |logit - ref| = %.3g\n", k.name, devs[0].logits);
}

INSTANTIATE_TEST_SUITE_P(Plans, ServeDecode, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<ServeCase>& i) { return std::string(i.param.name); });

// Prefill/decode disaggregation (models/lm_tp_decode.h kv_transfer): replica 0's chips prefill the eight prompts,
// their first tokens are sampled there, every sequence's keys and values go to replica 1's chips (one message per
// chip pair over the dp axis, on the modelled network), and replica 1 decodes kDecode steps from its received
// cache: every token and logit as the single-device recomputation's (the same bound as above). The transfer's
// arrival is at least its bytes over one link after the prefill ended.
// With a MoE model each sequence's cache is on its ep chip (slot mod ep) in both replicas: that chip pair moves it.
const ServeCase kDisaggCases[] = {{"one_device"}, {"tp2", 2}, {"tp2_x_pp2", 2, 2}, {"gpt_tp2", 2, 1, 8, true},
                                  {"mqa_tp2", 2, 1, 1},
                                  {"moe_ep2", 1, 1, 8, false, 2}, {"moe_ep2_x_tp2_etp2", 2, 1, 8, false, 2, 2}};

template <class World>
Deviation disaggregated_case(const ServeCase& k, const World& world, int n, int rank) {
  sharding::ModelSpec c = config_of(k);
  const int dp = n / inner(k), ep = std::max(k.ep, 1);
  c.batch = dp * ep;  // the trainer's training layout (unused in serving) needs a multiple of dp x ep
  auto topo = topology::Topology::ring(n, topology::LinkSpec{100, 1000});
  sharding::DeviceMesh mesh({{"tp", k.tp}, {"cp", 1}, {"ep", ep}, {"dp", dp}, {"pp", k.pp}}, topo);
  sim::Timeline tl(mesh.placement()[size_t(rank)], topo, sim::device_preset("h100"));
  runtime::Transport t(world, tl, mesh.placement());
  mesh.bind(t);
  models::LmDpConfig dpc;
  dpc.etp = k.etp;
  dpc.forward_only = true;  // as `serve` builds it: the serving mode is forward only (kv heads replicated above their count)
  models::LmTpTrainer tr(c, models::LmTrainConfig{}, mesh, t, tl, dpc);
  const int ep_rank = mesh.coordinate("ep", rank);
  const models::LmWeights ref_w = models::lm_init(c);
  const models::LmWeights ref = models::lm_compute_copy(c, ref_w);
  auto cache = tr.make_kv_cache(c.seq);
  const int d = mesh.coordinate("dp", rank);
  runtime::Transport& dpt = mesh["dp"];
  std::vector<std::vector<int64_t>> seqs;
  models::LmServeBatch batch;
  for (int i = 0; i < kSeqs; ++i) {
    seqs.push_back(prompt(i));
    batch.seqs.push_back({i, 0, int64_t(seqs.back().size())});
    batch.tokens.insert(batch.tokens.end(), seqs.back().begin(), seqs.back().end());
  }
  Deviation dev;
  auto check = [&](const models::LmServeResult& r) {  // this replica's logits against the reference; next tokens
    std::vector<double> next(size_t(kSeqs), 0.0);
    if (r.logits.size() != size_t(kSeqs)) {
      ++dev.token_mismatches;
      return next;
    }
    for (int s = 0; s < kSeqs; ++s) {
      const auto want = reference_logits(c, ref, seqs[size_t(s)]);
      for (size_t j = 0; j < want.size(); ++j)
        dev.logits = std::max(dev.logits, std::fabs(double(want[j]) - double(r.logits[size_t(s)][j])));
      next[size_t(s)] = double(argmax(r.logits[size_t(s)]));
      dev.token_mismatches += int64_t(next[size_t(s)]) != argmax(want);
      ++dev.checked;
    }
    return next;
  };
  std::vector<double> first(size_t(kSeqs), 0.0);
  sim::TimeNs prefill_end = 0;
  if (d == 0) {
    const models::LmServeResult r = tr.serve_step(batch, cache);
    first = check(r);
    prefill_end = r.ns;
  }
  dpt.allreduce(std::span<double>(first), runtime::Reduce::sum, "first tokens to the decode replica");
  dpt.allreduce(std::span<double>(&prefill_end, 1), runtime::Reduce::max, "prefill end");
  // Replica R's chips of ep rank E as a layout: chip (tp t, pp s) in mesh rank order.
  const auto layout = [&](int r, int e) {
    models::KvLayout l{k.tp, k.pp, {}, {}};
    for (int q = 0; q < n; ++q)
      if (mesh.coordinate("dp", q) == r && mesh.coordinate("ep", q) == e) l.ranks.push_back(q);
    return l;  // tp innermost in rank order, then ep, dp and pp: (t, s) at t + tp s
  };
  for (int s = 0; s < kSeqs; ++s) {
    if (s % ep != ep_rank) continue;  // held by another ep chip of each replica
    const int64_t len = int64_t(seqs[size_t(s)].size());
    const sim::TimeNs at =
        models::kv_transfer(t, cache, c.layers, c.kv_heads, layout(0, s % ep), layout(1, s % ep), {s, s, len, prefill_end});
    const int64_t kv_on_chip = std::max<int64_t>(1, c.kv_heads / k.tp);  // replicated above their count
    const double bytes = double(c.layers / k.pp) * 2.0 * double(len * kv_on_chip * c.head_dim) * 4.0;
    if (d == 1) {
      EXPECT_GE(at, prefill_end + bytes / 100.0 * (1 - 1e-12)) << "sequence " << s;
    }
  }
  for (int s = 0; s < kSeqs; ++s) seqs[size_t(s)].push_back(int64_t(first[size_t(s)]));
  if (d != 1) return dev;
  for (int step = 0; step < kDecode; ++step) {
    models::LmServeBatch next;
    for (int s = 0; s < kSeqs; ++s) {
      next.seqs.push_back({s, int64_t(seqs[size_t(s)].size()) - 1, 1});
      next.tokens.push_back(seqs[size_t(s)].back());
    }
    const std::vector<double> tok = check(tr.serve_step(next, cache));
    for (int s = 0; s < kSeqs; ++s) seqs[size_t(s)].push_back(int64_t(tok[size_t(s)]));
  }
  return dev;
}

class ServeDisaggregated : public ::testing::TestWithParam<ServeCase> {};

TEST_P(ServeDisaggregated, DecodeAfterTransferEqualsRecomputingOneChipPerRank) {
  const ServeCase& k = GetParam();
  const int p = world_size();
  if (p % inner(k) != 0 || p / inner(k) < 2) GTEST_SKIP() << k.name << " needs two replicas, " << p << " ranks";
  const Deviation d = disaggregated_case(k, MPI_COMM_WORLD, p, world_rank());
  const double worst = max_over_ranks(d.logits), mismatches = max_over_ranks(double(d.token_mismatches));
  const double checked = max_over_ranks(double(d.checked));
  if (world_rank() == 0)
    std::printf("[serve_decode] disaggregated %s on %d ranks: max |logit - ref| = %.3g, %g token mismatches\n", k.name,
                p, worst, mismatches);
  EXPECT_EQ(checked, kSeqs * kDecode);  // the decode replica's steps (the prefill replica's: kSeqs)
  EXPECT_LT(worst, 1e-4);
  EXPECT_EQ(mismatches, 0);
}

TEST_P(ServeDisaggregated, DecodeAfterTransferEqualsRecomputingEightChipsOnOneRank) {
  const ServeCase& k = GetParam();
  if (world_size() != 1) GTEST_SKIP() << "one rank hosting 8 chips";
  std::vector<Deviation> devs(8);
  const int code = runtime::run_chips(8, [&](const runtime::World& w) {
    devs[size_t(w.rank())] = disaggregated_case(k, w, w.size(), w.rank());
    return 0;
  });
  ASSERT_EQ(code, 0);
  int decoded = 0;
  for (int i = 0; i < 8; ++i) {
    EXPECT_LT(devs[size_t(i)].logits, 1e-4) << "chip " << i;
    EXPECT_EQ(devs[size_t(i)].token_mismatches, 0) << "chip " << i;
    decoded = std::max(decoded, devs[size_t(i)].checked);
  }
  EXPECT_EQ(decoded, kSeqs * kDecode);
  std::printf("[serve_decode] disaggregated %s on 8 chips of one rank: max |logit - ref| = %.3g\n", k.name, devs[0].logits);
}

INSTANTIATE_TEST_SUITE_P(Plans, ServeDisaggregated, ::testing::ValuesIn(kDisaggCases),
                         [](const ::testing::TestParamInfo<ServeCase>& i) { return std::string(i.param.name); });

// Per-phase parallelism (DistServe's prefill and decode instances with their own plans): chips [0, a) prefill the
// eight prompts under one tp x pp, chips [a, a + b) decode under another, and kv_transfer reshards every sequence's
// cache between the two layouts (each decode chip gets its layers' and KV heads' keys and values from whichever
// prefill chips hold them). Every decoded token and logit equals the single-device recomputation's, which they
// would not if a message carried another head's or layer's rows. Each group's mesh gives its executor its
// coordinates; its chips are those of its transport (a split of the world's), as the executor takes them.
struct PhaseCase {
  const char* name;
  int tp_a = 1, pp_a = 1, tp_b = 1, pp_b = 1;
  int64_t kv_heads = 8;
  int ep_a = 0, ep_b = 0;  // > 0: the MoE model, its experts over ep chips in that group (a sequence's cache on
                           // its ep chip, slot mod ep, in each)
};

std::ostream& operator<<(std::ostream& os, const PhaseCase& c) { return os << c.name; }

const PhaseCase kPhaseCases[] = {{"tp2_to_tp1", 2, 1, 1, 1},        {"tp1_to_tp2", 1, 1, 2, 1},
                                 {"tp2_x_pp2_to_tp4", 2, 2, 4, 1},  {"pp2_to_tp2", 1, 2, 2, 1},
                                 {"tp4_to_tp2_x_pp2", 4, 1, 2, 2},  {"mqa_tp2_to_tp1", 2, 1, 1, 1, 1},
                                 {"kv2_tp4_to_tp2", 4, 1, 2, 1, 2}, {"kv2_tp1_to_tp4", 1, 1, 4, 1, 2},
                                 {"tp2_to_tp4", 2, 1, 4, 1},        {"tp2_to_tp2_x_pp2", 2, 1, 2, 2},
                                 {"kv2_tp4_to_tp4", 4, 1, 4, 1, 2}, {"mqa_tp2_to_tp4", 2, 1, 4, 1, 1}, {"mqa_tp4_to_tp2", 4, 1, 2, 1, 1},
                                 {"moe_ep4_to_ep2", 1, 1, 1, 1, 8, 4, 2},
                                 {"moe_ep2_to_ep2_x_tp2", 1, 1, 2, 1, 8, 2, 2}};

template <class World>
Deviation phase_case(const PhaseCase& k, const World& world, int n, int rank) {
  const bool moe = k.ep_a > 0 || k.ep_b > 0;
  const int ep_a = std::max(k.ep_a, 1), ep_b = std::max(k.ep_b, 1);
  const sharding::ModelSpec c = config_of({k.name, 1, 1, k.kv_heads, false, moe ? 1 : 0});
  const int a = k.tp_a * k.pp_a * ep_a, b = k.tp_b * k.pp_b * ep_b;
  const int group = rank < a ? 0 : rank < a + b ? 1 : 2;  // prefill, decode, idle
  auto topo = topology::Topology::ring(n, topology::LinkSpec{100, 1000});
  sim::Timeline tl(rank, topo, sim::device_preset("h100"));
  std::vector<int> chips;
  for (int i = 0; i < n; ++i) chips.push_back(i);
  runtime::Transport t(world, tl, chips);
  runtime::Transport g = t.split(group, rank);
  // A group's chips of ep coordinate E as a layout (its mesh's rank order tp, ep, pp; its ranks from FIRST).
  const auto layout = [](int first, int tp, int ep, int pp, int e) {
    models::KvLayout l{tp, pp, {}, {}};
    for (int s = 0; s < pp; ++s)
      for (int t = 0; t < tp; ++t) l.ranks.push_back(first + t + tp * (e + ep * s));
    return l;
  };
  const models::LmWeights ref = models::lm_compute_copy(c, models::lm_init(c));
  std::vector<std::vector<int64_t>> seqs;
  models::LmServeBatch batch;
  for (int i = 0; i < kSeqs; ++i) {
    seqs.push_back(prompt(i));
    batch.seqs.push_back({i, 0, int64_t(seqs.back().size())});
    batch.tokens.insert(batch.tokens.end(), seqs.back().begin(), seqs.back().end());
  }
  Deviation dev;
  auto check = [&](const models::LmServeResult& r) {  // the logits against the reference; the next tokens
    std::vector<double> next(size_t(kSeqs), 0.0);
    if (r.logits.size() != size_t(kSeqs)) {
      ++dev.token_mismatches;
      return next;
    }
    for (int q = 0; q < kSeqs; ++q) {
      const auto want = reference_logits(c, ref, seqs[size_t(q)]);
      for (size_t j = 0; j < want.size(); ++j)
        dev.logits = std::max(dev.logits, std::fabs(double(want[j]) - double(r.logits[size_t(q)][j])));
      next[size_t(q)] = double(argmax(r.logits[size_t(q)]));
      dev.token_mismatches += int64_t(next[size_t(q)]) != argmax(want);
      ++dev.checked;
    }
    return next;
  };
  std::optional<sharding::DeviceMesh> mesh;
  std::optional<models::LmTpTrainer> tr;
  std::optional<sharding::plans::KvCache> cache;
  if (group < 2) {
    const int tp = group == 0 ? k.tp_a : k.tp_b, pp = group == 0 ? k.pp_a : k.pp_b, ep = group == 0 ? ep_a : ep_b;
    mesh.emplace(std::map<std::string, int>{{"tp", tp}, {"ep", ep}, {"pp", pp}},
                 topology::Topology::ring(tp * ep * pp, topology::LinkSpec{100, 1000}));
    mesh->bind(g);
    models::LmDpConfig dpc;
    dpc.forward_only = true;
    tr.emplace(c, models::LmTrainConfig{}, *mesh, g, tl, dpc);
    cache.emplace(tr->make_kv_cache(c.seq));
  } else {
    cache.emplace(1, 1, 1, c.dtype, 1, false);  // an idle chip holds nothing
  }
  std::vector<double> first(size_t(kSeqs), 0.0), end(1, 0.0);
  if (group == 0) {
    const models::LmServeResult r = tr->serve_step(batch, *cache);
    first = check(r);
    end[0] = r.ns;
  }
  t.allreduce(std::span<double>(first), runtime::Reduce::max, "first tokens to the decode chips");
  t.allreduce(std::span<double>(end), runtime::Reduce::max, "prefill end");
  for (int q = 0; q < kSeqs; ++q) {
    const int64_t len = int64_t(seqs[size_t(q)].size());
    const models::KvLayout from = layout(0, k.tp_a, ep_a, k.pp_a, q % ep_a), to = layout(a, k.tp_b, ep_b, k.pp_b, q % ep_b);
    const sim::TimeNs at = models::kv_transfer(t, *cache, c.layers, c.kv_heads, from, to, {q, q, len, end[0]});
    const bool holds = std::count(to.ranks.begin(), to.ranks.end(), rank) > 0;  // this chip receives the sequence
    if (holds) {
      EXPECT_GT(at, end[0]) << "sequence " << q;
    }
  }
  for (int q = 0; q < kSeqs; ++q) seqs[size_t(q)].push_back(int64_t(first[size_t(q)]));
  if (group != 1) return dev;
  dev = Deviation{};  // the decode chips' own checks
  for (int step = 0; step < kDecode; ++step) {
    models::LmServeBatch next;
    for (int q = 0; q < kSeqs; ++q) {
      next.seqs.push_back({q, int64_t(seqs[size_t(q)].size()) - 1, 1});
      next.tokens.push_back(seqs[size_t(q)].back());
    }
    const std::vector<double> tok = check(tr->serve_step(next, *cache));
    for (int q = 0; q < kSeqs; ++q) seqs[size_t(q)].push_back(int64_t(tok[size_t(q)]));
  }
  return dev;
}

class ServePerPhase : public ::testing::TestWithParam<PhaseCase> {};

TEST_P(ServePerPhase, DecodeAfterReshardEqualsRecomputingOneChipPerRank) {
  const PhaseCase& k = GetParam();
  const int p = world_size();
  if (p < k.tp_a * k.pp_a * std::max(k.ep_a, 1) + k.tp_b * k.pp_b * std::max(k.ep_b, 1)) GTEST_SKIP() << k.name << " needs more ranks than " << p;
  const Deviation d = phase_case(k, MPI_COMM_WORLD, p, world_rank());
  const double worst = max_over_ranks(d.logits), mismatches = max_over_ranks(double(d.token_mismatches));
  const double checked = max_over_ranks(double(d.checked));
  if (world_rank() == 0)
    std::printf("[serve_decode] per-phase %s on %d ranks: max |logit - ref| = %.3g, %g token mismatches\n", k.name, p,
                worst, mismatches);
  EXPECT_EQ(checked, kSeqs * kDecode);
  EXPECT_LT(worst, 1e-4);
  EXPECT_EQ(mismatches, 0);
}

TEST_P(ServePerPhase, DecodeAfterReshardEqualsRecomputingEightChipsOnOneRank) {
  const PhaseCase& k = GetParam();
  if (world_size() != 1) GTEST_SKIP() << "one rank hosting 8 chips";
  std::vector<Deviation> devs(8);
  const int code = runtime::run_chips(8, [&](const runtime::World& w) {
    devs[size_t(w.rank())] = phase_case(k, w, w.size(), w.rank());
    return 0;
  });
  ASSERT_EQ(code, 0);
  int decoded = 0;
  double worst = 0;
  for (int i = 0; i < 8; ++i) {
    EXPECT_LT(devs[size_t(i)].logits, 1e-4) << "chip " << i;
    EXPECT_EQ(devs[size_t(i)].token_mismatches, 0) << "chip " << i;
    decoded = std::max(decoded, devs[size_t(i)].checked);
    worst = std::max(worst, devs[size_t(i)].logits);
  }
  EXPECT_EQ(decoded, kSeqs * kDecode);
  std::printf("[serve_decode] per-phase %s on 8 chips of one rank: max |logit - ref| = %.3g\n", k.name, worst);
}

INSTANTIATE_TEST_SUITE_P(Plans, ServePerPhase, ::testing::ValuesIn(kPhaseCases),
                         [](const ::testing::TestParamInfo<PhaseCase>& i) { return std::string(i.param.name); });

// Issue 50's second must-show, the decode closed form: at batch 1 a decode step reads every weight of the GEMMs
// once and the sequence's whole KV cache, and nothing else of that size, so on one chip it is bandwidth-bound:
//   t = (matmul weights + 2·layers·kv_heads·head_dim·L) · bytes per element / (HBM bandwidth · hbm_efficiency)
// Llama-3-8B in bf16 on an H100 (shaped kernel model) with 4,095 cached tokens, shape-only. The closed form has no
// kernel launches, so the device's launch overhead and its host issue time are set to 0 for the comparison (with
// 2 us per kernel, above the H100 preset's 0.9 us, and the preset's eager host issue the step is longer by about 14
// launches per layer; checked to be longer, not by how much).
TEST(ServeDecodeClosedForm, BatchOneDecodeIsWeightsPlusCacheOverHbmBandwidth) {
  if (world_size() != 1) GTEST_SKIP() << "one chip";
  sharding::ModelSpec c = test::small_lm();
  c.vocab = 128256;
  c.hidden = 4096;
  c.layers = 32;
  c.heads = 32;
  c.kv_heads = 8;
  c.head_dim = 128;
  c.ffn = 14336;
  c.seq = 8192;
  c.batch = 1;
  c.dtype = runtime::DType::bf16;
  const int64_t L = 4096;
  auto step_ns = [&](double launch_ns) {
    double ns = 0;
    const int code = runtime::run_chips(1, [&](const runtime::World& w) {
      auto topo = topology::Topology::ring(1, topology::LinkSpec{100, 1000});
      sharding::DeviceMesh mesh({{"tp", 1}}, topo);
      sim::DeviceSpec dev = sim::device_preset("h100");
      dev.launch_overhead_ns = launch_ns;
      if (launch_ns == 0) dev.host_launch_ns = 0;
      sim::Timeline tl(0, topo, dev);
      runtime::Transport t(w, tl, mesh.placement());
      t.set_shape_only(true);
      mesh.bind(t);
      models::LmTpTrainer tr(c, models::LmTrainConfig{}, mesh, t, tl, models::LmDpConfig{});
      auto cache = tr.make_kv_cache(c.seq);
      models::LmServeBatch b;
      b.seqs.push_back({0, L - 1, 1});
      ns = tr.serve_step(b, cache).ns;
      return 0;
    });
    EXPECT_EQ(code, 0);
    return ns;
  };
  const sim::DeviceSpec h100 = sim::device_preset("h100");
  const double bytes = 2.0 * double(models::lm_matmul_param_count(c)) + 2.0 * 2.0 * double(c.layers * c.kv_heads * c.head_dim * L);
  const double closed = bytes / (h100.hbm_gbps * h100.kernel.hbm_efficiency);
  const double got = step_ns(0);
  std::printf("[serve_decode] Llama-3-8B bf16 decode at batch 1, L = %lld on h100: %.3f ms simulated, closed form "
              "%.3f ms (%.2f %%); with 2 us launches and host issue %.3f ms\n",
              (long long)L, got * 1e-6, closed * 1e-6, 100 * (got - closed) / closed, step_ns(2000) * 1e-6);
  EXPECT_NEAR(got, closed, 0.05 * closed);
  EXPECT_GT(step_ns(2000), got);
}

// The serve command's shortcut (LmServeBatch::repeat_blocks): a stage's blocks simulated until periodic, the
// period repeated, gives the full run's simulated iteration time, shape-only at tp 2 x pp 2 and tp 4 on chips of
// one rank, and for the model with MoE layers (8 experts top-2, uniform declared routing) at ep 4 and ep 2 x tp 2,
// for a batch mixing prefills of different lengths and decodes and for a batch of a few decodes (whose short
// kernels leave the host's issue gating the device; at ep 4 two ep chips have no sequence and route no rows), with
// the h100 preset's eager host issue and without.
TEST(ServeDecodeRepeatBlocks, EqualsSimulatingEveryBlock) {
  if (world_size() != 1) GTEST_SKIP() << "one rank hosting 4 chips";
  sharding::ModelSpec c = test::small_lm();
  c.vocab = 32000;
  c.hidden = 1024;
  c.layers = 16;
  c.heads = 16;
  c.kv_heads = 4;
  c.head_dim = 64;
  c.ffn = 4096;
  c.seq = 4096;
  c.batch = 1;
  c.dtype = runtime::DType::bf16;
  const std::vector<std::vector<sharding::plans::KvSeq>> batches = {
      {{0, 0, 300}, {1, 1000, 1}, {2, 17, 1}, {3, 0, 45}, {4, 2500, 1}}, {{0, 100, 1}, {1, 3000, 1}}};
  sharding::ModelSpec moe = c;
  moe.batch = 4;  // the training layout's batch (unused in serving) divides over the ep chips
  moe.moe = config_of({"moe", 1, 1, 8, false, 1}).moe;
  moe.moe->spec.hidden = c.hidden;
  moe.moe->spec.dtype = c.dtype;
  moe.moe->spec.expert_ffn.assign(8, 1024);
  struct Plan {
    int tp, pp, ep;
  };
  for (const double host_ns : {-1.0, 0.0})  // -1: the preset's host launch time
    for (const Plan pl : {Plan{2, 2, 1}, Plan{4, 1, 1}, Plan{1, 1, 4}, Plan{2, 1, 2}})
      for (size_t bi = 0; bi < batches.size(); ++bi) {
        const auto [tp, pp, ep] = pl;
        std::map<bool, double> got;
        for (bool repeat : {false, true}) {
          const int code = runtime::run_chips(4, [&](const runtime::World& w) {
            auto topo = topology::Topology::ring(4, topology::LinkSpec{100, 1000});
            sharding::DeviceMesh mesh({{"tp", tp}, {"ep", ep}, {"pp", pp}}, topo);
            sim::DeviceSpec dev = sim::device_preset("h100");
            if (host_ns >= 0) dev.host_launch_ns = host_ns;
            sim::Timeline tl(mesh.placement()[size_t(w.rank())], topo, dev);
            runtime::Transport t(w, tl, mesh.placement());
            t.set_shape_only(true);
            mesh.bind(t);
            models::LmTpTrainer tr(ep > 1 ? moe : c, models::LmTrainConfig{}, mesh, t, tl, models::LmDpConfig{});
            auto cache = tr.make_kv_cache(c.seq);
            models::LmServeBatch b;
            b.repeat_blocks = repeat;
            b.seqs = batches[bi];
            const double ns = tr.serve_step(b, cache).ns;
            if (w.rank() == 0) got[repeat] = ns;
            return 0;
          });
          ASSERT_EQ(code, 0);
        }
        std::printf("[serve_decode] host launch %s, tp %d x pp %d x ep %d, batch %zu: every block %.6f ms, periodic "
                    "blocks repeated %.6f ms\n", host_ns < 0 ? "h100's" : "0", tp, pp, ep, bi, got[false] * 1e-6,
                    got[true] * 1e-6);
        EXPECT_NEAR(got[true], got[false], 1e-9 * got[false]);
      }
}

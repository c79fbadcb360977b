// kernels::attention and merge_attention_partials against a naive reference that materializes the whole score
// matrix in double precision.
//
// Tolerances (relative to max|O_ref| of the case; lse absolutely, relative to max(1, |lse_ref|)):
//   fp32 inputs, fp32 O:   1e-5   (fp32 accumulation over <= 513 keys; measured <= 7.6e-7, recorded as max_rel_err)
//   bf16 inputs, fp32 O:   1e-5   (the reference uses the same bf16-rounded inputs, so only fp32 rounding is left)
//   bf16 inputs, bf16 O:   2^-8   (O is rounded once to bf16: at most half an ulp = 2^-9 of |O|, plus fp32 error)
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/attention.h"

using namespace shardsim;
using kernels::AttentionOptions;
using runtime::DType;
using runtime::Tensor;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

Tensor random_tensor(DType t, runtime::Shape shape, uint32_t seed, float amplitude = 1.0f) {
  Tensor x(t, shape);
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(-amplitude, amplitude);
  for (int64_t i = 0; i < x.numel(); ++i) x.set(i, u(gen));
  return x;
}

struct Reference {
  std::vector<double> out;  // [sq, hq, d]
  std::vector<double> lse;  // [hq, sq]
};

// Materializes every score row in double: the thing the kernel must never do, used only to check it.
Reference naive_attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& o) {
  const int64_t sq = q.dim(0), hq = q.dim(1), d = q.dim(2), sk = k.dim(0), hkv = k.dim(1);
  const double scale = o.scale ? double(*o.scale) : 1.0 / std::sqrt(double(d));
  Reference r{std::vector<double>(size_t(sq * hq * d), 0.0), std::vector<double>(size_t(hq * sq), -kInf)};
  std::vector<double> s(static_cast<size_t>(sk));
  for (int64_t h = 0; h < hq; ++h) {
    const int64_t g = h / (hq / hkv);
    for (int64_t i = 0; i < sq; ++i) {
      double m = -kInf;
      for (int64_t j = 0; j < sk; ++j) {
        const bool masked = o.causal && o.q_offset + i < o.k_offset + j;
        double dot = 0;
        for (int64_t c = 0; c < d; ++c) dot += double(q.get((i * hq + h) * d + c)) * double(k.get((j * hkv + g) * d + c));
        s[size_t(j)] = masked ? -kInf : dot * scale;
        m = std::max(m, s[size_t(j)]);
      }
      if (m == -kInf) continue;  // no visible key: O = 0, lse = -inf
      double l = 0;
      for (int64_t j = 0; j < sk; ++j) l += std::exp(s[size_t(j)] - m);
      for (int64_t j = 0; j < sk; ++j) {
        const double p = std::exp(s[size_t(j)] - m) / l;
        if (p == 0) continue;
        for (int64_t c = 0; c < d; ++c) r.out[size_t((i * hq + h) * d + c)] += p * double(v.get((j * hkv + g) * d + c));
      }
      r.lse[size_t(h * sq + i)] = m + std::log(l);
    }
  }
  return r;
}

double max_abs(const std::vector<double>& x) {
  double m = 0;
  for (double v : x) m = std::max(m, std::fabs(v));
  return m;
}

// Checks O and lse against the reference; returns the worst O error relative to max|O_ref|.
double expect_close(const Tensor& out, const Tensor& lse, const Reference& ref, double rel_tol,
                    const std::string& what, double lse_tol = 1e-5) {
  const double scale = max_abs(ref.out);
  double worst = 0;
  int reported = 0;
  for (int64_t i = 0; i < out.numel(); ++i) {
    const double want = ref.out[size_t(i)], got = out.get(i);
    const double err = std::fabs(got - want);
    if (scale == 0 ? err != 0 : !(err <= rel_tol * scale)) {  // `!(<=)` also catches NaN
      if (reported++ < 5) ADD_FAILURE() << what << ": O[" << i << "] = " << got << ", want " << want;
    }
    if (scale > 0) worst = std::max(worst, err / scale);
  }
  for (int64_t i = 0; i < lse.numel(); ++i) {
    const double want = ref.lse[size_t(i)], got = lse.get(i);
    if (want == -kInf) {
      if (got != -kInf && reported++ < 10) ADD_FAILURE() << what << ": lse[" << i << "] = " << got << ", want -inf";
    } else if (!(std::fabs(got - want) <= lse_tol * std::max(1.0, std::fabs(want)))) {
      if (reported++ < 10) ADD_FAILURE() << what << ": lse[" << i << "] = " << got << ", want " << want;
    }
  }
  return worst;
}

struct Case {
  const char* name;
  int64_t sq, sk, hq, hkv, d;
  bool causal;
  int64_t q_offset, k_offset;
  int64_t block_q, block_k;  // 0: the defaults
};

AttentionOptions options_of(const Case& c) {
  AttentionOptions o;
  o.causal = c.causal;
  o.q_offset = c.q_offset;
  o.k_offset = c.k_offset;
  if (c.block_q) o.block_q = c.block_q;
  if (c.block_k) o.block_k = c.block_k;
  return o;
}

const Case kCases[] = {
    // name                 sq   sk  hq hkv   d  causal  q_off k_off  Br  Bc
    {"mha_full",           100, 100,  2,  2, 32, false,     0,    0, 32, 48},
    {"mha_causal",         130, 130,  2,  2, 32, true,      0,    0, 32, 48},
    {"gqa8x2_causal",       77,  77,  8,  2, 16, true,      0,    0, 16, 32},
    {"gqa8x2_full",        200, 300,  8,  2, 64, false,     0,    0,  0,  0},
    {"mqa8x1_causal",      150, 150,  8,  1, 32, true,      0,    0,  0,  0},
    {"mqa8x1_full_tiles7", 45,   61,  8,  1,  8, false,     0,    0,  7,  5},
    {"offsets_q_after_k",   70, 130,  4,  2, 16, true,    100,   20, 16, 32},
    {"offsets_rows_masked", 90,  60,  2,  1, 16, true,      0,   40, 32, 16},
    {"all_rows_masked",     40,  50,  2,  2, 16, true,      0,  500, 16, 16},
    {"seq1",                 1,   1,  1,  1,  4, true,      0,    0,  0,  0},
    {"empty_keys",          10,   0,  2,  1,  8, false,     0,    0,  0,  0},
    {"d128_chunk",         257, 513,  4,  4,128, true,    256,    0,  0,  0},
};

class AttentionCase : public ::testing::TestWithParam<Case> {};

TEST_P(AttentionCase, Fp32MatchesDoubleReference) {
  const Case& c = GetParam();
  const auto o = options_of(c);
  Tensor q = random_tensor(DType::fp32, {c.sq, c.hq, c.d}, 1), k = random_tensor(DType::fp32, {c.sk, c.hkv, c.d}, 2),
         v = random_tensor(DType::fp32, {c.sk, c.hkv, c.d}, 3);
  Tensor out(DType::fp32, {c.sq, c.hq, c.d}), lse(DType::fp32, {c.hq, c.sq});
  out.set(0, 123.0f);  // stale contents must be overwritten
  kernels::attention(q, k, v, out, lse, o);
  const double worst = expect_close(out, lse, naive_attention(q, k, v, o), 1e-5, c.name);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2e", worst);
  RecordProperty("max_rel_err", buf);
}

TEST_P(AttentionCase, Bf16InputsFp32AccumulationRoundedOnce) {
  const Case& c = GetParam();
  const auto o = options_of(c);
  Tensor q = random_tensor(DType::bf16, {c.sq, c.hq, c.d}, 4), k = random_tensor(DType::bf16, {c.sk, c.hkv, c.d}, 5),
         v = random_tensor(DType::bf16, {c.sk, c.hkv, c.d}, 6);
  const Reference ref = naive_attention(q, k, v, o);  // on the same (bf16-valued) inputs
  Tensor lse(DType::fp32, {c.hq, c.sq});
  Tensor out32(DType::fp32, {c.sq, c.hq, c.d});
  kernels::attention(q, k, v, out32, lse, o);
  expect_close(out32, lse, ref, 1e-5, std::string(c.name) + " bf16->fp32");
  Tensor out16(DType::bf16, {c.sq, c.hq, c.d});
  kernels::attention(q, k, v, out16, lse, o);
  expect_close(out16, lse, ref, std::ldexp(1.0, -8), std::string(c.name) + " bf16->bf16");
  // Rounded once: the bf16 output is exactly the rounding of the fp32 one.
  for (int64_t i = 0; i < out16.numel(); ++i)
    ASSERT_EQ(out16.bf16()[i], runtime::float_to_bf16(out32.f32()[i])) << c.name << " element " << i;
}

// Two KV halves (a ring-attention step's view: each half has its own k_offset), merged, equal the whole.
TEST_P(AttentionCase, MergeOfTwoKvBlocksEqualsFullResult) {
  const Case& c = GetParam();
  if (c.sk < 2) GTEST_SKIP() << "needs two key blocks";
  const auto o = options_of(c);
  Tensor q = random_tensor(DType::fp32, {c.sq, c.hq, c.d}, 7), k = random_tensor(DType::fp32, {c.sk, c.hkv, c.d}, 8),
         v = random_tensor(DType::fp32, {c.sk, c.hkv, c.d}, 9);
  const int64_t split = c.sk * 3 / 7 + 1;  // not a tile multiple
  auto rows = [&](const Tensor& t, int64_t lo, int64_t hi) {
    Tensor part(t.dtype(), {hi - lo, t.dim(1), t.dim(2)});
    const int64_t w = t.dim(1) * t.dim(2);
    for (int64_t i = 0; i < (hi - lo) * w; ++i) part.set(i, t.get(lo * w + i));
    return part;
  };
  Tensor out_a(DType::fp32, {c.sq, c.hq, c.d}), lse_a(DType::fp32, {c.hq, c.sq});
  Tensor out_b(DType::fp32, {c.sq, c.hq, c.d}), lse_b(DType::fp32, {c.hq, c.sq});
  AttentionOptions oa = o, ob = o;
  ob.k_offset = o.k_offset + split;
  kernels::attention(q, rows(k, 0, split), rows(v, 0, split), out_a, lse_a, oa);
  kernels::attention(q, rows(k, split, c.sk), rows(v, split, c.sk), out_b, lse_b, ob);
  const Reference ref = naive_attention(q, k, v, o);
  Tensor ma = out_a, la = lse_a;  // A then B
  kernels::merge_attention_partials(ma, la, out_b, lse_b);
  expect_close(ma, la, ref, 1e-5, std::string(c.name) + " merge(A,B)");
  kernels::merge_attention_partials(out_b, lse_b, out_a, lse_a);  // B then A
  expect_close(out_b, lse_b, ref, 1e-5, std::string(c.name) + " merge(B,A)");
}

INSTANTIATE_TEST_SUITE_P(Shapes, AttentionCase, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

TEST(Attention, TileSizesDoNotChangeTheResultBeyondRounding) {
  Tensor q = random_tensor(DType::fp32, {300, 2, 32}, 11), k = random_tensor(DType::fp32, {300, 2, 32}, 12),
         v = random_tensor(DType::fp32, {300, 2, 32}, 13);
  AttentionOptions o;
  o.causal = true;
  const Reference ref = naive_attention(q, k, v, o);
  for (auto [bq, bk] : {std::pair<int64_t, int64_t>{1, 1}, {3, 300}, {300, 3}, {64, 128}, {128, 256}, {512, 512}}) {
    o.block_q = bq;
    o.block_k = bk;
    Tensor out(DType::fp32, {300, 2, 32}), lse(DType::fp32, {2, 300});
    kernels::attention(q, k, v, out, lse, o);
    expect_close(out, lse, ref, 1e-5, "Br=" + std::to_string(bq) + " Bc=" + std::to_string(bk));
  }
}

// Scores of magnitude ~1e3: exp would overflow without the running max.
TEST(Attention, OnlineSoftmaxIsStableForLargeScores) {
  Tensor q = random_tensor(DType::fp32, {96, 1, 16}, 14, 10.0f), k = random_tensor(DType::fp32, {200, 1, 16}, 15, 10.0f),
         v = random_tensor(DType::fp32, {200, 1, 16}, 16);
  AttentionOptions o;
  o.scale = 1.0f;
  o.block_q = 32;
  o.block_k = 24;
  Tensor out(DType::fp32, {96, 1, 16}), lse(DType::fp32, {1, 96});
  kernels::attention(q, k, v, out, lse, o);
  const Reference ref = naive_attention(q, k, v, o);
  ASSERT_GT(max_abs(ref.lse), 200.0);  // e^200 overflows fp32: the test exercises the rescaling
  // Scores near 500 carry an fp32 rounding error of ~u·|s| ≈ 3e-5 before any softmax, which moves the weights
  // by that relative amount: hence 2e-4 here (not 1e-5). Without the running max the result would be NaN/inf.
  expect_close(out, lse, ref, 2e-4, "large scores", 1e-6);
}

TEST(Attention, CustomScale) {
  Tensor q = random_tensor(DType::fp32, {33, 2, 8}, 17), k = random_tensor(DType::fp32, {40, 2, 8}, 18),
         v = random_tensor(DType::fp32, {40, 2, 8}, 19);
  AttentionOptions o;
  o.scale = 0.37f;
  Tensor out(DType::fp32, {33, 2, 8}), lse(DType::fp32, {2, 33});
  kernels::attention(q, k, v, out, lse, o);
  expect_close(out, lse, naive_attention(q, k, v, o), 1e-5, "scale 0.37");
}

TEST(Attention, HeadRangeComputesOnlyThoseHeads) {
  Tensor q = random_tensor(DType::fp32, {50, 8, 16}, 20), k = random_tensor(DType::fp32, {60, 2, 16}, 21),
         v = random_tensor(DType::fp32, {60, 2, 16}, 22);
  AttentionOptions o;
  o.causal = true;
  o.k_offset = -10;
  const Reference ref = naive_attention(q, k, v, o);
  Tensor out(DType::fp32, {50, 8, 16}), lse(DType::fp32, {8, 50});
  for (int64_t i = 0; i < out.numel(); ++i) out.set(i, 7.0f);
  for (int64_t i = 0; i < lse.numel(); ++i) lse.set(i, 7.0f);
  o.head_begin = 3;  // crosses the kv-group boundary at head 4
  o.head_end = 6;
  const auto cost = kernels::attention(q, k, v, out, lse, o);
  for (int64_t i = 0; i < 50; ++i)
    for (int64_t h = 0; h < 8; ++h) {
      const bool in = h >= 3 && h < 6;
      if (in)
        EXPECT_NEAR(lse.get(h * 50 + i), ref.lse[size_t(h * 50 + i)], 1e-5);
      else
        EXPECT_EQ(lse.get(h * 50 + i), 7.0f);
      for (int64_t c = 0; c < 16; ++c) {
        const int64_t idx = (i * 8 + h) * 16 + c;
        if (in)
          EXPECT_NEAR(out.get(idx), ref.out[size_t(idx)], 1e-5);
        else
          EXPECT_EQ(out.get(idx), 7.0f);
      }
    }
  EXPECT_DOUBLE_EQ(cost.flops, kernels::attention_cost(50, 60, 8, 2, 16, DType::fp32, DType::fp32, o).flops);
  AttentionOptions all = o;
  all.head_begin = 0;
  all.head_end = -1;
  EXPECT_DOUBLE_EQ(cost.flops * 8, kernels::attention_cost(50, 60, 8, 2, 16, DType::fp32, DType::fp32, all).flops * 3);
}

TEST(AttentionMerge, EmptyPartialsContributeNothing) {
  Tensor out_a = random_tensor(DType::fp32, {5, 2, 4}, 23), lse_a(DType::fp32, {2, 5});
  Tensor out_b(DType::fp32, {5, 2, 4}), lse_b(DType::fp32, {2, 5});
  for (int64_t i = 0; i < 10; ++i) {
    lse_a.set(i, i < 5 ? 1.5f : -std::numeric_limits<float>::infinity());  // head 1 of A: empty
    lse_b.set(i, -std::numeric_limits<float>::infinity());                  // B: all empty, O = 0
  }
  const Tensor before = out_a;
  kernels::merge_attention_partials(out_a, lse_a, out_b, lse_b);
  for (int64_t i = 0; i < 5; ++i) {
    EXPECT_EQ(lse_a.get(i), 1.5f);
    EXPECT_EQ(lse_a.get(5 + i), -std::numeric_limits<float>::infinity());
    for (int64_t c = 0; c < 4; ++c) {
      EXPECT_EQ(out_a.get((i * 2 + 0) * 4 + c), before.get((i * 2 + 0) * 4 + c));  // merged with nothing: unchanged
      EXPECT_EQ(out_a.get((i * 2 + 1) * 4 + c), 0.0f);  // both empty: 0, not NaN
    }
  }
}

TEST(AttentionMerge, WeightsByExpOfLse) {
  // Hand-computed: lse 0 and log 3 give weights 1/4 and 3/4 and lse log 4; huge lses do not overflow.
  Tensor oa(DType::fp32, {2, 1, 1}), la(DType::fp32, {1, 2}), ob(DType::fp32, {2, 1, 1}), lb(DType::fp32, {1, 2});
  oa.set(0, 1.0f), ob.set(0, 5.0f), la.set(0, 0.0f), lb.set(0, std::log(3.0f));
  oa.set(1, 2.0f), ob.set(1, 4.0f), la.set(1, 1000.0f), lb.set(1, 1000.0f);
  kernels::merge_attention_partials(oa, la, ob, lb);
  EXPECT_NEAR(oa.get(0), 0.25 * 1 + 0.75 * 5, 1e-6);
  EXPECT_NEAR(la.get(0), std::log(4.0), 1e-6);
  EXPECT_NEAR(oa.get(1), 3.0, 1e-6);
  EXPECT_NEAR(la.get(1), 1000.0 + std::log(2.0), 1e-3);
}

TEST(AttentionCost, FlopsAndBytesFollowTheDocumentedFormulas) {
  AttentionOptions o;
  o.block_q = 128;
  // Non-causal: 4·sq·sk·d per head; K and V read once per query tile (2 tiles of 128 rows).
  auto c = kernels::attention_cost(256, 512, 2, 1, 64, DType::fp32, DType::fp32, o);
  EXPECT_DOUBLE_EQ(c.flops, 2.0 * 4 * 256 * 512 * 64);
  EXPECT_DOUBLE_EQ(c.bytes, 2.0 * (256.0 * 64 * 4 * 2 + 256 * 4 + 2.0 * 64 * 4 * (2 * 512)));
  // Causal, equal offsets: s(s+1)/2 visible pairs; query tile t reads keys [0, 128(t+1)).
  o.causal = true;
  c = kernels::attention_cost(256, 256, 1, 1, 64, DType::bf16, DType::bf16, o);
  EXPECT_DOUBLE_EQ(c.flops, 4.0 * 64 * (256.0 * 257 / 2));
  EXPECT_DOUBLE_EQ(c.bytes, 256.0 * 64 * 2 * 2 + 256 * 4 + 2.0 * 64 * 2 * (128 + 256));
  // A KV block entirely in the queries' future costs nothing.
  o.k_offset = 1000;
  c = kernels::attention_cost(256, 256, 1, 1, 64, DType::fp32, DType::fp32, o);
  EXPECT_DOUBLE_EQ(c.flops, 0.0);
  EXPECT_DOUBLE_EQ(c.bytes, 256.0 * 64 * 4 * 2 + 256 * 4);
}

TEST(AttentionCost, WorkspaceIsLinearInSequenceNotQuadratic) {
  AttentionOptions o;  // defaults
  const auto w8k = kernels::attention_workspace_bytes(8192, 128, DType::fp32, o);
  const auto w32k = kernels::attention_workspace_bytes(32768, 128, DType::fp32, o);
  EXPECT_EQ(w8k, w32k);  // fp32: tiles only
  EXPECT_EQ(w32k, (128 * 256 + 128 * 128 + 2 * 128) * 4);
  const auto b8k = kernels::attention_workspace_bytes(8192, 128, DType::bf16, o);
  const auto b32k = kernels::attention_workspace_bytes(32768, 128, DType::bf16, o);
  EXPECT_EQ(b32k - b8k, 2 * (32768 - 8192) * 128 * 4);  // widened K, V of one head
  EXPECT_LT(b32k, 32768LL * 32768 * 4 / 100);          // far below one score matrix
}

TEST(AttentionErrors, BadShapesAndOptionsThrowWithClearMessages) {
  auto t = [](DType dt, runtime::Shape s) { return Tensor(dt, s); };
  const Tensor q = t(DType::fp32, {4, 6, 8}), k = t(DType::fp32, {5, 4, 8}), v = t(DType::fp32, {5, 4, 8});
  Tensor out = t(DType::fp32, {4, 6, 8}), lse = t(DType::fp32, {6, 4});
  auto expect_msg = [](auto&& fn, const std::string& needle) {
    try {
      fn();
      ADD_FAILURE() << "no exception, expected one mentioning '" << needle << "'";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_msg([&] { kernels::attention(q, k, v, out, lse); }, "multiple of kv heads");  // 6 % 4
  const Tensor k2 = t(DType::fp32, {5, 2, 8}), v2 = t(DType::fp32, {5, 2, 8});
  EXPECT_NO_THROW(kernels::attention(q, k2, v2, out, lse));
  expect_msg([&] { kernels::attention(q, t(DType::fp32, {5, 2, 16}), t(DType::fp32, {5, 2, 16}), out, lse); },
             "head_dim differs");
  expect_msg([&] { kernels::attention(q, k2, t(DType::fp32, {6, 2, 8}), out, lse); }, "same shape");
  expect_msg([&] { kernels::attention(t(DType::fp32, {4, 48}), k2, v2, out, lse); }, "3-D");
  expect_msg([&] { kernels::attention(q, t(DType::bf16, {5, 2, 8}), v2, out, lse); }, "share one dtype");
  expect_msg([&] {
    Tensor o16 = t(DType::fp16, {4, 6, 8}), l = t(DType::fp32, {6, 4});
    kernels::attention(t(DType::fp16, {4, 6, 8}), t(DType::fp16, {5, 2, 8}), t(DType::fp16, {5, 2, 8}), o16, l);
  }, "fp32 or bf16");
  expect_msg([&] {
    Tensor o = t(DType::bf16, {4, 6, 8});
    kernels::attention(q, k2, v2, o, lse);
  }, "O must be fp32 or Q's dtype");
  expect_msg([&] {
    Tensor o = t(DType::fp32, {4, 6, 4});
    kernels::attention(q, k2, v2, o, lse);
  }, "O must have Q's shape");
  expect_msg([&] {
    Tensor l = t(DType::fp32, {4, 6});
    kernels::attention(q, k2, v2, out, l);
  }, "lse must be fp32 [Hq, seq_q]");
  expect_msg([&] {
    AttentionOptions o;
    o.head_begin = 2, o.head_end = 7;
    kernels::attention(q, k2, v2, out, lse, o);
  }, "head range");
  expect_msg([&] {
    AttentionOptions o;
    o.block_k = 0;
    kernels::attention(q, k2, v2, out, lse, o);
  }, "block_q and block_k");
  expect_msg([&] {
    AttentionOptions o;
    o.scale = std::numeric_limits<float>::quiet_NaN();
    kernels::attention(q, k2, v2, out, lse, o);
  }, "scale");
  expect_msg([&] {
    Tensor ob = t(DType::fp32, {4, 6, 4}), lb = t(DType::fp32, {6, 4});
    kernels::merge_attention_partials(out, lse, ob, lb);
  }, "one shape");
  expect_msg([&] {
    Tensor ob = t(DType::fp32, {4, 6, 8}), lb = t(DType::fp32, {4, 6});
    kernels::merge_attention_partials(out, lse, ob, lb);
  }, "lse must be fp32 [H, seq]");
}

}  // namespace

// kernels::attention_backward against central finite differences of an fp64 attention that materializes the
// score matrix (grad_check.h), for non-causal and causal attention, GQA and MQA, position offsets (a context-
// parallel chunk) and tiles smaller than the sequence.
//
// Tolerance: max |kernel − FD| <= 1e-4 · max |FD| per gradient. The FD is exact to ~1e-9; the kernel recomputes
// P from the fp32 lse and sums over <= 9 keys and d = 4 in fp32 (unit roundoff 6e-8), so its error is ~1e-6
// relative (measured: at most 3.8e-7); a wrong term or transpose gives errors of order 1.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "kernels/attention.h"
#include "kernels/attention_backward.h"
#include "tests/unit/grad_check.h"

using namespace shardsim;
using namespace shardsim::testing;
using kernels::AttentionOptions;
using runtime::DType;
using runtime::Tensor;

namespace {

Forward attention_ref(int64_t sq, int64_t sk, int64_t hq, int64_t hkv, int64_t d, const AttentionOptions& o) {
  return [=](const std::vector<Vec>& in) {
    const Vec &q = in[0], &k = in[1], &v = in[2];
    const double scale = 1.0 / std::sqrt(double(d));
    Vec out(static_cast<size_t>(sq * hq * d), 0.0), s(static_cast<size_t>(sk));
    for (int64_t h = 0; h < hq; ++h) {
      const int64_t g = h / (hq / hkv);
      for (int64_t i = 0; i < sq; ++i) {
        double m = -INFINITY;
        for (int64_t j = 0; j < sk; ++j) {
          double dot = 0;
          for (int64_t c = 0; c < d; ++c) dot += q[size_t((i * hq + h) * d + c)] * k[size_t((j * hkv + g) * d + c)];
          s[size_t(j)] = (o.causal && o.q_offset + i < o.k_offset + j) ? -INFINITY : dot * scale;
          m = std::max(m, s[size_t(j)]);
        }
        if (m == -INFINITY) continue;
        double l = 0;
        for (int64_t j = 0; j < sk; ++j) l += std::exp(s[size_t(j)] - m);
        for (int64_t j = 0; j < sk; ++j)
          for (int64_t c = 0; c < d; ++c)
            out[size_t((i * hq + h) * d + c)] += std::exp(s[size_t(j)] - m) / l * v[size_t((j * hkv + g) * d + c)];
      }
    }
    return out;
  };
}

AttentionOptions opts(bool causal, int64_t q_offset, int64_t k_offset, int64_t block_q, int64_t block_k) {
  AttentionOptions o;
  o.causal = causal;
  o.q_offset = q_offset;
  o.k_offset = k_offset;
  o.block_q = block_q;
  o.block_k = block_k;
  return o;
}

struct Case {
  int64_t sq, sk, hq, hkv, d;
  AttentionOptions o;
};

double check_case(const Case& c) {
  Tensor q = random_tensor({c.sq, c.hq, c.d}, 31, -2, 2), k = random_tensor({c.sk, c.hkv, c.d}, 32, -2, 2);
  Tensor v = random_tensor({c.sk, c.hkv, c.d}, 33), dout = random_tensor({c.sq, c.hq, c.d}, 34);
  Tensor out(DType::fp32, q.shape()), lse(DType::fp32, {c.hq, c.sq});
  const auto fwd = kernels::attention(q, k, v, out, lse, c.o);
  Tensor dq(DType::fp32, q.shape()), dk(DType::fp32, k.shape()), dv(DType::fp32, v.shape());
  const auto cost = kernels::attention_backward(q, k, v, out, lse, dout, dq, dk, dv, c.o);
  EXPECT_DOUBLE_EQ(cost.flops, 2.5 * fwd.flops);  // 10·d against the forward's 4·d per visible pair
  const auto f = attention_ref(c.sq, c.sk, c.hq, c.hkv, c.d, c.o);
  const auto g = fd_gradients(f, {widen(q), widen(k), widen(v)}, widen(dout));
  const double eq = rel_error(dq, g[0]), ek = rel_error(dk, g[1]), ev = rel_error(dv, g[2]);
  EXPECT_LT(eq, 1e-4) << "dQ";
  EXPECT_LT(ek, 1e-4) << "dK";
  EXPECT_LT(ev, 1e-4) << "dV";
  return std::max({eq, ek, ev});
}

}  // namespace

TEST(AttentionBackward, NonCausalMultiHead) {
  check_case({5, 6, 2, 2, 4, opts(false, 0, 0, 2, 4)});
}

TEST(AttentionBackward, CausalGroupedQuery) {
  // Hq = 4 query heads on Hkv = 2 kv heads: dK, dV of a kv head sum over its two query heads.
  check_case({7, 7, 4, 2, 4, opts(true, 0, 0, 3, 2)});
}

TEST(AttentionBackward, CausalMultiQueryWithOffsets) {
  // A context-parallel chunk: queries at positions 3..6, keys 0..8 (keys 7, 8 are in every query's future, and
  // the first query sees only 4 keys). One kv head (MQA).
  check_case({4, 9, 3, 1, 4, opts(true, 3, 0, 2, 3)});
}

TEST(AttentionBackward, RowsWithoutVisibleKeysGetZeroGradient) {
  // Keys start after the first two queries: those rows have lse = -inf, O = 0 and no gradient.
  const Case c{4, 3, 2, 1, 4, opts(true, 0, 2, 4, 2)};
  check_case(c);
  Tensor q = random_tensor({4, 2, 4}, 35), k = random_tensor({3, 1, 4}, 36), v = random_tensor({3, 1, 4}, 37);
  Tensor out(DType::fp32, q.shape()), lse(DType::fp32, {2, 4}), dout = random_tensor({4, 2, 4}, 38);
  kernels::attention(q, k, v, out, lse, c.o);
  Tensor dq(DType::fp32, q.shape()), dk(DType::fp32, k.shape()), dv(DType::fp32, v.shape());
  kernels::attention_backward(q, k, v, out, lse, dout, dq, dk, dv, c.o);
  for (int64_t i = 0; i < 2 * 2 * 4; ++i) EXPECT_EQ(dq.get(i), 0.0f);
}

TEST(AttentionBackward, NaNInValueReachesTheQueriesThatSeeIt) {
  // A NaN in V[3] must reach dQ of every query that sees key 3 (3..5 under causal masking) and dV must stay NaN-free
  // for keys no NaN reaches... except through masked products: the tile GEMMs multiply masked P = 0 by V, and
  // 0 · NaN = NaN, so queries that share a tile with key 3 may get NaN too (PyTorch's math attention, softmax then
  // P @ V, does the same). The tiles here (2 x 2) put queries 0, 1 in a tile without key 3: those stay finite.
  const int64_t s = 6, h = 2, d = 4;
  Tensor q = random_tensor({s, h, d}, 39), k = random_tensor({s, 1, d}, 40), v = random_tensor({s, 1, d}, 41);
  Tensor dout = random_tensor({s, h, d}, 42);
  v.set(3 * d + 1, std::numeric_limits<float>::quiet_NaN());
  const AttentionOptions o = opts(true, 0, 0, 2, 2);
  Tensor out(DType::fp32, q.shape()), lse(DType::fp32, {h, s});
  kernels::attention(q, k, v, out, lse, o);
  Tensor dq(DType::fp32, q.shape()), dk(DType::fp32, k.shape()), dv(DType::fp32, v.shape());
  EXPECT_NO_THROW(kernels::attention_backward(q, k, v, out, lse, dout, dq, dk, dv, o));
  for (int64_t i = 0; i < s; ++i) {
    bool nan = false;
    for (int64_t c = 0; c < h * d; ++c) nan = nan || std::isnan(dq.get(i * h * d + c));
    if (i >= 3) {
      EXPECT_TRUE(nan) << "query " << i << " sees the NaN";
    }
    if (i < 2) {
      EXPECT_FALSE(nan) << "query " << i << " shares no tile with it";
    }
  }
}

TEST(AttentionBackward, CostAndWorkspaceAreLinearInSequence) {
  // O(seq) memory: doubling the sequence at fixed tiles at most doubles the workspace (no seq_q·seq_k term).
  const AttentionOptions o = opts(true, 0, 0, 128, 256);
  const int64_t w1 = kernels::attention_backward_workspace_bytes(4096, 4096, 128, o);
  const int64_t w2 = kernels::attention_backward_workspace_bytes(8192, 8192, 128, o);
  EXPECT_LE(w2, 2 * w1);
  EXPECT_LT(w2, 8192LL * 8192 * 4 / 16);  // far below one fp32 score matrix
  const auto c = kernels::attention_backward_cost(64, 64, 8, 2, 16, DType::bf16, DType::bf16, o);
  EXPECT_DOUBLE_EQ(c.flops, 8 * 10.0 * 16 * (64.0 * 65 / 2));
  EXPECT_THROW(kernels::attention_backward_cost(64, 64, 8, 3, 16, DType::fp32, DType::fp32), std::invalid_argument);
}

TEST(AttentionBackward, Bf16InputsAreWidenedExactlyAndGradientsRoundedOnce) {
  // bf16 Q, K, V (and O, dO) are widened exactly and the arithmetic is fp32: the fp32 gradients equal, bit for
  // bit, those of fp32 tensors holding the same values; bf16 gradients are those rounded once.
  const int64_t s = 6, hq = 2, hkv = 1, d = 4;
  auto to_bf16 = [](const Tensor& t) { return Tensor::from_float(t.to_float(), DType::bf16, t.shape()); };
  auto to_f32 = [](const Tensor& t) { return Tensor::from_float(t.to_float(), DType::fp32, t.shape()); };
  const Tensor qb = to_bf16(random_tensor({s, hq, d}, 43)), kb = to_bf16(random_tensor({s, hkv, d}, 44));
  const Tensor vb = to_bf16(random_tensor({s, hkv, d}, 45)), dob = to_bf16(random_tensor({s, hq, d}, 46));
  const AttentionOptions o = opts(true, 0, 0, 4, 4);
  Tensor ob(DType::bf16, {s, hq, d}), lse(DType::fp32, {hq, s});
  kernels::attention(qb, kb, vb, ob, lse, o);
  // Reference: fp32 tensors with the bf16 values.
  Tensor dq(DType::fp32, qb.shape()), dk(DType::fp32, kb.shape()), dv(DType::fp32, vb.shape());
  kernels::attention_backward(to_f32(qb), to_f32(kb), to_f32(vb), to_f32(ob), lse, to_f32(dob), dq, dk, dv, o);
  Tensor dq1(DType::fp32, qb.shape()), dk1(DType::fp32, kb.shape()), dv1(DType::fp32, vb.shape());
  kernels::attention_backward(qb, kb, vb, ob, lse, dob, dq1, dk1, dv1, o);
  EXPECT_TRUE(dq1.bit_equal(dq) && dk1.bit_equal(dk) && dv1.bit_equal(dv));
  Tensor dq2(DType::bf16, qb.shape()), dk2(DType::bf16, kb.shape()), dv2(DType::bf16, vb.shape());
  kernels::attention_backward(qb, kb, vb, ob, lse, dob, dq2, dk2, dv2, o);
  EXPECT_TRUE(dq2.bit_equal(to_bf16(dq)) && dk2.bit_equal(to_bf16(dk)) && dv2.bit_equal(to_bf16(dv)));
}

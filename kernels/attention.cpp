#include "kernels/attention.h"

#include <cblas.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

namespace shardsim::kernels {

using runtime::DType;
using runtime::Tensor;

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

std::string dims(int64_t sq, int64_t sk, int64_t hq, int64_t hkv, int64_t d) {
  return "seq_q=" + std::to_string(sq) + " seq_k=" + std::to_string(sk) + " Hq=" + std::to_string(hq) +
         " Hkv=" + std::to_string(hkv) + " d=" + std::to_string(d);
}

struct HeadRange {
  int64_t begin, end;
};

HeadRange check_numbers(int64_t sq, int64_t sk, int64_t hq, int64_t hkv, int64_t d, DType in, DType out,
                        const AttentionOptions& o) {
  if (in != DType::fp32 && in != DType::bf16)
    throw std::invalid_argument("attention: Q, K, V must be fp32 or bf16, got " + runtime::dtype_name(in));
  if (out != DType::fp32 && out != in)
    throw std::invalid_argument("attention: O must be fp32 or Q's dtype (" + runtime::dtype_name(in) + "), got " +
                                runtime::dtype_name(out));
  if (sq < 0 || sk < 0 || hq < 1 || hkv < 1 || d < 1)
    throw std::invalid_argument("attention: need seq >= 0 and Hq, Hkv, d >= 1, got " + dims(sq, sk, hq, hkv, d));
  if (hq % hkv != 0)
    throw std::invalid_argument("attention: query heads Hq=" + std::to_string(hq) +
                                " must be a multiple of kv heads Hkv=" + std::to_string(hkv));
  if (o.block_q < 1 || o.block_k < 1)
    throw std::invalid_argument("attention: block_q and block_k must be >= 1, got " + std::to_string(o.block_q) +
                                " and " + std::to_string(o.block_k));
  if (o.scale && !std::isfinite(*o.scale)) throw std::invalid_argument("attention: scale must be finite");
  const int64_t end = o.head_end < 0 ? hq : o.head_end;
  if (o.head_begin < 0 || o.head_begin > end || end > hq)
    throw std::invalid_argument("attention: head range [" + std::to_string(o.head_begin) + ", " +
                                std::to_string(o.head_end) + ") is not inside [0, Hq=" + std::to_string(hq) + ")");
  return {o.head_begin, end};
}

// Key columns [0, visible_end) a query tile of rows [i0, i0 + rows) needs: all of them, or with causal masking
// up to the last row's position.
int64_t key_end(int64_t i0, int64_t rows, int64_t sk, const AttentionOptions& o) {
  if (!o.causal) return sk;
  const int64_t last = o.q_offset + i0 + rows - 1 - o.k_offset;  // last visible key index of the last row
  return std::clamp<int64_t>(last + 1, 0, sk);
}


// e^x for x <= 0 (x = s - rowmax), 0 below -87 (where e^x is near fp32's subnormal range) and for -inf.
// Cephes' expf: x = n·ln2 + r, |r| <= ln2/2, degree-6 polynomial, 2^n through the exponent bits; ~1 ulp.
// Branch-free so the loop that calls it vectorizes (std::exp does not without -ffast-math).
inline float exp_nonpos(float x) {
  const float xc = std::max(x, -87.0f);
  const float t = xc * 1.44269504088896341f;
  const float n = (t + 12582912.0f) - 12582912.0f;  // round to nearest integer (|t| < 2^22)
  float r = xc - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  const float two_n = std::bit_cast<float>(bits);
  return x < -87.0f ? 0.0f : y * two_n;
}

// The per-row softmax work, compiled for AVX-512, AVX2 and baseline x86-64 (picked at load time by the ifunc
// resolver), because it is the only non-BLAS loop that matters: about one exp per 4·d FLOPs of the tile GEMMs.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define SHARDSIM_SIMD_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define SHARDSIM_SIMD_CLONES
#endif

// Row max of s[0, n) (n >= 1), 16 independent lanes so the compiler can vectorize without reassociation flags.
SHARDSIM_SIMD_CLONES float row_max(const float* s, int64_t n) {
  float lane[16];
  for (int k = 0; k < 16; ++k) lane[k] = kNegInf;
  int64_t c = 0;
  for (; c + 16 <= n; c += 16)
    for (int k = 0; k < 16; ++k) lane[k] = std::max(lane[k], s[c + k]);
  float m = kNegInf;
  for (int k = 0; k < 16; ++k) m = std::max(m, lane[k]);
  for (; c < n; ++c) m = std::max(m, s[c]);
  return m;
}

// p[c] = e^{s[c] - m} in place for c < n; returns their sum (16 lanes).
SHARDSIM_SIMD_CLONES float exp_row_sum(float* __restrict s, int64_t n, float m) {
  for (int64_t c = 0; c < n; ++c) s[c] = exp_nonpos(s[c] - m);
  float lane[16] = {};
  int64_t c = 0;
  for (; c + 16 <= n; c += 16)
    for (int k = 0; k < 16; ++k) lane[k] += s[c + k];
  float sum = 0;
  for (int k = 0; k < 16; ++k) sum += lane[k];
  for (; c < n; ++c) sum += s[c];
  return sum;
}

}  // namespace

int64_t attention_visible_pairs(int64_t sq, int64_t sk, const AttentionOptions& o) {
  if (sq <= 0 || sk <= 0) return 0;
  if (!o.causal) return sq * sk;
  // Row i sees clamp(a + i, 0, sk) keys, a = q_offset - k_offset + 1: none for i < lo, all sk for i >= hi, a + i
  // in between.
  const int64_t a = o.q_offset - o.k_offset + 1;
  const int64_t lo = std::clamp<int64_t>(1 - a, 0, sq);
  const int64_t hi = std::max(lo, std::clamp<int64_t>(sk - a, 0, sq));
  return (hi - lo) * a + (lo + hi - 1) * (hi - lo) / 2 + (sq - hi) * sk;
}

KernelCost attention_cost(int64_t sq, int64_t sk, int64_t hq, int64_t hkv, int64_t d, DType in, DType out,
                          const AttentionOptions& o) {
  const auto heads = check_numbers(sq, sk, hq, hkv, d, in, out, o);
  const double nh = double(heads.end - heads.begin);
  // Visible (i, j) pairs and key rows loaded per query tile; both the same for every head.
  const double pairs = double(attention_visible_pairs(sq, sk, o));
  double kv_rows = 0;
  for (int64_t i0 = 0; i0 < sq; i0 += o.block_q) kv_rows += double(key_end(i0, std::min(o.block_q, sq - i0), sk, o));
  const double es_in = double(runtime::dtype_size(in)), es_out = double(runtime::dtype_size(out));
  KernelCost c;
  c.name = o.causal ? "attention_causal" : "attention";
  c.dtype = in;
  c.flops = nh * 4.0 * double(d) * pairs;
  c.shape = sim::KernelShape{sim::KernelClass::attention_forward, sq, sk, d, int64_t(nh)};
  c.bytes = nh * (double(sq) * double(d) * (es_in + es_out) + 4.0 * double(sq) + 2.0 * double(d) * es_in * kv_rows);
  return c;
}

int64_t attention_workspace_bytes(int64_t sk, int64_t d, DType in, const AttentionOptions& o) {
  const int64_t br = o.block_q, bc = o.block_k;
  int64_t floats = br * bc + br * d + 2 * br;
  if (in != DType::fp32) floats += br * d + 2 * sk * d;
  return floats * 4;
}

KernelCost attention(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, Tensor& lse,
                     const AttentionOptions& o) {
  if (q.rank() != 3 || k.rank() != 3 || v.rank() != 3)
    throw std::invalid_argument("attention: Q [seq_q, Hq, d], K and V [seq_k, Hkv, d] must be 3-D, got Q " +
                                runtime::shape_str(q.shape()) + ", K " + runtime::shape_str(k.shape()) + ", V " +
                                runtime::shape_str(v.shape()));
  if (k.shape() != v.shape())
    throw std::invalid_argument("attention: K " + runtime::shape_str(k.shape()) + " and V " +
                                runtime::shape_str(v.shape()) + " must have the same shape");
  if (q.dim(2) != k.dim(2))
    throw std::invalid_argument("attention: head_dim differs: Q " + runtime::shape_str(q.shape()) + " vs K " +
                                runtime::shape_str(k.shape()));
  if (k.dtype() != q.dtype() || v.dtype() != q.dtype())
    throw std::invalid_argument("attention: Q, K, V must share one dtype, got " + runtime::dtype_name(q.dtype()) +
                                ", " + runtime::dtype_name(k.dtype()) + ", " + runtime::dtype_name(v.dtype()));
  const int64_t sq = q.dim(0), hq = q.dim(1), d = q.dim(2), sk = k.dim(0), hkv = k.dim(1);
  const auto heads = check_numbers(sq, sk, hq, hkv, d, q.dtype(), out.dtype(), o);
  if (out.shape() != q.shape())
    throw std::invalid_argument("attention: O must have Q's shape " + runtime::shape_str(q.shape()) + ", got " +
                                runtime::shape_str(out.shape()));
  if (lse.dtype() != DType::fp32 || lse.shape() != runtime::Shape{hq, sq})
    throw std::invalid_argument("attention: lse must be fp32 [Hq, seq_q] = " + runtime::shape_str({hq, sq}) +
                                ", got " + runtime::dtype_name(lse.dtype()) + " " + runtime::shape_str(lse.shape()));

  KernelCost cost = attention_cost(sq, sk, hq, hkv, d, q.dtype(), out.dtype(), o);
  if (cost_only({&q, &k, &v}, {&out, &lse})) return cost;
  if (heads.begin == heads.end || sq == 0) return cost;

  const float scale = o.scale ? *o.scale : 1.0f / std::sqrt(static_cast<float>(d));
  const bool f32 = q.dtype() == DType::fp32;
  const int64_t group = hq / hkv;
  const int64_t br = o.block_q, bc = o.block_k;

  std::vector<float> s(static_cast<size_t>(br * bc)), acc(static_cast<size_t>(br * d));
  std::vector<float> mrow(static_cast<size_t>(br)), lrow(static_cast<size_t>(br));
  std::vector<float> qbuf, kbuf, vbuf;
  if (!f32) {
    qbuf.resize(static_cast<size_t>(br * d));
    kbuf.resize(static_cast<size_t>(sk * d));
    vbuf.resize(static_cast<size_t>(sk * d));
  }
  float* lse_p = lse.f32();

  for (int64_t g = heads.begin / group; g * group < heads.end; ++g) {
    // K and V of kv head g: strided views of the input (fp32) or widened once into contiguous buffers (bf16).
    const float *kp, *vp;
    int64_t ldk;
    if (f32) {
      kp = k.f32() + g * d;
      vp = v.f32() + g * d;
      ldk = hkv * d;
    } else {
      const uint16_t *kb = k.bf16(), *vb = v.bf16();
      for (int64_t j = 0; j < sk; ++j)
        for (int64_t c = 0; c < d; ++c) {
          kbuf[size_t(j * d + c)] = runtime::bf16_to_float(kb[(j * hkv + g) * d + c]);
          vbuf[size_t(j * d + c)] = runtime::bf16_to_float(vb[(j * hkv + g) * d + c]);
        }
      kp = kbuf.data();
      vp = vbuf.data();
      ldk = d;
    }
    const int64_t h_lo = std::max(heads.begin, g * group), h_hi = std::min(heads.end, (g + 1) * group);
    for (int64_t h = h_lo; h < h_hi; ++h) {
      for (int64_t i0 = 0; i0 < sq; i0 += br) {
        const int64_t rows = std::min(br, sq - i0);
        const float* qp;
        int64_t ldq;
        if (f32) {
          qp = q.f32() + (i0 * hq + h) * d;
          ldq = hq * d;
        } else {
          const uint16_t* qb = q.bf16();
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t c = 0; c < d; ++c) qbuf[size_t(r * d + c)] = runtime::bf16_to_float(qb[((i0 + r) * hq + h) * d + c]);
          qp = qbuf.data();
          ldq = d;
        }
        std::fill(mrow.begin(), mrow.begin() + rows, kNegInf);
        std::fill(lrow.begin(), lrow.begin() + rows, 0.0f);
        std::fill(acc.begin(), acc.begin() + rows * d, 0.0f);

        const int64_t jend = key_end(i0, rows, sk, o);
        for (int64_t j0 = 0; j0 < jend; j0 += bc) {
          const int64_t cols = std::min(bc, jend - j0);
          // S = scale · Q_tile · K_tile^T   [rows, cols], compact (ld = cols)
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, blasint(rows), blasint(cols), blasint(d), scale, qp,
                      blasint(ldq), kp + j0 * ldk, blasint(ldk), 0.0f, s.data(), blasint(cols));
          // Does any row of this tile see fewer than all `cols` keys? (the first row sees the fewest)
          const bool partial = o.causal && o.q_offset + i0 < o.k_offset + j0 + cols - 1;
          for (int64_t r = 0; r < rows; ++r) {
            float* sr = s.data() + r * cols;
            const int64_t vis = partial ? std::clamp<int64_t>(o.q_offset + i0 + r - o.k_offset - j0 + 1, 0, cols) : cols;
            if (vis == 0) {  // nothing visible in this tile: P row = 0, running state unchanged
              std::fill(sr, sr + cols, 0.0f);
              continue;
            }
            const float m_old = mrow[size_t(r)];
            const float m_new = std::max(m_old, row_max(sr, vis));
            const float sum = exp_row_sum(sr, vis, m_new);
            std::fill(sr + vis, sr + cols, 0.0f);
            const float alpha = m_old == kNegInf ? 0.0f : std::exp(m_old - m_new);
            lrow[size_t(r)] = lrow[size_t(r)] * alpha + sum;
            mrow[size_t(r)] = m_new;
            if (alpha != 1.0f) {
              float* ar = acc.data() + r * d;
              for (int64_t c = 0; c < d; ++c) ar[c] *= alpha;
            }
          }
          // acc += P · V_tile   [rows, d]
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, blasint(rows), blasint(d), blasint(cols), 1.0f,
                      s.data(), blasint(cols), vp + j0 * ldk, blasint(ldk), 1.0f, acc.data(), blasint(d));
        }
        // O = acc / l, lse = m + log l; rows that saw no key: O = 0, lse = -inf.
        for (int64_t r = 0; r < rows; ++r) {
          const float l = lrow[size_t(r)];
          const float inv = l > 0 ? 1.0f / l : 0.0f;
          const float* ar = acc.data() + r * d;
          const size_t base = size_t(((i0 + r) * hq + h) * d);
          if (out.dtype() == DType::fp32) {
            float* op = out.f32() + base;
            for (int64_t c = 0; c < d; ++c) op[c] = ar[c] * inv;
          } else {
            uint16_t* op = out.bf16() + base;
            for (int64_t c = 0; c < d; ++c) op[c] = runtime::float_to_bf16(ar[c] * inv);
          }
          // A NaN score (a NaN in Q or K) leaves l NaN: lse NaN too (not -inf, which reads as "saw no key" and
          // let a merge or the backward drop the row's NaN where one device keeps it).
          lse_p[h * sq + i0 + r] = l > 0 || std::isnan(l) ? mrow[size_t(r)] + std::log(l) : kNegInf;
        }
      }
    }
  }
  return cost;
}

KernelCost merge_attention_partials(Tensor& out_a, Tensor& lse_a, const Tensor& out_b, const Tensor& lse_b) {
  if (out_a.rank() != 3 || out_a.shape() != out_b.shape())
    throw std::invalid_argument("merge_attention_partials: outs must be [seq, H, d] of one shape, got " +
                                runtime::shape_str(out_a.shape()) + " and " + runtime::shape_str(out_b.shape()));
  for (const Tensor* t : std::initializer_list<const Tensor*>{&out_a, &out_b})
    if (t->dtype() != DType::fp32 && t->dtype() != DType::bf16)
      throw std::invalid_argument("merge_attention_partials: outs must be fp32 or bf16, got " +
                                  runtime::dtype_name(t->dtype()));
  const int64_t seq = out_a.dim(0), h = out_a.dim(1), d = out_a.dim(2);
  for (const Tensor* t : std::initializer_list<const Tensor*>{&lse_a, &lse_b})
    if (t->dtype() != DType::fp32 || t->shape() != runtime::Shape{h, seq})
      throw std::invalid_argument("merge_attention_partials: lse must be fp32 [H, seq] = " +
                                  runtime::shape_str({h, seq}) + ", got " + runtime::dtype_name(t->dtype()) + " " +
                                  runtime::shape_str(t->shape()));
  const double n = double(out_a.numel());
  KernelCost cost;
  cost.name = "attention_merge";
  cost.dtype = out_a.dtype();
  cost.flops = 3.0 * n;
  cost.bytes = n * double(2 * runtime::dtype_size(out_a.dtype()) + runtime::dtype_size(out_b.dtype())) +
               double(lse_a.numel()) * 4.0 * 3.0;
  if (cost_only({&out_a, &lse_a, &out_b, &lse_b}, {&out_a, &lse_a})) return cost;
  float* la = lse_a.f32();
  const float* lb = lse_b.f32();
  const bool a32 = out_a.dtype() == DType::fp32, b32 = out_b.dtype() == DType::fp32;
  for (int64_t hh = 0; hh < h; ++hh)
    for (int64_t i = 0; i < seq; ++i) {
      const float xa = la[hh * seq + i], xb = lb[hh * seq + i];
      const float m = std::max(xa, xb);
      const size_t base = size_t((i * h + hh) * d);
      float wa = 0, wb = 0, lse = kNegInf;
      if (std::isnan(xa) || std::isnan(xb)) {  // a partial that saw a NaN score: the merged row is NaN
        wa = wb = lse = std::numeric_limits<float>::quiet_NaN();
      } else if (m != kNegInf) {
        wa = std::exp(xa - m);  // e^{-inf} = 0: an empty partial has no weight
        wb = std::exp(xb - m);
        lse = m + std::log(wa + wb);
        const float inv = 1.0f / (wa + wb);
        wa *= inv;
        wb *= inv;
      }
      for (int64_t c = 0; c < d; ++c) {
        const float oa = a32 ? out_a.f32()[base + size_t(c)] : runtime::bf16_to_float(out_a.bf16()[base + size_t(c)]);
        const float ob = b32 ? out_b.f32()[base + size_t(c)] : runtime::bf16_to_float(out_b.bf16()[base + size_t(c)]);
        const float r = (wa == 0 ? 0.0f : wa * oa) + (wb == 0 ? 0.0f : wb * ob);
        if (a32)
          out_a.f32()[base + size_t(c)] = r;
        else
          out_a.bf16()[base + size_t(c)] = runtime::float_to_bf16(r);
      }
      la[hh * seq + i] = lse;
    }
  return cost;
}

}  // namespace shardsim::kernels

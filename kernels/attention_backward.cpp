#include "kernels/attention_backward.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

namespace shardsim::kernels {

using runtime::DType;
using runtime::shape_str;
using runtime::Tensor;

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

bool visible(int64_t i, int64_t j, const AttentionOptions& o) { return !o.causal || o.q_offset + i >= o.k_offset + j; }

// Keys [0, end) a query row can see.
int64_t visible_keys(int64_t i, int64_t sk, const AttentionOptions& o) {
  if (!o.causal) return sk;
  return std::clamp<int64_t>(o.q_offset + i - o.k_offset + 1, 0, sk);
}

// Query rows [begin, sq) that see key j (causal: the first row whose position reaches the key's).
int64_t first_query(int64_t j, int64_t sq, const AttentionOptions& o) {
  if (!o.causal) return 0;
  return std::clamp<int64_t>(o.k_offset + j - o.q_offset, 0, sq);
}

void check_numbers(int64_t sq, int64_t sk, int64_t hq, int64_t hkv, int64_t d, DType in, DType grad,
                   const AttentionOptions& o) {
  if (in != DType::fp32 && in != DType::bf16)
    throw std::invalid_argument("attention_backward: Q, K, V must be fp32 or bf16, got " + runtime::dtype_name(in));
  if (grad != DType::fp32 && grad != in)
    throw std::invalid_argument("attention_backward: dQ, dK, dV must be fp32 or Q's dtype, got " +
                                runtime::dtype_name(grad));
  if (sq < 0 || sk < 0 || hq < 1 || hkv < 1 || d < 1 || hq % hkv != 0)
    throw std::invalid_argument("attention_backward: need seq >= 0, Hq a multiple of Hkv >= 1 and d >= 1, got seq_q=" +
                                std::to_string(sq) + " seq_k=" + std::to_string(sk) + " Hq=" + std::to_string(hq) +
                                " Hkv=" + std::to_string(hkv) + " d=" + std::to_string(d));
  if (o.block_q < 1 || o.block_k < 1)
    throw std::invalid_argument("attention_backward: block_q and block_k must be >= 1");
  if (o.scale && !std::isfinite(*o.scale)) throw std::invalid_argument("attention_backward: scale must be finite");
  if (o.head_begin != 0 || (o.head_end != -1 && o.head_end != hq))
    throw std::invalid_argument("attention_backward: a head range [" + std::to_string(o.head_begin) + ", " +
                                std::to_string(o.head_end) + ") is not supported (dK, dV need every query head)");
}

// fp32 view of a tensor: its own storage, or a widened copy kept in `keep`.
const float* as_f32(const Tensor& t, std::vector<float>& keep) {
  if (t.dtype() == DType::fp32) return t.f32();
  keep = t.to_float();
  return keep.data();
}

}  // namespace

KernelCost attention_backward_cost(int64_t sq, int64_t sk, int64_t hq, int64_t hkv, int64_t d, DType in, DType grad,
                                   const AttentionOptions& o) {
  check_numbers(sq, sk, hq, hkv, d, in, grad, o);
  const double pairs = double(attention_visible_pairs(sq, sk, o));
  double q_rows = 0;  // query rows visited, summed over key tiles
  for (int64_t j0 = 0; j0 < sk; j0 += o.block_k) q_rows += double(sq - first_query(j0, sq, o));
  const double es = double(runtime::dtype_size(in)), eg = double(runtime::dtype_size(grad));
  KernelCost c;
  c.name = o.causal ? "attention_backward_causal" : "attention_backward";
  c.dtype = in;
  c.flops = double(hq) * 10.0 * double(d) * pairs;
  c.shape = sim::KernelShape{sim::KernelClass::attention_backward, sq, sk, d, hq};
  c.bytes = double(hq) * (2.0 * double(sq) * double(d) * es                      // O, dO for D
                          + 2.0 * double(sk) * double(d) * (es + eg)             // K, V read; dK, dV written
                          + q_rows * (2.0 * double(d) * es + 8.0 * double(d) + 8.0));  // Q, dO; dQ fp32 r/w; lse, D
  return c;
}

int64_t attention_backward_workspace_bytes(int64_t sq, int64_t sk, int64_t d, const AttentionOptions& o) {
  return (2 * o.block_q * o.block_k + o.block_q * d + sq + 2 * sk * d) * 4;
}

KernelCost attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                              const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv, const AttentionOptions& o) {
  for (const Tensor* t : std::initializer_list<const Tensor*>{&q, &k, &v, &out, &dout, &dq, &dk, &dv})
    if (t->rank() != 3)
      throw std::invalid_argument("attention_backward: Q, O, dO, dQ [seq_q, Hq, d] and K, V, dK, dV [seq_k, Hkv, d] "
                                  "must be 3-D, got " + shape_str(t->shape()));
  if (k.shape() != v.shape() || dk.shape() != k.shape() || dv.shape() != k.shape() || out.shape() != q.shape() ||
      dout.shape() != q.shape() || dq.shape() != q.shape() || q.dim(2) != k.dim(2))
    throw std::invalid_argument("attention_backward: shapes do not fit: Q " + shape_str(q.shape()) + ", K " +
                                shape_str(k.shape()) + ", V " + shape_str(v.shape()) + ", O " + shape_str(out.shape()) +
                                ", dO " + shape_str(dout.shape()) + ", dQ " + shape_str(dq.shape()) + ", dK " +
                                shape_str(dk.shape()) + ", dV " + shape_str(dv.shape()));
  if (k.dtype() != q.dtype() || v.dtype() != q.dtype() || dk.dtype() != dq.dtype() || dv.dtype() != dq.dtype())
    throw std::invalid_argument("attention_backward: Q, K, V must share one dtype and dQ, dK, dV another");
  for (const Tensor* t : std::initializer_list<const Tensor*>{&out, &dout})
    if (t->dtype() != DType::fp32 && t->dtype() != q.dtype())
      throw std::invalid_argument("attention_backward: O and dO must be fp32 or Q's dtype, got " +
                                  runtime::dtype_name(t->dtype()));
  const int64_t sq = q.dim(0), hq = q.dim(1), d = q.dim(2), sk = k.dim(0), hkv = k.dim(1);
  check_numbers(sq, sk, hq, hkv, d, q.dtype(), dq.dtype(), o);
  if (lse.dtype() != DType::fp32 || lse.shape() != runtime::Shape{hq, sq})
    throw std::invalid_argument("attention_backward: lse must be fp32 [Hq, seq_q] = " + shape_str({hq, sq}) +
                                ", got " + runtime::dtype_name(lse.dtype()) + " " + shape_str(lse.shape()));
  const KernelCost cost = attention_backward_cost(sq, sk, hq, hkv, d, q.dtype(), dq.dtype(), o);
  if (cost_only({&q, &k, &v, &out, &lse, &dout}, {&dq, &dk, &dv})) return cost;

  std::vector<float> kq, kk, kv, ko, kdo;
  const float *qp = as_f32(q, kq), *kp = as_f32(k, kk), *vp = as_f32(v, kv), *op = as_f32(out, ko),
              *dop = as_f32(dout, kdo);
  const float* lp = lse.f32();
  const float scale = o.scale ? *o.scale : 1.0f / std::sqrt(static_cast<float>(d));
  const int64_t group = hq / hkv, br = o.block_q, bc = o.block_k;
  const int64_t ldq = hq * d, ldk = hkv * d;

  std::vector<float> p(static_cast<size_t>(br * bc)), dp(static_cast<size_t>(br * bc));
  std::vector<float> dq_tile(static_cast<size_t>(br * d)), dvec(static_cast<size_t>(sq));
  std::vector<float> dk_acc(static_cast<size_t>(sk * d)), dv_acc(static_cast<size_t>(sk * d));
  auto store = [](Tensor& t, int64_t idx, float x) {
    if (t.dtype() == DType::fp32)
      t.f32()[idx] = x;
    else
      t.set(idx, x);
  };

  for (int64_t g = 0; g < hkv; ++g) {
    std::fill(dk_acc.begin(), dk_acc.end(), 0.0f);
    std::fill(dv_acc.begin(), dv_acc.end(), 0.0f);
    const float* kg = kp + g * d;
    const float* vg = vp + g * d;
    for (int64_t h = g * group; h < (g + 1) * group; ++h) {
      for (int64_t i = 0; i < sq; ++i) {
        double s = 0;
        for (int64_t c = 0; c < d; ++c) s += double(dop[(i * hq + h) * d + c]) * op[(i * hq + h) * d + c];
        dvec[size_t(i)] = static_cast<float>(s);
      }
      for (int64_t i0 = 0; i0 < sq; i0 += br) {
        const int64_t rows = std::min(br, sq - i0);
        const float* qt = qp + (i0 * hq + h) * d;
        const float* dot = dop + (i0 * hq + h) * d;
        std::fill(dq_tile.begin(), dq_tile.begin() + rows * d, 0.0f);
        const int64_t jend = visible_keys(i0 + rows - 1, sk, o);
        for (int64_t j0 = 0; j0 < jend; j0 += bc) {
          const int64_t cols = std::min(bc, jend - j0);
          // P = exp(scale · Q K^T − lse), masked entries 0
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, blasint(rows), blasint(cols), blasint(d), scale, qt,
                      blasint(ldq), kg + j0 * ldk, blasint(ldk), 0.0f, p.data(), blasint(cols));
          for (int64_t r = 0; r < rows; ++r) {
            const float l = lp[h * sq + i0 + r];
            for (int64_t c = 0; c < cols; ++c) {
              float& x = p[size_t(r * cols + c)];
              x = (visible(i0 + r, j0 + c, o) && l != kNegInf) ? std::exp(x - l) : 0.0f;
            }
          }
          // dV[j0:] += P^T dO
          cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, blasint(cols), blasint(d), blasint(rows), 1.0f, p.data(),
                      blasint(cols), dot, blasint(ldq), 1.0f, dv_acc.data() + j0 * d, blasint(d));
          // dP = dO V^T; dS = P ∘ (dP − D)
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, blasint(rows), blasint(cols), blasint(d), 1.0f, dot,
                      blasint(ldq), vg + j0 * ldk, blasint(ldk), 0.0f, dp.data(), blasint(cols));
          for (int64_t r = 0; r < rows; ++r) {
            const bool any = lp[h * sq + i0 + r] != kNegInf;
            for (int64_t c = 0; c < cols; ++c) {
              const size_t e = size_t(r * cols + c);
              dp[e] = (any && visible(i0 + r, j0 + c, o)) ? p[e] * (dp[e] - dvec[size_t(i0 + r)]) : 0.0f;
            }
          }
          // dQ_tile += scale · dS K;  dK[j0:] += scale · dS^T Q
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, blasint(rows), blasint(d), blasint(cols), scale,
                      dp.data(), blasint(cols), kg + j0 * ldk, blasint(ldk), 1.0f, dq_tile.data(), blasint(d));
          cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, blasint(cols), blasint(d), blasint(rows), scale,
                      dp.data(), blasint(cols), qt, blasint(ldq), 1.0f, dk_acc.data() + j0 * d, blasint(d));
        }
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t c = 0; c < d; ++c) store(dq, ((i0 + r) * hq + h) * d + c, dq_tile[size_t(r * d + c)]);
      }
    }
    for (int64_t j = 0; j < sk; ++j)
      for (int64_t c = 0; c < d; ++c) {
        store(dk, (j * hkv + g) * d + c, dk_acc[size_t(j * d + c)]);
        store(dv, (j * hkv + g) * d + c, dv_acc[size_t(j * d + c)]);
      }
  }
  return cost;
}

}  // namespace shardsim::kernels

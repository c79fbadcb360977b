#include "kernels/attention_unfused.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

namespace shardsim::kernels {

using runtime::DType;
using runtime::Tensor;

namespace {

struct CoreDims {
  int64_t sq, sk, hq, hkv, d;
};

std::string dims_str(const CoreDims& c) {
  return "seq_q=" + std::to_string(c.sq) + " seq_k=" + std::to_string(c.sk) + " Hq=" + std::to_string(c.hq) +
         " Hkv=" + std::to_string(c.hkv) + " d=" + std::to_string(c.d);
}

void need(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument("attention_unfused: " + what);
}

CoreDims check_core(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& probs, const AttentionOptions& o,
                    double dropout_p) {
  need(q.rank() == 3 && k.rank() == 3 && v.rank() == 3, "Q, K, V must be 3-D [seq, heads, d]");
  need(k.shape() == v.shape(), "K " + runtime::shape_str(k.shape()) + " and V " + runtime::shape_str(v.shape()) +
                                   " must have one shape");
  const CoreDims c{q.dim(0), k.dim(0), q.dim(1), k.dim(1), q.dim(2)};
  need(c.d >= 1 && k.dim(2) == c.d && c.hkv >= 1 && c.hq % c.hkv == 0,
       "head dims / heads do not fit (" + dims_str(c) + ", K " + runtime::shape_str(k.shape()) + ")");
  need((q.dtype() == DType::fp32 || q.dtype() == DType::bf16) && k.dtype() == q.dtype() && v.dtype() == q.dtype(),
       "Q, K, V must share one dtype, fp32 or bf16");
  need(probs.dtype() == q.dtype() && probs.shape() == runtime::Shape{c.hq, c.sq, c.sk},
       "P must be " + runtime::dtype_name(q.dtype()) + " [Hq, seq_q, seq_k] = [" + std::to_string(c.hq) + ", " +
           std::to_string(c.sq) + ", " + std::to_string(c.sk) + "], got " + runtime::dtype_name(probs.dtype()) +
           " " + runtime::shape_str(probs.shape()));
  need(o.head_begin == 0 && (o.head_end < 0 || o.head_end == c.hq), "the head range must be all query heads");
  need(!o.scale || std::isfinite(*o.scale), "scale must be finite");
  need(dropout_p >= 0 && dropout_p < 1, "dropout probability must be in [0, 1)");
  return c;
}

bool visible(const AttentionOptions& o, int64_t i, int64_t j) { return !o.causal || o.q_offset + i >= o.k_offset + j; }

KernelCost cost(const char* name, double flops, double bytes, DType t, sim::KernelShape shape = {}) {
  KernelCost kc;
  kc.name = name;
  kc.flops = flops;
  kc.bytes = bytes;
  kc.dtype = t;
  kc.shape = shape;
  return kc;
}

sim::KernelShape gemm_shape(sim::KernelClass cls, int64_t m, int64_t n, int64_t k, int64_t batch) {
  sim::KernelShape s;
  s.cls = cls;
  s.m = m;
  s.n = n;
  s.k = k;
  s.batch = batch;
  return s;
}

std::vector<KernelCost> forward_costs(const CoreDims& c, DType in, DType out, double dropout_p) {
  const double e = double(runtime::dtype_size(in)), eo = double(runtime::dtype_size(out));
  const double ss = double(c.hq) * double(c.sq) * double(c.sk);  // score elements
  const double qd = double(c.sq) * double(c.hq) * double(c.d), kd = double(c.sk) * double(c.hkv) * double(c.d);
  std::vector<KernelCost> v;
  v.push_back(cost("attention_core.qk", 2.0 * ss * double(c.d), e * (qd + kd + ss), in,
                   gemm_shape(sim::KernelClass::gemm, c.sq, c.sk, c.d, c.hq)));
  v.push_back(cost("attention_core.softmax", 4.0 * ss, 2.0 * e * ss, in));
  if (dropout_p > 0) v.push_back(cost("attention_core.dropout", 2.0 * ss, (2.0 * e + 1.0) * ss, in));
  v.push_back(cost("attention_core.pv", 2.0 * ss * double(c.d), e * (ss + kd) + eo * qd, in,
                   gemm_shape(sim::KernelClass::gemm, c.sq, c.d, c.sk, c.hq)));
  return v;
}

std::vector<KernelCost> backward_costs(const CoreDims& c, DType in, DType dout, DType grad, double dropout_p) {
  const double e = double(runtime::dtype_size(in)), eg = double(runtime::dtype_size(grad));
  const double edo = double(runtime::dtype_size(dout));
  const double ss = double(c.hq) * double(c.sq) * double(c.sk);
  const double qd = double(c.sq) * double(c.hq) * double(c.d), kd = double(c.sk) * double(c.hkv) * double(c.d);
  std::vector<KernelCost> v;
  v.push_back(cost("attention_core.pv_backward", 4.0 * ss * double(c.d), edo * qd + e * (kd + ss) + e * ss + eg * kd,
                   in, gemm_shape(sim::KernelClass::gemm_backward, c.sq, c.d, c.sk, c.hq)));
  if (dropout_p > 0) v.push_back(cost("attention_core.dropout_backward", ss, (2.0 * e + 1.0) * ss, in));
  v.push_back(cost("attention_core.softmax_backward", 3.0 * ss, 3.0 * e * ss, in));
  v.push_back(cost("attention_core.qk_backward", 4.0 * ss * double(c.d), e * (ss + qd + kd) + eg * (qd + kd), in,
                   gemm_shape(sim::KernelClass::gemm_backward, c.sq, c.sk, c.d, c.hq)));
  return v;
}

float scale_of(const AttentionOptions& o, int64_t d) { return o.scale ? *o.scale : 1.0f / std::sqrt(float(d)); }

}  // namespace

std::vector<KernelCost> attention_unfused(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out,
                                          Tensor& probs, const AttentionOptions& o, double dropout_p) {
  const CoreDims c = check_core(q, k, v, probs, o, dropout_p);
  need(out.shape() == q.shape() && (out.dtype() == DType::fp32 || out.dtype() == q.dtype()),
       "O must be fp32 or Q's dtype with Q's shape " + runtime::shape_str(q.shape()) + ", got " +
           runtime::shape_str(out.shape()));
  auto costs = forward_costs(c, q.dtype(), out.dtype(), dropout_p);
  if (cost_only({&q, &k, &v}, {&out, &probs})) return costs;
  const std::vector<float> qf = q.to_float(), kf = k.to_float(), vf = v.to_float();
  std::vector<float> of(size_t(c.sq * c.hq * c.d), 0.0f), p(size_t(c.sq * c.sk));
  const float scale = scale_of(o, c.d);
  const int64_t group = c.hq / c.hkv;
  const int64_t ldq = c.hq * c.d, ldk = c.hkv * c.d;
  for (int64_t h = 0; h < c.hq; ++h) {
    const int64_t g = h / group;
    if (c.sq > 0 && c.sk > 0)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(c.sq), int(c.sk), int(c.d), scale, qf.data() + h * c.d,
                  int(ldq), kf.data() + g * c.d, int(ldk), 0.0f, p.data(), int(c.sk));
    for (int64_t i = 0; i < c.sq; ++i) {
      float* row = p.data() + i * c.sk;
      float m = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < c.sk; ++j)
        if (visible(o, i, j)) m = std::max(m, row[j]);
      double sum = 0;
      for (int64_t j = 0; j < c.sk; ++j) {
        row[j] = visible(o, i, j) ? std::exp(row[j] - m) : 0.0f;
        sum += row[j];
      }
      const float inv = sum > 0 ? float(1.0 / sum) : 0.0f;
      for (int64_t j = 0; j < c.sk; ++j) {  // P as stored (rounded to the compute dtype), then used by P·V
        const int64_t at = (h * c.sq + i) * c.sk + j;
        probs.set(at, row[j] * inv);
        row[j] = probs.get(at);
      }
    }
    if (c.sq > 0 && c.sk > 0)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(c.sq), int(c.d), int(c.sk), 1.0f, p.data(),
                  int(c.sk), vf.data() + g * c.d, int(ldk), 0.0f, of.data() + h * c.d, int(ldq));
  }
  for (size_t i = 0; i < of.size(); ++i) out.set(int64_t(i), of[i]);
  return costs;
}

std::vector<KernelCost> attention_unfused_backward(const Tensor& q, const Tensor& k, const Tensor& v,
                                                   const Tensor& probs, const Tensor& dout, Tensor& dq, Tensor& dk,
                                                   Tensor& dv, const AttentionOptions& o, double dropout_p) {
  const CoreDims c = check_core(q, k, v, probs, o, dropout_p);
  need(dout.shape() == q.shape() && (dout.dtype() == DType::fp32 || dout.dtype() == q.dtype()),
       "dO must have Q's shape " + runtime::shape_str(q.shape()) + ", got " + runtime::shape_str(dout.shape()));
  need(dq.shape() == q.shape() && dk.shape() == k.shape() && dv.shape() == v.shape() &&
           dk.dtype() == dq.dtype() && dv.dtype() == dq.dtype() &&
           (dq.dtype() == DType::fp32 || dq.dtype() == q.dtype()),
       "dQ, dK, dV must have the shapes of Q, K, V and one dtype (fp32 or Q's)");
  auto costs = backward_costs(c, q.dtype(), dout.dtype(), dq.dtype(), dropout_p);
  if (cost_only({&q, &k, &v, &probs, &dout}, {&dq, &dk, &dv})) return costs;
  const std::vector<float> qf = q.to_float(), kf = k.to_float(), vf = v.to_float(), pf = probs.to_float(),
                           dof = dout.to_float();
  std::vector<float> dqf(qf.size(), 0.0f), dkf(kf.size(), 0.0f), dvf(vf.size(), 0.0f), dp(size_t(c.sq * c.sk));
  const float scale = scale_of(o, c.d);
  const int64_t group = c.hq / c.hkv, ldq = c.hq * c.d, ldk = c.hkv * c.d;
  for (int64_t h = 0; h < c.hq && c.sq > 0 && c.sk > 0; ++h) {
    const int64_t g = h / group;
    const float* P = pf.data() + h * c.sq * c.sk;
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, int(c.sk), int(c.d), int(c.sq), 1.0f, P, int(c.sk),
                dof.data() + h * c.d, int(ldq), 1.0f, dvf.data() + g * c.d, int(ldk));
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(c.sq), int(c.sk), int(c.d), 1.0f, dof.data() + h * c.d,
                int(ldq), vf.data() + g * c.d, int(ldk), 0.0f, dp.data(), int(c.sk));
    for (int64_t i = 0; i < c.sq; ++i) {  // dS = P ∘ (dP − rowsum(dP ∘ P)), in place of dP
      const float* pr = P + i * c.sk;
      float* r = dp.data() + i * c.sk;
      double dot = 0;
      for (int64_t j = 0; j < c.sk; ++j) dot += double(pr[j]) * double(r[j]);
      for (int64_t j = 0; j < c.sk; ++j) r[j] = pr[j] * (r[j] - float(dot));
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(c.sq), int(c.d), int(c.sk), scale, dp.data(),
                int(c.sk), kf.data() + g * c.d, int(ldk), 0.0f, dqf.data() + h * c.d, int(ldq));
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, int(c.sk), int(c.d), int(c.sq), scale, dp.data(), int(c.sk),
                qf.data() + h * c.d, int(ldq), 1.0f, dkf.data() + g * c.d, int(ldk));
  }
  for (size_t i = 0; i < dqf.size(); ++i) dq.set(int64_t(i), dqf[i]);
  for (size_t i = 0; i < dkf.size(); ++i) dk.set(int64_t(i), dkf[i]);
  for (size_t i = 0; i < dvf.size(); ++i) dv.set(int64_t(i), dvf[i]);
  return costs;
}

}  // namespace shardsim::kernels

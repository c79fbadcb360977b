#include "kernels/backward.h"

#include "kernels/norm.h"

#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

namespace shardsim::kernels {

using runtime::shape_str;
using runtime::Tensor;

namespace {

double esize(const Tensor& t) { return static_cast<double>(runtime::dtype_size(t.dtype())); }

void check_like(const Tensor& a, const Tensor& b, const char* op, const char* na, const char* nb) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype())
    throw std::invalid_argument(std::string(op) + ": " + na + " " + shape_str(a.shape()) + " " +
                                runtime::dtype_name(a.dtype()) + " and " + nb + " " + shape_str(b.shape()) + " " +
                                runtime::dtype_name(b.dtype()) + " must have one shape and dtype");
}

}  // namespace

KernelCost gemm_backward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dx, Tensor* dw) {
  if (x.rank() != 2 || w.rank() != 2 || dy.rank() != 2 || x.dim(1) != w.dim(0) || dy.dim(0) != x.dim(0) ||
      dy.dim(1) != w.dim(1))
    throw std::invalid_argument("gemm_backward: X " + shape_str(x.shape()) + ", W " + shape_str(w.shape()) +
                                ", dY " + shape_str(dy.shape()) + " (want X [M, K], W [K, N], dY [M, N])");
  // Shape for the kernel model: both GEMMs, or the one that runs (dX = dY·W^T [M, K]; dW = X^T·dY [K, N]).
  const int64_t M = x.dim(0), K = x.dim(1), N = w.dim(1);
  KernelCost cost{"gemm_backward", 0, 0, x.dtype(), sim::KernelShape{sim::KernelClass::gemm_backward, M, N, K, 1}};
  if (!dx && dw) cost.shape = sim::KernelShape{sim::KernelClass::gemm, K, N, M, 1, nullptr};
  if (dx && !dw) cost.shape = sim::KernelShape{sim::KernelClass::gemm, M, K, N, 1, nullptr};
  // Shape-only: dX and dW become shape-only here, so the two gemm() calls below only charge their cost.
  cost_only({&x, &w, &dy}, {dx, dw});
  if (dx) {
    if (dx->shape() != x.shape())
      throw std::invalid_argument("gemm_backward: dX " + shape_str(dx->shape()) + " must have X's shape " +
                                  shape_str(x.shape()));
    const auto c = gemm(dy, w, *dx, {.trans_a = false, .trans_b = true});  // [M, N] x [K, N]^T
    cost.dtype = c.dtype;  // fp8 under an FP8 recipe (kernels/fp8.h)
    cost.flops += c.flops;
    cost.bytes += c.bytes;
  }
  if (dw) {
    if (dw->shape() != w.shape())
      throw std::invalid_argument("gemm_backward: dW " + shape_str(dw->shape()) + " must have W's shape " +
                                  shape_str(w.shape()));
    const auto c = gemm(x, dy, *dw, {.trans_a = true, .trans_b = false});  // [M, K]^T x [M, N]
    cost.dtype = c.dtype;
    cost.flops += c.flops;
    cost.bytes += c.bytes;
  }
  return cost;
}

KernelCost swiglu_backward(const Tensor& gate, const Tensor& up, const Tensor& dout, Tensor& dgate, Tensor& dup) {
  check_like(gate, up, "swiglu_backward", "gate", "up");
  check_like(gate, dout, "swiglu_backward", "gate", "dOut");
  check_like(gate, dgate, "swiglu_backward", "gate", "dGate");
  check_like(gate, dup, "swiglu_backward", "gate", "dUp");
  const double n = static_cast<double>(gate.numel());
  const KernelCost cost{"swiglu_backward", 10.0 * n, 5.0 * n * esize(gate), gate.dtype(), {}};
  if (cost_only({&gate, &up, &dout}, {&dgate, &dup})) return cost;
  for (int64_t i = 0; i < gate.numel(); ++i) {
    const float g = gate.get(i), u = up.get(i), d = dout.get(i);
    const float sg = 1.0f / (1.0f + std::exp(-g));
    const float silu = g * sg;
    dgate.set(i, d * u * (sg * (1.0f + g * (1.0f - sg))));
    dup.set(i, d * silu);
  }
  return cost;
}

KernelCost rmsnorm_backward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor& dx, Tensor* dw, float eps) {
  if (x.rank() != 2 || w.rank() != 1 || w.dim(0) != x.dim(1) || dy.shape() != x.shape() || dx.shape() != x.shape() ||
      (dw && dw->shape() != w.shape()))
    throw std::invalid_argument("rmsnorm_backward: x " + shape_str(x.shape()) + ", w " + shape_str(w.shape()) +
                                ", dy " + shape_str(dy.shape()) + ", dx " + shape_str(dx.shape()) +
                                (dw ? ", dw " + shape_str(dw->shape()) : std::string()) +
                                " (want x, dy, dx [T, h] and w, dw [h])");
  const int64_t T = x.dim(0), h = x.dim(1);
  const double n = static_cast<double>(T * h);
  const KernelCost cost{"rmsnorm_backward", 12.0 * n, (3.0 * n + 2.0 * double(h)) * esize(x), x.dtype(), {}};
  if (cost_only({&x, &w, &dy}, {&dx, dw})) return cost;
  const auto wf = w.to_float();
  std::vector<double> dw_acc(static_cast<size_t>(h), 0.0);
  std::vector<float> xr(static_cast<size_t>(h)), gr(static_cast<size_t>(h));
  for (int64_t t = 0; t < T; ++t) {
    double ss = 0, dot = 0;
    for (int64_t i = 0; i < h; ++i) {
      const size_t si = static_cast<size_t>(i);
      xr[si] = x.get(t * h + i);
      gr[si] = dy.get(t * h + i);
      ss += double(xr[si]) * xr[si];
      dot += double(gr[si]) * wf[si] * xr[si];
    }
    const double r = 1.0 / std::sqrt(ss / double(h) + eps);  // the forward's statistic, in fp64 as there
    const float rf = static_cast<float>(r);
    const float coef = static_cast<float>(r * r * r * dot / double(h));
    for (int64_t i = 0; i < h; ++i) {
      const size_t si = static_cast<size_t>(i);
      dx.set(t * h + i, rf * wf[si] * gr[si] - xr[si] * coef);
      dw_acc[si] += double(gr[si]) * xr[si] * rf;
    }
  }
  if (dw)
    for (int64_t i = 0; i < h; ++i) dw->set(i, static_cast<float>(dw_acc[static_cast<size_t>(i)]));
  return cost;
}

KernelCost layernorm_backward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor& dx, Tensor* dw, Tensor* db,
                              float eps) {
  if (x.rank() != 2 || w.rank() != 1 || w.dim(0) != x.dim(1) || dy.shape() != x.shape() || dx.shape() != x.shape() ||
      (dw && dw->shape() != w.shape()) || (db && db->shape() != w.shape()))
    throw std::invalid_argument("layernorm_backward: x " + shape_str(x.shape()) + ", w " + shape_str(w.shape()) +
                                ", dy " + shape_str(dy.shape()) + ", dx " + shape_str(dx.shape()) +
                                " (want x, dy, dx [T, h] and w, dw, db [h])");
  const int64_t T = x.dim(0), h = x.dim(1);
  const double n = static_cast<double>(T * h);
  const KernelCost cost{"layernorm_backward", 14.0 * n, (3.0 * n + 3.0 * double(h)) * esize(x), x.dtype(), {}};
  if (cost_only({&x, &w, &dy}, {&dx, dw, db})) return cost;
  const auto wf = w.to_float();
  std::vector<double> dw_acc(static_cast<size_t>(h), 0.0), db_acc(static_cast<size_t>(h), 0.0);
  std::vector<float> xh(static_cast<size_t>(h)), gr(static_cast<size_t>(h));
  for (int64_t t = 0; t < T; ++t) {
    double sum = 0;
    for (int64_t i = 0; i < h; ++i) sum += xh[static_cast<size_t>(i)] = x.get(t * h + i);
    const double mu = sum / double(h);
    double ss = 0;
    for (int64_t i = 0; i < h; ++i) ss += (xh[static_cast<size_t>(i)] - mu) * (xh[static_cast<size_t>(i)] - mu);
    const double r = 1.0 / std::sqrt(ss / double(h) + eps);  // the forward's statistics, in fp64 as there
    double mg = 0, mgx = 0;
    for (int64_t i = 0; i < h; ++i) {
      const size_t si = static_cast<size_t>(i);
      xh[si] = static_cast<float>((xh[si] - mu) * r);
      gr[si] = dy.get(t * h + i);
      const double g = double(gr[si]) * wf[si];
      mg += g;
      mgx += g * xh[si];
    }
    mg /= double(h);
    mgx /= double(h);
    for (int64_t i = 0; i < h; ++i) {
      const size_t si = static_cast<size_t>(i);
      dx.set(t * h + i, static_cast<float>(r * (double(gr[si]) * wf[si] - mg - double(xh[si]) * mgx)));
      dw_acc[si] += double(gr[si]) * xh[si];
      db_acc[si] += gr[si];
    }
  }
  for (int64_t i = 0; i < h; ++i) {
    if (dw) dw->set(i, static_cast<float>(dw_acc[static_cast<size_t>(i)]));
    if (db) db->set(i, static_cast<float>(db_acc[static_cast<size_t>(i)]));
  }
  return cost;
}

KernelCost gelu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) {
  check_like(x, dy, "gelu_backward", "x", "dy");
  check_like(x, dx, "gelu_backward", "x", "dx");
  const double n = static_cast<double>(x.numel());
  const KernelCost cost{"gelu_backward", 10.0 * n, 3.0 * n * esize(x), x.dtype(), {}};
  if (cost_only({&x, &dy}, {&dx})) return cost;
  for (int64_t i = 0; i < x.numel(); ++i) {
    const float v = x.get(i);
    const float cdf = 0.5f * (1.0f + std::erf(v * 0.70710678118654752f));
    const float pdf = 0.39894228040143268f * std::exp(-0.5f * v * v);
    dx.set(i, dy.get(i) * (cdf + v * pdf));
  }
  return cost;
}

KernelCost rope_backward_inplace(Tensor& dx, const std::vector<int64_t>& positions, float theta) {
  if (dx.rank() != 3 || dx.dim(2) % 2 != 0 || static_cast<int64_t>(positions.size()) != dx.dim(0))
    throw std::invalid_argument("rope_backward: dx " + shape_str(dx.shape()) + " with " +
                                std::to_string(positions.size()) +
                                " positions (want dx [T, H, d] with d even and one position per token)");
  std::vector<int64_t> negated(positions.size());
  for (size_t i = 0; i < positions.size(); ++i) negated[i] = -positions[i];
  KernelCost c = rope_inplace(dx, negated, theta);  // R(pos)^T = R(-pos): same angles, sine negated
  c.name = "rope_backward";
  return c;
}

KernelCost add_backward(const Tensor& dy, Tensor& da, Tensor& db) {
  check_like(dy, da, "add_backward", "dy", "da");
  check_like(dy, db, "add_backward", "dy", "db");
  const KernelCost cost{"add_backward", 0.0, 3.0 * double(dy.numel()) * esize(dy), dy.dtype(), {}};
  if (cost_only({&dy}, {&da, &db})) return cost;
  std::memcpy(da.data(), dy.data(), dy.nbytes());
  std::memcpy(db.data(), dy.data(), dy.nbytes());
  return cost;
}

}  // namespace shardsim::kernels

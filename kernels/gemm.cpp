#include "kernels/gemm.h"

#include <cstring>
#include <string>

#include <cblas.h>

#include <stdexcept>
#include <vector>

namespace shardsim::kernels {

using runtime::DType;
using runtime::Tensor;

runtime::Tensor transposed(const runtime::Tensor& a) {
  if (a.rank() != 2) throw std::invalid_argument("transposed: want a matrix, got " + runtime::shape_str(a.shape()));
  const int64_t m = a.dim(0), n = a.dim(1);
  runtime::Tensor t = runtime::Tensor::make(a.dtype(), {n, m}, a.has_storage());
  if (!a.has_storage()) return t;
  const size_t es = runtime::dtype_size(a.dtype());
  const char* src = static_cast<const char*>(a.data());
  char* dst = static_cast<char*>(t.data());
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) std::memcpy(dst + size_t(j * m + i) * es, src + size_t(i * n + j) * es, es);
  return t;
}

void set_blas_threads(int n) { openblas_set_num_threads(n); }

KernelCost gemm(const Tensor& a, const Tensor& b, Tensor& c, const GemmOptions& o) {
  if (a.rank() != 2 || b.rank() != 2 || c.rank() != 2)
    throw std::invalid_argument("gemm: A, B, C must be 2-D, got " + runtime::shape_str(a.shape()) + ", " +
                                runtime::shape_str(b.shape()) + ", " + runtime::shape_str(c.shape()));
  if (a.dtype() != b.dtype() || a.dtype() != c.dtype())
    throw std::invalid_argument("gemm: A, B and C must share one dtype");
  const int64_t m = o.trans_a ? a.dim(1) : a.dim(0);
  const int64_t k = o.trans_a ? a.dim(0) : a.dim(1);
  const int64_t kb = o.trans_b ? b.dim(1) : b.dim(0);
  const int64_t n = o.trans_b ? b.dim(0) : b.dim(1);
  if (k != kb || c.dim(0) != m || c.dim(1) != n)
    throw std::invalid_argument("gemm: shapes do not fit: A " + runtime::shape_str(a.shape()) +
                                (o.trans_a ? "^T" : "") + " x B " + runtime::shape_str(b.shape()) +
                                (o.trans_b ? "^T" : "") + " -> C " + runtime::shape_str(c.shape()));
  KernelCost cost{"gemm", 2.0 * double(m) * double(n) * double(k),
                  double(m * k + k * n + m * n) * double(runtime::dtype_size(a.dtype())), a.dtype(),
                  sim::KernelShape{sim::KernelClass::gemm, m, n, k, 1}};
  if (cost_only({&a, &b}, {&c})) return cost;
  if (m == 0 || n == 0) return cost;
  const auto ta = o.trans_a ? CblasTrans : CblasNoTrans;
  const auto tb = o.trans_b ? CblasTrans : CblasNoTrans;
  const auto lda = static_cast<blasint>(a.dim(1)), ldb = static_cast<blasint>(b.dim(1));
  if (a.dtype() == DType::fp32) {
    cblas_sgemm(CblasRowMajor, ta, tb, blasint(m), blasint(n), blasint(k), 1.0f, a.f32(), lda, b.f32(), ldb, 0.0f,
                c.f32(), blasint(n));
  } else {
    const auto fa = a.to_float(), fb = b.to_float();
    std::vector<float> fc(static_cast<size_t>(m * n));
    cblas_sgemm(CblasRowMajor, ta, tb, blasint(m), blasint(n), blasint(k), 1.0f, fa.data(), lda, fb.data(), ldb,
                0.0f, fc.data(), blasint(n));
    auto* out = c.bf16();
    for (size_t i = 0; i < fc.size(); ++i) out[i] = runtime::float_to_bf16(fc[i]);
  }
  return cost;
}

KernelCost gemm_rows(const Tensor& a, int64_t a_row0, int64_t rows, const Tensor& b, Tensor& c, int64_t c_row0) {
  if (a.rank() != 2 || b.rank() != 2 || c.rank() != 2 || a.dtype() != b.dtype() || a.dtype() != c.dtype() ||
      a.dim(1) != b.dim(0) || c.dim(1) != b.dim(1) || rows < 0 || a_row0 < 0 || c_row0 < 0 ||
      a_row0 + rows > a.dim(0) || c_row0 + rows > c.dim(0))
    throw std::invalid_argument("gemm_rows: rows [" + std::to_string(a_row0) + ", +" + std::to_string(rows) + ") of A " +
                                runtime::shape_str(a.shape()) + " x B " + runtime::shape_str(b.shape()) +
                                " -> rows from " + std::to_string(c_row0) + " of C " + runtime::shape_str(c.shape()) +
                                " do not fit (or dtypes differ)");
  const int64_t k = a.dim(1), n = b.dim(1);
  KernelCost cost{"gemm", 2.0 * double(rows) * double(n) * double(k),
                  double(rows * k + k * n + rows * n) * double(runtime::dtype_size(a.dtype())), a.dtype(),
                  sim::KernelShape{sim::KernelClass::gemm, rows, n, k, 1}};
  if (cost_only({&a, &b}, {&c})) return cost;
  if (rows == 0 || n == 0) return cost;
  if (a.dtype() == DType::fp32) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, blasint(rows), blasint(n), blasint(k), 1.0f,
                a.f32() + a_row0 * k, blasint(k), b.f32(), blasint(n), 0.0f, c.f32() + c_row0 * n, blasint(n));
    return cost;
  }
  // bf16: widen the row block, multiply in fp32, round once (as gemm does).
  Tensor ab(a.dtype(), {rows, k}), cb(c.dtype(), {rows, n});
  std::memcpy(ab.data(), static_cast<const unsigned char*>(a.data()) + static_cast<size_t>(a_row0 * k) * 2, ab.nbytes());
  gemm(ab, b, cb);
  std::memcpy(static_cast<unsigned char*>(c.data()) + static_cast<size_t>(c_row0 * n) * 2, cb.data(), cb.nbytes());
  return cost;
}

}  // namespace shardsim::kernels

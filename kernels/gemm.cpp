#include "kernels/gemm.h"

#include "kernels/fp8.h"

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

namespace {

// Under an active FP8 recipe (kernels/fp8.h): the GEMM runs at fp8, A and B read as one byte per element.
void apply_fp8_cost(KernelCost& cost, int64_t m, int64_t n, int64_t k, DType c_dtype) {
  const Fp8Recipe& r = fp8_recipe();
  if (!r.active()) return;
  cost.dtype = r.format;
  cost.bytes = double(m * k + k * n) + double(m * n) * double(runtime::dtype_size(c_dtype));
}

// The FP8 GEMM's values: A and B quantised and dequantised by the recipe (A in 1 x 128 tiles along K, B in 128 x
// 128 blocks under block scaling; one scale each under tensor scaling), multiplied in fp32, C rounded once.
void fp8_gemm(const Tensor& a, const Tensor& b, Tensor& c, const GemmOptions& o, int64_t m, int64_t n, int64_t k) {
  const Fp8Recipe& r = fp8_recipe();
  const bool block = r.scaling == Fp8Scaling::block;
  auto fa = a.to_float(), fb = b.to_float();
  const int64_t lda = a.dim(1), ldb = b.dim(1);
  fp8_quantize_dequantize(fa.data(), m, k, o.trans_a ? 1 : lda, o.trans_a ? lda : 1, r.format, block ? 1 : 0,
                          block ? 128 : 0);
  fp8_quantize_dequantize(fb.data(), k, n, o.trans_b ? 1 : ldb, o.trans_b ? ldb : 1, r.format, block ? 128 : 0,
                          block ? 128 : 0);
  std::vector<float> fc(static_cast<size_t>(m * n));
  cblas_sgemm(CblasRowMajor, o.trans_a ? CblasTrans : CblasNoTrans, o.trans_b ? CblasTrans : CblasNoTrans,
              blasint(m), blasint(n), blasint(k), 1.0f, fa.data(), blasint(lda), fb.data(), blasint(ldb), 0.0f,
              fc.data(), blasint(n));
  for (size_t i = 0; i < fc.size(); ++i) runtime::store_from_float(c.data(), i, c.dtype(), fc[i]);
}

}  // namespace

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
  apply_fp8_cost(cost, m, n, k, c.dtype());
  if (cost_only({&a, &b}, {&c})) return cost;
  if (m == 0 || n == 0) return cost;
  if (fp8_recipe().active()) {
    fp8_gemm(a, b, c, o, m, n, k);
    return cost;
  }
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
  apply_fp8_cost(cost, rows, n, k, c.dtype());
  if (cost_only({&a, &b}, {&c})) return cost;
  if (rows == 0 || n == 0) return cost;
  if (a.dtype() == DType::fp32 && !fp8_recipe().active()) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, blasint(rows), blasint(n), blasint(k), 1.0f,
                a.f32() + a_row0 * k, blasint(k), b.f32(), blasint(n), 0.0f, c.f32() + c_row0 * n, blasint(n));
    return cost;
  }
  // bf16 (or any dtype under an FP8 recipe): the row block through gemm (widened, multiplied in fp32, rounded once).
  const size_t es = runtime::dtype_size(a.dtype());
  Tensor ab(a.dtype(), {rows, k}), cb(c.dtype(), {rows, n});
  std::memcpy(ab.data(), static_cast<const unsigned char*>(a.data()) + static_cast<size_t>(a_row0 * k) * es, ab.nbytes());
  gemm(ab, b, cb);
  std::memcpy(static_cast<unsigned char*>(c.data()) + static_cast<size_t>(c_row0 * n) * es, cb.data(), cb.nbytes());
  return cost;
}

}  // namespace shardsim::kernels

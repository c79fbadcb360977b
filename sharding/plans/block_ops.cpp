#include "sharding/plans/block_ops.h"

#include <algorithm>
#include <limits>

#include "kernels/backward.h"
#include "kernels/gemm.h"
#include "kernels/norm.h"

namespace shardsim::sharding::plans {

Tensor gemm(Chip& chip, const Tensor& a, const Tensor& b, const std::string& name) {
  Tensor c = Tensor::make(a.dtype(), {a.dim(0), b.dim(1)}, a.has_storage() && b.has_storage());
  chip.charge(kernels::gemm(a, b, c), name);
  return c;
}

bool fuses_column_gemms(const Chip& chip) { return chip.tl && !chip.tl->device().eager_kernels; }

namespace {

// A storage-less [rows, sum of the weights' columns] matrix: the operand of the fused GEMM's cost.
Tensor concatenated_columns(DType dtype, int64_t rows, const std::vector<const Tensor*>& parts) {
  int64_t cols = 0;
  for (const Tensor* t : parts) cols += t->dim(1);
  return Tensor::make(dtype, {rows, cols}, false);
}

}  // namespace

std::vector<Tensor> column_gemms(Chip& chip, const Tensor& x, const std::vector<const Tensor*>& weights,
                                 const std::vector<std::string>& names, const std::string& fused_name) {
  std::vector<Tensor> out;
  if (weights.size() < 2 || !fuses_column_gemms(chip)) {
    for (size_t i = 0; i < weights.size(); ++i) out.push_back(gemm(chip, x, *weights[i], names[i]));
    return out;
  }
  for (const Tensor* w : weights) {
    out.push_back(Tensor::make(x.dtype(), {x.dim(0), w->dim(1)}, x.has_storage() && w->has_storage()));
    (void)kernels::gemm(x, *w, out.back());  // the values; the cost is the fused GEMM's, below
  }
  const Tensor w = concatenated_columns(weights[0]->dtype(), weights[0]->dim(0), weights);
  Tensor y = Tensor::make(x.dtype(), {x.dim(0), w.dim(1)}, false);
  chip.charge(kernels::gemm(x, w, y), fused_name);
  return out;
}

Tensor column_gemms_backward(Chip& chip, const Tensor& x, const std::vector<const Tensor*>& weights,
                             const std::vector<const Tensor*>& dys, const std::vector<Tensor*>& dws,
                             const std::string& fused_name) {
  const bool fuse = weights.size() > 1 && fuses_column_gemms(chip);
  std::vector<Tensor> dx;
  bool any_dw = false;
  for (size_t i = 0; i < weights.size(); ++i) {
    dx.push_back(Tensor::make(x.dtype(), {x.dim(0), x.dim(1)}, x.has_storage()));
    const auto k = kernels::gemm_backward(x, *weights[i], *dys[i], &dx.back(), dws[i]);
    any_dw = any_dw || dws[i];
    if (!fuse) chip.charge(k, k.name);
  }
  for (size_t i = 1; i < dx.size(); ++i) {
    const auto k = kernels::add_inplace(dx[0], dx[i]);
    if (!fuse) chip.charge(k, k.name);
  }
  if (fuse) {  // dX over the concatenated columns (the sum is its contraction) and, unless deferred, dW
    const Tensor w = concatenated_columns(weights[0]->dtype(), weights[0]->dim(0), weights);
    const Tensor dy = concatenated_columns(dys[0]->dtype(), dys[0]->dim(0), dys);
    Tensor dxf = Tensor::make(x.dtype(), x.shape(), false), dwf = Tensor::make(w.dtype(), w.shape(), false);
    const auto k = kernels::gemm_backward(x, w, dy, &dxf, any_dw ? &dwf : nullptr);
    chip.charge(k, fused_name);
  }
  return std::move(dx[0]);
}

Tensor rmsnorm(Chip& chip, const Tensor& x, const Tensor& w, const std::string& name, double eps) {
  Tensor y = Tensor::make(x.dtype(), x.shape(), x.has_storage() && w.has_storage());
  chip.charge(kernels::rmsnorm(x, w, y, static_cast<float>(eps)), name);
  return y;
}

std::vector<int64_t> positions_of(const std::vector<Chunk>& chunks) {
  std::vector<int64_t> p;
  for (const auto& c : chunks)
    for (int64_t i = 0; i < c.len; ++i) p.push_back(c.global + i);
  return p;
}

collectives::CollectiveOptions ring_opts(const std::string& name, const std::string& algorithm) {
  collectives::CollectiveOptions o;
  o.algorithm = algorithm;
  o.name = name;
  return o;
}


}  // namespace shardsim::sharding::plans

#include "sharding/plans/block_ops.h"

#include <algorithm>
#include <limits>

#include "kernels/gemm.h"
#include "kernels/norm.h"

namespace shardsim::sharding::plans {

Tensor gemm(Chip& chip, const Tensor& a, const Tensor& b, const std::string& name) {
  Tensor c = Tensor::make(a.dtype(), {a.dim(0), b.dim(1)}, a.has_storage() && b.has_storage());
  chip.charge(kernels::gemm(a, b, c), name);
  return c;
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

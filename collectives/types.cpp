#include "collectives/types.h"

#include <algorithm>
#include <stdexcept>

namespace shardsim::collectives {

std::string reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::prod: return "prod";
    case ReduceOp::min: return "min";
    case ReduceOp::max: return "max";
    case ReduceOp::avg: return "avg";
  }
  return "?";
}

ReduceOp parse_reduce_op(const std::string& name) {
  for (auto op : {ReduceOp::sum, ReduceOp::prod, ReduceOp::min, ReduceOp::max, ReduceOp::avg})
    if (reduce_op_name(op) == name) return op;
  throw std::invalid_argument("unknown reduction op '" + name + "' (known: sum, prod, min, max, avg)");
}

namespace {
inline float apply(float a, float b, ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg: return a + b;
    case ReduceOp::prod: return a * b;
    case ReduceOp::min: return std::min(a, b);
    case ReduceOp::max: return std::max(a, b);
  }
  return a;
}
}  // namespace

void reduce_into(void* acc, const void* in, size_t n, DType t, ReduceOp op) {
  if (t == DType::fp32) {
    auto* a = static_cast<float*>(acc);
    const auto* b = static_cast<const float*>(in);
    for (size_t i = 0; i < n; ++i) a[i] = apply(a[i], b[i], op);
  } else {
    auto* a = static_cast<uint16_t*>(acc);
    const auto* b = static_cast<const uint16_t*>(in);
    for (size_t i = 0; i < n; ++i)
      a[i] = runtime::float_to_bf16(apply(runtime::bf16_to_float(a[i]), runtime::bf16_to_float(b[i]), op));
  }
}

void finish_avg(void* buf, size_t n, DType t, size_t ranks) {
  const float inv = 1.0f / static_cast<float>(ranks);
  for (size_t i = 0; i < n; ++i) runtime::store_from_float(buf, i, t, runtime::load_as_float(buf, i, t) * inv);
}

}  // namespace shardsim::collectives

#include "runtime/dtype.h"

#include <stdexcept>

namespace shardsim::runtime {

size_t dtype_size(DType t) { return t == DType::fp32 ? 4 : 2; }

std::string dtype_name(DType t) { return t == DType::fp32 ? "fp32" : "bf16"; }

DType parse_dtype(const std::string& name) {
  if (name == "fp32" || name == "float32" || name == "float") return DType::fp32;
  if (name == "bf16" || name == "bfloat16") return DType::bf16;
  throw std::invalid_argument("unknown dtype '" + name + "' (known: fp32, bf16)");
}

sim::Precision precision_of(DType t) { return t == DType::fp32 ? sim::Precision::fp32 : sim::Precision::bf16; }

}  // namespace shardsim::runtime

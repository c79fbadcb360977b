// Element types of tensors and collectives.
//
// fp32: IEEE-754 binary32. bf16: bfloat16 (1 sign, 8 exponent, 7 mantissa bits; the top half of a binary32),
// stored as uint16_t. Conversion float->bf16 rounds to nearest, ties to even; NaN stays NaN (quiet).
// Arithmetic on bf16 always accumulates in fp32 and rounds once when the result is stored.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "sim/device_spec.h"

namespace shardsim::runtime {

enum class DType { fp32, bf16 };

size_t dtype_size(DType t);
std::string dtype_name(DType t);
DType parse_dtype(const std::string& name);  // "fp32"/"float32", "bf16"/"bfloat16"; std::invalid_argument
sim::Precision precision_of(DType t);

inline uint16_t float_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu) != 0) {
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);  // quiet NaN, keep the sign
  }
  const uint32_t lsb = (bits >> 16) & 1u;
  bits += 0x7fffu + lsb;  // round to nearest, ties to even
  return static_cast<uint16_t>(bits >> 16);
}

inline float bf16_to_float(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Loads element I of a buffer of type T as float / stores a float with T's rounding.
inline float load_as_float(const void* base, size_t i, DType t) {
  return t == DType::fp32 ? static_cast<const float*>(base)[i] : bf16_to_float(static_cast<const uint16_t*>(base)[i]);
}
inline void store_from_float(void* base, size_t i, DType t, float v) {
  if (t == DType::fp32) {
    static_cast<float*>(base)[i] = v;
  } else {
    static_cast<uint16_t*>(base)[i] = float_to_bf16(v);
  }
}

}  // namespace shardsim::runtime

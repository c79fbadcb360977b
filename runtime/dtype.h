// Element types of tensors and collectives: the set NCCL offers (ncclDataType_t).
//
//   int8 uint8 int32 uint32 int64 uint64   two's-complement / unsigned integers
//   fp16      IEEE-754 binary16 (1 sign, 5 exponent, 10 mantissa bits)
//   bf16      bfloat16 (1, 8, 7): the top half of a binary32
//   fp32      IEEE-754 binary32;  fp64 IEEE-754 binary64
//   fp8_e4m3  OCP FP8 E4M3 ("FN"): bias 7, no infinities, S.1111.111 is NaN, largest finite 448
//   fp8_e5m2  OCP FP8 E5M2: bias 15, IEEE-like with infinities and NaNs, largest finite 57344
//   (OCP "8-bit Floating Point Specification (OFP8)" rev 1.0, 2023; Micikevicius et al., arXiv:2209.05433.)
//
// Conversions from float round to nearest, ties to even; NaN stays NaN (quiet). Overflow of a finite value:
//   fp16, bf16: infinity (IEEE 754 round-to-nearest).
//   fp8 (e4m3 and e5m2 alike): the largest finite value of the sign, +-448 / +-57344: the default of NVIDIA's
//     cuda_fp8 converters (__nv_cvt_*_to_fp8 with __NV_SATFINITE), so a sum that overflows in fp8 clamps in
//     both formats (summing 448 on 4 ranks gives 448 in e4m3; 57344 on 4 ranks gives 57344 in e5m2).
//   An infinite input is not finite and is not clamped (this departs from __NV_SATFINITE, which also maps
//   infinities to the largest finite value): e5m2 keeps +-Inf, e4m3, which has no infinity, gives NaN.
//   So in fp8 an infinity or NaN comes only from an infinite or NaN operand (or Inf - Inf, 0 * Inf).
// Storage types narrower than fp32 (fp16, bf16, fp8) are always *computed* in fp32 and rounded once when
// stored. tests/unit/dtype_test.cpp checks these conventions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "sim/device_spec.h"

namespace shardsim::runtime {

enum class DType { int8, uint8, int32, uint32, int64, uint64, fp16, bf16, fp32, fp64, fp8_e4m3, fp8_e5m2 };

size_t dtype_size(DType t);
std::string dtype_name(DType t);
// Accepts the names above and common aliases (float32/float/f32, float16/half, bfloat16, float64/double,
// e4m3/float8_e4m3, e5m2/float8_e5m2, char/int8_t...). std::invalid_argument listing the known names otherwise.
DType parse_dtype(const std::string& name);
const std::vector<DType>& all_dtypes();
bool is_integer(DType t);
bool is_floating(DType t);
// Floating types stored in fewer than 32 bits (computed in fp32).
bool is_narrow_float(DType t);
// Largest M such that every integer in [-M, M] (unsigned: [0, M]) is exactly representable.
double exact_integer_limit(DType t);
// Unit roundoff u = 2^-(mantissa bits + 1) of a floating type (0 for integers).
double unit_roundoff(DType t);
// Largest finite value of a floating type (448 for e4m3, 57344 for e5m2, 65504 for fp16...); for integers the
// largest value of the type as a double (rounded for 64-bit types).
double max_finite(DType t);
// Smallest positive subnormal of a floating type (2^-9 for e4m3, 2^-24 for fp16, 2^-149 for fp32...); 0 for
// integers.
double min_subnormal(DType t);
// Whether the type has infinities (every floating type except fp8_e4m3).
bool has_infinity(DType t);
// Precision the compute engine runs an op of this type at (sim/device_spec.h):
//   fp8_e4m3, fp8_e5m2 -> fp8;  int8, uint8 -> int8;  fp16 -> fp16;  bf16 -> bf16;
//   fp64, int64, uint64 -> fp64 (64-bit arithmetic);  fp32, int32, uint32 -> fp32.
sim::Precision precision_of(DType t);

// ---- bf16 (inline: hot in kernels) ----
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

// ---- fp16 and fp8 ----
uint16_t float_to_fp16(float f);
float fp16_to_float(uint16_t h);
uint8_t float_to_e4m3(float f);
float e4m3_to_float(uint8_t b);
uint8_t float_to_e5m2(float f);
float e5m2_to_float(uint8_t b);

// Element I of a buffer of type T as double (exact for every type except 64-bit integers beyond 2^53) / stores V
// with T's rounding (floats) or conversion (integers: truncation toward zero, then wrap-around).
double load_as_double(const void* base, size_t i, DType t);
void store_from_double(void* base, size_t i, DType t, double v);

// Float views for the kernels (fp32 and bf16 fast paths, every type accepted).
inline float load_as_float(const void* base, size_t i, DType t) {
  if (t == DType::fp32) return static_cast<const float*>(base)[i];
  if (t == DType::bf16) return bf16_to_float(static_cast<const uint16_t*>(base)[i]);
  return static_cast<float>(load_as_double(base, i, t));
}
inline void store_from_float(void* base, size_t i, DType t, float v) {
  if (t == DType::fp32) {
    static_cast<float*>(base)[i] = v;
  } else if (t == DType::bf16) {
    static_cast<uint16_t*>(base)[i] = float_to_bf16(v);
  } else {
    store_from_double(base, i, t, v);
  }
}

}  // namespace shardsim::runtime

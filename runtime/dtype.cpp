#include "runtime/dtype.h"

#include <array>
#include <bit>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace shardsim::runtime {

namespace {

struct Info {
  DType t;
  const char* name;
  size_t size;
  std::vector<const char*> aliases;
};

const std::vector<Info>& infos() {
  static const std::vector<Info> v = {
      {DType::int8, "int8", 1, {"int8_t", "char", "i8"}},
      {DType::uint8, "uint8", 1, {"uint8_t", "u8"}},
      {DType::int32, "int32", 4, {"int", "int32_t", "i32"}},
      {DType::uint32, "uint32", 4, {"uint32_t", "u32"}},
      {DType::int64, "int64", 8, {"int64_t", "i64"}},
      {DType::uint64, "uint64", 8, {"uint64_t", "u64"}},
      {DType::fp16, "fp16", 2, {"float16", "half", "f16"}},
      {DType::bf16, "bf16", 2, {"bfloat16"}},
      {DType::fp32, "fp32", 4, {"float32", "float", "f32"}},
      {DType::fp64, "fp64", 8, {"float64", "double", "f64"}},
      {DType::fp8_e4m3, "fp8_e4m3", 1, {"e4m3", "float8_e4m3", "f8e4m3"}},
      {DType::fp8_e5m2, "fp8_e5m2", 1, {"e5m2", "float8_e5m2", "f8e5m2"}},
  };
  return v;
}

const Info& info(DType t) { return infos().at(static_cast<size_t>(t)); }

// A small binary floating-point format (fp16, fp8): EXP exponent bits, MAN mantissa bits, IEEE-style specials or
// the e4m3 "FN" convention (no infinities, only S.1111.111 is NaN).
struct MiniFormat {
  int exp_bits;
  int man_bits;
  bool ieee;
  bool saturate;  // finite overflow gives the largest finite value (fp8) instead of infinity (fp16, bf16)
  int bias() const { return (1 << (exp_bits - 1)) - 1; }
  uint32_t exp_mask() const { return (1u << exp_bits) - 1; }
  uint32_t sign_bit() const { return 1u << (exp_bits + man_bits); }
  double max_finite() const {
    const int top_exp = ieee ? static_cast<int>(exp_mask()) - 1 : static_cast<int>(exp_mask());
    const double top_man = ieee ? 2.0 - std::ldexp(1.0, -man_bits) : 2.0 - std::ldexp(2.0, -man_bits);
    return top_man * std::ldexp(1.0, top_exp - bias());
  }
};

constexpr MiniFormat kFp16{5, 10, true, false};
constexpr MiniFormat kE4M3{4, 3, false, true};
constexpr MiniFormat kE5M2{5, 2, true, true};
constexpr MiniFormat kBf16{8, 7, true, false};

uint32_t encode(double x, const MiniFormat& F) {
  // On the bits of the double (no frexp / ldexp: validate encodes every element of every case): a finite x is
  // rounded to a multiple of the quantum of its binade (clamped at the format's subnormals), ties to even.
  const uint64_t b = std::bit_cast<uint64_t>(x);
  const uint32_t sign = (b >> 63) ? F.sign_bit() : 0u;
  const uint32_t all_exp = F.exp_mask() << F.man_bits;
  const uint32_t man_mask = (1u << F.man_bits) - 1;
  const uint32_t nan = F.ieee ? sign | all_exp | (1u << (F.man_bits - 1)) : sign | all_exp | man_mask;
  // The largest finite value's bits (monotone in the magnitude, so "rounds beyond it" is a comparison of bits).
  const uint32_t max_bits = F.ieee ? ((F.exp_mask() - 1) << F.man_bits) | man_mask : all_exp | (man_mask - 1);
  const int dexp = static_cast<int>((b >> 52) & 0x7ff);
  // An infinite input stays infinite (e4m3 has no infinity: NaN); a finite one that rounds beyond the largest
  // finite value saturates (fp8) or becomes infinite (fp16, bf16). See dtype.h.
  if (dexp == 0x7ff) return (b & ((uint64_t{1} << 52) - 1)) ? nan : (F.ieee ? sign | all_exp : nan);
  if (dexp == 0) return sign;  // zero or a double subnormal: far below half the smallest subnormal of every format
  const int e = dexp - 1023;   // |x| = m 2^(e - 52), m in [2^52, 2^53)
  const uint64_t m = (b & ((uint64_t{1} << 52) - 1)) | (uint64_t{1} << 52);
  const int emin = 1 - F.bias();
  const int ex = std::max(e, emin);                    // the binade whose quantum applies: 2^(ex - man_bits)
  const int shift = 52 - F.man_bits + (ex - e);        // |x| / quantum = m / 2^shift
  if (shift >= 54) return sign;                        // below half a quantum (m < 2^53)
  uint64_t q = m >> shift;
  const uint64_t rem = m & ((uint64_t{1} << shift) - 1), half = uint64_t{1} << (shift - 1);
  if (rem > half || (rem == half && (q & 1))) ++q;     // round to nearest, ties to even
  if (q == 0) return sign;
  uint32_t bits;
  if (q < (uint64_t{1} << F.man_bits)) {
    bits = static_cast<uint32_t>(q);                   // subnormal (only when ex == emin)
  } else {
    int ev = ex;
    if (q >> (F.man_bits + 1)) {                       // rounded up into the next binade
      q >>= 1;
      ++ev;
    }
    const int biased = ev + F.bias();
    if (biased > static_cast<int>(F.exp_mask())) return F.saturate ? sign | max_bits : sign | all_exp;
    bits = (static_cast<uint32_t>(biased) << F.man_bits) | (static_cast<uint32_t>(q) & man_mask);
  }
  if (bits > max_bits) return F.saturate ? sign | max_bits : sign | all_exp;
  return sign | bits;
}

double decode(uint32_t bits, const MiniFormat& F) {
  const double sign = (bits & F.sign_bit()) ? -1.0 : 1.0;
  const uint32_t e = (bits >> F.man_bits) & F.exp_mask();
  const uint32_t m = bits & ((1u << F.man_bits) - 1);
  if (F.ieee && e == F.exp_mask())
    return m ? std::numeric_limits<double>::quiet_NaN() : sign * std::numeric_limits<double>::infinity();
  if (!F.ieee && e == F.exp_mask() && m == (1u << F.man_bits) - 1) return std::numeric_limits<double>::quiet_NaN();
  if (e == 0) return sign * std::ldexp(static_cast<double>(m), 1 - F.bias() - F.man_bits);
  return sign * std::ldexp(1.0 + std::ldexp(static_cast<double>(m), -F.man_bits), static_cast<int>(e) - F.bias());
}

template <size_t N>
std::array<float, N> decode_table(const MiniFormat& F) {
  std::array<float, N> t{};
  for (size_t i = 0; i < N; ++i) t[i] = static_cast<float>(decode(static_cast<uint32_t>(i), F));
  return t;
}

template <class T>
T from_double_int(double v) {
  // Truncate toward zero, then wrap modulo 2^64 and on to T's width (two's complement). NaN and infinities: 0.
  if (!std::isfinite(v)) return T{0};
  const double r = std::fmod(std::trunc(v), 18446744073709551616.0);  // exact; |r| < 2^64
  const uint64_t u = r >= 0 ? static_cast<uint64_t>(r) : uint64_t{0} - static_cast<uint64_t>(-r);
  return static_cast<T>(u);
}

}  // namespace

uint16_t float_to_fp16(float f) { return static_cast<uint16_t>(encode(f, kFp16)); }
float fp16_to_float(uint16_t h) {
  static const auto table = decode_table<65536>(kFp16);
  return table[h];
}
uint8_t float_to_e4m3(float f) { return static_cast<uint8_t>(encode(f, kE4M3)); }
float e4m3_to_float(uint8_t b) {
  static const auto table = decode_table<256>(kE4M3);
  return table[b];
}
uint8_t float_to_e5m2(float f) { return static_cast<uint8_t>(encode(f, kE5M2)); }
float e5m2_to_float(uint8_t b) {
  static const auto table = decode_table<256>(kE5M2);
  return table[b];
}

size_t dtype_size(DType t) { return info(t).size; }
std::string dtype_name(DType t) { return info(t).name; }

DType parse_dtype(const std::string& name) {
  std::string known;
  for (const auto& i : infos()) {
    if (name == i.name) return i.t;
    for (const char* a : i.aliases)
      if (name == a) return i.t;
    known += (known.empty() ? "" : ", ") + std::string(i.name);
  }
  throw std::invalid_argument("unknown dtype '" + name + "' (known: " + known + ")");
}

const std::vector<DType>& all_dtypes() {
  static const std::vector<DType> v = [] {
    std::vector<DType> out;
    for (const auto& i : infos()) out.push_back(i.t);
    return out;
  }();
  return v;
}

bool is_integer(DType t) { return static_cast<int>(t) <= static_cast<int>(DType::uint64); }
bool is_floating(DType t) { return !is_integer(t); }
bool is_narrow_float(DType t) {
  return t == DType::fp16 || t == DType::bf16 || t == DType::fp8_e4m3 || t == DType::fp8_e5m2;
}

double exact_integer_limit(DType t) {
  switch (t) {
    case DType::int8: return 127;
    case DType::uint8: return 255;
    case DType::int32: return 2147483647.0;
    case DType::uint32: return 4294967295.0;
    case DType::int64:
    case DType::uint64: return 9007199254740992.0;  // what a double (the reference's carrier) holds exactly
    case DType::fp16: return 2048;
    case DType::bf16: return 256;
    case DType::fp32: return 16777216.0;
    case DType::fp64: return 9007199254740992.0;
    case DType::fp8_e4m3: return 16;
    case DType::fp8_e5m2: return 8;
  }
  return 0;
}

double unit_roundoff(DType t) {
  switch (t) {
    case DType::fp16: return std::ldexp(1.0, -11);
    case DType::bf16: return std::ldexp(1.0, -8);
    case DType::fp32: return std::ldexp(1.0, -24);
    case DType::fp64: return std::ldexp(1.0, -53);
    case DType::fp8_e4m3: return std::ldexp(1.0, -4);
    case DType::fp8_e5m2: return std::ldexp(1.0, -3);
    default: return 0;
  }
}

double max_finite(DType t) {
  switch (t) {
    case DType::int8: return 127;
    case DType::uint8: return 255;
    case DType::int32: return 2147483647.0;
    case DType::uint32: return 4294967295.0;
    case DType::int64: return static_cast<double>(std::numeric_limits<int64_t>::max());
    case DType::uint64: return static_cast<double>(std::numeric_limits<uint64_t>::max());
    case DType::fp16: return kFp16.max_finite();
    case DType::bf16: return kBf16.max_finite();
    case DType::fp32: return std::numeric_limits<float>::max();
    case DType::fp64: return std::numeric_limits<double>::max();
    case DType::fp8_e4m3: return kE4M3.max_finite();
    case DType::fp8_e5m2: return kE5M2.max_finite();
  }
  return 0;
}

double min_subnormal(DType t) {
  switch (t) {
    case DType::fp16: return std::ldexp(1.0, 1 - kFp16.bias() - kFp16.man_bits);
    case DType::bf16: return std::ldexp(1.0, 1 - kBf16.bias() - kBf16.man_bits);
    case DType::fp32: return std::numeric_limits<float>::denorm_min();
    case DType::fp64: return std::numeric_limits<double>::denorm_min();
    case DType::fp8_e4m3: return std::ldexp(1.0, 1 - kE4M3.bias() - kE4M3.man_bits);
    case DType::fp8_e5m2: return std::ldexp(1.0, 1 - kE5M2.bias() - kE5M2.man_bits);
    default: return 0;
  }
}

bool has_infinity(DType t) { return is_floating(t) && t != DType::fp8_e4m3; }

sim::Precision precision_of(DType t) {
  switch (t) {
    case DType::fp8_e4m3:
    case DType::fp8_e5m2: return sim::Precision::fp8;
    case DType::int8:
    case DType::uint8: return sim::Precision::int8;
    case DType::fp16: return sim::Precision::fp16;
    case DType::bf16: return sim::Precision::bf16;
    case DType::fp64:
    case DType::int64:
    case DType::uint64: return sim::Precision::fp64;
    case DType::fp32:
    case DType::int32:
    case DType::uint32: return sim::Precision::fp32;
  }
  return sim::Precision::fp32;
}

double load_as_double(const void* base, size_t i, DType t) {
  switch (t) {
    case DType::int8: return static_cast<const int8_t*>(base)[i];
    case DType::uint8: return static_cast<const uint8_t*>(base)[i];
    case DType::int32: return static_cast<const int32_t*>(base)[i];
    case DType::uint32: return static_cast<const uint32_t*>(base)[i];
    case DType::int64: return static_cast<double>(static_cast<const int64_t*>(base)[i]);
    case DType::uint64: return static_cast<double>(static_cast<const uint64_t*>(base)[i]);
    case DType::fp16: return fp16_to_float(static_cast<const uint16_t*>(base)[i]);
    case DType::bf16: return bf16_to_float(static_cast<const uint16_t*>(base)[i]);
    case DType::fp32: return static_cast<const float*>(base)[i];
    case DType::fp64: return static_cast<const double*>(base)[i];
    case DType::fp8_e4m3: return e4m3_to_float(static_cast<const uint8_t*>(base)[i]);
    case DType::fp8_e5m2: return e5m2_to_float(static_cast<const uint8_t*>(base)[i]);
  }
  return 0;
}

void store_from_double(void* base, size_t i, DType t, double v) {
  switch (t) {
    case DType::int8: static_cast<int8_t*>(base)[i] = from_double_int<int8_t>(v); return;
    case DType::uint8: static_cast<uint8_t*>(base)[i] = from_double_int<uint8_t>(v); return;
    case DType::int32: static_cast<int32_t*>(base)[i] = from_double_int<int32_t>(v); return;
    case DType::uint32: static_cast<uint32_t*>(base)[i] = from_double_int<uint32_t>(v); return;
    case DType::int64: static_cast<int64_t*>(base)[i] = from_double_int<int64_t>(v); return;
    case DType::uint64: static_cast<uint64_t*>(base)[i] = from_double_int<uint64_t>(v); return;
    // Narrow floats encode straight from the double: one rounding, not double -> float -> narrow.
    case DType::fp16: static_cast<uint16_t*>(base)[i] = static_cast<uint16_t>(encode(v, kFp16)); return;
    case DType::bf16: static_cast<uint16_t*>(base)[i] = static_cast<uint16_t>(encode(v, kBf16)); return;
    case DType::fp32: static_cast<float*>(base)[i] = static_cast<float>(v); return;
    case DType::fp64: static_cast<double*>(base)[i] = v; return;
    case DType::fp8_e4m3: static_cast<uint8_t*>(base)[i] = static_cast<uint8_t>(encode(v, kE4M3)); return;
    case DType::fp8_e5m2: static_cast<uint8_t*>(base)[i] = static_cast<uint8_t>(encode(v, kE5M2)); return;
  }
}

}  // namespace shardsim::runtime

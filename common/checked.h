// Overflow-safe integer arithmetic for sizes, counts and their products (config validation: every product of
// sizes a parser derives is formed with these, so a size that would wrap int64 is refused instead of going
// negative). std::nullopt on overflow (GCC/Clang __builtin_*_overflow).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>

namespace shardsim::inline common {

inline std::optional<int64_t> checked_mul(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}
inline std::optional<int64_t> checked_add(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}
// The product of FACTORS, std::nullopt when any partial product overflows int64.
inline std::optional<int64_t> checked_product(std::initializer_list<int64_t> factors) {
  int64_t r = 1;
  for (int64_t f : factors) {
    const auto next = checked_mul(r, f);
    if (!next) return std::nullopt;
    r = *next;
  }
  return r;
}

// The sum of VALUES (any range of int64_t), std::nullopt when any partial sum overflows int64.
template <class Range>
std::optional<int64_t> checked_sum(const Range& values) {
  int64_t r = 0;
  for (int64_t v : values) {
    const auto next = checked_add(r, v);
    if (!next) return std::nullopt;
    r = *next;
  }
  return r;
}

}  // namespace shardsim::common

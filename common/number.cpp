#include "common/number.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <string>

namespace shardsim::inline common {

namespace {
bool digit(char c) { return c >= '0' && c <= '9'; }
}  // namespace

std::optional<int64_t> decimal_int(std::string_view text) {
  size_t i = !text.empty() && text[0] == '-' ? 1 : 0;
  if (i == text.size()) return std::nullopt;
  for (size_t j = i; j < text.size(); ++j)
    if (!digit(text[j])) return std::nullopt;
  const bool negative = text[0] == '-';
  // Accumulated as a negative number so that INT64_MIN is representable; overflow is checked at each digit.
  int64_t v = 0;
  for (; i < text.size(); ++i) {
    const int d = text[i] - '0';
    if (v < (INT64_MIN + d) / 10) return std::nullopt;
    v = v * 10 - d;
  }
  if (!negative) {
    if (v == INT64_MIN) return std::nullopt;
    v = -v;
  }
  return v;
}

std::optional<double> decimal_double(std::string_view text) {
  size_t i = !text.empty() && text[0] == '-' ? 1 : 0;
  size_t mantissa_digits = 0;
  while (i < text.size() && digit(text[i])) ++i, ++mantissa_digits;
  if (i < text.size() && text[i] == '.') {
    ++i;
    while (i < text.size() && digit(text[i])) ++i, ++mantissa_digits;
  }
  if (mantissa_digits == 0) return std::nullopt;
  if (i < text.size() && (text[i] == 'e' || text[i] == 'E')) {
    ++i;
    if (i < text.size() && (text[i] == '+' || text[i] == '-')) ++i;
    size_t exponent_digits = 0;
    while (i < text.size() && digit(text[i])) ++i, ++exponent_digits;
    if (exponent_digits == 0) return std::nullopt;
  }
  if (i != text.size()) return std::nullopt;
  // The grammar above is a subset of strtod's decimal form, so strtod reads exactly these characters.
  const std::string s(text);
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

bool yaml_nonfinite(std::string_view text) {
  if (!text.empty() && (text[0] == '+' || text[0] == '-')) text.remove_prefix(1);
  for (std::string_view s : {".nan", ".NaN", ".NAN", ".inf", ".Inf", ".INF"})
    if (text == s) return true;
  return false;
}

}  // namespace shardsim::common

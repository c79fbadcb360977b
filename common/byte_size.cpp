#include "common/byte_size.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "common/config.h"
#include "common/number.h"
#include "common/text.h"

namespace shardsim::inline common {

size_t parse_byte_size(const std::string& text, size_t min_bytes) {
  // The number is decimal (common/number.h: stod also read '0x10K' as 16 KiB and ' 8K', 'infK'); the suffix follows.
  const size_t pos = std::min(text.find_first_not_of("0123456789+-.eE"), text.size());
  const auto number = decimal_double(std::string_view(text).substr(0, pos));
  if (!number) throw std::invalid_argument("'" + escape_control(text) + "' is not a size (e.g. 1024, 8K, 4MiB, 1G)");
  const double v = *number;
  const std::string suffix = text.substr(pos);
  double mult = 1;
  if (suffix == "K" || suffix == "k" || suffix == "KiB") mult = 1024.0;
  else if (suffix == "M" || suffix == "m" || suffix == "MiB") mult = 1024.0 * 1024;
  else if (suffix == "G" || suffix == "g" || suffix == "GiB") mult = 1024.0 * 1024 * 1024;
  else if (!suffix.empty() && suffix != "B")
    throw std::invalid_argument("'" + escape_control(text) + "' has an unknown size suffix '" + escape_control(suffix) + "' (use K, M, G or B)");
  const double bytes = v * mult;
  if (!std::isfinite(bytes) || bytes < 0 || bytes > 1e15 || bytes != std::floor(bytes))
    throw std::invalid_argument("'" + escape_control(text) + "' must be a whole number of bytes from 0 to 1e15");
  if (bytes < static_cast<double>(min_bytes))
    throw std::invalid_argument("'" + escape_control(text) + "' must be at least " + std::to_string(min_bytes) + " B");
  return static_cast<size_t>(bytes);
}

int64_t config_bytes_in(const ConfigNode& node, std::string_view key, int64_t lo, int64_t hi, int64_t fallback) {
  if (!node.has(key)) return fallback;
  const ConfigNode n = node.child(key);
  size_t v = 0;
  try {
    v = parse_byte_size(n.printable_text());
  } catch (const std::invalid_argument& e) {
    n.fail(n.path() + ": " + e.what());
  }
  if (v < static_cast<uint64_t>(lo) || v > static_cast<uint64_t>(hi))
    n.fail(n.path() + ": must be between " + std::to_string(lo) + " and " + std::to_string(hi) + " bytes (got " +
           std::to_string(v) + ")");
  return static_cast<int64_t>(v);
}

}  // namespace shardsim::common

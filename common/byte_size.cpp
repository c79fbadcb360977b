#include "common/byte_size.h"

#include <cmath>
#include <stdexcept>

namespace shardsim {

size_t parse_byte_size(const std::string& text, size_t min_bytes) {
  size_t pos = 0;
  double v = 0;
  try {
    v = std::stod(text, &pos);
  } catch (const std::exception&) {
    throw std::invalid_argument("'" + text + "' is not a size (e.g. 1024, 8K, 4MiB, 1G)");
  }
  const std::string suffix = text.substr(pos);
  double mult = 1;
  if (suffix == "K" || suffix == "k" || suffix == "KiB") mult = 1024.0;
  else if (suffix == "M" || suffix == "m" || suffix == "MiB") mult = 1024.0 * 1024;
  else if (suffix == "G" || suffix == "g" || suffix == "GiB") mult = 1024.0 * 1024 * 1024;
  else if (!suffix.empty() && suffix != "B")
    throw std::invalid_argument("'" + text + "' has an unknown size suffix '" + suffix + "' (use K, M, G or B)");
  const double bytes = v * mult;
  if (!std::isfinite(bytes) || bytes < 0 || bytes > 1e15 || bytes != std::floor(bytes))
    throw std::invalid_argument("'" + text + "' must be a whole number of bytes from 0 to 1e15");
  if (bytes < static_cast<double>(min_bytes))
    throw std::invalid_argument("'" + text + "' must be at least " + std::to_string(min_bytes) + " B");
  return static_cast<size_t>(bytes);
}

}  // namespace shardsim

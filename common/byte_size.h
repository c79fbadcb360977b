// The one parser of byte sizes written by users (CLI flags such as -b/-e/--min-bytes, sweep `size:` axes,
// `validate_max_bytes`): "1024", "8K" / "8k" / "8KiB", "4M" / "4m" / "4MiB", "1G" / "1g" / "1GiB", "512B".
// Multiples are binary (K = 1024). The value must come out as a whole number of bytes (1.5K = 1536 is fine,
// 0.3 is not), finite and at most 1e15 B, and at least MIN_BYTES.
// Errors: std::invalid_argument with the reason ("'4X' has an unknown size suffix 'X' (use K, M, G or B)");
// callers prefix the flag or FILE:LINE.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace shardsim::inline common {

size_t parse_byte_size(const std::string& text, size_t min_bytes = 0);

class ConfigNode;
// Config key KEY of NODE as a byte size in [LO, HI] (FALLBACK when absent): an integer or a size with a suffix as
// above ("25M", "1GiB"); otherwise ConfigError "FILE:LINE: path.key: ..." naming the reason or the bounds.
int64_t config_bytes_in(const ConfigNode& node, std::string_view key, int64_t lo, int64_t hi, int64_t fallback);

}  // namespace shardsim::common

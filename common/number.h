// Numbers from untrusted text (command-line values, request-trace fields, list items of a flag): the whole text is
// the number, written in decimal. strtod/stod alone also take hexadecimal ('0x10' as 16, '0x1p4'), leading blanks,
// 'inf', 'nan' and 'infinity', and stoll/strtoll a leading blank; none of those is a number a user means here
// (issue 46, kind 8). The numbers of config files and of --set/--plan values are read with these too
// (common/config.h): yaml-cpp's own conversion took '0x10', '010' (as 8), '+2' and a trailing blank.
// No leading '+' either: no config or flag needs one, and '+2' read as 2 hid a typo.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace shardsim::inline common {

// TEXT as -?[0-9]+ within int64 (at most 19 digits after leading zeros are counted), else nullopt.
std::optional<int64_t> decimal_int(std::string_view text);

// TEXT as -?(D+ | D+.D* | .D+)([eE][+-]?D+)? (D a decimal digit) whose value is finite (1e400 is nullopt; a
// value below the smallest subnormal reads as 0), else nullopt. No blanks, hexadecimal, 'inf' or 'nan'.
std::optional<double> decimal_double(std::string_view text);

// TEXT is one of YAML 1.2's spellings of NaN or an infinity (.nan .NaN .NAN, [+-].inf .Inf .INF): a config reader
// names it "must be a finite number" rather than "not a number".
bool yaml_nonfinite(std::string_view text);

}  // namespace shardsim::common

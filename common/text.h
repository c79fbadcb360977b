// Echoing untrusted text safely: every value a message repeats back (a config value, a key, a log field, a flag)
// may hold bytes that drive a terminal (ESC sequences that set the window title or clear the screen) or that
// forge extra lines (a newline followed by "shardsim: ..."). escape_control makes such text inert and one line.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace shardsim::inline common {

// S with every byte that is not printable text written as \xNN (two lowercase hex digits): C0 controls (0x00-0x1f,
// newline and tab included), DEL (0x7f), the C1 controls U+0080..U+009F encoded in UTF-8 (each byte of the pair),
// and every byte that is not part of a well-formed UTF-8 sequence. Printable ASCII and well-formed UTF-8 above
// U+009F pass unchanged, so the result is one line and idempotent (escaping it again changes nothing).
std::string escape_control(std::string_view s);

// A multi-line text (a report) with escape_control applied to each line, the '\n' that end lines kept: no
// terminal control reaches the screen. A value that may hold a newline itself (a path, a checkpoint attribute)
// is escaped with escape_control before it goes into the text, so it cannot forge a line of its own.
std::string escape_lines(std::string_view s);

// The items of a comma-separated list given on a command line (--plan, --what-if, --counts, ...), split at commas
// outside [] and {} (an item may be a YAML list or map: pp_layers=[3,1]). Every item must be there and distinct:
// an empty list, an empty item ("a,,b", "a,", ",a") or an item given twice ("0,0") throws std::invalid_argument
// saying which (escaped); the caller names its flag.
std::vector<std::string> split_items(std::string_view text);

}  // namespace shardsim::common

// Bounded input files: a file a command reads whole (an nccl-tests log for `calibrate`) is a regular file of
// bounded size, so /dev/zero, /dev/urandom, a FIFO with no writer or a directory given by mistake end in one clear
// line (exit 2) instead of exhausting host memory or blocking forever (docs/SECURITY.md, docs/RELIABILITY.md).
#pragma once

#include <cstddef>
#include <string>

namespace shardsim::inline common {

// PATH's whole contents. ConfigError (exit 2) "PATH: ..." when PATH does not exist or cannot be opened ("cannot
// open: " and the C library's words), is a directory ("is a directory"), is not a regular file (a FIFO, device or
// socket: "is not a regular file"; checked with stat(2) before opening and again on the descriptor, which is
// opened O_NONBLOCK, so a FIFO never blocks), holds more than MAX_BYTES bytes (the limit and WHAT, e.g. "an
// nccl-tests log", in the message), or cannot be read.
std::string read_input_file(const std::string& path, size_t max_bytes, const std::string& what);

// Why PATH cannot be read as an input file ("cannot open: No such file or directory", "is a directory", "is not a
// regular file (...)", "cannot open: Permission denied"), or "" when it can: for a caller that names the key or flag
// that gave PATH before read_input_file (whose errors name only PATH) is reached.
std::string unreadable_input(const std::string& path);

// Why PATH, when it exists, cannot be read as a regular file ("is a directory", "is not a regular file (...)"), or
// "" when it is one or does not exist: for checks made before any work (a sweep's results.csv).
std::string not_a_regular_file(const std::string& path);

}  // namespace shardsim::common

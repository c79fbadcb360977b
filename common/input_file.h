// Reading input files that may come from someone else: only regular files, of bounded size, never blocking.
//   read_regular_file: opens PATH with O_NONBLOCK (a FIFO with no writer cannot block the open) and checks with
//   fstat that it is a regular file before reading: a directory, FIFO, socket or device is ConfigError "FLAG PATH:
//   is a directory" / "is not a regular file (a FIFO ...)"; a file larger than MAX_BYTES is ConfigError naming the
//   limit (so /dev/zero-like inputs and runaway files cannot exhaust memory). Missing or unreadable: ConfigError
//   with the C library's reason. All exit 2.
#pragma once

#include <cstdint>
#include <string>

namespace shardsim {

std::string read_regular_file(const std::string& path, uint64_t max_bytes, const std::string& what);

// Why PATH, when it exists, cannot be read as a regular file ("" when it is one or does not exist): "is a
// directory", "is not a regular file (a FIFO)". For checks made before any work.
std::string not_a_regular_file(const std::string& path);

}  // namespace shardsim

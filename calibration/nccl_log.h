// Reading nccl-tests output (the input of `shardsim calibrate`, calibration/calibrate.h).
//
// Input: the tables nccl-tests' *_perf programs print (github.com/NVIDIA/nccl-tests, doc/PERFORMANCE.md):
//
//   # Collective test starting: all_reduce_perf
//   #  Rank  0 Group  0 Pid 1234 on host device  0 [0x18] NVIDIA H100 80GB HBM3
//   #       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw ...
//          8192          2048     float     sum      -1    35.15    0.23    0.23       0    30.33    0.27 ...
//
// Columns: size (B), count (elements), type, redop, root, then out-of-place time (us), algbw, busbw (GB/s,
// GB = 1e9 B), #wrong, then the same four in place. Versions before 2.13 have no root column (and print
// "error" instead of "#wrong"); both are read. Lines may carry mpirun's "[0] " or "[1,0]<stdout>:" prefix.
// The out-of-place time is the measurement. nccl-tests sizes a buffer as shardsim's estimate_ns does
// (all_reduce the buffer, all_gather the output, reduce_scatter the input).
//
// Skipped, each kind counted in NcclLog::notes: rows of 0 bytes (nccl-tests prints them when -b is below one
// element per rank), NCCL's own log lines (NCCL_DEBUG=INFO/WARN) and any other text that is not a table row.
// "# Rank N" lines are parsed: the ranks listed must be 0 .. N-1, each once.
//
// Errors: ConfigError (exit 2) "FILE:LINE: ..." for a malformed row, a row with #wrong > 0, a second table in one
// file (sizes restart or a second "Collective test starting"), mixed types or ops in one table, an unknown
// collective, a rank that is not a number or is listed twice or with a gap, a line longer than 64 KiB, a table
// that does not fit the collective it is read as (a reduction's op is not "none", all_gather's, broadcast's and
// all_to_all's is; with a root column, size = count x element size, x ranks for all_gather / reduce_scatter /
// all_to_all / gather / scatter); "FILE: ..." for a file with no rows or no collective named (give one with
// `collective`), a directory, a FIFO or device, a file above kMaxLogBytes.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "collectives/algorithms.h"

namespace shardsim::calibration {

using collectives::Collective;

struct NcclRow {
  int line = 0;         // 1-based line in the file
  double bytes = 0;     // "size" column
  double time_us = 0;   // out-of-place time
  double busbw = 0;     // out-of-place busbw as printed (GB/s)
};

struct NcclLog {
  std::string file;
  Collective collective = Collective::all_reduce;
  std::string type;     // "float", "half", ...
  std::string redop;    // "sum", "none", ...
  int ranks = 0;        // N when the log lists "# Rank 0" .. "# Rank N-1" (0: it does not list them)
  std::vector<NcclRow> rows;
  // What was skipped, one line each (0-byte rows, NCCL INFO/WARN lines, other text), for the reader to see.
  std::vector<std::string> notes;
};

// The largest log read (bytes): a day of nccl-tests output with NCCL_DEBUG=INFO is a few MB.
constexpr size_t kMaxLogBytes = size_t{64} << 20;

// Reads one nccl-tests output file (common/input_file.h: a regular file of at most kMaxLogBytes; a FIFO never
// blocks). COLLECTIVE ("" = none) names the log's collective: when the file has a "# Collective test starting:
// X_perf" line, that line wins, and with NAMED_FOR_FILE (`calibrate --collective FILE=NAME`) the two must agree
// (ConfigError otherwise). Throws ConfigError as described above.
NcclLog parse_nccl_tests_log(const std::string& path, const std::string& collective = "",
                             bool named_for_file = false);
NcclLog parse_nccl_tests_text(const std::string& text, const std::string& file, const std::string& collective = "",
                              bool named_for_file = false);

// "%.9g": how calibrate prints a number in its messages and files.
std::string format_number(double v);

}  // namespace shardsim::calibration

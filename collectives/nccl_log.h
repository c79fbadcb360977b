// Reading nccl-tests output (the input of `shardsim calibrate`, collectives/calibrate.h).
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
// Errors: ConfigError (exit 2) "FILE:LINE: ..." for a malformed row, a row with #wrong > 0, a second table in one
// file (sizes restart or a second "Collective test starting"), mixed types or ops in one table, an unknown
// collective; "FILE: ..." for a file with no rows or no collective named (give one with `collective`).
#pragma once

#include <string>
#include <vector>

#include "collectives/algorithms.h"

namespace shardsim::collectives {

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
  int ranks = 0;        // "# Rank N" lines counted (0: the log does not list them)
  std::vector<NcclRow> rows;
};

// Reads one nccl-tests output file. DEFAULT_COLLECTIVE ("" = none) names the collective when the file has no
// "# Collective test starting: X_perf" line. Throws ConfigError as described above.
NcclLog parse_nccl_tests_log(const std::string& path, const std::string& default_collective = "");
NcclLog parse_nccl_tests_text(const std::string& text, const std::string& file,
                              const std::string& default_collective = "");

// "%.9g": how calibrate prints a number in its messages and files.
std::string format_number(double v);

}  // namespace shardsim::collectives

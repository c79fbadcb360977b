#include "collectives/nccl_log.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>

#include "common/error.h"

namespace shardsim::collectives {

namespace {

// "[0] ", "[1,0]<stdout>:" (mpirun --tag-output) and similar prefixes in front of a log line.
std::string strip_prefix(const std::string& line) {
  size_t i = 0;
  while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) ++i;
  if (i < line.size() && line[i] == '[') {
    const size_t close = line.find(']', i);
    if (close != std::string::npos) {
      size_t j = close + 1;
      const std::string tag = "<stdout>:";
      if (line.compare(j, tag.size(), tag) == 0) j += tag.size();
      return line.substr(j);
    }
  }
  return line;
}

std::vector<std::string> tokens(const std::string& s) {
  std::istringstream in(s);
  std::vector<std::string> out;
  for (std::string t; in >> t;) out.push_back(t);
  return out;
}

bool parse_number(const std::string& s, double& v) {
  if (s.empty()) return false;
  char* end = nullptr;
  v = std::strtod(s.c_str(), &end);
  return end == s.c_str() + s.size() && std::isfinite(v);
}

// nccl-tests program name -> our collective name.
std::string collective_of_program(const std::string& program) {
  static const std::map<std::string, std::string> names = {
      {"all_reduce_perf", "all_reduce"}, {"all_gather_perf", "all_gather"},
      {"reduce_scatter_perf", "reduce_scatter"}, {"broadcast_perf", "broadcast"},
      {"reduce_perf", "reduce"}, {"alltoall_perf", "all_to_all"}, {"sendrecv_perf", "send_recv"},
      {"gather_perf", "gather"}, {"scatter_perf", "scatter"}};
  std::string p = program;
  if (const size_t slash = p.rfind('/'); slash != std::string::npos) p = p.substr(slash + 1);
  if (p.size() > 4 && p.compare(p.size() - 4, 4, "_mpi") == 0) p = p.substr(0, p.size() - 4);
  const auto it = names.find(p);
  return it == names.end() ? "" : it->second;
}

}  // namespace

std::string format_number(double v) {
  char b[64];
  std::snprintf(b, sizeof b, "%.9g", v);
  return b;
}

NcclLog parse_nccl_tests_text(const std::string& text, const std::string& file, const std::string& default_collective) {
  NcclLog log;
  log.file = file;
  std::string collective;
  int collective_line = 0;
  bool has_root = true, root_known = false;
  std::istringstream in(text);
  std::string raw;
  int line_no = 0;
  auto fail = [&](const std::string& why) -> ConfigError {
    return ConfigError(file + ":" + std::to_string(line_no) + ": " + why);
  };
  while (std::getline(in, raw)) {
    ++line_no;
    const std::string line = strip_prefix(raw);
    const auto t = tokens(line);
    if (t.empty()) continue;
    if (t[0][0] == '#') {
      const size_t at = line.find("Collective test starting:");
      if (at != std::string::npos) {
        const auto rest = tokens(line.substr(at + 25));
        const std::string name = rest.empty() ? "" : collective_of_program(rest[0]);
        if (name.empty())
          throw fail("unknown nccl-tests program '" + (rest.empty() ? std::string() : rest[0]) +
                     "' (known: all_reduce_perf, all_gather_perf, reduce_scatter_perf, broadcast_perf, reduce_perf, "
                     "alltoall_perf, sendrecv_perf, gather_perf, scatter_perf)");
        if (!collective.empty())
          throw fail("a second 'Collective test starting' line (the first is on line " +
                     std::to_string(collective_line) + "): give one table per file");
        collective = name;
        collective_line = line_no;
      }
      // "#  Rank  3 Group  0 Pid ..." lists the ranks.
      if (t.size() >= 3 && t[0] == "#" && t[1] == "Rank") ++log.ranks;
      else if (t.size() >= 2 && t[0] == "#Rank") ++log.ranks;
      // The column header says whether there is a root column.
      if (line.find("size") != std::string::npos && line.find("count") != std::string::npos &&
          line.find("redop") != std::string::npos) {
        has_root = line.find("root") != std::string::npos;
        root_known = true;
      }
      continue;
    }
    double bytes = 0;
    if (!parse_number(t[0], bytes)) {
      // nccl-tests' own non-table lines (warnings, NCCL INFO, ...) are skipped, but a row of table width whose
      // size is spelled like a number that does not parse (1e400, nan, inf) is a malformed row, not a comment.
      std::string low;
      for (char ch : t[0]) low += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      const std::string word = low.substr(std::min(low.find_first_not_of("+-"), low.size()));
      const bool numeric_like = low.find_first_not_of("0123456789.e+-") == std::string::npos || word == "nan" ||
                                word == "inf" || word == "infinity";
      if (numeric_like && (t.size() == 8 || t.size() == 9 || t.size() == 12 || t.size() == 13))
        throw fail("size '" + t[0] + "' is not a finite byte count");
      continue;
    }
    // Columns: size count type redop [root] time algbw busbw #wrong [time algbw busbw #wrong]
    if (!root_known) {
      if (t.size() != 8 && t.size() != 9 && t.size() != 12 && t.size() != 13)
        throw fail("expected 9 or 13 columns (size count type redop root time algbw busbw #wrong [in-place: time "
                   "algbw busbw #wrong]; 8 or 12 in logs without a root column), got " + std::to_string(t.size()));
      has_root = t.size() == 9 || t.size() == 13;
    }
    const size_t base = has_root ? 5 : 4;
    if (t.size() != base + 4 && t.size() != base + 8)
      throw fail("expected " + std::to_string(base + 4) + " or " + std::to_string(base + 8) +
                 " columns (size count type redop" + (has_root ? " root" : "") +
                 " time algbw busbw #wrong [in-place: time algbw busbw #wrong]), got " + std::to_string(t.size()));
    double count = 0, time_us = 0, algbw = 0, busbw = 0;
    if (!(bytes > 0) || std::floor(bytes) != bytes) throw fail("size '" + t[0] + "' is not a positive byte count");
    // The --min-bytes/--max-bytes range; a size of 1e300 made the fit's error rms 'inf%' (exit 0).
    if (bytes > 1e15) throw fail("size '" + t[0] + "' is above 1e15 bytes: not a measured message size");
    if (!parse_number(t[1], count) || count < 0) throw fail("count '" + t[1] + "' is not a number");
    if (!parse_number(t[base], time_us) || !(time_us > 0))
      throw fail("time '" + t[base] + "' is not a positive number of microseconds");
    // No collective completes in under a nanosecond; a time like 1e-300 made the fit's error rms 'inf%' (exit 0).
    if (time_us < 1e-3) throw fail("time '" + t[base] + "' us is below 1 ns: not a measured collective time");
    // ... nor in more than a day (1e308 fitted silently, printing a 300-digit time at -100% error).
    if (time_us > 8.64e10) throw fail("time '" + t[base] + "' us is above one day: not a measured collective time");
    if (!parse_number(t[base + 1], algbw) || !parse_number(t[base + 2], busbw))
      throw fail("algbw/busbw '" + t[base + 1] + "' '" + t[base + 2] + "' are not numbers");
    for (size_t col = base + 3; col < t.size(); col += 4) {  // out of place, then in place
      const std::string& wrong = t[col];
      double nwrong = 0;
      if (wrong != "N/A" && (!parse_number(wrong, nwrong) || nwrong != 0))
        throw fail("#wrong is '" + wrong + "': a measurement with wrong results is not a calibration input");
    }
    if (log.rows.empty()) {
      log.type = t[2];
      log.redop = t[3];
    } else {
      if (t[2] != log.type || t[3] != log.redop)
        throw fail("type/op '" + t[2] + " " + t[3] + "' differs from the table's '" + log.type + " " + log.redop +
                   "' (line " + std::to_string(log.rows.front().line) + "): mixed logs, give one table per file");
      if (bytes <= log.rows.back().bytes)
        throw fail("size " + t[0] + " does not grow (previous row: " + format_number(log.rows.back().bytes) +
                   "): a second table starts here, give one table per file");
    }
    log.rows.push_back({line_no, bytes, time_us, busbw});
  }
  if (collective.empty()) collective = default_collective;
  if (collective.empty())
    throw ConfigError(file + ": no '# Collective test starting: X_perf' line; name the collective (--collective)");
  try {
    log.collective = parse_collective(collective);
  } catch (const std::invalid_argument& e) {
    throw ConfigError(file + ": " + e.what());
  }
  if (log.rows.empty()) throw ConfigError(file + ": no nccl-tests table rows found");
  return log;
}

NcclLog parse_nccl_tests_log(const std::string& path, const std::string& default_collective) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(path + ": cannot open");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw ConfigError(path + ": read error");
  return parse_nccl_tests_text(ss.str(), path, default_collective);
}
}  // namespace shardsim::collectives

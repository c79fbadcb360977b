#include "calibration/nccl_log.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>

#include "common/error.h"
#include "common/number.h"
#include "common/input_file.h"

namespace shardsim::calibration {

using namespace collectives;  // the collectives this room calibrates / verifies

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
  const auto d = decimal_double(s);  // decimal only (common/number.h): strtod took '0x10' and ' 5'
  v = d.value_or(0);
  return d.has_value();
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

namespace {

// Bytes per element of nccl-tests' type names (its -d values as the table prints them); 0 when unknown.
double type_bytes(const std::string& type) {
  static const std::map<std::string, double> sizes = {
      {"int8", 1},    {"uint8", 1},   {"int32", 4},  {"uint32", 4},   {"int64", 8},     {"uint64", 8},
      {"half", 2},    {"float", 4},   {"double", 8}, {"bfloat16", 2}, {"f8e4m3", 1},    {"f8e5m2", 1},
      {"fp8_e4m3", 1}, {"fp8_e5m2", 1}};
  const auto it = sizes.find(type);
  return it == sizes.end() ? 0 : it->second;
}

// The rows' size over count x element size: 1 for the collectives whose count column is the whole buffer
// (all_reduce, broadcast, reduce, send_recv), the rank count for those whose size is the gathered or scattered
// buffer and count one rank's part (all_gather, reduce_scatter, all_to_all, gather, scatter). nccl-tests 2.13+
// (the tables with a root column) print both so.
bool size_is_per_rank_times_ranks(Collective c) {
  return c == Collective::all_gather || c == Collective::reduce_scatter || c == Collective::all_to_all ||
         c == Collective::gather || c == Collective::scatter;
}
bool reduces(Collective c) {
  return c == Collective::all_reduce || c == Collective::reduce_scatter || c == Collective::reduce;
}
bool never_reduces(Collective c) {
  return c == Collective::all_gather || c == Collective::broadcast || c == Collective::all_to_all;
}

constexpr size_t kMaxLineBytes = 65536;  // nccl-tests' longest lines (NCCL INFO) are a few hundred bytes
constexpr int kMaxRank = 1 << 20;        // the chip limit of a job is far below this

class LogParser {
 public:
  LogParser(const std::string& file, const std::string& collective, bool named_for_file)
      : file_(file), named_(collective), named_for_file_(named_for_file) {
    log_.file = file;
  }

  NcclLog parse(const std::string& text) {
    std::istringstream in(text);
    std::string raw;
    while (std::getline(in, raw)) {
      ++line_no_;
      if (raw.size() > kMaxLineBytes)
        throw fail("a line longer than " + std::to_string(kMaxLineBytes) + " bytes: not an nccl-tests log");
      const std::string line = strip_prefix(raw);
      const auto t = tokens(line);
      if (t.empty()) continue;
      if (t[0][0] == '#') {
        comment(line, t);
        continue;
      }
      double bytes = 0;
      if (!parse_number(t[0], bytes)) {
        other_line(line, t);
        continue;
      }
      row(t, bytes);
    }
    finish();
    return log_;
  }

 private:
  ConfigError fail(const std::string& why) const {
    return ConfigError(file_ + ":" + std::to_string(line_no_) + ": " + why);
  }

  void comment(const std::string& line, const std::vector<std::string>& t) {
    const size_t at = line.find("Collective test starting:");
    if (at != std::string::npos) {
      const auto rest = tokens(line.substr(at + 25));
      const std::string name = rest.empty() ? "" : collective_of_program(rest[0]);
      if (name.empty())
        throw fail("unknown nccl-tests program '" + (rest.empty() ? std::string() : rest[0]) +
                   "' (known: all_reduce_perf, all_gather_perf, reduce_scatter_perf, broadcast_perf, reduce_perf, "
                   "alltoall_perf, sendrecv_perf, gather_perf, scatter_perf)");
      if (!collective_.empty())
        throw fail("a second 'Collective test starting' line (the first is on line " +
                   std::to_string(collective_line_) + "): give one table per file");
      if (named_for_file_ && !named_.empty() && named_ != name)
        throw fail("the log says " + rest[0] + " but --collective " + file_ + "=" + named_ + " names " + named_);
      collective_ = name;
      collective_line_ = line_no_;
    }
    // "#  Rank  3 Group  0 Pid ..." (older: "#   Rank  3 Pid ...", "#Rank 3 ...") lists the ranks.
    if (t.size() >= 3 && t[0] == "#" && t[1] == "Rank") rank(t[2]);
    else if (t.size() >= 2 && t[0] == "#Rank") rank(t[1]);
    // The column header says whether there is a root column (and that the fourth column is the op).
    if (line.find("size") != std::string::npos && line.find("count") != std::string::npos &&
        line.find("redop") != std::string::npos) {
      has_root_ = line.find("root") != std::string::npos;
      root_known_ = true;
    }
  }

  // A "Rank N" line: N parsed, each rank listed once.
  void rank(const std::string& s) {
    double r = 0;
    if (!parse_number(s, r) || r < 0 || r >= kMaxRank || std::floor(r) != r)
      throw fail("rank '" + s + "' is not a rank number (0 .. " + std::to_string(kMaxRank - 1) + ")");
    const int id = static_cast<int>(r);
    if (const auto it = rank_line_.find(id); it != rank_line_.end())
      throw fail("rank " + s + " is listed twice (first on line " + std::to_string(it->second) +
                 "): two jobs' output in one log, or ranks started without MPI; give one job's log");
    rank_line_[id] = line_no_;
  }

  // nccl-tests' own non-table lines (NCCL INFO/WARN, warnings, ...) are skipped and counted, but a row of table
  // width whose size is spelled like a number that does not parse (1e400, nan, inf) is a malformed row.
  void other_line(const std::string& line, const std::vector<std::string>& t) {
    std::string low;
    for (char ch : t[0]) low += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    const std::string word = low.substr(std::min(low.find_first_not_of("+-"), low.size()));
    const bool numeric_like = low.find_first_not_of("0123456789.e+-") == std::string::npos || word == "nan" ||
                              word == "inf" || word == "infinity";
    if (numeric_like && (t.size() == 8 || t.size() == 9 || t.size() == 12 || t.size() == 13))
      throw fail("size '" + t[0] + "' is not a finite byte count");
    if (line.find("NCCL ") != std::string::npos || line.find("NCCL:") != std::string::npos) {
      ++nccl_lines_;
    } else {
      if (other_lines_++ == 0) first_other_ = line_no_;
    }
  }

  // Columns: size count type redop [root] time algbw busbw #wrong [time algbw busbw #wrong]
  void row(const std::vector<std::string>& t, double bytes) {
    if (!root_known_) {
      if (t.size() != 8 && t.size() != 9 && t.size() != 12 && t.size() != 13)
        throw fail("expected 9 or 13 columns (size count type redop root time algbw busbw #wrong [in-place: time "
                   "algbw busbw #wrong]; 8 or 12 in logs without a root column), got " + std::to_string(t.size()));
      has_root_ = t.size() == 9 || t.size() == 13;
    }
    const size_t base = has_root_ ? 5 : 4;
    if (t.size() != base + 4 && t.size() != base + 8)
      throw fail("expected " + std::to_string(base + 4) + " or " + std::to_string(base + 8) +
                 " columns (size count type redop" + (has_root_ ? " root" : "") +
                 " time algbw busbw #wrong [in-place: time algbw busbw #wrong]), got " + std::to_string(t.size()));
    double count = 0, time_us = 0, algbw = 0, busbw = 0;
    if (bytes == 0) {  // nccl-tests starts at 0 bytes when -b is below one element per rank: nothing to fit
      if (zero_rows_++ == 0) first_zero_ = line_no_;
      return;
    }
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
    if (log_.rows.empty()) {
      log_.type = t[2];
      log_.redop = t[3];
      first_count_ = count;
    } else {
      if (t[2] != log_.type || t[3] != log_.redop)
        throw fail("type/op '" + t[2] + " " + t[3] + "' differs from the table's '" + log_.type + " " + log_.redop +
                   "' (line " + std::to_string(log_.rows.front().line) + "): mixed logs, give one table per file");
      if (bytes <= log_.rows.back().bytes)
        throw fail("size " + t[0] + " does not grow (previous row: " + format_number(log_.rows.back().bytes) +
                   "): a second table starts here, give one table per file");
    }
    log_.rows.push_back({line_no_, bytes, time_us, busbw});
  }

  void finish() {
    std::string collective = collective_.empty() ? named_ : collective_;
    if (collective.empty())
      throw ConfigError(file_ + ": no '# Collective test starting: X_perf' line; name the collective (--collective " +
                        file_ + "=NAME, or --collective NAME for every log without that line)");
    try {
      log_.collective = parse_collective(collective);
    } catch (const std::invalid_argument& e) {
      throw ConfigError(file_ + ": " + e.what());
    }
    if (log_.rows.empty()) throw ConfigError(file_ + ": no nccl-tests table rows found");
    int expect = 0;
    for (const auto& [r, line] : rank_line_) {
      if (r != expect)
        throw ConfigError(file_ + ":" + std::to_string(line) + ": rank " + std::to_string(r) + " is listed but rank " +
                          std::to_string(expect) + " is not: the ranks of one job are 0 .. N-1");
      ++expect;
    }
    log_.ranks = expect;
    check_collective_fits_table();
    if (zero_rows_)
      log_.notes.push_back(std::to_string(zero_rows_) + " row(s) of 0 bytes skipped (first on line " +
                           std::to_string(first_zero_) + "): nothing moves, no time to fit");
    if (nccl_lines_) log_.notes.push_back(std::to_string(nccl_lines_) + " NCCL log line(s) (NCCL INFO/WARN) skipped");
    if (other_lines_)
      log_.notes.push_back(std::to_string(other_lines_) + " other line(s) that are not table rows skipped (first on "
                           "line " + std::to_string(first_other_) + ")");
  }

  // The collective the log is read as must fit its table: a reduction has an op, all_gather / broadcast /
  // all_to_all have none, and (tables with a root column, nccl-tests 2.13+) the size over count x element size is
  // 1 or the rank count as the collective says. An all_gather table read as all_reduce was fitted silently.
  void check_collective_fits_table() const {
    const Collective c = log_.collective;
    const std::string name = collective_name(c);
    const std::string where = file_ + ":" + std::to_string(log_.rows.front().line) + ": ";
    const std::string how = collective_.empty() ? " (named by --collective)" : "";
    const std::string fix = collective_.empty() ? "; name each log's collective with --collective FILE=NAME" : "";
    if (root_known_ && reduces(c) && log_.redop == "none")
      throw ConfigError(where + "the table's op is 'none' (a collective without reduction, e.g. all_gather_perf) but "
                        "the log is read as " + name + how + fix);
    if (root_known_ && never_reduces(c) && log_.redop != "none")
      throw ConfigError(where + "the table's op is '" + log_.redop + "' (a reduction) but the log is read as " + name +
                        how + fix);
    const double ws = type_bytes(log_.type);
    if (!has_root_ || !(ws > 0) || !(first_count_ > 0) || c == Collective::send_recv) return;
    const double ratio = log_.rows.front().bytes / (first_count_ * ws);
    const bool per_rank = size_is_per_rank_times_ranks(c);
    if (per_rank ? ratio < 1.5 : std::fabs(ratio - 1) > 1e-9)
      throw ConfigError(where + "size " + format_number(log_.rows.front().bytes) + " is " + format_number(ratio) +
                        " x count x " + format_number(ws) + " B, but " + name + "'s table has size = count x element" +
                        (per_rank ? " x ranks" : "") + how + fix);
  }

  std::string file_, named_;
  bool named_for_file_;
  NcclLog log_;
  std::string collective_;
  int collective_line_ = 0, line_no_ = 0;
  bool has_root_ = true, root_known_ = false;
  std::map<int, int> rank_line_;  // rank -> the line listing it
  int zero_rows_ = 0, first_zero_ = 0, nccl_lines_ = 0, other_lines_ = 0, first_other_ = 0;
  double first_count_ = 0;
};

}  // namespace

NcclLog parse_nccl_tests_text(const std::string& text, const std::string& file, const std::string& collective,
                              bool named_for_file) {
  return LogParser(file, collective, named_for_file).parse(text);
}

NcclLog parse_nccl_tests_log(const std::string& path, const std::string& collective, bool named_for_file) {
  return parse_nccl_tests_text(read_input_file(path, kMaxLogBytes, "an nccl-tests log"), path, collective,
                               named_for_file);
}
}  // namespace shardsim::calibration

// Sweep result rows: the columns, CSV (RFC 4180) written and read back, the best plan per workload x topology x
// device, and the JSON document (experiments/sweep.h).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "experiments/sweep.h"

#include "common/csv.h"

namespace shardsim::sharding {

const std::vector<std::string>& result_columns() {
  static const std::vector<std::string> cols = {
      "key",        "kind",          "topology",  "device",      "chips",     "collective", "algorithm",
      "algorithm_used", "dtype",     "size_bytes", "workload",   "plan",      "timing",     "sim_time_us",
      "algbw_gbps", "busbw_gbps",    "compute_us", "comm_us",    "exposed_comm_us", "peak_mem_bytes",
      "wrong",      "max_rel_error", "verdict",   "reason",      "wall_s",          "ranks",
      "idle_us",    "tflops",        "peak_fraction", "tokens_per_s", "validated_at"};
  return cols;
}

Row base_row(const SweepPoint& p) {
  Row r;
  for (const auto& c : result_columns()) r[c] = "";
  r["key"] = p.key;
  r["kind"] = p.kind == PointKind::collective ? "collective" : "workload";
  r["topology"] = p.topology;
  r["device"] = p.device;
  r["chips"] = std::to_string(p.chips);
  if (p.kind == PointKind::collective) {
    r["collective"] = p.collective;
    r["algorithm"] = p.algorithm;
    r["dtype"] = p.dtype;
    r["size_bytes"] = std::to_string(p.size_bytes);
  } else {
    r["workload"] = p.workload;
    r["plan"] = p.plan;
  }
  return r;
}

namespace {
// OWASP "CSV Injection": a cell starting with = + - @ TAB or CR is a formula to a spreadsheet. Such a cell is
// written with a leading ' (shown as text, not evaluated) unless it is a number ("-1.5e-3" stays a number).
bool formula_like(const std::string& f) {
  if (f.empty() || std::string_view("=+-@\t\r").find(f[0]) == std::string_view::npos) return false;
  if (f[0] != '+' && f[0] != '-') return true;
  char* end = nullptr;
  std::strtod(f.c_str(), &end);
  return end != f.c_str() + f.size();
}
// A formula, or a ' before one (so "'=x" written as "''=x" reads back as "'=x": the prefix is always undone once).
bool needs_quote(std::string_view f) {
  return formula_like(std::string(f)) || (f.size() > 1 && f[0] == '\'' && needs_quote(f.substr(1)));
}
}  // namespace

std::string csv_cell(const std::string& value) { return needs_quote(value) ? "'" + value : value; }

std::string csv_uncell(const std::string& cell) {
  return cell.size() >= 2 && cell[0] == '\'' && needs_quote(std::string_view(cell).substr(1)) ? cell.substr(1) : cell;
}

std::string csv_line(const std::vector<std::string>& fields) {
  std::string out;
  for (size_t i = 0; i < fields.size(); ++i) {
    if (i) out += ',';
    const std::string f = csv_cell(fields[i]);
    if (f.find_first_of(",\"\n\r") == std::string::npos) {
      out += f;
    } else {
      out += '"';
      for (char c : f) {
        if (c == '"') out += "\"\"";
        else if (c == '\n' || c == '\r') out += ' ';
        else out += c;
      }
      out += '"';
    }
  }
  return out + "\n";
}

std::string csv_header() { return csv_line(result_columns()); }

std::string csv_row(const Row& row) {
  std::vector<std::string> f;
  for (const auto& c : result_columns()) {
    const auto it = row.find(c);
    f.push_back(it == row.end() ? "" : it->second);
  }
  return csv_line(f);
}

std::vector<Row> parse_csv(const std::string& text, const std::string& file, int* dropped) {
  if (dropped) *dropped = 0;
  std::vector<Row> rows;
  const CsvRecords split = csv_records(text);
  if (split.truncated && dropped) ++*dropped;  // last line without its newline: an interrupted write
  std::vector<std::vector<std::string>> records;
  for (const auto& r : split.records) records.push_back(r.fields);
  if (records.empty()) return rows;
  // Columns are matched by name, so a file written before a column was added still resumes (the new column
  // stays empty in its old rows).
  const auto& known = result_columns();
  const auto& cols = records[0];
  bool ours = std::find(cols.begin(), cols.end(), "key") != cols.end();
  for (const auto& c : cols) ours = ours && std::find(known.begin(), known.end(), c) != known.end();
  if (!ours)
    throw ConfigError(file + ":1: not a shardsim sweep results file (unexpected header); move it away or use --force");
  for (size_t r = 1; r < records.size(); ++r) {
    if (records[r].size() != cols.size()) {
      if (dropped) ++*dropped;
      continue;
    }
    Row row;
    for (const auto& c : known) row[c] = "";
    for (size_t k = 0; k < cols.size(); ++k) row[cols[k]] = csv_uncell(records[r][k]);
    rows.push_back(std::move(row));
  }
  return rows;
}

namespace {
bool numeric_column(const std::string& c) {
  static const std::set<std::string> n = {"chips", "size_bytes", "sim_time_us", "algbw_gbps", "busbw_gbps",
                                          "compute_us", "comm_us", "exposed_comm_us", "peak_mem_bytes", "wrong",
                                          "max_rel_error", "wall_s", "idle_us", "tflops", "peak_fraction",
                                          "tokens_per_s"};
  return n.count(c) > 0;
}
nlohmann::json best_json(const std::vector<BestPlan>& best) {
  nlohmann::json a = nlohmann::json::array();
  for (const auto& b : best) {
    nlohmann::json o = {{"workload", b.workload}, {"topology", b.topology}, {"device", b.device},
                        {"compared", b.compared}};
    if (b.best.empty()) {
      o["best_plan"] = nullptr;
    } else {
      o["best_plan"] = b.best.at("plan");
      o["key"] = b.best.at("key");
      const auto at = b.best.find("validated_at");
      o["validated_at"] = at == b.best.end() ? std::string() : at->second;
      for (const char* c : {"sim_time_us", "compute_us", "comm_us", "exposed_comm_us", "idle_us", "tflops",
                            "peak_fraction", "tokens_per_s"}) {
        const auto it = b.best.find(c);
        o[c] = it == b.best.end() || it->second.empty() ? nlohmann::json(nullptr)
                                                         : nlohmann::json(std::strtod(it->second.c_str(), nullptr));
      }
    }
    nlohmann::json sk = nlohmann::json::array(), fl = nlohmann::json::array();
    for (const auto& [p, w] : b.skipped) sk.push_back({{"plan", p}, {"reason", w}});
    for (const auto& [p, w] : b.failed) fl.push_back({{"plan", p}, {"reason", w}});
    o["skipped"] = sk;
    o["failed_validation"] = fl;
    a.push_back(o);
  }
  return a;
}
}  // namespace

std::vector<BestPlan> best_plans(const std::vector<Row>& rows) {
  std::vector<BestPlan> out;
  std::map<std::string, size_t> at;  // group key -> index in OUT
  for (const auto& r : rows) {
    auto get = [&](const char* c) {
      const auto it = r.find(c);
      return it == r.end() ? std::string() : it->second;
    };
    if (get("kind") != "workload") continue;
    const std::string key = get("workload") + '\x1f' + get("topology") + '\x1f' + get("device");
    auto [it, fresh] = at.emplace(key, out.size());
    if (fresh) out.push_back({get("workload"), get("topology"), get("device"), {}, 0, {}, {}});
    BestPlan& b = out[it->second];
    const std::string v = get("verdict");
    if (v == "error") {
      b.skipped.emplace_back(get("plan"), get("reason"));
      continue;
    }
    if (v == "fail") {
      b.failed.emplace_back(get("plan"), get("reason"));
      continue;
    }
    if (v != "pass" && v != "not_validated") continue;
    char* end = nullptr;
    const std::string t = get("sim_time_us");
    const double us = std::strtod(t.c_str(), &end);
    if (t.empty() || !end || *end != '\0') continue;
    ++b.compared;
    if (b.best.empty() || us < std::strtod(b.best.at("sim_time_us").c_str(), nullptr)) b.best = r;
  }
  return out;
}

std::string best_plans_text(const std::vector<BestPlan>& best) {
  if (best.empty()) return "";
  std::ostringstream os;
  os << "best plan per topology x device (lowest simulated time among the plans that ran and passed; critical "
        "chip's breakdown in us)\n";
  char buf[512];
  std::snprintf(buf, sizeof buf, "  %-18s %-14s %-10s %-22s %11s %11s %11s %11s %11s %8s %6s  %s\n", "workload",
                "topology", "device", "best plan", "total", "compute", "comm", "exposed", "idle", "TFLOP/s", "%peak",
                "compared; validated at");
  os << buf;
  auto col = [](const Row& r, const char* c) {
    const auto it = r.find(c);
    return it == r.end() || it->second.empty() ? std::string("-") : it->second;
  };
  auto num = [&](const Row& r, const char* c, const char* f, double scale) {
    const std::string v = col(r, c);
    if (v == "-") return v;
    char b[64];
    std::snprintf(b, sizeof b, f, std::strtod(v.c_str(), nullptr) * scale);
    return std::string(b);
  };
  for (const auto& b : best) {
    std::string tail = std::to_string(b.compared) + " plan(s)";
    if (!b.skipped.empty()) tail += ", " + std::to_string(b.skipped.size()) + " skipped";
    if (!b.failed.empty()) tail += ", " + std::to_string(b.failed.size()) + " failed validation";
    if (!b.best.empty()) {
      const std::string at = col(b.best, "validated_at");
      tail += "; " + (at == "-" ? std::string("not validated") : at);
    }
    if (b.best.empty()) {
      std::snprintf(buf, sizeof buf, "  %-18s %-14s %-10s %-22s  %s\n", b.workload.c_str(), b.topology.c_str(),
                    b.device.c_str(), "(none ran)", tail.c_str());
    } else {
      std::snprintf(buf, sizeof buf, "  %-18s %-14s %-10s %-22s %11s %11s %11s %11s %11s %8s %6s  %s\n",
                    b.workload.c_str(), b.topology.c_str(), b.device.c_str(), col(b.best, "plan").c_str(),
                    num(b.best, "sim_time_us", "%.3f", 1).c_str(), num(b.best, "compute_us", "%.3f", 1).c_str(),
                    num(b.best, "comm_us", "%.3f", 1).c_str(), num(b.best, "exposed_comm_us", "%.3f", 1).c_str(),
                    num(b.best, "idle_us", "%.3f", 1).c_str(), num(b.best, "tflops", "%.2f", 1).c_str(),
                    num(b.best, "peak_fraction", "%.1f", 100).c_str(), tail.c_str());
    }
    os << buf;
    for (const auto& [plan, why] : b.skipped)
      os << "    skipped " << plan << " on " << b.topology << " / " << b.device << ": " << why << "\n";
    for (const auto& [plan, why] : b.failed)
      os << "    failed  " << plan << " on " << b.topology << " / " << b.device << ": " << why << "\n";
  }
  return os.str();
}

std::string rows_to_json(const std::string& name, const std::vector<Row>& rows) {
  nlohmann::json arr = nlohmann::json::array();
  for (const auto& r : rows) {
    nlohmann::json o = nlohmann::json::object();
    for (const auto& c : result_columns()) {
      const auto it = r.find(c);
      const std::string v = it == r.end() ? "" : it->second;
      if (numeric_column(c)) {
        if (v.empty()) o[c] = nullptr;
        else {
          char* end = nullptr;
          const double d = std::strtod(v.c_str(), &end);
          if (end && *end == '\0') {
            if (c == "chips" || c == "size_bytes" || c == "wrong" || c == "peak_mem_bytes") o[c] = static_cast<long long>(d);
            else o[c] = d;
          } else {
            o[c] = v;
          }
        }
      } else {
        o[c] = v;
      }
    }
    arr.push_back(o);
  }
  return nlohmann::json{{"sweep", name},
                        {"units", {{"time", "us (simulated unless wall_s)"}, {"bandwidth", "GB/s, GB = 1e9 B"}}},
                        {"rows", arr},
                        {"best_plans", best_json(best_plans(rows))}}
             .dump(2) +
         "\n";
}

}  // namespace shardsim::sharding

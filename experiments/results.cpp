// Sweep result rows: the columns, CSV (RFC 4180) written and read back, the best plan per workload x topology x
// device, and the JSON document (experiments/sweep.h).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "experiments/sweep.h"

#include "common/csv.h"

namespace shardsim::experiments {

const std::vector<std::string>& result_columns() {
  static const std::vector<std::string> cols = {
      "key",        "kind",          "topology",  "device",      "chips",     "collective", "algorithm",
      "algorithm_used", "dtype",     "size_bytes", "workload",   "plan",      "timing",     "sim_time_us",
      "algbw_gbps", "busbw_gbps",    "compute_us", "comm_us",    "exposed_comm_us", "peak_mem_bytes",
      "wrong",      "max_rel_error", "verdict",   "reason",      "wall_s",          "ranks",
      "idle_us",    "tflops",        "peak_fraction", "tokens_per_s", "validated_at",
      // Training plans (run_mode train); forward workload rows carry run_mode forward and leave the rest empty.
      "run_mode",   "tokens_per_step", "mfu",       "hbm_capacity_bytes", "fits_hbm", "bubble_fraction",
      "micro_batches",
      // Serve points (run_mode serve): the axis values and the run's latency percentiles and throughput.
      "rate", "batching", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms", "itl_p99_ms", "e2e_p50_s",
      "e2e_p99_s", "requests_per_s", "output_tokens_per_s", "goodput_requests_per_s", "batch_mean",
      "kv_occupancy_peak", "preemptions"};
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
    r["run_mode"] = p.serve ? "serve" : p.train ? "train" : "forward";
    r["rate"] = p.rate;
    r["batching"] = p.batching;
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

std::string csv_header(const std::vector<std::string>& extra) {
  std::vector<std::string> cols = result_columns();
  cols.insert(cols.end(), extra.begin(), extra.end());
  return csv_line(cols);
}

std::string csv_row(const Row& row, const std::vector<std::string>& extra) {
  std::vector<std::string> f;
  for (const auto* cols : {&result_columns(), &extra})
    for (const auto& c : *cols) {
      const auto it = row.find(c);
      f.push_back(it == row.end() ? "" : it->second);
    }
  return csv_line(f);
}

std::string what_if_column(const std::string& change) { return "speedup[" + change + "]"; }

bool is_what_if_column(const std::string& c) {
  return c.size() > 9 && c.rfind("speedup[", 0) == 0 && c.back() == ']';
}

std::vector<std::string> what_if_changes(const std::string& spec) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at <= spec.size() && !spec.empty()) {  // the changes as apps/profile.h splits them: by commas
    const size_t comma = spec.find(',', at);
    std::string change = spec.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    if (!change.empty()) out.push_back(std::move(change));
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return out;
}

std::vector<std::string> what_if_columns(const std::vector<Row>& rows, const std::string& spec) {
  std::vector<std::string> out;
  auto add = [&](const std::string& c) {
    if (std::find(out.begin(), out.end(), c) == out.end()) out.push_back(c);
  };
  for (const auto& r : rows)
    for (const auto& [c, v] : r)
      if (is_what_if_column(c)) add(c);
  for (const auto& change : what_if_changes(spec)) add(what_if_column(change));
  return out;
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
  for (const auto& c : cols)
    ours = ours && (std::find(known.begin(), known.end(), c) != known.end() || is_what_if_column(c));
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
  if (is_what_if_column(c)) return true;
  static const std::set<std::string> n = {"chips", "size_bytes", "sim_time_us", "algbw_gbps", "busbw_gbps",
                                          "compute_us", "comm_us", "exposed_comm_us", "peak_mem_bytes", "wrong",
                                          "max_rel_error", "wall_s", "idle_us", "tflops", "peak_fraction",
                                          "tokens_per_s", "tokens_per_step", "mfu", "hbm_capacity_bytes",
                                          "bubble_fraction", "micro_batches", "rate", "ttft_p50_ms", "ttft_p99_ms",
                                          "tpot_p50_ms", "tpot_p99_ms", "itl_p99_ms", "e2e_p50_s", "e2e_p99_s",
                                          "requests_per_s", "output_tokens_per_s", "goodput_requests_per_s",
                                          "batch_mean", "kv_occupancy_peak", "preemptions"};
  return n.count(c) > 0;
}
nlohmann::json best_json(const std::vector<BestPlan>& best) {
  nlohmann::json a = nlohmann::json::array();
  for (const auto& b : best) {
    nlohmann::json o = {{"workload", b.workload}, {"topology", b.topology}, {"device", b.device},
                        {"compared", b.compared}};
    if (b.train) {
      o["run_mode"] = "train";
      o["ranked_by"] = "tokens_per_s";
      nlohmann::json over = nlohmann::json::array();
      for (const auto& r : b.over_hbm)
        over.push_back({{"plan", r.at("plan")},
                        {"peak_mem_bytes", std::strtod(r.at("peak_mem_bytes").c_str(), nullptr)},
                        {"hbm_capacity_bytes", std::strtod(r.at("hbm_capacity_bytes").c_str(), nullptr)},
                        {"tokens_per_s", std::strtod(r.at("tokens_per_s").c_str(), nullptr)}});
      o["over_hbm"] = over;
      nlohmann::json ranked = nlohmann::json::array();
      for (const auto& r : b.ranked) ranked.push_back(r.at("plan"));
      o["ranking"] = ranked;
    }
    if (b.best.empty()) {
      o["best_plan"] = nullptr;
    } else {
      o["best_plan"] = b.best.at("plan");
      o["key"] = b.best.at("key");
      const auto at = b.best.find("validated_at");
      o["validated_at"] = at == b.best.end() ? std::string() : at->second;
      for (const char* c : {"sim_time_us", "compute_us", "comm_us", "exposed_comm_us", "idle_us", "tflops",
                            "peak_fraction", "tokens_per_s", "tokens_per_step", "mfu", "peak_mem_bytes",
                            "hbm_capacity_bytes", "bubble_fraction", "micro_batches"}) {
        if (!b.train && std::string_view(c) == "tokens_per_step") break;  // forward groups: the columns as before
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

namespace {
double number(const Row& r, const char* c) {
  const auto it = r.find(c);
  if (it == r.end() || it->second.empty()) return NAN;
  char* end = nullptr;
  const double v = std::strtod(it->second.c_str(), &end);
  return end && *end == '\0' ? v : NAN;
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
    if (get("kind") != "workload" || get("run_mode") == "serve") continue;  // serve points: serve_latency.gp
    const bool train = get("run_mode") == "train";
    const std::string key = get("workload") + '\x1f' + get("topology") + '\x1f' + get("device") + (train ? "\x1ftrain" : "");
    auto [it, fresh] = at.emplace(key, out.size());
    if (fresh) {
      out.emplace_back();
      out.back().workload = get("workload");
      out.back().topology = get("topology");
      out.back().device = get("device");
      out.back().train = train;
    }
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
    const double us = number(r, "sim_time_us");
    if (std::isnan(us)) continue;
    if (!train) {  // forward: the lowest simulated time
      ++b.compared;
      if (b.best.empty() || us < number(b.best, "sim_time_us")) b.best = r;
      continue;
    }
    // Training: every plan of the group runs the workload's global batch; the highest tokens/s among the plans
    // that fit in HBM wins; plans over HBM are listed, never ranked.
    if (get("fits_hbm") == "no") {
      b.over_hbm.push_back(r);
      continue;
    }
    ++b.compared;
    b.ranked.push_back(r);
  }
  for (auto& b : out) {
    if (!b.train) continue;
    std::stable_sort(b.ranked.begin(), b.ranked.end(),
                     [](const Row& x, const Row& y) { return number(x, "tokens_per_s") > number(y, "tokens_per_s"); });
    if (!b.ranked.empty()) b.best = b.ranked.front();
  }
  return out;
}

namespace {
// "12.34" GiB of a byte column, "-" when empty.
std::string gib(const Row& r, const char* c) {
  const double v = number(r, c);
  if (std::isnan(v)) return "-";
  char b[32];
  std::snprintf(b, sizeof b, "%.2f", v / 1073741824.0);
  return b;
}
std::string fixed(double v, const char* f) {
  if (std::isnan(v)) return "-";
  char b[48];
  std::snprintf(b, sizeof b, f, v);
  return b;
}
// One training plan's figures: step ms, tokens/s, MFU %, GiB per chip, bubble %, micro-batches.
std::string train_figures(const Row& r) {
  char b[160];
  std::snprintf(b, sizeof b, "%11s %12s %6s %8s %6s %7s %4s", fixed(number(r, "sim_time_us") / 1e3, "%.3f").c_str(),
                fixed(number(r, "tokens_per_s"), "%.0f").c_str(), fixed(100 * number(r, "mfu"), "%.1f").c_str(),
                gib(r, "peak_mem_bytes").c_str(), gib(r, "hbm_capacity_bytes").c_str(),
                fixed(100 * number(r, "bubble_fraction"), "%.1f").c_str(),
                fixed(number(r, "micro_batches"), "%.0f").c_str());
  return b;
}
// The training groups: the winner per topology x device by tokens/s, the next plans of the ranking, the plans
// over HBM (marked), skipped and failed ones with their reasons.
std::string train_best_text(const std::vector<BestPlan>& best) {
  std::ostringstream os;
  os << "best training plan per topology x device (highest tokens/s at the same global batch among the plans "
        "that ran and fit in HBM; step simulated; memory: chip 0's training state + activations)\n";
  // Column widths from the labels (training plan labels are long: pp16xtp8xdp2+sp-interleaved-v2-mb1-z1).
  int wl = 8, tw = 8, dw = 6, pw = 9;
  for (const auto& b : best) {
    if (!b.train) continue;
    wl = std::max(wl, static_cast<int>(b.workload.size()));
    tw = std::max(tw, static_cast<int>(b.topology.size()));
    dw = std::max(dw, static_cast<int>(b.device.size()));
    for (const auto* v : {&b.ranked, &b.over_hbm})
      for (const auto& r : *v) pw = std::max(pw, static_cast<int>(r.at("plan").size()));
  }
  const int rank_w = wl + tw + dw + pw - 4, over_w = wl + tw + dw + pw - 8;  // the figures line up with the winner's
  char buf[1024];
  std::snprintf(buf, sizeof buf, "  %-*s %-*s %-*s %-*s %11s %12s %6s %8s %6s %7s %4s  %s\n", wl, "workload", tw,
                "topology", dw, "device", pw, "best plan", "step ms", "tokens/s", "MFU%", "GiB/chip", "HBM", "bubble%",
                "m", "compared");
  os << buf;
  constexpr size_t kShown = 5;  // ranking lines under each winner
  for (const auto& b : best) {
    if (!b.train) continue;
    std::string tail = std::to_string(b.compared) + " fitting plan(s)";
    if (!b.over_hbm.empty()) tail += ", " + std::to_string(b.over_hbm.size()) + " over HBM";
    if (!b.skipped.empty()) tail += ", " + std::to_string(b.skipped.size()) + " skipped";
    if (!b.failed.empty()) tail += ", " + std::to_string(b.failed.size()) + " failed validation";
    const std::string plan = b.best.empty() ? std::string("(none fits)") : b.best.at("plan");
    std::snprintf(buf, sizeof buf, "  %-*s %-*s %-*s %-*s %s  %s\n", wl, b.workload.c_str(), tw, b.topology.c_str(), dw,
                  b.device.c_str(), pw, plan.c_str(), b.best.empty() ? "" : train_figures(b.best).c_str(), tail.c_str());
    os << buf;
    for (size_t i = 1; i < b.ranked.size() && i < kShown; ++i) {
      std::snprintf(buf, sizeof buf, "    #%-3zu %-*s %s\n", i + 1, rank_w, b.ranked[i].at("plan").c_str(),
                    train_figures(b.ranked[i]).c_str());
      os << buf;
    }
    if (b.ranked.size() > kShown) os << "    (" << b.ranked.size() - kShown << " more fitting plan(s) in results.csv)\n";
    for (const auto& r : b.over_hbm) {
      std::snprintf(buf, sizeof buf, "    over HBM %-*s %s  (does not fit: %s GiB > %s GiB)\n", over_w, r.at("plan").c_str(),
                    train_figures(r).c_str(), gib(r, "peak_mem_bytes").c_str(), gib(r, "hbm_capacity_bytes").c_str());
      os << buf;
    }
    for (const auto& [p, why] : b.skipped)
      os << "    skipped " << p << " on " << b.topology << " / " << b.device << ": " << why << "\n";
    for (const auto& [p, why] : b.failed)
      os << "    failed  " << p << " on " << b.topology << " / " << b.device << ": " << why << "\n";
  }
  return os.str();
}
}  // namespace

std::string best_plans_text(const std::vector<BestPlan>& best) {
  bool forward = false, train = false;
  for (const auto& b : best) (b.train ? train : forward) = true;
  if (!forward) return train ? train_best_text(best) : "";
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
    if (b.train) continue;
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
  return os.str() + (train ? train_best_text(best) : "");
}

std::string rows_to_json(const std::string& name, const std::vector<Row>& rows) {
  nlohmann::json arr = nlohmann::json::array();
  std::vector<std::string> cols = result_columns();
  for (const auto& c : what_if_columns(rows, "")) cols.push_back(c);
  for (const auto& r : rows) {
    nlohmann::json o = nlohmann::json::object();
    for (const auto& c : cols) {
      const auto it = r.find(c);
      const std::string v = it == r.end() ? "" : it->second;
      if (numeric_column(c)) {
        if (v.empty()) o[c] = nullptr;
        else {
          char* end = nullptr;
          const double d = std::strtod(v.c_str(), &end);
          if (end && *end == '\0') {
            if (c == "chips" || c == "size_bytes" || c == "wrong" || c == "peak_mem_bytes" ||
                c == "hbm_capacity_bytes" || c == "micro_batches")
              o[c] = static_cast<long long>(d);
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

}  // namespace shardsim::experiments

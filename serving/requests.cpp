#include "serving/requests.h"

#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/csv.h"
#include "common/error.h"
#include "common/input_file.h"
#include "common/json_keys.h"
#include "common/number.h"
#include "common/text.h"

namespace shardsim::serving {

namespace {

constexpr size_t kMaxTraceBytes = size_t(1) << 30;
constexpr size_t kMaxLineBytes = size_t(1) << 16;

[[noreturn]] void bad(const std::string& where, int line, const std::string& what) {
  throw ConfigError(where + (line > 0 ? ":" + std::to_string(line) : std::string()) + ": " + what);
}

// A field as a decimal number (blanks and a CR around it allowed; no hexadecimal, 'inf' or 'nan': common/number.h).
double number(const std::string& text, const std::string& where, int line, const char* field) {
  const size_t from = text.find_first_not_of(" \r"), to = text.find_last_not_of(" \r");
  const auto v = from == std::string::npos ? std::nullopt : decimal_double(std::string_view(text).substr(from, to - from + 1));
  if (!v) bad(where, line, std::string(field) + ": '" + escape_control(text.substr(0, 40)) + "' is not a decimal number");
  return *v;
}

// A field's value and its text as the file wrote it (messages echo the text: 9223372036854775807 read as a double
// was shown as 9223372036854775808.000000).
struct Field {
  double v = 0;
  std::string text;
};

int64_t tokens(const Field& f, const std::string& where, int line, const char* field) {
  if (!std::isfinite(f.v) || f.v < 1 || f.v > double(kMaxTokens) || f.v != std::floor(f.v))
    bad(where, line, std::string(field) + ": " + escape_control(f.text) + " must be an integer in 1.." +
                         std::to_string(kMaxTokens));
  return int64_t(f.v);
}

Request request(const Field& arrival, const Field& prompt, const Field& output, const std::string& where, int line,
                int64_t id) {
  if (!std::isfinite(arrival.v) || arrival.v < 0 || arrival.v > kMaxArrivalS) {
    char bound[32];
    std::snprintf(bound, sizeof bound, "%g", kMaxArrivalS);
    bad(where, line, "arrival_s: " + escape_control(arrival.text) + " must be a time from 0 to " + bound + " seconds");
  }
  Request r{id, arrival.v, tokens(prompt, where, line, "prompt_tokens"), tokens(output, where, line, "output_tokens")};
  r.index = id;
  r.line = line;
  return r;
}

void in_order(const std::vector<Request>& out, const std::string& where, int line) {
  if (out.size() > 1 && out.back().arrival_s < out[out.size() - 2].arrival_s)
    bad(where, line, "arrival_s: " + std::to_string(out.back().arrival_s) + " is before the previous request's (" +
                         std::to_string(out[out.size() - 2].arrival_s) + "); arrivals must be in order");
}

std::vector<Request> load_csv(const std::string& text_in, const std::string& where) {
  const std::string_view bom = "\xef\xbb\xbf";
  const std::string_view text = std::string_view(text_in).substr(text_in.rfind(bom, 0) == 0 ? bom.size() : 0);
  const CsvRecords recs = csv_records(std::string(text));
  if (recs.records.empty()) bad(where, 0, "empty trace (expected a header arrival_s,prompt_tokens,output_tokens)");
  std::map<std::string, size_t> col;
  const auto& head = recs.records[0].fields;
  for (size_t i = 0; i < head.size(); ++i) {
    const bool read = head[i] == "arrival_s" || head[i] == "prompt_tokens" || head[i] == "output_tokens";
    if (const auto [it, fresh] = col.emplace(head[i], i); !fresh && read)  // which one a reader takes is a guess
      bad(where, recs.records[0].line, "the header names column " + head[i] + " twice (columns " +
                                           std::to_string(it->second + 1) + " and " + std::to_string(i + 1) + "); keep one");
  }
  for (const char* k : {"arrival_s", "prompt_tokens", "output_tokens"})
    if (!col.count(k)) bad(where, 1, std::string("the header has no column ") + k);
  std::vector<Request> out;
  for (size_t r = 1; r < recs.records.size(); ++r) {
    const CsvRecord& rec = recs.records[r];
    if (rec.fields.size() == 1 && rec.fields[0].empty()) continue;  // a blank line
    if (rec.fields.size() > head.size())  // a field no column names: a shifted or merged record, not data to drop
      bad(where, rec.line, std::to_string(rec.fields.size()) + " fields, the header names " +
                               std::to_string(head.size()) + " columns");
    auto field = [&](const char* k) {
      const size_t i = col[k];
      if (i >= rec.fields.size()) bad(where, rec.line, std::string(k) + ": missing");
      return Field{number(rec.fields[i], where, rec.line, k), rec.fields[i].substr(0, 40)};
    };
    if (out.size() >= size_t(kMaxRequests)) bad(where, rec.line, "more than " + std::to_string(kMaxRequests) + " requests");
    out.push_back(request(field("arrival_s"), field("prompt_tokens"), field("output_tokens"), where, rec.line,
                          int64_t(out.size())));
    in_order(out, where, rec.line);
  }
  if (recs.truncated) bad(where, 0, "the last record has no final newline or an unclosed quote");
  return out;
}

std::vector<Request> load_jsonl(const std::string& text, const std::string& where) {
  std::vector<Request> out;
  std::istringstream in(text);
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j;
    std::string dup;
    try {
      j = parse_json_unique_keys(line, &dup);
    } catch (const nlohmann::json::exception&) {
      bad(where, n, "not a JSON object");
    }
    if (!j.is_object()) bad(where, n, "not a JSON object");
    if (!dup.empty())  // nlohmann keeps the last value, other readers the first: neither is a guess made here
      bad(where, n, "key " + escape_control(dup.substr(0, 40)) + " given twice in one request; keep one");
    auto field = [&](const char* k) {
      if (!j.contains(k)) bad(where, n, std::string(k) + ": missing");
      if (!j[k].is_number()) bad(where, n, std::string(k) + ": not a number");
      return Field{j[k].get<double>(), j[k].dump().substr(0, 40)};
    };
    if (out.size() >= size_t(kMaxRequests)) bad(where, n, "more than " + std::to_string(kMaxRequests) + " requests");
    out.push_back(request(field("arrival_s"), field("prompt_tokens"), field("output_tokens"), where, n,
                          int64_t(out.size())));
    in_order(out, where, n);
  }
  return out;
}

// Uniform double in [0, 1) from 53 bits of G.
double unit(std::mt19937_64& g) { return double(g() >> 11) * (1.0 / 9007199254740992.0); }

int64_t draw(const LengthDist& d, std::mt19937_64& g) {
  if (d.kind == "fixed") return d.value;
  if (d.kind == "uniform") return d.lo + int64_t(unit(g) * double(d.hi - d.lo + 1));
  // normal: Box-Muller, rounded and clamped
  const double u1 = 1.0 - unit(g), u2 = unit(g);
  const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  const double v = std::round(d.mean + d.std * z);
  return std::clamp<int64_t>(int64_t(std::clamp(v, -1e15, 1e15)), d.lo, d.hi);
}

}  // namespace

std::vector<Request> generate_trace(const TraceSpec& s) {
  std::mt19937_64 g(s.seed);
  std::vector<Request> out;
  double t = 0;
  for (int64_t i = 0; i < s.count; ++i) {
    if (s.arrival == "fixed")
      t += i == 0 ? 0.0 : 1.0 / s.rate;
    else if (s.arrival == "poisson")
      t += -std::log(1.0 - unit(g)) / s.rate;
    Request r;
    r.id = r.index = i;
    r.arrival_s = t;
    r.prompt = draw(s.prompt, g);
    r.output = draw(s.output, g);
    out.push_back(r);
  }
  return out;
}

// Every line within kMaxLineBytes and at most a header and kMaxRequests records, checked in one pass before any
// parsing: a 400 MB line took 2.4 GB in the JSON parser, 4M + 1 records 11 s before "more than ... requests".
static void check_lines(const std::string& text, const std::string& where) {
  int64_t records = 0, line = 1;
  for (size_t at = 0; at < text.size(); ++line) {
    size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    if (end - at > kMaxLineBytes)
      bad(where, int(line), "a line of " + std::to_string(end - at) + " bytes; at most " + std::to_string(kMaxLineBytes) +
                                " (a request is three numbers)");
    if (text.find_first_not_of(" \t\r", at) < end && ++records > kMaxRequests + 1)
      bad(where, int(line), "more than " + std::to_string(kMaxRequests) + " requests");
    at = end + 1;
  }
}

std::vector<Request> load_trace(const std::string& file) {
  const std::string text = read_input_file(file, kMaxTraceBytes, "a request trace");
  check_lines(text, file);
  const bool csv = file.size() >= 4 && file.compare(file.size() - 4, 4, ".csv") == 0;
  return csv ? load_csv(text, file) : load_jsonl(text, file);
}

std::string request_label(const Request& r, const std::string& trace) {
  const std::string n = std::to_string(r.index);
  if (r.line > 0) return trace + ":" + std::to_string(r.line) + ": request " + n;
  return (trace.empty() ? "" : trace + ": ") + "generated request " + n;
}

void check_trace(const std::vector<Request>& reqs, int64_t max_context, const std::string& where) {
  if (reqs.empty()) bad(where, 0, "the trace holds no request");
  for (size_t i = 0; i < reqs.size(); ++i) {
    const Request& r = reqs[i];
    const std::string id = request_label(r, where);
    if (i > 0 && r.arrival_s < reqs[i - 1].arrival_s)
      throw ConfigError(id + ": arrival_s " + std::to_string(r.arrival_s) + " is before the previous request's (" +
                        std::to_string(reqs[i - 1].arrival_s) + "); arrivals must be in order");
    if (!(r.arrival_s <= kMaxArrivalS)) {  // a generated trace: count / rate past it
      char b[160];
      std::snprintf(b, sizeof b, ": arrives at %.10g s, past the latest arrival (%.10g s): the first %zu requests "
                    "arrive in time", r.arrival_s, kMaxArrivalS, i);
      throw ConfigError(id + b + "; a generated trace: raise serve.trace.rate or lower serve.trace.count");
    }
    if (r.prompt + r.output > max_context)
      throw ConfigError(id + ": prompt_tokens + output_tokens = " + std::to_string(r.prompt + r.output) +
                        " exceeds the model's context of " + std::to_string(max_context) +
                        " tokens (model.seq, vLLM's max_model_len)");
  }
}

}  // namespace shardsim::serving

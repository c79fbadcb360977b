// Request traces for `shardsim serve` (issue 50): each request arrives at ARRIVAL_S seconds (simulated clock) with
// a prompt of PROMPT tokens and asks for OUTPUT tokens. From a file (CSV or JSONL, as Vidur's and vLLM's benchmark
// traces hold them: arrival time, prompt tokens, output tokens) or generated (Poisson or fixed-rate arrivals, seeded
// length distributions).
//
// Files (by extension: .csv, else .jsonl / .json lines):
//   CSV   a header naming the columns arrival_s, prompt_tokens, output_tokens (any order, other columns ignored),
//         then one request per record.
//   JSONL one object per non-empty line with those three keys (other keys ignored).
// A key given twice in one JSONL object, or a CSV header naming one of the three columns twice, is refused: readers
// disagree on which value wins. A file is at most 1 GiB, a line at most 64 KiB, checked before any parsing.
// Checks (ConfigError, exit 2, one line "FILE:LINE: ..." naming the field; untrusted text escaped): a missing or
// non-numeric field, a negative arrival or one past kMaxArrivalS, arrivals out of order, prompt_tokens < 1,
// output_tokens < 1, a length above kMaxTokens, prompt + output above the model's context (MAX_CONTEXT), an empty
// trace. A UTF-8 byte-order mark before a CSV header (spreadsheets write one) is skipped.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace shardsim::serving {

inline constexpr int64_t kMaxTokens = int64_t(1) << 24;   // 16M tokens: beyond any model's context
inline constexpr int64_t kMaxRequests = int64_t(1) << 22;  // 4M requests per trace
// The latest arrival, in seconds (about 11.6 days): every simulated time stays finite and exact to well under a
// nanosecond (1e6 s = 1e15 ns, a double's step there is 0.125 ns); 1e308 printed inf and NaN latencies.
inline constexpr double kMaxArrivalS = 1e6;
// A generated trace's rate, requests per second (serve.trace.rate, a sweep's rate axis).
inline constexpr double kMinRate = 1e-6, kMaxRate = 1e9;

struct Request {
  int64_t id = 0;  // 0-based, in arrival order
  double arrival_s = 0;
  int64_t prompt = 0;
  int64_t output = 0;
  // Disaggregated decode (serving/scheduler.h): the request arrives with its prompt's keys and values already in
  // the cache (moved there from a prefill instance) and its first token made at FIRST_TOKEN_S; it decodes the rest.
  bool prefilled = false;
  double first_token_s = 0;
  // Where it came from, for messages (request_label): its 0-based position in the trace (ID may be renumbered per
  // replica) and its line in the trace file (0: a generated request).
  int64_t index = 0;
  int line = 0;
};

// A length distribution: fixed VALUE, or uniform integers in [LO, HI], or normal(MEAN, STD) rounded and clamped
// to [LO, HI] (kind "normal").
struct LengthDist {
  std::string kind = "fixed";  // fixed | uniform | normal
  int64_t value = 128;
  int64_t lo = 1, hi = 128;
  double mean = 128, std = 0;
};

struct TraceSpec {
  std::string arrival = "poisson";  // poisson | fixed | at_once (every request at t = 0: an offline benchmark)
  double rate = 1;                  // requests per second
  int64_t count = 100;
  uint64_t seed = 1;
  LengthDist prompt, output;
};

// The generated trace: arrivals every 1/rate s (fixed, the first at 0), with exponential gaps of mean 1/rate
// (poisson, the first at its first gap) or all at 0 (at_once: an offline benchmark's infinite rate), lengths drawn from the distributions; the same spec gives the same trace (std::mt19937_64 and
// inverse-transform sampling written here, independent of the standard library's distributions).
std::vector<Request> generate_trace(const TraceSpec& spec);
// The trace in FILE (see above).
std::vector<Request> load_trace(const std::string& file);
// "TRACE:LINE: request N" for a request read from the file TRACE, "TRACE: generated request N" for a generated one
// (TRACE then names the config's serve.trace; "generated request N" when TRACE is empty): every per-request
// message starts with it.
std::string request_label(const Request& r, const std::string& trace);
// The checks of a trace against the model's context (see above); WHERE names the trace in messages.
void check_trace(const std::vector<Request>& reqs, int64_t max_context, const std::string& where);

}  // namespace shardsim::serving

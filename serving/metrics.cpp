#include "serving/metrics.h"

#include <algorithm>
#include <cmath>
#include <charconv>
#include <cstdio>
#include <utility>

namespace shardsim::serving {

Percentiles percentiles(std::vector<double> v) {
  Percentiles p;
  p.count = int64_t(v.size());
  if (v.empty()) return p;
  std::sort(v.begin(), v.end());
  auto at = [&](double q) {
    const double x = q * double(v.size() - 1);
    const size_t i = size_t(std::floor(x));
    const double f = x - double(i);
    return i + 1 < v.size() ? v[i] + f * (v[i + 1] - v[i]) : v[i];
  };
  p.p50 = at(0.5);
  p.p90 = at(0.9);
  p.p99 = at(0.99);
  double s = 0;
  for (double x : v) s += x;
  p.mean = s / double(v.size());
  return p;
}

ServeMetrics summarise(const ServeRun& run, const Slo& slo, int chips) {
  ServeMetrics m;
  m.chips = chips;
  std::vector<double> ttft, tpot, e2e;
  double first = INFINITY, last = 0;
  for (const RequestResult& r : run.requests) {
    ++m.requests;
    m.output_tokens += r.output;
    m.prompt_tokens += r.prompt;
    const double t = r.first_token_s - r.arrival_s, e = r.finish_s - r.arrival_s;
    ttft.push_back(t);
    e2e.push_back(e);
    double tp = 0;
    if (r.output > 1) {
      tp = (e - t) / double(r.output - 1);
      tpot.push_back(tp);
    }
    // A request with one output token has no TPOT: it does not meet a TPOT SLO (nor miss it by a figure).
    if (r.output <= 1) ++m.no_tpot;
    if ((slo.ttft_s <= 0 || t <= slo.ttft_s) && (slo.tpot_s <= 0 || (r.output > 1 && tp <= slo.tpot_s))) ++m.slo_met;
    first = std::min(first, r.arrival_s);
    last = std::max(last, r.finish_s);
  }
  m.ttft = percentiles(ttft);
  m.tpot = percentiles(tpot);
  m.itl = percentiles(run.itl_s);
  m.e2e = percentiles(e2e);
  m.iterations = int64_t(run.iterations.size());
  m.preemptions = run.preemptions;
  m.swaps = run.swaps;
  m.duration_s = m.requests > 0 ? last - first : 0;
  if (m.duration_s > 0) {
    m.requests_per_s = double(m.requests) / m.duration_s;
    m.output_tokens_per_s = double(m.output_tokens) / m.duration_s;
    m.tokens_per_s = double(m.output_tokens + m.prompt_tokens) / m.duration_s;
    m.output_tokens_per_s_chip = m.output_tokens_per_s / double(chips);
    m.goodput_requests_per_s = double(m.slo_met) / m.duration_s;
  }
  double busy = 0;
  for (const IterationSample& s : run.iterations) {
    const double dt = s.end_s - s.start_s;
    busy += dt;
    m.mean_batch += dt * double(s.seqs);
    m.peak_batch = std::max(m.peak_batch, double(s.seqs));
    const double kv = run.kv_blocks_total > 0 ? double(s.kv_blocks) / double(run.kv_blocks_total) : 0;
    m.mean_kv += dt * kv;
    m.peak_kv = std::max(m.peak_kv, kv);
  }
  if (busy > 0) {
    m.mean_batch /= busy;
    m.mean_kv /= busy;
  }
  return m;
}

namespace {

// No sample (no request made a second token): the figures are undefined, null (not 0).
nlohmann::json pct(const Percentiles& p) {
  if (p.count == 0) return {{"p50", nullptr}, {"p90", nullptr}, {"p99", nullptr}, {"mean", nullptr}, {"count", 0}};
  return {{"p50", p.p50}, {"p90", p.p90}, {"p99", p.p99}, {"mean", p.mean}, {"count", p.count}};
}

}  // namespace

nlohmann::json metrics_json(const ServeMetrics& m) {
  return {{"ttft_s", pct(m.ttft)},
          {"tpot_s", pct(m.tpot)},
          {"itl_s", pct(m.itl)},
          {"e2e_s", pct(m.e2e)},
          {"requests", m.requests},
          {"prompt_tokens", m.prompt_tokens},
          {"output_tokens", m.output_tokens},
          {"iterations", m.iterations},
          {"preemptions", m.preemptions},
          {"swaps", m.swaps},
          {"duration_s", m.duration_s},
          {"requests_per_s", m.requests_per_s},
          {"output_tokens_per_s", m.output_tokens_per_s},
          {"tokens_per_s", m.tokens_per_s},
          {"output_tokens_per_s_per_chip", m.output_tokens_per_s_chip},
          {"slo_met", m.slo_met},
          {"goodput_requests_per_s", m.goodput_requests_per_s},
          {"batch_mean", m.mean_batch},
          {"batch_peak", m.peak_batch},
          {"kv_occupancy_mean", m.mean_kv},
          {"kv_occupancy_peak", m.peak_kv},
          {"chips", m.chips}};
}

nlohmann::json iterations_json(const ServeRun& run) {
  nlohmann::json a = nlohmann::json::array();
  for (const IterationSample& s : run.iterations)
    a.push_back({s.start_s, s.end_s, s.seqs, s.tokens, s.prefill_tokens, s.decode_seqs, s.kv_blocks, s.replica, s.engine});
  return a;
}

nlohmann::json requests_json(const ServeRun& run) {
  nlohmann::json a = nlohmann::json::array();
  for (const RequestResult& r : run.requests)
    a.push_back({r.arrival_s, r.first_token_s - r.arrival_s, r.finish_s - r.arrival_s, r.prompt, r.output,
                 r.preemptions});
  return a;
}

namespace {

// One event at a time into a buffer handed to SINK in pieces of about 1 MiB (SINK empty: bytes counted only), so
// writing a trace of millions of events takes no more host memory than the run itself.
class TraceSink {
 public:
  explicit TraceSink(std::function<void(std::string_view)> sink) : sink_(std::move(sink)) {}
  TraceSize finish() {
    put("]}\n");
    flush();
    return size_;
  }
  // One event: "{" + FIELDS + "}" (FIELDS: JSON members, numbers by num()), after ",\n" but for the first.
  void event(const std::string& fields) {
    if (size_.events++ > 0) put(",\n");
    put("{");
    put(fields);
    put("}");
  }
  void put(std::string_view s) {
    size_.bytes += double(s.size());
    if (!sink_) return;
    buf_ += s;
    if (buf_.size() >= (1u << 20)) flush();
  }

 private:
  void flush() {
    if (sink_ && !buf_.empty()) sink_(buf_);
    buf_.clear();
  }
  std::function<void(std::string_view)> sink_;
  std::string buf_;
  TraceSize size_;
};

// Shortest text that reads back as V (JSON numbers: V is finite here, simulated times and counts).
std::string num(double v) {
  char b[32];
  const auto r = std::to_chars(b, b + sizeof b, v);
  return std::string(b, r.ptr);
}
std::string num(int64_t v) { return std::to_string(v); }

void meta(TraceSink& t, int pid, const std::string& name) {
  t.event("\"ph\":\"M\",\"name\":\"process_name\",\"pid\":" + num(int64_t(pid)) + ",\"args\":{\"name\":\"" + name +
          "\"}");
}

void iteration_events(TraceSink& t, const IterationSample& s) {
  const char* name = s.prefill_tokens > 0 ? (s.decode_seqs > 0 ? "mixed" : "prefill") : "decode";
  t.event("\"ph\":\"X\",\"name\":\"" + std::string(name) + "\",\"cat\":\"iteration\",\"pid\":" +
          num(int64_t(s.replica)) + ",\"tid\":" + num(int64_t(s.engine)) + ",\"ts\":" + num(s.start_s * 1e6) +
          ",\"dur\":" + num((s.end_s - s.start_s) * 1e6) + ",\"args\":{\"seqs\":" + num(s.seqs) +
          ",\"tokens\":" + num(s.tokens) + ",\"prefill_tokens\":" + num(s.prefill_tokens) +
          ",\"decode_seqs\":" + num(s.decode_seqs) + ",\"kv_blocks\":" + num(s.kv_blocks) + "}");
  t.event("\"ph\":\"C\",\"name\":\"batch and KV cache\",\"pid\":" + num(int64_t(s.replica)) +
          ",\"ts\":" + num(s.start_s * 1e6) + ",\"args\":{\"seqs\":" + num(s.seqs) +
          ",\"kv_blocks\":" + num(s.kv_blocks) + "}");
}

// An async span of request I (process PID) from A to B seconds: a begin and an end event.
void request_span(TraceSink& t, const char* name, size_t i, const RequestResult& r, int pid, double a, double b) {
  const std::string head = "\"name\":\"" + std::string(name) + "\",\"cat\":\"request\",\"id\":" +
                           num(int64_t(i)) + ",\"pid\":" + num(int64_t(pid)) + ",\"ts\":";
  t.event("\"ph\":\"b\"," + head + num(a * 1e6));
  t.event("\"ph\":\"e\"," + head + num(b * 1e6) + ",\"args\":{\"request\":" + num(int64_t(i)) +
          ",\"prompt\":" + num(r.prompt) + ",\"output\":" + num(r.output) +
          ",\"preemptions\":" + num(int64_t(r.preemptions)) + "}");
}

}  // namespace

TraceSize write_trace(const ServeRun& run, const TraceWindow& w, const std::function<void(std::string_view)>& sink) {
  TraceSink t(sink);
  t.put("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[");
  int replicas = 1;
  for (const IterationSample& s : run.iterations) replicas = std::max(replicas, s.replica + 1);
  for (int r = 0; r < replicas; ++r) meta(t, r, "replica " + std::to_string(r));
  meta(t, replicas, "requests");
  for (const IterationSample& s : run.iterations)
    if (w.keeps(s.start_s, s.end_s)) iteration_events(t, s);
  for (size_t i = 0; i < run.requests.size(); ++i) {
    const RequestResult& r = run.requests[i];
    if (w.keeps(r.arrival_s, r.first_token_s)) request_span(t, "to first token", i, r, replicas, r.arrival_s, r.first_token_s);
    if (r.finish_s > r.first_token_s && w.keeps(r.first_token_s, r.finish_s))
      request_span(t, "decode", i, r, replicas, r.first_token_s, r.finish_s);
  }
  return t.finish();
}

TraceSize trace_size_at_least(const std::vector<Request>& requests, const TraceWindow& w) {
  // The events every run of REQUESTS writes, each with its shortest times (0) and no preemption.
  TraceSink t(nullptr);
  t.put("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[");
  meta(t, 0, "replica 0");
  meta(t, 1, "requests");
  int64_t iterations = 0;  // each of a request's output tokens after the first is made by its own iteration
  for (const Request& q : requests) {
    RequestResult r;
    r.prompt = q.prompt;
    r.output = q.output;
    const bool windowed = w.from_s > 0 || std::isfinite(w.to_s);
    if (q.arrival_s >= w.from_s && q.arrival_s <= w.to_s)
      request_span(t, "to first token", size_t(q.id), r, 1, 0, 0);
    if (!windowed && q.output > 1) request_span(t, "decode", size_t(q.id), r, 1, 0, 0);
    if (!windowed) iterations = std::max(iterations, q.output - 1);
  }
  TraceSize n = t.finish();
  TraceSink one(nullptr);  // every such iteration writes the same bytes: one, times their number
  one.put(",\n");         // an event's separator
  iteration_events(one, IterationSample{});
  const TraceSize each = one.finish();
  n.events += iterations * (each.events);
  n.bytes += double(iterations) * (each.bytes - 3);  // less one's "]}\n"
  return n;
}

std::string metrics_text(const ServeMetrics& m, const Slo& slo) {
  std::string out;
  char b[256];
  auto row = [&](const char* name, const Percentiles& p, double scale, const char* unit) {
    if (p.count == 0)  // no request has a second token: undefined, not 0 (the JSON says count 0)
      std::snprintf(b, sizeof b, "  %-5s n/a (no request made a second token)\n", name);
    else
      std::snprintf(b, sizeof b, "  %-5s p50 %10.3f  p90 %10.3f  p99 %10.3f  mean %10.3f %s\n", name, p.p50 * scale,
                    p.p90 * scale, p.p99 * scale, p.mean * scale, unit);
    out += b;
  };
  row("TTFT", m.ttft, 1e3, "ms");
  row("TPOT", m.tpot, 1e3, "ms");
  row("ITL", m.itl, 1e3, "ms");
  row("e2e", m.e2e, 1, "s");
  // Fixed decimals, or three significant digits for a rate they would print as 0 (1e-6 requests/s is not 0.000).
  const auto rate = [](double v, int decimals) {
    char t[48];
    if (v != 0 && std::fabs(v) < 0.1) std::snprintf(t, sizeof t, "%.3g", v);
    else std::snprintf(t, sizeof t, "%.*f", decimals, v);
    return std::string(t);
  };
  out += "  throughput: " + rate(m.requests_per_s, 3) + " requests/s, " + rate(m.output_tokens_per_s, 1) +
         " output tokens/s (" + rate(m.output_tokens_per_s_chip, 1) + " per chip), " + rate(m.tokens_per_s, 1) +
         " tokens/s in+out over " + rate(m.duration_s, 3) + " s\n";
  char t[64] = "any", p[64] = "any";
  if (slo.ttft_s > 0) std::snprintf(t, sizeof t, "%g ms", slo.ttft_s * 1e3);
  if (slo.tpot_s > 0) std::snprintf(p, sizeof p, "%g ms", slo.tpot_s * 1e3);
  std::snprintf(b, sizeof b, "  goodput: %s requests/s (%lld of %lld within TTFT <= %s and TPOT <= %s",
                rate(m.goodput_requests_per_s, 3).c_str(), (long long)m.slo_met, (long long)m.requests, t, p);
  out += b;
  if (slo.tpot_s > 0 && m.no_tpot > 0) {
    std::snprintf(b, sizeof b, "; %lld with one output token have no TPOT and do not count", (long long)m.no_tpot);
    out += b;
  }
  out += ")\n";
  std::snprintf(b, sizeof b, "  batch: mean %.1f, peak %.0f sequences; KV cache occupancy mean %.1f %%, peak %.1f %%; %lld iterations, %lld preemptions (%lld by swap)\n",
                m.mean_batch, m.peak_batch, 100 * m.mean_kv, 100 * m.peak_kv, (long long)m.iterations,
                (long long)m.preemptions, (long long)m.swaps);
  out += b;
  return out;
}

}  // namespace shardsim::serving

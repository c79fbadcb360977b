#include "serving/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

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
    if ((slo.ttft_s <= 0 || t <= slo.ttft_s) && (slo.tpot_s <= 0 || tp <= slo.tpot_s)) ++m.slo_met;
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

nlohmann::json pct(const Percentiles& p) {
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

nlohmann::json trace_json(const ServeRun& run) {
  nlohmann::json ev = nlohmann::json::array();
  int replicas = 1;
  for (const IterationSample& s : run.iterations) replicas = std::max(replicas, s.replica + 1);
  auto meta = [&](int pid, const std::string& name) {
    ev.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", pid}, {"args", {{"name", name}}}});
  };
  for (int r = 0; r < replicas; ++r) meta(r, "replica " + std::to_string(r));
  meta(replicas, "requests");
  for (const IterationSample& s : run.iterations) {
    const std::string name = s.prefill_tokens > 0 ? (s.decode_seqs > 0 ? "mixed" : "prefill") : "decode";
    ev.push_back({{"ph", "X"}, {"name", name}, {"cat", "iteration"}, {"pid", s.replica}, {"tid", s.engine},
                  {"ts", s.start_s * 1e6}, {"dur", (s.end_s - s.start_s) * 1e6},
                  {"args", {{"seqs", s.seqs}, {"tokens", s.tokens}, {"prefill_tokens", s.prefill_tokens},
                            {"decode_seqs", s.decode_seqs}, {"kv_blocks", s.kv_blocks}}}});
    ev.push_back({{"ph", "C"}, {"name", "batch and KV cache"}, {"pid", s.replica}, {"ts", s.start_s * 1e6},
                  {"args", {{"seqs", s.seqs}, {"kv_blocks", s.kv_blocks}}}});
  }
  for (size_t i = 0; i < run.requests.size(); ++i) {
    const RequestResult& r = run.requests[i];
    auto span = [&](const char* name, double a, double b) {
      ev.push_back({{"ph", "b"}, {"name", name}, {"cat", "request"}, {"id", i}, {"pid", replicas}, {"ts", a * 1e6}});
      ev.push_back({{"ph", "e"}, {"name", name}, {"cat", "request"}, {"id", i}, {"pid", replicas}, {"ts", b * 1e6},
                    {"args", {{"request", i}, {"prompt", r.prompt}, {"output", r.output}, {"preemptions", r.preemptions}}}});
    };
    span("to first token", r.arrival_s, r.first_token_s);
    if (r.finish_s > r.first_token_s) span("decode", r.first_token_s, r.finish_s);
  }
  return {{"traceEvents", std::move(ev)}, {"displayTimeUnit", "ms"}};
}

std::string metrics_text(const ServeMetrics& m, const Slo& slo) {
  std::string out;
  char b[256];
  auto row = [&](const char* name, const Percentiles& p, double scale, const char* unit) {
    std::snprintf(b, sizeof b, "  %-5s p50 %10.3f  p90 %10.3f  p99 %10.3f  mean %10.3f %s\n", name, p.p50 * scale,
                  p.p90 * scale, p.p99 * scale, p.mean * scale, unit);
    out += b;
  };
  row("TTFT", m.ttft, 1e3, "ms");
  row("TPOT", m.tpot, 1e3, "ms");
  row("ITL", m.itl, 1e3, "ms");
  row("e2e", m.e2e, 1, "s");
  std::snprintf(b, sizeof b, "  throughput: %.3f requests/s, %.1f output tokens/s (%.1f per chip), %.1f tokens/s in+out over %.3f s\n",
                m.requests_per_s, m.output_tokens_per_s, m.output_tokens_per_s_chip, m.tokens_per_s, m.duration_s);
  out += b;
  char t[64] = "any", p[64] = "any";
  if (slo.ttft_s > 0) std::snprintf(t, sizeof t, "%g ms", slo.ttft_s * 1e3);
  if (slo.tpot_s > 0) std::snprintf(p, sizeof p, "%g ms", slo.tpot_s * 1e3);
  std::snprintf(b, sizeof b, "  goodput: %.3f requests/s (%lld of %lld within TTFT <= %s and TPOT <= %s)\n",
                m.goodput_requests_per_s, (long long)m.slo_met, (long long)m.requests, t, p);
  out += b;
  std::snprintf(b, sizeof b, "  batch: mean %.1f, peak %.0f sequences; KV cache occupancy mean %.1f %%, peak %.1f %%; %lld iterations, %lld preemptions (%lld by swap)\n",
                m.mean_batch, m.peak_batch, 100 * m.mean_kv, 100 * m.peak_kv, (long long)m.iterations,
                (long long)m.preemptions, (long long)m.swaps);
  out += b;
  return out;
}

}  // namespace shardsim::serving

// Serving metrics (issue 50), as vLLM's and TensorRT-LLM's benchmarks define them:
//   TTFT  first token time − arrival
//   TPOT  (e2e − TTFT) / (output tokens − 1), per request with more than one output token
//   ITL   every gap between consecutive tokens of one request
//   e2e   finish − arrival
// percentiles p50 / p90 / p99 (linear interpolation between order statistics, numpy's default) and the mean;
// throughput over the run's duration (last finish − first arrival): requests/s, output tokens/s, total tokens/s,
// output tokens/s per chip; goodput (DistServe, Zhong et al. OSDI 2024): requests/s finished within both SLOs
// (TTFT <= slo.ttft_s and TPOT <= slo.tpot_s; an SLO of 0 is not checked; a request with one output token has no
// TPOT and does not meet a TPOT SLO); a percentile without samples is null in JSON and "n/a" in text (not 0);
// batch size and KV cache occupancy
// over the iterations (time-weighted means and peaks).
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "serving/scheduler.h"

namespace shardsim::serving {

struct Percentiles {
  double p50 = 0, p90 = 0, p99 = 0, mean = 0;
  int64_t count = 0;
};
// Of V (empty: zeros).
Percentiles percentiles(std::vector<double> v);

struct Slo {
  double ttft_s = 0, tpot_s = 0;  // 0: not checked
};

struct ServeMetrics {
  Percentiles ttft, tpot, itl, e2e;
  int64_t requests = 0, output_tokens = 0, prompt_tokens = 0, iterations = 0, preemptions = 0, swaps = 0, slo_met = 0,
          no_tpot = 0;  // requests with one output token (no TPOT)
  double duration_s = 0, requests_per_s = 0, output_tokens_per_s = 0, tokens_per_s = 0, output_tokens_per_s_chip = 0,
         goodput_requests_per_s = 0;
  double mean_batch = 0, peak_batch = 0, mean_kv = 0, peak_kv = 0;  // kv: fraction of the cache's blocks
  int chips = 1;
};

ServeMetrics summarise(const ServeRun& run, const Slo& slo, int chips);
nlohmann::json metrics_json(const ServeMetrics& m);
// The iterations' time series: [[start_s, end_s, seqs, tokens, prefill_tokens, decode_seqs, kv_blocks, replica,
// engine], ...].
nlohmann::json iterations_json(const ServeRun& run);
// Per request: [[arrival_s, ttft_s, e2e_s, prompt, output, preemptions], ...].
nlohmann::json requests_json(const ServeRun& run);
// The Chrome / Perfetto trace (JSON, microseconds of simulated time) `serve --trace` writes: per dp replica a
// process whose threads are its virtual engines, one slice per iteration (prefill, decode or mixed; its batch in
// args) and a counter of the batch size and the KV cache blocks held; a "requests" process with two async spans per
// request (arrival to first token, first token to finish). W keeps the iterations and spans that overlap
// [from_s, to_s] (`--trace-window`, simulated seconds here). The text goes to SINK in pieces of about 1 MiB, event
// by event, so host memory stays bounded whatever the run's size; an empty SINK only counts. Returns the events
// (process names included) and the bytes written.
struct TraceWindow {
  double from_s = 0, to_s = std::numeric_limits<double>::infinity();
  bool keeps(double a, double b) const { return b >= from_s && a <= to_s; }
};
struct TraceSize {
  int64_t events = 0;
  double bytes = 0;
};
TraceSize write_trace(const ServeRun& run, const TraceWindow& w, const std::function<void(std::string_view)>& sink);
// A lower bound of write_trace's size for any run of REQUESTS, known before the run: each request's spans that W
// surely keeps (both without a window, the first when it arrives in it) and, without a window, the iterations its
// longest output needs (one per token after the first), every time written as 0.
TraceSize trace_size_at_least(const std::vector<Request>& requests, const TraceWindow& w);
std::string metrics_text(const ServeMetrics& m, const Slo& slo);

}  // namespace shardsim::serving

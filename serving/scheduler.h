// The serving scheduler (issue 50): requests arrive on the simulated clock, a batching policy forms each
// iteration's batch, the caller's ITERATION function simulates that batch on the chips (the executor's serve_step)
// and returns its simulated time, and the clock advances by it. Policies:
//   static      (FasterTransformer-style request-level batching): when nothing runs, up to max_num_seqs waiting
//               requests are admitted together, prefilled in one iteration and decoded until the last finishes;
//               nothing new joins meanwhile.
//   continuous  (Orca, Yu et al. OSDI 2022; vLLM's default scheduler): iteration-level; waiting requests are
//               admitted as soon as the cache and max_num_seqs allow, their whole prompts prefilled in an iteration
//               of their own (at most max_num_batched_tokens tokens), otherwise every running sequence decodes one
//               token.
//   chunked     (Sarathi-Serve, Agrawal et al. OSDI 2024, arXiv 2403.02310; vLLM's chunked prefill): one token
//               budget (max_num_batched_tokens) per iteration: every decoding sequence's token first, then chunks of
//               the prompts in progress and of newly admitted requests fill the rest (stall-free batching).
// The KV cache (kv_cache.h) grows a sequence block by block before each iteration; when a decode finds no free
// block the latest admitted running sequence is preempted by recompute (vLLM's default: its blocks freed, it
// returns to the front of the queue and later prefills its prompt and the tokens generated so far again).
// Token timing: a sequence's next token exists at the end of the iteration that brings its cache up to all its
// known tokens (the prompt's last chunk, or a decode step); its first token's time minus its arrival is its TTFT.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "serving/kv_cache.h"
#include "serving/requests.h"

namespace shardsim::serving {

enum class Policy { static_batch, continuous, chunked };
Policy parse_policy(const std::string& s);  // "static" | "continuous" | "chunked"; std::invalid_argument else
const char* policy_name(Policy p);

struct SchedulerConfig {
  Policy policy = Policy::continuous;
  int64_t max_num_seqs = 256;             // vLLM's default max_num_seqs
  int64_t max_num_batched_tokens = 8192;  // tokens per iteration (chunked: the Sarathi token budget)
};

// One sequence of an iteration: its request, the tokens already in its cache, its new tokens.
struct BatchEntry {
  int64_t request = 0;
  int64_t past = 0;
  int64_t rows = 1;
};
// The simulated time of one iteration (seconds).
using IterationFn = std::function<double(const std::vector<BatchEntry>&)>;

struct RequestResult {
  double arrival_s = 0, first_token_s = 0, finish_s = 0;
  int64_t prompt = 0, output = 0;
  int preemptions = 0;
};

struct IterationSample {
  double start_s = 0, end_s = 0;
  int64_t seqs = 0, tokens = 0, prefill_tokens = 0, decode_seqs = 0;
  int64_t kv_blocks = 0;  // blocks held during the iteration
};

struct ServeRun {
  std::vector<RequestResult> requests;  // by request id
  std::vector<double> itl_s;            // every inter-token gap of every request
  std::vector<IterationSample> iterations;
  int64_t preemptions = 0;
  int64_t kv_blocks_total = 0;
};

// The whole trace through POLICY on CACHE. std::invalid_argument when a request cannot fit the cache alone
// (naming it and the capacity).
ServeRun simulate(const std::vector<Request>& reqs, const SchedulerConfig& cfg, PagedKvCache& cache,
                  const IterationFn& iteration);

}  // namespace shardsim::serving

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
// block the latest admitted running sequence is preempted (vLLM's policy), by
//   recompute  (vLLM's default): its blocks freed, it returns to the front of the queue and later prefills its
//              prompt and the tokens generated so far again;
//   swap       (vLLM's preemption_mode "swap"): its blocks are copied to host memory over the host link, freed, and
//              copied back when it is admitted again (then it decodes on). A copy takes tokens x swap_s_per_token
//              (the chips copy their own shards in parallel) on its chip's host link, a resource of its own (a
//              copy engine, as vLLM's cache engine's cache_stream): copies queue there in the order they are made; a copy out
//              starts at its iteration's start and overlaps its compute (the iteration ends no earlier than it:
//              the freed blocks take the iteration's new tokens), a copy in delays only the compute of the
//              iteration that needs it. Host memory holds swap_blocks blocks per chip (vLLM's swap_space); with
//              shards (ep chips) each has its own host memory and link, a sequence's on its chip; a sequence that
//              does not fit there is recomputed.
// Disaggregated decode (Request::prefilled): a request arrives with its prompt's cache (from a prefill instance)
// and its first token made; on admission it takes the blocks of its prompt and decodes from there (under
// continuous batching such admissions join the running sequences' decode step; so do sequences swapped back in).
// Token timing: a sequence's next token exists at the end of the iteration that brings its cache up to all its
// known tokens (the prompt's last chunk, or a decode step); its first token's time minus its arrival is its TTFT.
//
// Pipeline parallelism (ENGINES > 1, as vLLM's virtual engines, one per pipeline stage): each engine has its own
// queue, running set and 1/ENGINES of the cache's blocks; an arriving request goes to the engine with the fewest
// unfinished requests (the lowest index on a tie), and an engine forms its next batch when its previous one has
// left the last stage, so up to ENGINES batches are in flight. A batch's timing is its run alone through the
// pipeline (STAGES: each stage's [start, end] from the batch's start, simulated on the chips); batches in flight
// are composed stage by stage: a stage runs one batch at a time, in launch order, and a batch reaches stage s+1
// the alone run's hop after leaving stage s. With one engine and one stage this is the plain loop: each iteration
// starts when the previous one ends.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "serving/kv_cache.h"
#include "serving/requests.h"

namespace shardsim::inline common {
class ConfigNode;
}

namespace shardsim::serving {

enum class Policy { static_batch, continuous, chunked };
Policy parse_policy(const std::string& s);  // "static" | "continuous" | "chunked"; std::invalid_argument else
const char* policy_name(Policy p);

struct SchedulerConfig {
  Policy policy = Policy::continuous;
  int64_t max_num_seqs = 256;             // vLLM's default max_num_seqs
  int64_t max_num_batched_tokens = 8192;  // tokens per iteration (chunked: the Sarathi token budget)
  int engines = 1;                        // virtual engines: batches in flight through a pipeline (see above)
  bool swap = false;                      // preemption by swap (else recompute)
  double swap_s_per_token = 0;            // seconds to copy one token's KV cache shard over the host link
  int64_t swap_blocks = 0;                // host memory for swapped blocks (each engine, per cache shard)
  std::string trace;                      // the trace's name in per-request messages (request_label)
};

// The batching settings of N, a config's `serve:` section or a sweep's `batching:` entry, into SCHED: policy
// (continuous), max_num_seqs (1..2^20, 256), max_num_batched_tokens (1..2^24, 8192) and preemption (recompute |
// swap); keys N lacks keep SCHED's values. ConfigError naming N's key and line (exit 2).
void read_batching(const ConfigNode& n, SchedulerConfig& sched);
// The limits SCHED's policy could not honour, refused as vLLM refuses them (ConfigError naming N's
// max_num_batched_tokens with its line, and the policy's or max_num_seqs' origin when another line or a --set gave
// it): with static or continuous batching a whole prompt is prefilled in one iteration, so max_num_batched_tokens
// must hold the longest sequence (MAX_CONTEXT, model.seq: vLLM's max_model_len, without chunked prefill), and
// every running sequence decodes a token per iteration, so it must hold max_num_seqs. Chunked batching honours any
// budget (a prompt in chunks, decodes within the budget).
void check_batching(const ConfigNode& n, const SchedulerConfig& sched, int64_t max_context);

// One sequence of an iteration: its request, the tokens already in its cache, its new tokens.
struct BatchEntry {
  int64_t request = 0;
  int64_t past = 0;
  int64_t rows = 1;
};
// The simulated time of one iteration (seconds).
using IterationFn = std::function<double(const std::vector<BatchEntry>&)>;
// One batch alone through the pipeline: per stage, when it starts and ends, seconds from the batch's start (stage
// 0 starts at 0; the last stage's end is when its tokens exist).
struct StageSpan {
  double start_s = 0, end_s = 0;
};
// START_S: when the batch starts at stage 0 on the simulated clock (a caller simulating on a shared timeline
// places it there; the spans stay relative to it).
using StageFn = std::function<std::vector<StageSpan>(const std::vector<BatchEntry>&, double start_s)>;

struct RequestResult {
  double arrival_s = 0, first_token_s = 0, finish_s = 0;
  int64_t prompt = 0, output = 0;
  int preemptions = 0;
};

struct IterationSample {
  double start_s = 0, end_s = 0;  // the first stage's start, the last stage's end
  int engine = 0;                 // the virtual engine (0 without pipelining)
  int replica = 0;                // the data-parallel replica (`serve` sets it; the scheduler runs one)
  int64_t seqs = 0, tokens = 0, prefill_tokens = 0, decode_seqs = 0;
  int64_t kv_blocks = 0;  // blocks held during the iteration (every engine's)
  int64_t swapped_tokens = 0;  // tokens it copied over the host links (out and in)
};

struct ServeRun {
  std::vector<RequestResult> requests;  // by request id
  std::vector<double> itl_s;            // every inter-token gap of every request
  std::vector<IterationSample> iterations;
  int64_t preemptions = 0, swaps = 0;  // swaps: preemptions by swap (their copies back included in the iterations)
  int64_t kv_blocks_total = 0;  // every engine's
};

// The scheduler stepped by its caller (a load balancer over replicas, apps/serve.cpp): REQS are every request
// that may arrive (by id); arrive(id) hands one over at its arrival_s, after run_until(arrival_s) ran every batch
// that starts before it. simulate_pipeline is: for each request in order, run_until(arrival), arrive; finish.
class Simulation {
 public:
  Simulation(const std::vector<Request>& reqs, const SchedulerConfig& cfg, PagedKvCache& cache, StageFn stages);
  ~Simulation();
  Simulation(const Simulation&) = delete;
  Simulation& operator=(const Simulation&) = delete;
  void run_until(double t);  // every batch whose engine may start it before T (its effects at its end)
  void arrive(int64_t id);
  // A disaggregated decode's arrival (Request::prefilled): request ID's prompt cache arrives at ARRIVAL_S with its
  // first token made at FIRST_TOKEN_S (<= ARRIVAL_S; std::invalid_argument else); then arrive(id).
  void arrive_prefilled(int64_t id, double arrival_s, double first_token_s);
  // Stepping one batch at a time (a caller ordering several schedulers' batches in time): when the next batch's
  // engine may form it (+infinity when no engine has work), and that batch run; the requests whose last token it
  // made (in batch order).
  double next_ready() const;
  void step();
  const std::vector<int64_t>& finished_last() const;
  double last_end() const;  // the latest batch's end (its tokens' time; 0 before any)
  // The tokens the unfinished requests handed over still put through the model (prompt + output less what their
  // caches hold), as of the end of each engine's latest batch.
  int64_t outstanding_tokens() const;
  ServeRun finish();  // runs until every request handed over is done; the results (requests never handed over
                      // keep their arrival and lengths, no times)
 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The whole trace through POLICY on CACHE, one engine, each iteration taking ITERATION's time after the previous
// one. std::invalid_argument when a request cannot fit the cache alone (naming it and the capacity).
ServeRun simulate(const std::vector<Request>& reqs, const SchedulerConfig& cfg, PagedKvCache& cache,
                  const IterationFn& iteration);
// The same over CFG.engines virtual engines through a pipeline (see above); with more than one engine each gets
// 1/engines of CACHE's blocks (CACHE itself then stays unused), as vLLM divides them.
ServeRun simulate_pipeline(const std::vector<Request>& reqs, const SchedulerConfig& cfg, PagedKvCache& cache,
                           const StageFn& stages);

}  // namespace shardsim::serving

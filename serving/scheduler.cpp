#include "serving/scheduler.h"

#include <algorithm>
#include <cstdint>
#include <deque>
#include <limits>
#include <memory>
#include <stdexcept>
#include <utility>

#include "common/config.h"
#include "common/error.h"

namespace shardsim::serving {

Policy parse_policy(const std::string& s) {
  if (s == "static") return Policy::static_batch;
  if (s == "continuous") return Policy::continuous;
  if (s == "chunked") return Policy::chunked;
  throw std::invalid_argument("'" + s + "' is not a batching policy (static, continuous, chunked)");
}

void read_batching(const ConfigNode& n, SchedulerConfig& sched) {
  if (n.has("policy")) {
    try {
      sched.policy = parse_policy(n.get_string("policy"));
    } catch (const std::invalid_argument& e) {
      n.child("policy").fail(n.path() + ".policy: " + e.what());
    }
  }
  sched.max_num_seqs = n.get_int_in("max_num_seqs", 1, 1 << 20, sched.max_num_seqs);
  sched.max_num_batched_tokens = n.get_int_in("max_num_batched_tokens", 1, 1 << 24, sched.max_num_batched_tokens);
  if (n.has("preemption")) {
    const std::string pre = n.get_string("preemption");
    if (pre != "recompute" && pre != "swap") n.child("preemption").fail(n.path() + ".preemption: '" + pre + "' (recompute | swap)");
    sched.swap = pre == "swap";
  }
}

void check_batching(const ConfigNode& n, const SchedulerConfig& s, int64_t max_context) {
  if (s.policy == Policy::chunked) return;
  const std::string key = n.path() + ".max_num_batched_tokens", given = std::to_string(s.max_num_batched_tokens);
  auto where = [&](const char* k) { return n.has(k) ? " (" + n.child(k).where() + ")" : std::string(" (the default)"); };
  const std::string policy = "policy " + std::string(policy_name(s.policy)) + where("policy");
  auto fail = [&](const std::string& what) {
    const std::string m = key + ": " + given + what;
    if (n.has("max_num_batched_tokens")) n.child("max_num_batched_tokens").fail(m);
    n.fail(m + " (max_num_batched_tokens not given: its default)");
  };
  if (s.policy == Policy::continuous && s.max_num_batched_tokens < max_context)  // static: per request (Simulation)
    fail(" is below the model's context of " + std::to_string(max_context) + " tokens (model.seq, vLLM's max_model_len): " +
         policy + " prefills a whole prompt in one iteration and cannot keep to it; raise it to " +
         std::to_string(max_context) + " or use policy chunked (vLLM refuses this too)");
  if (s.max_num_batched_tokens < s.max_num_seqs)
    fail(" is below max_num_seqs " + std::to_string(s.max_num_seqs) + where("max_num_seqs") + ": " + policy +
         " decodes a token of every running sequence per iteration; raise it to " + std::to_string(s.max_num_seqs) +
         " or lower max_num_seqs (vLLM refuses this too)");
}

const char* policy_name(Policy p) {
  switch (p) {
    case Policy::static_batch: return "static";
    case Policy::continuous: return "continuous";
    case Policy::chunked: return "chunked";
  }
  return "?";
}

namespace {

struct Seq {
  int64_t cached = 0, generated = 0;
  double last_token_s = 0;
  bool swapped = false;  // preempted by swap: CACHED tokens in host memory
};

// Shared by the engines: the requests, the sequences' progress and the results.
struct State {
  std::vector<Request> reqs;  // a copy: a disaggregated decode's arrivals are set as they come (arrive_prefilled)
  std::vector<Seq> seqs;
  ServeRun run;
  size_t done = 0;
  std::vector<int64_t> finished;  // the requests the latest iteration finished
  int64_t known(int64_t id) const { return reqs[size_t(id)].prompt + seqs[size_t(id)].generated; }
};

// One engine: its queue, its running sequences, its cache; forms batches by the policy.
class Engine {
 public:
  Engine(State& st, const SchedulerConfig& cfg, PagedKvCache& cache) : st_(st), cfg_(cfg), cache_(cache) {}

  bool busy() const { return !running_.empty() || !waiting_.empty(); }
  // The tokens its unfinished requests still put through the model: prompt and output less what their caches hold.
  int64_t outstanding_tokens() const {
    int64_t n = 0;
    for (int64_t id : waiting_) n += remaining(id);
    for (int64_t id : running_) n += remaining(id);
    return n;
  }
  int64_t unfinished() const { return int64_t(running_.size() + waiting_.size()); }
  void enqueue(int64_t id) { waiting_.push_back(id); }
  const PagedKvCache& cache() const { return cache_; }

  std::vector<BatchEntry> form() {
    std::vector<BatchEntry> batch;
    int64_t budget = cfg_.max_num_batched_tokens, unlimited = INT64_MAX;
    switch (cfg_.policy) {
      case Policy::static_batch:  // requests while their prompts fit the budget (TensorRT-LLM's max_num_tokens)
        if (running_.empty())
          admit(batch, budget, false);
        else
          decodes(batch, unlimited);
        break;
      case Policy::continuous: {
        const size_t before = running_.size();
        admit(batch, budget, false);
        // Admissions that are single-token decodes (a disaggregated decode's arrivals, swapped sequences back)
        // join the running sequences' decode step; prompts run in an iteration of their own.
        const bool prompts = std::any_of(batch.begin(), batch.end(), [](const BatchEntry& e) { return e.past == 0 || e.rows > 1; });
        if (!prompts) decodes(batch, unlimited, before);
        break;
      }
      case Policy::chunked:
        decodes(batch, budget);
        for (size_t i = 0; i < running_.size() && budget > 0; ++i) {  // prompts in progress
          const int64_t id = running_[i];
          Seq& q = st_.seqs[size_t(id)];
          const int64_t want = st_.known(id) - q.cached;
          if (want <= 1) continue;
          const int64_t rows = std::min(want, budget);
          if (!make_room(id, q.cached + rows, false)) break;
          batch.push_back({id, q.cached, rows});
          budget -= rows;
        }
        admit(batch, budget, true);
        break;
    }
    return batch;
  }

  void advance(const std::vector<BatchEntry>& batch, double now) {
    for (const BatchEntry& e : batch) {
      Seq& q = st_.seqs[size_t(e.request)];
      q.cached += e.rows;
      if (q.cached != st_.known(e.request)) continue;  // a prompt chunk: no token yet
      ++q.generated;
      RequestResult& o = st_.run.requests[size_t(e.request)];
      if (q.generated == 1)
        o.first_token_s = now;
      else
        st_.run.itl_s.push_back(now - q.last_token_s);
      q.last_token_s = now;
      if (q.generated == st_.reqs[size_t(e.request)].output) {
        o.finish_s = now;
        st_.finished.push_back(e.request);
        cache_.release(e.request);
        running_.erase(std::find(running_.begin(), running_.end(), e.request));
        ++st_.done;
      }
    }
  }

  // Tokens copied over each shard's host link since the last call (swaps out, swaps in), per shard.
  std::vector<int64_t> take_swapped_out() { return std::exchange(out_, std::vector<int64_t>(shards(), 0)); }
  std::vector<int64_t> take_swapped_in() { return std::exchange(in_, std::vector<int64_t>(shards(), 0)); }

 private:
  // Preempts the latest admitted running sequence (by swap when configured and host memory has room, else by
  // recompute); false when none but SELF is left.
  bool preempt_one(int64_t self) {
    for (auto it = running_.rbegin(); it != running_.rend(); ++it) {
      if (*it == self) continue;
      const int64_t v = *it;
      running_.erase(std::next(it).base());
      Seq& q = st_.seqs[size_t(v)];
      const int64_t blocks = cache_.blocks_for(q.cached);
      cache_.release(v);
      const size_t sh = shard(v);
      if (cfg_.swap && q.cached > 0 && host_blocks_[sh] + blocks <= cfg_.swap_blocks) {
        q.swapped = true;  // its cached tokens wait in its chip's host memory
        host_blocks_[sh] += blocks;
        out_[sh] += q.cached;
        ++st_.run.swaps;
      } else {
        q.cached = 0;
      }
      ++st_.run.requests[size_t(v)].preemptions;
      ++st_.run.preemptions;
      waiting_.push_front(v);
      return true;
    }
    return false;
  }

  // A swapped sequence admitted again: its tokens come back from host memory.
  void swap_in(int64_t id) {
    Seq& q = st_.seqs[size_t(id)];
    if (!q.swapped) return;
    q.swapped = false;
    host_blocks_[shard(id)] -= cache_.blocks_for(q.cached);
    in_[shard(id)] += q.cached;
  }

  // Grows ID's cache to TOKENS, preempting others when needed; false when even that cannot make room.
  bool make_room(int64_t id, int64_t tokens, bool may_preempt) {
    while (!cache_.can_grow(id, tokens))
      if (!may_preempt || !preempt_one(id)) return false;
    cache_.grow(id, tokens);
    return true;
  }

  // Admits waiting requests with their whole remaining prompt (CHUNK false) or a chunk within BUDGET.
  void admit(std::vector<BatchEntry>& batch, int64_t& budget, bool chunk) {
    while (!waiting_.empty() && int64_t(running_.size()) < cfg_.max_num_seqs && budget > 0) {
      const int64_t id = waiting_.front();
      const int64_t want = st_.known(id) - st_.seqs[size_t(id)].cached;
      int64_t rows = chunk ? std::min(want, budget) : want;
      if (!chunk && rows > budget && !batch.empty()) break;
      if (!make_room(id, st_.seqs[size_t(id)].cached + rows, false)) break;
      waiting_.pop_front();
      running_.push_back(id);
      swap_in(id);
      batch.push_back({id, st_.seqs[size_t(id)].cached, rows});
      budget -= rows;
    }
  }

  // Every running sequence that has a token to decode (KNOWN - CACHED == 1), within BUDGET.
  // UPTO: only the first UPTO running sequences (those admitted before this iteration).
  void decodes(std::vector<BatchEntry>& batch, int64_t& budget, size_t upto = SIZE_MAX) {
    for (size_t i = 0; i < std::min(upto, running_.size()) && budget > 0; ++i) {
      const int64_t id = running_[i];
      Seq& q = st_.seqs[size_t(id)];
      if (st_.known(id) - q.cached != 1) continue;
      if (!make_room(id, q.cached + 1, true))  // alone and still no room: cannot happen (checked at start)
        throw std::logic_error("serving scheduler: a sequence does not fit the cache alone");
      batch.push_back({id, q.cached, 1});
      --budget;
    }
    // A preemption may have removed a sequence already in the batch: keep the running ones only.
    std::erase_if(batch, [&](const BatchEntry& e) { return std::find(running_.begin(), running_.end(), e.request) == running_.end(); });
  }

  int64_t remaining(int64_t id) const {
    const Request& r = st_.reqs[size_t(id)];
    return r.prompt + r.output - st_.seqs[size_t(id)].cached;
  }

  State& st_;
  const SchedulerConfig& cfg_;
  PagedKvCache& cache_;
  std::deque<int64_t> waiting_;
  std::vector<int64_t> running_;
  // Per shard (the ep chip holding a sequence, kv_cache.h): host memory in use, tokens copied out and in.
  size_t shards() const { return size_t(cache_.capacity().shards); }
  size_t shard(int64_t id) const { return size_t(id % int64_t(shards())); }
  std::vector<int64_t> host_blocks_ = std::vector<int64_t>(shards(), 0), out_ = host_blocks_, in_ = host_blocks_;
};

}  // namespace

struct Simulation::Impl {
  Impl(const std::vector<Request>& reqs, const SchedulerConfig& cfg, PagedKvCache& cache, StageFn stages)
      : cfg(cfg), stages(std::move(stages)), st{reqs, std::vector<Seq>(reqs.size()), {}, 0, {}} {
    if (cfg.engines < 1) throw std::invalid_argument("serving scheduler: engines must be >= 1");
    if (cfg.policy != Policy::chunked && cfg.max_num_batched_tokens < cfg.max_num_seqs)  // check_batching's rule
      throw std::invalid_argument("serving scheduler: max_num_batched_tokens below max_num_seqs: every running "
                                  "sequence's decode would not fit an iteration");
    // The engines' caches: CACHE itself for one engine, else 1/engines of its blocks each (as vLLM divides them).
    KvCapacity share = cache.capacity();
    share.blocks /= cfg.engines;
    if (cfg.engines > 1) owned.assign(size_t(cfg.engines), PagedKvCache(share));
    for (int e = 0; e < cfg.engines; ++e) engines.emplace_back(st, this->cfg, cfg.engines > 1 ? owned[size_t(e)] : cache);
    const KvCapacity& per = engines[0].cache().capacity();
    st.run.requests.resize(reqs.size());
    st.run.kv_blocks_total = per.blocks * cfg.engines;
    for (const Request& r : reqs) {
      auto& o = st.run.requests[size_t(r.id)];
      o.arrival_s = r.arrival_s;
      o.prompt = r.prompt;
      o.output = r.output;
      if (r.prefilled) prefilled(r.id);
      if (engines[0].cache().blocks_for(r.prompt + r.output) > per.shard_blocks())
        throw ConfigError(request_label(r, cfg.trace) + ": needs " + std::to_string(r.prompt + r.output) +
                                    " tokens of KV cache, more than " +
                                    (cfg.engines > 1 ? "an engine's share" : per.shards > 1 ? "a chip's share" : "its capacity") +
                                    " of " + std::to_string(per.shard_blocks() * per.block_size) + " tokens");
      // Static and continuous batching prefill a whole prompt in one iteration (after a preemption by recompute,
      // the prompt and every output token but the last): it must fit the token budget, never exceed it silently.
      if (cfg.policy != Policy::chunked && r.prompt + r.output - 1 > cfg.max_num_batched_tokens)
        throw ConfigError(request_label(r, cfg.trace) + ": prompt_tokens + output_tokens - 1 = " +
                          std::to_string(r.prompt + r.output - 1) + " tokens may be prefilled in one iteration (" +
                          "recomputed after a preemption), more than max_num_batched_tokens " +
                          std::to_string(cfg.max_num_batched_tokens) + ": policy " + policy_name(cfg.policy) +
                          " prefills whole prompts; raise max_num_batched_tokens or use policy chunked");
    }
    ready.assign(size_t(cfg.engines), 0.0);
  }

  // Request ID's prompt cache arrives with it, its first token made already (disaggregated decode).
  void prefilled(int64_t id) {
    const Request& r = st.reqs[size_t(id)];
    auto& o = st.run.requests[size_t(id)];
    o.arrival_s = r.arrival_s;
    Seq& q = st.seqs[size_t(id)];
    q.cached = r.prompt;
    q.generated = 1;
    q.last_token_s = o.first_token_s = r.first_token_s;
    if (r.first_token_s > r.arrival_s)
      throw std::invalid_argument(request_label(r, cfg.trace) + ": its first token (" +
                                  std::to_string(r.first_token_s) + " s) is later than its cache's arrival");
  }

  // The busy engine that may form its next batch first (-1: none busy).
  int next_engine() const {
    int pick = -1;
    for (int e = 0; e < cfg.engines; ++e)
      if (engines[size_t(e)].busy() && (pick < 0 || ready[size_t(e)] < ready[size_t(pick)])) pick = e;
    return pick;
  }

  void arrive(int64_t id) {
    const Request& r = st.reqs[size_t(id)];
    if (r.prefilled && r.output <= 1) {  // nothing left to decode
      st.run.requests[size_t(id)].finish_s = r.first_token_s;
      ++st.done;
      return;
    }
    // The arrival goes to the engine with the fewest unfinished requests (vLLM's choice; the lowest on a tie).
    int to = 0;
    for (int e = 1; e < cfg.engines; ++e)
      if (engines[size_t(e)].unfinished() < engines[size_t(to)].unfinished()) to = e;
    if (!engines[size_t(to)].busy()) ready[size_t(to)] = std::max(ready[size_t(to)], r.arrival_s);
    engines[size_t(to)].enqueue(id);
  }

  // Engine PICK's next batch through the pipeline.
  void iterate(int pick) {
    Engine& en = engines[size_t(pick)];
    st.finished.clear();
    std::vector<BatchEntry> batch = en.form();
    if (batch.empty()) throw std::logic_error("serving scheduler: no progress possible");
    IterationSample s;
    s.engine = pick;
    for (const Engine& x : engines) s.kv_blocks += x.cache().used_blocks();
    for (const auto& e : batch) {
      s.tokens += e.rows;
      if (st.known(e.request) - e.past == 1)
        ++s.decode_seqs;
      else
        s.prefill_tokens += e.rows;
    }
    s.seqs = int64_t(batch.size());
    // The swap copies, on each chip's host link (its own copy engine, as vLLM's cache engine's stream), in the order the
    // scheduler made them: the copies out from this batch's start, overlapping its compute (it ends no earlier
    // than they do: their blocks take its new tokens), then the copies in, which its compute waits for.
    const std::vector<int64_t> out = en.take_swapped_out(), in = en.take_swapped_in();
    const double r0 = ready[size_t(pick)];
    double at = r0, copies_out = r0;
    host_free.resize(std::max(host_free.size(), out.size()), 0.0);
    for (size_t k = 0; k < out.size(); ++k) {
      s.swapped_tokens += out[k] + in[k];
      if (out[k] + in[k] == 0) continue;
      double t = std::max(r0, host_free[k]) + double(out[k]) * cfg.swap_s_per_token;
      copies_out = std::max(copies_out, t);
      t += double(in[k]) * cfg.swap_s_per_token;
      if (in[k] > 0) at = std::max(at, t);
      host_free[k] = t;
    }
    double end = at;
    const std::vector<StageSpan> sp = stages(batch, std::max(at, stage_free.empty() ? 0.0 : stage_free[0]));
    if (sp.empty()) throw std::logic_error("serving scheduler: an iteration without stages");
    stage_free.resize(std::max(stage_free.size(), sp.size()), 0.0);
    // Stage by stage: each runs one batch at a time; the batch reaches stage k+1 the alone run's hop after stage k.
    for (size_t k = 0; k < sp.size(); ++k) {
      const double arrive = k == 0 ? at : end + (sp[k].start_s - sp[k - 1].end_s);
      const double start = std::max(arrive, stage_free[k]);
      if (k == 0) s.start_s = start;
      end = start + (sp[k].end_s - sp[k].start_s);
      stage_free[k] = end;
    }
    s.end_s = end = std::max(end, copies_out);
    st.run.iterations.push_back(s);
    en.advance(batch, end);
    ready[size_t(pick)] = end;
  }

  const SchedulerConfig cfg;
  const StageFn stages;
  State st;
  std::vector<PagedKvCache> owned;
  std::vector<Engine> engines;
  std::vector<double> ready;       // when each engine may form its next batch
  std::vector<double> stage_free;  // when each pipeline stage is free
  std::vector<double> host_free;   // when each shard's host link is free (swap copies)
};

Simulation::Simulation(const std::vector<Request>& reqs, const SchedulerConfig& cfg, PagedKvCache& cache, StageFn stages)
    : impl_(std::make_unique<Impl>(reqs, cfg, cache, std::move(stages))) {}
Simulation::~Simulation() = default;

void Simulation::run_until(double t) {
  for (int pick = impl_->next_engine(); pick >= 0 && impl_->ready[size_t(pick)] < t; pick = impl_->next_engine())
    impl_->iterate(pick);
}

void Simulation::arrive(int64_t id) { impl_->arrive(id); }

void Simulation::arrive_prefilled(int64_t id, double arrival_s, double first_token_s) {
  Request& r = impl_->st.reqs.at(size_t(id));
  r.prefilled = true;
  r.arrival_s = arrival_s;
  r.first_token_s = first_token_s;
  impl_->prefilled(id);
  impl_->arrive(id);
}

double Simulation::next_ready() const {
  const int pick = impl_->next_engine();
  return pick < 0 ? std::numeric_limits<double>::infinity() : impl_->ready[size_t(pick)];
}

void Simulation::step() {
  const int pick = impl_->next_engine();
  if (pick < 0) throw std::logic_error("serving scheduler: step() with no work");
  impl_->iterate(pick);
}

const std::vector<int64_t>& Simulation::finished_last() const { return impl_->st.finished; }

double Simulation::last_end() const {
  return impl_->st.run.iterations.empty() ? 0.0 : impl_->st.run.iterations.back().end_s;
}

int64_t Simulation::outstanding_tokens() const {
  int64_t n = 0;
  for (const Engine& e : impl_->engines) n += e.outstanding_tokens();
  return n;
}

ServeRun Simulation::finish() {
  for (int pick = impl_->next_engine(); pick >= 0; pick = impl_->next_engine()) impl_->iterate(pick);
  return std::move(impl_->st.run);
}

namespace {

ServeRun run_engines(const std::vector<Request>& reqs, const SchedulerConfig& cfg, PagedKvCache& cache,
                     const StageFn& stages) {
  Simulation sim(reqs, cfg, cache, stages);
  for (const Request& r : reqs) {
    sim.run_until(r.arrival_s);
    sim.arrive(r.id);
  }
  return sim.finish();
}

}  // namespace

ServeRun simulate(const std::vector<Request>& reqs, const SchedulerConfig& cfg, PagedKvCache& cache,
                  const IterationFn& iteration) {
  SchedulerConfig one = cfg;
  one.engines = 1;
  return run_engines(reqs, one, cache, [&](const std::vector<BatchEntry>& b, double) {
    return std::vector<StageSpan>{{0.0, iteration(b)}};
  });
}

ServeRun simulate_pipeline(const std::vector<Request>& reqs, const SchedulerConfig& cfg, PagedKvCache& cache,
                           const StageFn& stages) {
  return run_engines(reqs, cfg, cache, stages);
}

}  // namespace shardsim::serving

#include "serving/scheduler.h"

#include <algorithm>
#include <cstdint>
#include <deque>
#include <stdexcept>

namespace shardsim::serving {

Policy parse_policy(const std::string& s) {
  if (s == "static") return Policy::static_batch;
  if (s == "continuous") return Policy::continuous;
  if (s == "chunked") return Policy::chunked;
  throw std::invalid_argument("'" + s + "' is not a batching policy (static, continuous, chunked)");
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
};

class Sim {
 public:
  Sim(const std::vector<Request>& reqs, const SchedulerConfig& cfg, PagedKvCache& cache)
      : reqs_(reqs), cfg_(cfg), cache_(cache), seqs_(reqs.size()) {
    run_.requests.resize(reqs.size());
    run_.kv_blocks_total = cache.capacity().blocks;
    for (const Request& r : reqs) {
      auto& o = run_.requests[size_t(r.id)];
      o.arrival_s = r.arrival_s;
      o.prompt = r.prompt;
      o.output = r.output;
      if (cache.blocks_for(r.prompt + r.output) > cache.capacity().blocks)
        throw std::invalid_argument("request " + std::to_string(r.id) + " needs " +
                                    std::to_string(r.prompt + r.output) + " tokens of KV cache, more than its capacity of " +
                                    std::to_string(cache.capacity().tokens()) + " tokens");
    }
  }

  ServeRun run(const IterationFn& iteration) {
    size_t next = 0;
    double now = 0;
    while (done_ < reqs_.size()) {
      while (next < reqs_.size() && reqs_[next].arrival_s <= now) waiting_.push_back(reqs_[next++].id);
      if (running_.empty() && waiting_.empty()) {
        now = reqs_[next].arrival_s;
        continue;
      }
      std::vector<BatchEntry> batch = form();
      if (batch.empty()) throw std::logic_error("serving scheduler: no progress possible");
      IterationSample s;
      s.start_s = now;
      s.kv_blocks = cache_.used_blocks();
      for (const auto& e : batch) {
        s.tokens += e.rows;
        if (known(e.request) - e.past == 1)
          ++s.decode_seqs;
        else
          s.prefill_tokens += e.rows;
      }
      s.seqs = int64_t(batch.size());
      now += iteration(batch);
      s.end_s = now;
      run_.iterations.push_back(s);
      advance(batch, now);
    }
    return std::move(run_);
  }

 private:
  int64_t known(int64_t id) const { return reqs_[size_t(id)].prompt + seqs_[size_t(id)].generated; }

  // Preempts the latest admitted running sequence (recompute); false when none but SELF is left.
  bool preempt_one(int64_t self) {
    for (auto it = running_.rbegin(); it != running_.rend(); ++it) {
      if (*it == self) continue;
      const int64_t v = *it;
      running_.erase(std::next(it).base());
      cache_.release(v);
      seqs_[size_t(v)].cached = 0;
      ++run_.requests[size_t(v)].preemptions;
      ++run_.preemptions;
      waiting_.push_front(v);
      return true;
    }
    return false;
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
      const int64_t want = known(id) - seqs_[size_t(id)].cached;
      int64_t rows = chunk ? std::min(want, budget) : want;
      if (!chunk && rows > budget && !batch.empty()) break;
      if (!make_room(id, seqs_[size_t(id)].cached + rows, false)) break;
      waiting_.pop_front();
      running_.push_back(id);
      batch.push_back({id, seqs_[size_t(id)].cached, rows});
      budget -= rows;
    }
  }

  // Every running sequence that has a token to decode (KNOWN - CACHED == 1), within BUDGET.
  void decodes(std::vector<BatchEntry>& batch, int64_t& budget) {
    for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
      const int64_t id = running_[i];
      Seq& q = seqs_[size_t(id)];
      if (known(id) - q.cached != 1) continue;
      if (!make_room(id, q.cached + 1, true)) {  // alone and still no room: cannot happen (checked at start)
        throw std::logic_error("serving scheduler: a sequence does not fit the cache alone");
      }
      batch.push_back({id, q.cached, 1});
      --budget;
    }
    // A preemption may have removed a sequence already in the batch: keep the running ones only.
    std::erase_if(batch, [&](const BatchEntry& e) { return std::find(running_.begin(), running_.end(), e.request) == running_.end(); });
  }

  std::vector<BatchEntry> form() {
    std::vector<BatchEntry> batch;
    int64_t budget = cfg_.max_num_batched_tokens;
    switch (cfg_.policy) {
      case Policy::static_batch: {
        if (running_.empty()) {
          int64_t unlimited = INT64_MAX;
          admit(batch, unlimited, false);
          return batch;
        }
        int64_t unlimited = INT64_MAX;
        decodes(batch, unlimited);
        return batch;
      }
      case Policy::continuous: {
        admit(batch, budget, false);
        if (!batch.empty()) return batch;
        int64_t unlimited = INT64_MAX;
        decodes(batch, unlimited);
        return batch;
      }
      case Policy::chunked: {
        decodes(batch, budget);
        for (size_t i = 0; i < running_.size() && budget > 0; ++i) {  // prompts in progress
          const int64_t id = running_[i];
          Seq& q = seqs_[size_t(id)];
          const int64_t want = known(id) - q.cached;
          if (want <= 1) continue;
          const int64_t rows = std::min(want, budget);
          if (!make_room(id, q.cached + rows, false)) break;
          batch.push_back({id, q.cached, rows});
          budget -= rows;
        }
        admit(batch, budget, true);
        return batch;
      }
    }
    return batch;
  }

  void advance(const std::vector<BatchEntry>& batch, double now) {
    for (const BatchEntry& e : batch) {
      Seq& q = seqs_[size_t(e.request)];
      q.cached += e.rows;
      if (q.cached != known(e.request)) continue;  // a prompt chunk: no token yet
      ++q.generated;
      RequestResult& o = run_.requests[size_t(e.request)];
      if (q.generated == 1)
        o.first_token_s = now;
      else
        run_.itl_s.push_back(now - q.last_token_s);
      q.last_token_s = now;
      if (q.generated == reqs_[size_t(e.request)].output) {
        o.finish_s = now;
        cache_.release(e.request);
        running_.erase(std::find(running_.begin(), running_.end(), e.request));
        ++done_;
      }
    }
  }

  const std::vector<Request>& reqs_;
  const SchedulerConfig& cfg_;
  PagedKvCache& cache_;
  std::vector<Seq> seqs_;
  std::deque<int64_t> waiting_;
  std::vector<int64_t> running_;
  size_t done_ = 0;
  ServeRun run_;
};

}  // namespace

ServeRun simulate(const std::vector<Request>& reqs, const SchedulerConfig& cfg, PagedKvCache& cache,
                  const IterationFn& iteration) {
  Sim s(reqs, cfg, cache);
  return s.run(iteration);
}

}  // namespace shardsim::serving

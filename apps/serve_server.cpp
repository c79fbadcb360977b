// The `serve` command's machinery on one chip (apps/serve_server.h): the replicas' results gathered on every chip,
// the memoised batch stage, one replica's run, the colocated replicas and --profile's longest iteration.
#include <algorithm>
#include <cstdio>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "apps/serve_server.h"
#include "common/error.h"
#include "reporting/profile.h"
#include "reporting/report.h"

namespace shardsim::apps {

namespace serve_detail {

// V of every replica's first chip, concatenated in replica order, on every chip (SPMD over WORLD).
std::vector<double> gather_lead(runtime::Transport& world, int dp, int replica, bool lead, const std::vector<double>& v,
                                const char* what) {
  std::vector<double> n(size_t(dp), 0.0);
  if (lead) n[size_t(replica)] = double(v.size());
  world.allreduce(std::span<double>(n), runtime::Reduce::sum, std::string("serve replicas: ") + what + " sizes");
  size_t off = 0, total = 0;
  for (int r = 0; r < dp; ++r) {
    if (r < replica) off += size_t(n[size_t(r)]);
    total += size_t(n[size_t(r)]);
  }
  std::vector<double> all(total, 0.0);
  if (lead) std::copy(v.begin(), v.end(), all.begin() + std::ptrdiff_t(off));
  world.allreduce(std::span<double>(all), runtime::Reduce::sum, std::string("serve replicas: ") + what);
  return all;
}

// The replicas' runs as one (requests by their global id GLOBAL_ID, iterations in start order with their replica).
serving::ServeRun gather_replicas(runtime::Transport& world, int dp, int replica, bool lead, const serving::ServeRun& run,
                                  const std::vector<int64_t>& global_id, size_t requests) {
  std::vector<double> rq, it;
  for (size_t i = 0; i < run.requests.size(); ++i) {
    const auto& r = run.requests[i];
    rq.insert(rq.end(), {double(global_id[i]), r.arrival_s, r.first_token_s, r.finish_s, double(r.prompt),
                         double(r.output), double(r.preemptions)});
  }
  for (const auto& x : run.iterations)
    it.insert(it.end(), {x.start_s, x.end_s, double(x.engine), double(replica), double(x.seqs), double(x.tokens),
                         double(x.prefill_tokens), double(x.decode_seqs), double(x.kv_blocks), double(x.swapped_tokens)});
  const std::vector<double> R = gather_lead(world, dp, replica, lead, rq, "requests");
  const std::vector<double> I = gather_lead(world, dp, replica, lead, it, "iterations");
  serving::ServeRun out;
  out.itl_s = gather_lead(world, dp, replica, lead, run.itl_s, "inter-token gaps");
  std::vector<double> kv{double(run.kv_blocks_total)};
  world.allreduce(std::span<double>(kv), runtime::Reduce::max, "serve replicas: cache blocks");
  out.kv_blocks_total = int64_t(kv[0]);
  std::vector<double> sw{lead ? double(run.swaps) : 0.0};
  world.allreduce(std::span<double>(sw), runtime::Reduce::sum, "serve replicas: swaps");
  out.swaps = int64_t(sw[0]);
  out.requests.resize(requests);
  for (size_t i = 0; i + 7 <= R.size(); i += 7) {
    auto& r = out.requests.at(size_t(R[i]));
    r = {R[i + 1], R[i + 2], R[i + 3], int64_t(R[i + 4]), int64_t(R[i + 5]), int(R[i + 6])};
    out.preemptions += r.preemptions;
  }
  for (size_t i = 0; i + 10 <= I.size(); i += 10)
    out.iterations.push_back({I[i], I[i + 1], int(I[i + 2]), int(I[i + 3]), int64_t(I[i + 4]), int64_t(I[i + 5]),
                              int64_t(I[i + 6]), int64_t(I[i + 7]), int64_t(I[i + 8]), int64_t(I[i + 9])});
  std::stable_sort(out.iterations.begin(), out.iterations.end(),
                   [](const auto& a, const auto& b) { return a.start_s < b.start_s; });
  return out;
}

std::vector<int64_t> Server::shape_key(const std::vector<serving::BatchEntry>& batch) {
  std::vector<int64_t> key;
  key.reserve(batch.size() * 2);
  for (const auto& b : batch) {
    key.push_back(b.past);
    key.push_back(b.rows);
  }
  return key;
}

void Server::note_longest(const std::vector<serving::BatchEntry>& batch, double end_s) {
  if (end_s <= longest_s) return;
  longest_s = end_s;
  longest = batch;
}

bool Server::graphed(const std::vector<serving::BatchEntry>& batch) const {
  if (int64_t(batch.size()) > graph_max) return false;
  return std::all_of(batch.begin(), batch.end(), [](const serving::BatchEntry& b) { return b.rows == 1; });
}

void Server::set_launch_mode(bool graph) {
  if (graph == graph_now) return;
  sim::DeviceSpec d = tl.device();
  d.cuda_graph = graph;
  tl = sim::Timeline(tl.chip(), tl.topology(), d);  // the executor and the transports hold this object
  tl.set_keep_events(false);
  graph_now = graph;
}

serving::StageFn Server::stage_fn() {
  return [this](const std::vector<serving::BatchEntry>& batch, double) -> const std::vector<serving::StageSpan>& {
    std::vector<int64_t> key = shape_key(batch);
    auto it = memo.find(key);
    if (it != memo.end()) return it->second;
    set_launch_mode(graphed(batch));
    models::LmServeBatch mb;
    mb.repeat_blocks = true;  // exact (models/lm_tp.h LmServeBatch)
    for (const auto& b : batch) mb.seqs.push_back({b.request, b.past, b.rows});
    std::vector<serving::StageSpan> st;
    for (const sim::Span& sp : exec.serve_step(mb, kv).stages) st.push_back({sp.start * 1e-9, sp.end * 1e-9});
    ++simulated;
    if (!st.empty()) note_longest(batch, st.back().end_s);
    return memo.emplace(std::move(key), std::move(st)).first->second;
  };
}

serving::ServeRun Server::run_replica(const std::vector<serving::Request>& mine) {
  serving::ServeRun run;
  world.agree([&] {
    try {
      if (mine.empty()) return;
      serving::PagedKvCache paged(cap);
      run = serving::simulate_pipeline(mine, sched, paged, stage_fn());
    } catch (const std::invalid_argument& e) {
      throw UsageError(config_name + ": " + e.what());
    }
  });
  return run;
}

// Colocated, LEAST_TOKENS: each request, at its arrival, to the replica with the fewest outstanding tokens (the
// lowest on a tie; every replica's scheduler stepped to the arrival, serving::Simulation), as SGLang's and
// vLLM's production routers balance by load; else request i on replica i mod dp (round-robin). Each replica
// prefills and decodes its own.
serving::ServeRun Server::colocated(const std::vector<serving::Request>& reqs, bool least_tokens) {
  if (least_tokens) {
    serving::ServeRun run;
    std::vector<int64_t> mine;
    world.agree([&] {
      try {
        serving::PagedKvCache paged(cap);
        serving::Simulation sim(reqs, sched, paged, stage_fn());
        for (const auto& r : reqs) {
          sim.run_until(r.arrival_s);
          std::vector<double> load(size_t(dp), 0.0);
          if (lead) load[size_t(replica)] = double(sim.outstanding_tokens());
          tp.allreduce(std::span<double>(load), runtime::Reduce::sum, "serve: replicas' outstanding tokens");
          const int to = int(std::min_element(load.begin(), load.end()) - load.begin());
          if (to != replica) continue;
          sim.arrive(r.id);
          mine.push_back(r.id);
        }
        run = sim.finish();
      } catch (const std::invalid_argument& e) {
        throw UsageError(config_name + ": " + e.what());
      }
    });
    serving::ServeRun sub = run;  // this replica's requests only (the others' are blank here)
    sub.requests.clear();
    for (const int64_t id : mine) sub.requests.push_back(run.requests[size_t(id)]);
    return gather_replicas(tp, dp, replica, lead, sub, mine, reqs.size());
  }
  std::vector<serving::Request> mine;
  std::vector<int64_t> global_id;
  for (const auto& r : reqs)
    if (r.id % dp == replica) {
      global_id.push_back(r.id);
      mine.push_back(r);
      mine.back().id = int64_t(mine.size()) - 1;
    }
  return gather_replicas(tp, dp, replica, lead, run_replica(mine), global_id, reqs.size());
}

// --profile: the run's longest iteration (the lowest replica's on a tie) simulated again with every block and
// its events recorded, profiled as `train --profile` profiles a step (reporting/profile.h). Collective.
std::shared_ptr<const sim::Profile> Server::profile_longest(double peak_tflops, std::string& what) {
  std::vector<double> v{longest_s};
  tp.allreduce(std::span<double>(v), runtime::Reduce::max, "serve profile: longest iteration");
  std::vector<double> who{longest_s == v[0] && lead ? double(replica) : 1e9};
  tp.allreduce(std::span<double>(who), runtime::Reduce::min, "serve profile: its replica");
  set_launch_mode(graphed(longest));
  tl.set_record_dependencies(true);
  tl.set_keep_events(true);
  tl.reset();
  int64_t tokens = 0;
  if (replica == int(who[0])) {
    models::LmServeBatch mb;
    for (const auto& b : longest) {
      mb.seqs.push_back({b.request, b.past, b.rows});
      tokens += b.rows;
    }
    (void)exec.serve_step(mb, kv);
  }
  reporting::RunReport rep;
  reporting::profile_and_trace(world, tl, {"", true, "", peak_tflops, {}, launch ? launch : &mesh}, rep);
  std::vector<double> shape{replica == int(who[0]) && lead ? double(longest.size()) : 0.0,
                            replica == int(who[0]) && lead ? double(tokens) : 0.0};
  tp.allreduce(std::span<double>(shape), runtime::Reduce::sum, "serve profile: its batch");
  char b[256];
  std::snprintf(b, sizeof b, "the longest iteration (replica %d, %.0f sequences, %.0f new tokens, %.3f ms)",
                int(who[0]), shape[0], shape[1], v[0] * 1e3);
  what = b;
  return rep.profile;
}

}  // namespace serve_detail

}  // namespace shardsim::apps

// `shardsim serve CONFIG`: inference serving on the modelled machine (issue 50; docs/SERVING.md). A request trace
// (serve.trace: a CSV/JSONL file or generated arrivals and lengths) goes through a batching scheduler
// (serving/scheduler.h: static, continuous, chunked prefill) over a paged KV cache whose capacity follows from HBM
// (serving/kv_cache.h); every iteration's batch runs through the executor's serving mode (models/lm_tp.h
// serve_step: the embedding, the block program with its KV-cache attention, the head and the tp logits gather) on
// the config's mesh, shape-only, and its simulated time advances the clock. Metrics: TTFT, TPOT, ITL, e2e
// percentiles, throughput, goodput under serve.slo, batch size and cache occupancy (serving/metrics.h).
// Each iteration simulates one block per pipeline stage and repeats its span for the stage's other blocks
// (LmServeBatch::repeat_blocks: exact, tested). Memoised: an iteration whose exact batch shape (each sequence's
// cached tokens and new tokens, in order) ran
// before takes that run's simulated time (the simulation is deterministic, so this changes no number).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <span>
#include <string>

#include <nlohmann/json.hpp>

#include "apps/cli_common.h"
#include "apps/commands.h"
#include "apps/train_setup.h"
#include "common/error.h"
#include "common/output_file.h"
#include "models/lm_tp.h"
#include "runtime/transport.h"
#include "serving/config_keys.h"
#include "serving/kv_cache.h"
#include "serving/metrics.h"
#include "serving/requests.h"
#include "serving/scheduler.h"
#include "sharding/device_mesh.h"

namespace shardsim::apps {

namespace {

using namespace train_detail;

struct ServeFlags {
  std::string config;
  std::string json_path, trace_path;
  std::string requests;  // --requests FILE: the trace instead of the config's
  sharding::ConfigOverrides overrides;
};

struct ServeSetup {
  serving::SchedulerConfig sched;
  serving::Slo slo;
  int64_t block_size = 16;
  double memory_fraction = 0.9;
  double swap_space_gib = 4;   // vLLM's swap_space per GPU
  double host_link_gbps = 64;  // PCIe 5.0 x16 per direction (H100 SXM's host link; an assumption for others)
  std::vector<serving::Request> requests;
  std::string trace_text;  // where the requests came from
};

// PARENT.KEY: a number (fixed) or {kind: fixed, value} | {kind: uniform, min, max} | {kind: normal, mean, std, min, max}.
serving::LengthDist length_dist(const ConfigNode& parent, const char* key) {
  serving::LengthDist d;
  const ConfigNode n = parent.child(key);
  if (!n.is_map()) {  // a number: fixed
    d.value = parent.get_int_in(key, 1, serving::kMaxTokens);
    return d;
  }
  n.expect_keys(serving::kServeLengthKeys);
  d.kind = n.get_string("kind", "fixed");
  if (d.kind == "fixed") {
    d.value = n.get_int_in("value", 1, serving::kMaxTokens);
  } else if (d.kind == "uniform" || d.kind == "normal") {
    d.lo = n.get_int_in("min", 1, serving::kMaxTokens);
    d.hi = n.get_int_in("max", d.lo, serving::kMaxTokens);
    if (d.kind == "normal") {
      d.mean = n.get_positive_double("mean");
      d.std = n.get_nonnegative_double("std", 0);
    }
  } else {
    n.child("kind").fail(n.path() + ".kind: '" + d.kind + "' (fixed | uniform | normal)");
  }
  return d;
}

ServeSetup parse_serve(const ConfigNode& root, const ServeFlags& f, int64_t max_context) {
  ServeSetup s;
  if (!root.has("serve")) root.fail("serve: missing (the serving section: trace, policy, cache, SLO; docs/SERVING.md)");
  const ConfigNode v = root.child("serve");
  v.expect_keys(serving::kServeKeys);
  try {
    s.sched.policy = serving::parse_policy(v.get_string("policy", "continuous"));
  } catch (const std::invalid_argument& e) {
    v.child("policy").fail(std::string("serve.policy: ") + e.what());
  }
  s.sched.max_num_seqs = v.get_int_in("max_num_seqs", 1, 1 << 20, 256);
  s.sched.max_num_batched_tokens = v.get_int_in("max_num_batched_tokens", 1, 1 << 24, 8192);
  s.block_size = v.get_int_in("block_size", 1, 1 << 16, 16);
  s.memory_fraction = v.get_double("memory_fraction", 0.9);
  if (!(s.memory_fraction > 0 && s.memory_fraction <= 1))
    v.child("memory_fraction").fail("serve.memory_fraction: must be in (0, 1] (got " + std::to_string(s.memory_fraction) + ")");
  const std::string pre = v.get_string("preemption", "recompute");
  if (pre != "recompute" && pre != "swap")
    v.child("preemption").fail("serve.preemption: '" + pre + "' (recompute | swap)");
  s.sched.swap = pre == "swap";
  s.swap_space_gib = v.get_nonnegative_double("swap_space_gib", 4);
  if (v.has("host_link_gbps")) s.host_link_gbps = v.get_positive_double("host_link_gbps");
  if (v.has("slo")) {
    const ConfigNode slo = v.child("slo");
    slo.expect_keys(serving::kServeSloKeys);
    s.slo.ttft_s = slo.get_nonnegative_double("ttft_ms", 0) * 1e-3;
    s.slo.tpot_s = slo.get_nonnegative_double("tpot_ms", 0) * 1e-3;
  }
  std::string file = f.requests;
  std::optional<ConfigNode> t = v.maybe_child("trace");
  if (file.empty() && t && t->has("file")) {
    t->expect_keys(serving::kServeTraceFileKeys);
    file = t->get_string("file");
    if (!file.empty() && file[0] != '/')
      file = (std::filesystem::path(root.file()).parent_path() / file).string();
  }
  if (!file.empty()) {
    s.requests = serving::load_trace(file);
    s.trace_text = "file " + file;
    serving::check_trace(s.requests, max_context, file);
    return s;
  }
  if (!t) v.fail("serve.trace: missing (a file: or generated arrivals: arrival, rate, count, seed, prompt, output)");
  t->expect_keys(serving::kServeTraceKeys);
  serving::TraceSpec g;
  g.arrival = t->get_string("arrival", "poisson");
  if (g.arrival != "poisson" && g.arrival != "fixed" && g.arrival != "at_once")
    t->child("arrival").fail("serve.trace.arrival: '" + g.arrival + "' (poisson | fixed | at_once)");
  if (g.arrival != "at_once" || t->has("rate")) g.rate = t->get_positive_double("rate");
  g.count = t->get_int_in("count", 1, serving::kMaxRequests);
  g.seed = uint64_t(t->get_int_in("seed", 0, INT64_MAX, 1));
  g.prompt = length_dist(*t, "prompt");
  g.output = length_dist(*t, "output");
  s.requests = serving::generate_trace(g);
  char b[256];
  if (g.arrival == "at_once")
    std::snprintf(b, sizeof b, "generated: %lld requests at once, seed %llu", (long long)g.count, (unsigned long long)g.seed);
  else
    std::snprintf(b, sizeof b, "generated: %s arrivals at %g requests/s, %lld requests, seed %llu", g.arrival.c_str(),
                  g.rate, (long long)g.count, (unsigned long long)g.seed);
  s.trace_text = b;
  serving::check_trace(s.requests, max_context, root.file() + " (serve.trace)");
  return s;
}

// One layer's forward working set at the largest iteration (N tokens) and the fp32 logits of SEQS rows, per chip:
// the activation peak vLLM profiles before sizing its cache (an estimate: the residual stream twice, q/k/v, the
// MLP's gate and up of this chip's heads and columns).
double activation_bytes(const models::LmConfig& local, int64_t N, int64_t seqs) {
  const double e = double(runtime::dtype_size(local.dtype));
  const double per_token = 2.0 * double(local.hidden) +
                           double((local.heads + 2 * local.kv_heads) * local.head_dim) + 2.0 * double(local.ffn);
  return double(N) * e * per_token + double(seqs) * double(local.vocab) * 4.0;
}

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

int run_serve(const runtime::World& world, const ServeFlags& sf) {
  TrainFlags f;
  f.config = sf.config;
  f.overrides = sf.overrides;
  f.shape_only = true;
  f.serve = true;
  TrainSetup s;
  ServeSetup sv;
  world.agree([&] {
    std::vector<std::pair<std::string, std::string>> outputs;
    if (!sf.json_path.empty()) outputs.emplace_back("--json", sf.json_path);
    if (!sf.trace_path.empty()) outputs.emplace_back("--trace", sf.trace_path);
    if (!outputs.empty()) check_outputs_distinct(outputs, {{"the config file", f.config}});
    s = load(f, world.size());
    sv = parse_serve(train_config(f), sf, s.model.seq);
  });
  const topology::Topology& topo = *s.topology;
  std::optional<sharding::DeviceMesh> mesh(run_mesh(world, s));
  sim::Timeline tl(mesh->placement().at(size_t(world.rank())), topo, s.device);
  tl.set_keep_events(false);  // the trace (--trace) is the scheduler's, not the kernels'

  runtime::Transport tp(world, tl, mesh->placement());
  tp.set_shape_only(true);
  tp.set_plan_algorithms(true);  // parallel.algorithm's rule, as train's (collectives::plan_algorithm)
  mesh->bind(tp);
  std::optional<models::LmTpTrainer> exec;
  std::optional<sharding::plans::KvCache> kv;
  serving::KvCapacity cap;
  models::LmConfig model = s.model;
  model.batch = s.plan.dp;  // the trainer's training layout (one sequence per replica) is unused in serving
  world.agree([&] {
    try {
      exec.emplace(model, s.train, *mesh, tp, tl, s.dp, s.sp, s.cp_zigzag, s.ulysses, s.fused);
      kv.emplace(exec->make_kv_cache(s.model.seq));
      (void)exec->serve_step({}, *kv);  // the serving plan's checks
    } catch (const std::invalid_argument& e) {
      throw UsageError(s.config_name + ": " + e.what());
    } catch (const ConfigKeyError& e) {  // a key the mesh's groups refuse: its FILE:LINE
      train_config(f).fail_at(e.key(), e.what());
    }
    const models::LmConfig& l = exec->local_config();
    const double e = double(runtime::dtype_size(l.dtype));
    const double weights = exec->local_param_count() * e;
    const double acts = activation_bytes(l, sv.sched.max_num_batched_tokens, sv.sched.max_num_seqs);
    const double per_token = 2.0 * double(l.layers) * double(l.kv_heads) * double(l.head_dim) * e;
    try {
      cap = serving::kv_capacity(s.device.hbm_bytes(), sv.memory_fraction, weights, acts, per_token, sv.block_size);
    } catch (const std::invalid_argument& err) {
      throw UsageError(s.config_name + ": serve.memory_fraction / block_size: the KV cache is too small: " + err.what());
    }
  });
  serving::PagedKvCache paged(cap);
  // dp replicas: request i goes to replica i mod dp (a round-robin load balancer); each replica's chips run its
  // own scheduler and batches. pp: one virtual engine per stage, so pp batches are in flight (serving/scheduler.h).
  const int dp = mesh->size("dp"), replica = mesh->coordinate("dp", mesh->rank());
  bool lead = true;  // the replica's first chip: its results go into the report
  for (const auto& a : mesh->axes())
    if (a.name != "dp" && mesh->coordinate(a.name, mesh->rank()) != 0) lead = false;
  std::vector<serving::Request> mine;
  std::vector<int64_t> global_id;
  for (const auto& r : sv.requests)
    if (r.id % dp == replica) {
      global_id.push_back(r.id);
      mine.push_back(r);
      mine.back().id = int64_t(mine.size()) - 1;
    }
  serving::SchedulerConfig sched = sv.sched;
  sched.engines = s.pp;
  sched.swap_s_per_token = cap.bytes_per_token / (sv.host_link_gbps * 1e9);
  sched.swap_blocks = int64_t(sv.swap_space_gib * double(1LL << 30) / (double(cap.block_size) * cap.bytes_per_token));
  std::map<std::vector<int64_t>, std::vector<serving::StageSpan>> memo;
  int64_t simulated = 0;
  const auto wall0 = std::chrono::steady_clock::now();
  serving::ServeRun run;
  world.agree([&] {
    try {
      if (mine.empty()) return;
      run = serving::simulate_pipeline(mine, sched, paged, [&](const std::vector<serving::BatchEntry>& batch) {
        std::vector<int64_t> key;
        key.reserve(batch.size() * 2);
        for (const auto& b : batch) {
          key.push_back(b.past);
          key.push_back(b.rows);
        }
        auto it = memo.find(key);
        if (it != memo.end()) return it->second;
        models::LmServeBatch mb;
        mb.repeat_blocks = true;  // exact (models/lm_tp.h LmServeBatch)
        for (const auto& b : batch) mb.seqs.push_back({b.request, b.past, b.rows});
        std::vector<serving::StageSpan> st;
        for (const sim::Span& sp : exec->serve_step(mb, *kv).stages) st.push_back({sp.start * 1e-9, sp.end * 1e-9});
        ++simulated;
        return memo.emplace(std::move(key), std::move(st)).first->second;
      });
    } catch (const std::invalid_argument& e) {
      throw UsageError(s.config_name + ": " + e.what());
    }
  });
  run = gather_replicas(tp, dp, replica, lead, run, global_id, sv.requests.size());
  {
    std::vector<double> n{double(simulated)};
    tp.allreduce(std::span<double>(n), runtime::Reduce::max, "serve simulated shapes");
    simulated = int64_t(n[0]);
  }
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  const serving::ServeMetrics m = serving::summarise(run, sv.slo, world.size());
  if (world.rank() == 0) {
    std::string out = "serve: " + (s.name.empty() ? s.config_name : s.name) + "\n";
    char b[512];
    std::snprintf(b, sizeof b, "  device %s, %d chips, plan tp=%d x pp=%d x dp=%d, model %lld layers, hidden %lld, %lld/%lld heads, %s\n",
                  s.device.name.c_str(), world.size(), s.tp, s.pp, dp, (long long)s.model.layers, (long long)s.model.hidden,
                  (long long)s.model.heads, (long long)s.model.kv_heads, runtime::dtype_name(s.model.dtype).c_str());
    out += b;
    std::snprintf(b, sizeof b, "  policy %s, max_num_seqs %lld, max_num_batched_tokens %lld, preemption by %s; trace %s\n",
                  serving::policy_name(sv.sched.policy), (long long)sv.sched.max_num_seqs,
                  (long long)sv.sched.max_num_batched_tokens, sv.sched.swap ? "swap" : "recompute", sv.trace_text.c_str());
    out += b;
    if (dp > 1 || s.pp > 1) {
      std::snprintf(b, sizeof b, "  %d replica%s (request i on replica i mod %d), %d batch%s in flight per replica (one "
                    "virtual engine per pipeline stage, %lld cache blocks each)\n", dp, dp > 1 ? "s" : "", dp, s.pp,
                    s.pp > 1 ? "es" : "", (long long)(cap.blocks / s.pp));
      out += b;
    }
    out += "  KV cache per chip: " + cap.formula() + "\n";
    out += serving::metrics_text(m, sv.slo);
    std::snprintf(b, sizeof b, "  simulated %lld distinct iteration shapes of %lld iterations (memoised by exact batch shape) in %.1f s wall\n",
                  (long long)simulated, (long long)m.iterations, wall);
    out += b;
    std::fputs(out.c_str(), stdout);
    if (!sf.json_path.empty()) {
      nlohmann::json j = {{"config", s.config_name},
                          {"device", s.device.name},
                          {"chips", world.size()},
                          {"tp", s.tp},
                          {"pp", s.pp},
                          {"dp", dp},
                          {"policy", serving::policy_name(sv.sched.policy)},
                          {"max_num_seqs", sv.sched.max_num_seqs},
                          {"max_num_batched_tokens", sv.sched.max_num_batched_tokens},
                          {"preemption", sv.sched.swap ? "swap" : "recompute"},
                          {"trace", sv.trace_text},
                          {"slo", {{"ttft_s", sv.slo.ttft_s}, {"tpot_s", sv.slo.tpot_s}}},
                          {"kv_cache",
                           {{"hbm_bytes", cap.hbm}, {"memory_fraction", cap.fraction}, {"weights_bytes", cap.weights},
                            {"activation_bytes", cap.activations}, {"bytes_per_token", cap.bytes_per_token},
                            {"block_size", cap.block_size}, {"blocks", cap.blocks}, {"tokens", cap.tokens()}}},
                          {"metrics", serving::metrics_json(m)},
                          {"iterations_simulated", simulated},
                          {"iterations", serving::iterations_json(run)},
                          {"requests", serving::requests_json(run)}};
      write_file_atomic(sf.json_path, j.dump(1) + "\n");
    }
    if (!sf.trace_path.empty()) write_file_atomic(sf.trace_path, serving::trace_json(run).dump() + "\n");
  }
  return kExitOk;
}

}  // namespace

Command add_serve(CLI::App& app, const runtime::World& world) {
  auto* sub = app.add_subcommand("serve", "inference serving: a request trace through a batching scheduler over a "
                                          "paged KV cache, every iteration simulated on the chips (TTFT, TPOT, "
                                          "throughput, goodput; docs/SERVING.md)");
  auto flags = std::make_shared<ServeFlags>();
  sub->add_option("config", flags->config, "serving YAML (configs/serve/)")->required();
  sub->add_option("--json", flags->json_path, "also write the report, the iterations and the requests as JSON");
  sub->add_option("--trace", flags->trace_path, "also write a Chrome / Perfetto trace of the iterations (per replica "
                                               "and engine), the batch and cache over time, and the requests");
  sub->add_option("--requests", flags->requests, "a request trace (CSV or JSONL) instead of the config's serve.trace");
  add_config_override_flags(sub, flags->overrides);
  return {sub, [&world, flags] { return run_serve(world, *flags); }};
}

}  // namespace shardsim::apps

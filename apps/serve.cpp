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
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "apps/cli_common.h"
#include "apps/commands.h"
#include "apps/train_setup.h"
#include "common/error.h"
#include "common/output_file.h"
#include "models/lm_tp.h"
#include "runtime/transport.h"
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
  n.expect_keys({"kind", "value", "min", "max", "mean", "std"});
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
  v.expect_keys({"policy", "max_num_seqs", "max_num_batched_tokens", "block_size", "memory_fraction", "slo", "trace"});
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
  if (v.has("slo")) {
    const ConfigNode slo = v.child("slo");
    slo.expect_keys({"ttft_ms", "tpot_ms"});
    s.slo.ttft_s = slo.get_nonnegative_double("ttft_ms", 0) * 1e-3;
    s.slo.tpot_s = slo.get_nonnegative_double("tpot_ms", 0) * 1e-3;
  }
  std::string file = f.requests;
  std::optional<ConfigNode> t = v.maybe_child("trace");
  if (file.empty() && t && t->has("file")) {
    t->expect_keys({"file"});
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
  t->expect_keys({"arrival", "rate", "count", "seed", "prompt", "output"});
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
    if (s.plan.dp > 1)
      throw UsageError("parallel.dp: serve simulates one model replica (tp x pp); dp replicas serve independent shares "
                       "of the traffic: run dp = 1 at rate / dp");
  });
  const topology::Topology& topo = *s.topology;
  std::optional<sharding::DeviceMesh> mesh;
  world.agree([&] {
    try {
      mesh.emplace(sharding::build_mesh(s.plan, topo));
    } catch (const std::invalid_argument& e) {
      throw UsageError(s.config_name + ": " + e.what());
    }
  });
  sim::Timeline tl(mesh->placement().at(size_t(world.rank())), topo, s.device);
  tl.set_keep_events(!sf.trace_path.empty());
  runtime::Transport tp(world, tl, mesh->placement());
  tp.set_shape_only(true);
  mesh->bind(tp);
  std::optional<models::LmTpTrainer> exec;
  std::optional<sharding::plans::KvCache> kv;
  serving::KvCapacity cap;
  models::LmConfig model = s.model;
  model.batch = 1;  // the trainer's training layout is unused in serving
  world.agree([&] {
    try {
      exec.emplace(model, s.train, *mesh, tp, tl, s.dp, s.sp, s.cp_zigzag, s.ulysses, s.fused);
      kv.emplace(exec->make_kv_cache(s.model.seq));
      (void)exec->serve_step({}, *kv);  // the serving plan's checks
    } catch (const std::invalid_argument& e) {
      throw UsageError(s.config_name + ": " + e.what());
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
  std::map<std::vector<int64_t>, double> memo;
  int64_t simulated = 0;
  const auto wall0 = std::chrono::steady_clock::now();
  serving::ServeRun run;
  world.agree([&] {
    try {
      run = serving::simulate(sv.requests, sv.sched, paged, [&](const std::vector<serving::BatchEntry>& batch) {
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
        const double secs = exec->serve_step(mb, *kv).ns * 1e-9;
        ++simulated;
        return memo.emplace(std::move(key), secs).first->second;
      });
    } catch (const std::invalid_argument& e) {
      throw UsageError(s.config_name + ": " + e.what());
    }
  });
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  const serving::ServeMetrics m = serving::summarise(run, sv.slo, world.size());
  if (world.rank() == 0) {
    std::string out = "serve: " + (s.name.empty() ? s.config_name : s.name) + "\n";
    char b[512];
    std::snprintf(b, sizeof b, "  device %s, %d chips, plan tp=%d x pp=%d, model %lld layers, hidden %lld, %lld/%lld heads, %s\n",
                  s.device.name.c_str(), world.size(), s.tp, s.pp, (long long)s.model.layers, (long long)s.model.hidden,
                  (long long)s.model.heads, (long long)s.model.kv_heads, runtime::dtype_name(s.model.dtype).c_str());
    out += b;
    std::snprintf(b, sizeof b, "  policy %s, max_num_seqs %lld, max_num_batched_tokens %lld; trace %s\n",
                  serving::policy_name(sv.sched.policy), (long long)sv.sched.max_num_seqs,
                  (long long)sv.sched.max_num_batched_tokens, sv.trace_text.c_str());
    out += b;
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
                          {"policy", serving::policy_name(sv.sched.policy)},
                          {"max_num_seqs", sv.sched.max_num_seqs},
                          {"max_num_batched_tokens", sv.sched.max_num_batched_tokens},
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
  sub->add_option("--requests", flags->requests, "a request trace (CSV or JSONL) instead of the config's serve.trace");
  add_config_override_flags(sub, flags->overrides);
  return {sub, [&world, flags] { return run_serve(world, *flags); }};
}

}  // namespace shardsim::apps

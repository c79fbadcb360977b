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
#include "apps/profile.h"
#include "apps/serve_server.h"
#include "apps/train_setup.h"
#include "common/config_rules.h"
#include "common/error.h"
#include "common/input_file.h"
#include "common/output_file.h"
#include "common/text.h"
#include "models/lm_tp.h"
#include "models/lm_tp_decode.h"
#include "reporting/profile.h"
#include "reporting/report.h"
#include "runtime/transport.h"
#include "serving/config_keys.h"
#include "serving/kv_cache.h"
#include "serving/metrics.h"
#include "serving/requests.h"
#include "serving/scheduler.h"
#include "sharding/device_mesh.h"
#include "topology/topology.h"

namespace shardsim::apps {

namespace {

using namespace train_detail;

struct ServeFlags {
  std::string config;
  std::string config_text;  // a sweep point: the config as generated (CONFIG names it in messages)
  std::string json_path, trace_path;
  reporting::TraceOptions trace;  // --trace-window, --trace-max-mib (serve's trace has no chips to filter)
  std::string requests;  // --requests FILE: the trace instead of the config's
  sharding::ConfigOverrides overrides;
  bool profile = false;    // --profile: the critical path of the run's longest iteration (docs/PROFILE.md)
  std::string what_if;     // --what-if SPEC (apps/profile.h): each change re-served over the same trace
  bool quiet = false;      // a what-if re-run: nothing printed or written
  bool check_only = false;  // a what-if change's check before the baseline: returns once its KV cache is sized
  serving::ServeMetrics* metrics_out = nullptr;  // a what-if re-run's metrics (rank 0)
};

struct ServeSetup {
  serving::SchedulerConfig sched;
  serving::Slo slo;
  int64_t block_size = 16;
  double memory_fraction = 0.9;
  double swap_space_gib = 4;   // vLLM's swap_space per GPU
  double host_link_gbps = 64;  // PCIe 5.0 x16 per direction (H100 SXM's host link; an assumption for others)
  int prefill_replicas = 0;    // serve.disaggregation.prefill_replicas (0: prefill and decode colocated)
  // serve.disaggregation.prefill / decode: each group's own plan over its share of the launch's chips (DistServe's
  // per-phase parallelism); prefill_replicas is then the prefill plan's dp.
  std::optional<sharding::ParallelPlan> prefill_plan, decode_plan;
  bool least_tokens = false;   // serve.load_balance: least_tokens (else round_robin)
  bool cuda_graphs = true;     // serve.cuda_graphs: decode-only batches replay CUDA graphs (vLLM's default)
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
  if (d.kind == "fixed") refuse_keys_of_other_kinds(n, "kind", d.kind, {"value"});
  if (d.kind == "uniform") refuse_keys_of_other_kinds(n, "kind", d.kind, {"min", "max"});
  if (d.kind == "normal") refuse_keys_of_other_kinds(n, "kind", d.kind, {"mean", "std", "min", "max"});
  if (d.kind == "fixed") {
    d.value = n.get_int_in("value", 1, serving::kMaxTokens);
  } else if (d.kind == "uniform" || d.kind == "normal") {
    d.lo = n.get_int_in("min", 1, serving::kMaxTokens);
    d.hi = n.get_int_in("max", d.lo, serving::kMaxTokens);
    if (d.kind == "normal") {
      d.mean = n.get_double_in("mean", 1, double(serving::kMaxTokens));
      d.std = n.get_double_in("std", 0, double(serving::kMaxTokens), 0);
    }
  } else {
    n.child("kind").fail(n.path() + ".kind: '" + d.kind + "' (fixed | uniform | normal)");
  }
  return d;
}

// Bounds of the serve section's figures (docs/SERVING.md; issue 46, kind 3: every figure bounded).
constexpr double kMaxSwapGib = 1 << 20;  // host memory per chip for swapped-out blocks: 1 PiB (an assumption)
constexpr double kMaxSloMs = 1e9;        // an SLO of about 11.6 days

ServeSetup parse_serve(const ConfigNode& root, const ServeFlags& f, const sharding::ModelSpec& spec, int chips, int dp) {
  const int64_t max_context = spec.seq;
  ServeSetup s;
  if (!root.has("serve")) root.fail("serve: missing (the serving section: trace, policy, cache, SLO; docs/SERVING.md)");
  const ConfigNode v = root.child("serve");
  v.expect_keys(serving::kServeKeys);
  serving::read_batching(v, s.sched);  // policy, max_num_seqs, max_num_batched_tokens, preemption
  s.block_size = v.get_int_in("block_size", 1, 1 << 16, 16);
  s.memory_fraction = v.get_double("memory_fraction", 0.9);
  if (!(s.memory_fraction > 0 && s.memory_fraction <= 1))
    v.child("memory_fraction").fail("serve.memory_fraction: must be in (0, 1] (got " + std::to_string(s.memory_fraction) + ")");
  s.swap_space_gib = v.get_double_in("swap_space_gib", 0, kMaxSwapGib, s.swap_space_gib);
  s.host_link_gbps = v.get_double_in("host_link_gbps", topology::kMinBandwidthGbps, topology::kMaxBandwidthGbps,
                                     s.host_link_gbps);
  const std::string lb = v.get_string("load_balance", "round_robin");
  if (lb != "round_robin" && lb != "least_tokens")
    v.child("load_balance").fail("serve.load_balance: '" + lb + "' (round_robin | least_tokens)");
  s.least_tokens = lb == "least_tokens";
  s.cuda_graphs = v.get_bool("cuda_graphs", true);
  if (v.has("disaggregation")) {
    const ConfigNode d = v.child("disaggregation");
    d.expect_keys(serving::kServeDisaggKeys);
    refuse_together(d, {"prefill_replicas"}, {"prefill", "decode"},
                    "prefill_replicas splits the replicas of the config's plan; prefill and decode give each group "
                    "its own plan");
    if (d.has("prefill") || d.has("decode")) {
      std::tie(s.prefill_plan, s.decode_plan) = serve_detail::read_phase_plans(root, d, spec, chips);
      s.prefill_replicas = s.prefill_plan->dp;
    } else {
      s.prefill_replicas = int(d.get_int_in("prefill_replicas", 0, 1 << 20));  // 0: colocated
    }
    if (!s.prefill_plan && s.prefill_replicas >= dp)
      d.child("prefill_replicas").fail("serve.disaggregation.prefill_replicas: " + std::to_string(s.prefill_replicas) +
                                       " prefill replicas need parallel.dp > " + std::to_string(s.prefill_replicas) +
                                       " (at least one decode replica); dp is " + std::to_string(dp));
  }
  if (v.has("slo")) {
    const ConfigNode slo = v.child("slo");
    slo.expect_keys(serving::kServeSloKeys);
    s.slo.ttft_s = slo.get_double_in("ttft_ms", 0, kMaxSloMs, 0) * 1e-3;
    s.slo.tpot_s = slo.get_double_in("tpot_ms", 0, kMaxSloMs, 0) * 1e-3;
  }
  // serve.trace is checked whether or not --requests replaces it (one rule for every key a flag replaces: a config
  // is valid on its own; a bad key is exit 2 naming it, never silently ignored).
  std::optional<ConfigNode> t = v.maybe_child("trace");
  if (!t && f.requests.empty())
    v.fail("serve.trace: missing (a file: or generated arrivals: arrival, rate, count, seed, prompt, output)");
  std::string file;
  serving::TraceSpec g;
  if (t)  // (a --set of one next to the other was "unknown key serve.trace.arrival" at the config's line)
    refuse_together(*t, {"file"}, {std::begin(serving::kServeTraceKeys), std::end(serving::kServeTraceKeys)},
                    "a trace is a file or generated arrivals; to serve a file instead of a config's generated "
                    "trace, give it with --requests FILE");
  if (t && t->has("file")) {
    t->expect_keys(serving::kServeTraceFileKeys);
    file = t->get_string("file");
    if (file.empty()) t->child("file").fail("serve.trace.file: empty (a CSV or JSONL request trace)");
    if (file[0] != '/') file = (std::filesystem::path(root.file()).parent_path() / file).string();
    if (const std::string why = unreadable_input(file); !why.empty())  // its key and line, not the path alone
      t->child("file").fail("serve.trace.file: " + file + ": " + why);
  } else if (t) {
    t->expect_keys(serving::kServeTraceKeys);
    g.arrival = t->get_string("arrival", "poisson");
    if (g.arrival != "poisson" && g.arrival != "fixed" && g.arrival != "at_once")
      t->child("arrival").fail("serve.trace.arrival: '" + g.arrival + "' (poisson | fixed | at_once)");
    if (g.arrival != "at_once" || t->has("rate")) g.rate = t->get_double_in("rate", serving::kMinRate, serving::kMaxRate);
    g.count = t->get_int_in("count", 1, serving::kMaxRequests);
    g.seed = uint64_t(t->get_int_in("seed", 0, INT64_MAX, 1));
    g.prompt = length_dist(*t, "prompt");
    g.output = length_dist(*t, "output");
  }
  const std::string replaced = t ? " (replacing the config's serve.trace)" : "";
  if (!f.requests.empty()) file = f.requests;
  if (const std::string why = unreadable_input(f.requests); !f.requests.empty() && !why.empty())
    throw UsageError("--requests " + escape_control(f.requests) + ": " + why);
  serving::check_batching(v, s.sched, max_context);
  if (!file.empty()) {
    s.requests = serving::load_trace(file);
    s.trace_text = "file " + file + (f.requests.empty() ? "" : replaced);
    serving::check_trace(s.requests, max_context, file);
    s.sched.trace = file;
    return s;
  }
  s.requests = serving::generate_trace(g);
  char b[256];
  if (g.arrival == "at_once")
    std::snprintf(b, sizeof b, "generated: %lld requests at once, seed %llu", (long long)g.count, (unsigned long long)g.seed);
  else
    std::snprintf(b, sizeof b, "generated: %s arrivals at %g requests/s, %lld requests, seed %llu", g.arrival.c_str(),
                  g.rate, (long long)g.count, (unsigned long long)g.seed);
  s.trace_text = b;
  s.sched.trace = root.file() + " (serve.trace)";
  serving::check_trace(s.requests, max_context, s.sched.trace);
  return s;
}

// One layer's forward working set at the largest iteration (N tokens) and the fp32 logits of SEQS rows, per chip:
// the activation peak vLLM profiles before sizing its cache (an estimate: the residual stream twice, q/k/v, the
// MLP's gate and up of this chip's heads and columns).
double activation_bytes(const sharding::ModelSpec& local, int64_t N, int64_t seqs) {
  const double e = double(runtime::dtype_size(local.dtype));
  const double per_token = 2.0 * double(local.hidden) +
                           double((local.heads + 2 * local.kv_heads) * local.head_dim) + 2.0 * double(local.ffn);
  return double(N) * e * per_token + double(seqs) * double(local.vocab) * 4.0;
}

}  // namespace


namespace {

using namespace serve_detail;

// --what-if: one change's re-run over the same trace (every flag but the outputs), its metrics on rank 0.
struct ServeWhatIf {
  std::string change;
  std::vector<std::string> sets;
  serving::ServeMetrics m;
  double speedup = 0;  // baseline mean e2e latency / this one's
};

int run_serve(const runtime::World& world, const ServeFlags& sf);

// Each change of SF.what_if served again (apps/profile.h: plan_what_if, run_what_if, as `train --what-if`), the
// speedup on the mean end-to-end latency (the open-loop trace's arrivals are fixed: a faster machine shows in the
// latencies, not the run's length).
// One what-if change's run (quiet; CHECK_ONLY: up to its KV cache) with OV, its metrics into M; bad input it meets
// (exit 2) names the change.
void serve_change(const runtime::World& world, const ServeFlags& sf, const std::string& change,
                  const sharding::ConfigOverrides& ov, bool check_only, serving::ServeMetrics& m) {
  ServeFlags v;
  v.config = sf.config;
  v.requests = sf.requests;
  v.overrides = ov;
  v.quiet = true;
  v.check_only = check_only;
  v.metrics_out = &m;
  try {
    run_serve(world, v);
  } catch (const AgreedError& e) {
    if (e.exit_code() != kExitBadInput) throw;
    throw AgreedError("--what-if " + change + ": " + e.what(), e.exit_code());
  } catch (const Error& e) {
    if (e.exit_code() != kExitBadInput) throw;
    throw UsageError("--what-if " + change + ": " + e.what());
  }
}

// Every change's plan, mesh and KV cache checked before the baseline runs (the same code as its run, stopped
// once the cache is sized): a change that cannot serve is exit 2 naming it, before any simulation.
void check_what_if(const runtime::World& world, const ServeFlags& sf, const std::vector<WhatIfPlan>& plans) {
  for (const auto& p : plans) {
    sharding::ConfigOverrides ov = sf.overrides;
    ov.set.insert(ov.set.end(), p.sets.begin(), p.sets.end());
    serving::ServeMetrics unused;
    serve_change(world, sf, p.change, ov, true, unused);
  }
}

std::vector<ServeWhatIf> serve_what_if(const runtime::World& world, const ServeFlags& sf,
                                       const std::vector<WhatIfPlan>& plans, const serving::ServeMetrics& base) {
  std::map<std::string, serving::ServeMetrics> by_change;
  size_t next = 0;
  const std::vector<reporting::WhatIf> rows = run_what_if(
      plans, base.e2e.mean * 1e9,
      [&](const sharding::ConfigOverrides& ov) {
        const std::string change = plans.at(next++).change;
        serving::ServeMetrics m;
        serve_change(world, sf, change, ov, false, m);
        by_change[change] = m;
        return m.e2e.mean * 1e9;
      },
      sf.overrides);
  std::vector<ServeWhatIf> out;
  for (const auto& w : rows) out.push_back({w.change, w.sets, by_change[w.change], w.speedup});
  return out;
}

std::string what_if_table(const serving::ServeMetrics& base, const std::vector<ServeWhatIf>& rows) {
  std::string s = "what-if (each change served again over the same trace; speedup = baseline / changed mean e2e latency)\n";
  char b[512];
  std::snprintf(b, sizeof b, "  %-28s %21s %19s %12s %9s %8s\n", "change", "TTFT p50 / p99 (ms)", "TPOT p50 / p99 (ms)",
                "e2e mean (s)", "goodput", "speedup");
  s += b;
  auto row = [&](const std::string& name, const serving::ServeMetrics& m, double speedup, const std::string& sets) {
    std::snprintf(b, sizeof b, "  %-28s %10.1f / %8.1f %9.2f / %7.2f %12.3f %9.3f %7.3fx%s\n", name.c_str(),
                  m.ttft.p50 * 1e3, m.ttft.p99 * 1e3, m.tpot.p50 * 1e3, m.tpot.p99 * 1e3, m.e2e.mean,
                  m.goodput_requests_per_s, speedup, sets.c_str());
    s += b;
  };
  row("baseline", base, 1.0, "");
  for (const auto& w : rows) {
    std::string sets;
    for (const auto& x : w.sets) sets += (sets.empty() ? "  (" : " ") + std::string("--set ") + x;
    row(w.change, w.m, w.speedup, sets.empty() ? sets : sets + ")");
  }
  return s;
}

// What serving has no use for, refused before the training checks it would meet (virtual stages said "the
// interleaved schedule needs the micro-batches per step ..." at the model's line): the train: section, the
// plan's training keys, model.micro_batch, mode: real, validate:, fold:. Each was accepted and ignored (zero 3 gave
// the figures of zero 0).
void refuse_training_keys(const ConfigNode& root) {
  const std::string why = ": training only (serve runs no backward, optimizer or training step); remove it";
  // A section is named at its first key: the --set that made it, or its line.
  auto refuse_section = [&](const std::string& k, const std::string& what) {
    const ConfigNode t = root.child(k);
    if (t.is_map() && t.yaml().size() > 0) {
      const std::string first = t.yaml().begin()->first.as<std::string>();
      if (t.has(first)) t.child(first).fail(k + "." + first + what);
    }
    t.fail(k + what);
  };
  if (root.has("train")) refuse_section("train", why);
  // serve always runs shape-only and validates nothing: mode: real, validate: and fold: were accepted and ignored
  if (root.has("mode") && root.get_string("mode") != "shape_only")
    root.child("mode").fail("mode: serve runs shape-only (no tensors: the simulated clock only); remove it or say "
                            "shape_only");
  for (const char* k : {"validate", "fold"})
    if (root.has(k)) refuse_section(k, ": not used by serve (it runs shape-only: nothing to validate or fold); remove it");
  if (root.has("workload") && root.child("workload").is_map() && root.child("workload").has("micro_batch"))
    root.child("workload").child("micro_batch").fail("model.micro_batch" + why);
  if (!root.has("parallel") || !root.child("parallel").is_map()) return;
  const ConfigNode par = root.child("parallel");
  for (const std::string k : {"zero", "bucket_bytes", "overlap_grad_reduce", "overlap_param_gather", "recompute",
                              "schedule", "virtual_stages"})
    if (par.has(k))
      par.child(k).fail("parallel." + k +
                        (k == "schedule" || k == "virtual_stages"
                             ? ": a training pipeline's (serve's pp runs one model stage per chip, a virtual engine per "
                               "stage); remove it"
                             : why));
}

// The config and the serve section as every chip agrees on them (exit 2 naming the key on bad input), and each
// --what-if change checked to load before anything runs.
void load_serve(const runtime::World& world, const ServeFlags& sf, TrainFlags& f, TrainSetup& s, ServeSetup& sv,
                std::vector<WhatIfPlan>& what_if) {
  f.config = sf.config;
  f.config_text = sf.config_text;
  f.overrides = sf.overrides;
  f.shape_only = true;
  f.serve = true;
  world.agree([&] {
    std::vector<std::pair<std::string, std::string>> outputs;
    if (!sf.json_path.empty()) outputs.emplace_back("--json", sf.json_path);
    if (!sf.trace_path.empty()) outputs.emplace_back("--trace", sf.trace_path);
    if (!outputs.empty()) {  // never over an input: the config, the --requests trace (it was overwritten, exit 0)
      std::vector<std::pair<std::string, std::string>> inputs = {{"the config file", f.config}};
      if (!sf.requests.empty()) inputs.emplace_back("the --requests file", sf.requests);
      check_outputs_distinct(outputs, inputs);
    }
    refuse_training_keys(train_config(f));
    s = load(f, world.size());
    sv = parse_serve(train_config(f), sf, s.spec, world.size(), s.plan.dp);
    if (!sf.trace_path.empty()) check_trace_size(sf.trace_path, sf.trace, sv.requests, world.rank() == 0);
    if (!sf.what_if.empty()) {  // every change must load as a serve config before anything runs (exit 2 naming it)
      what_if = plan_what_if(sf.what_if, train_config(f));
      for (const auto& plan : what_if) {
        TrainFlags v = f;
        v.overrides.set.insert(v.overrides.set.end(), plan.sets.begin(), plan.sets.end());
        try {
          const TrainSetup vs = load(v, world.size());
          (void)parse_serve(train_config(v), sf, vs.spec, world.size(), vs.plan.dp);
        } catch (const Error& e) {
          throw UsageError("--what-if " + plan.change + ": " + e.what());
        }
      }
    }
  });
}

// What one serving run produced, for its report.
struct ServeReport {
  const TrainSetup& s;
  const ServeSetup& sv;
  const serving::KvCapacity& cap;
  const serving::ServeRun& run;
  const serving::ServeMetrics& m;
  const Transfers& xfer;
  int chips = 1, dp = 1, K = 0;
  int64_t simulated = 0, graph_max = 0;
  double wall = 0;
  std::shared_ptr<const sim::Profile> prof;
  std::string prof_what;
  const std::vector<WhatIfPlan>& what_if;
  const std::vector<ServeWhatIf>& wi;
  std::string trace_note;  // --trace: its events and size, or why it was not written
  const Phases* phases = nullptr;                       // disaggregated: the two groups
  const std::vector<serving::KvCapacity>* group_caps = nullptr;  // and each one's cache per chip
};

// Per-phase plans: the plan line's text ("prefill tp=4 x dp=2 on 8 chips, decode tp=8 on 8 chips").
std::string phase_plans_text(const Phases& ph) {
  std::string out;
  for (const ServeGroup& g : ph.group)
    out += (out.empty() ? "" : ", ") + g.name + " " + g.describe() + " on " + std::to_string(g.ranks.size()) + " chips";
  return out;
}

// The report's text (docs/SERVING.md): the plan, the batching, the replicas, the cache, the metrics.
std::string report_text(const ServeReport& r) {
  const TrainSetup& s = r.s;
  const ServeSetup& sv = r.sv;
  const serving::KvCapacity& cap = r.cap;
  const serving::ServeMetrics& m = r.m;
  const Transfers& xfer = r.xfer;
  const int dp = r.dp, K = r.K;
  std::string out = "serve: " + (s.name.empty() ? s.config_name : s.name) + "\n";
  char b[512];
  const std::string ep_text = s.plan.ep > 1 ? " x ep=" + std::to_string(s.plan.ep) : "";
  char plan[160];
  std::snprintf(plan, sizeof plan, "tp=%d x pp=%d%s x dp=%d", s.tp, s.pp, ep_text.c_str(), dp);
  const bool per_phase = r.phases && r.phases->per_phase;
  std::snprintf(b, sizeof b, "  device %s, %d chips, plan %s, model %lld layers, hidden %lld, %lld/%lld heads, %s\n",
                s.device.name.c_str(), r.chips, per_phase ? ("per phase: " + phase_plans_text(*r.phases)).c_str() : plan,
                (long long)s.model.layers, (long long)s.model.hidden, (long long)s.model.heads,
                (long long)s.model.kv_heads, runtime::dtype_name(s.model.dtype).c_str());
  out += b;
  if (s.model.moe && per_phase) {
    const auto& ms = s.model.moe->spec;
    const int ep_p = r.phases->group[0].plan.ep, ep_d = r.phases->group[1].plan.ep;
    std::snprintf(b, sizeof b, "  mixture of experts: %lld experts top-%lld, %lld per ep chip in prefill (ep %d), %lld "
                  "in decode (ep %d); each ep chip attends its own sequences (request id mod its group's ep) and holds "
                  "their cache\n", (long long)ms.experts(), (long long)ms.router.top_k, (long long)(ms.experts() / ep_p),
                  ep_p, (long long)(ms.experts() / ep_d), ep_d);
    out += b;
  } else if (s.model.moe) {
    const auto& ms = s.model.moe->spec;
    std::snprintf(b, sizeof b, "  mixture of experts: %lld experts top-%lld, %lld per ep chip; each ep chip attends its "
                  "own sequences (request id mod %d) and holds their cache\n", (long long)ms.experts(),
                  (long long)ms.router.top_k, (long long)(ms.experts() / s.plan.ep), s.plan.ep);
    out += b;
  }
  std::snprintf(b, sizeof b, "  policy %s, max_num_seqs %lld, max_num_batched_tokens %lld, preemption by %s; trace %s\n",
                serving::policy_name(sv.sched.policy), (long long)sv.sched.max_num_seqs,
                (long long)sv.sched.max_num_batched_tokens, sv.sched.swap ? "swap" : "recompute", sv.trace_text.c_str());
  out += b;
  if (r.graph_max > 0)
    out += "  CUDA graphs: batches of decodes only, up to " + std::to_string(r.graph_max) +
           " sequences, replay a captured graph; prefill and mixed batches run eagerly\n";
  if (K > 0) {
    const std::string to_prefill = sv.least_tokens ? "each request to the one with the fewest outstanding tokens"
                                                   : "request i on replica i mod " + std::to_string(K);
    const std::string to_decode = sv.least_tokens ? "each cache to the one with the fewest outstanding tokens"
                                                  : "the j-th prefill to end on replica " + std::to_string(K) +
                                                        " + j mod " + std::to_string(dp - K);
    const int pp_in_flight = per_phase ? std::max(r.phases->group[0].plan.pp, r.phases->group[1].plan.pp) : s.pp;
    std::snprintf(b, sizeof b, "  disaggregated: replica%s 0..%d prefill (%s), replica%s %d..%d decode (%s); per pipeline "
                  "stage %d batch%s in flight\n", K > 1 ? "s" : "", K - 1, to_prefill.c_str(), dp - K > 1 ? "s" : "", K,
                  dp - 1, to_decode.c_str(), pp_in_flight, pp_in_flight > 1 ? "es" : "");
    out += b;
    std::vector<double> ts = xfer.time_s;
    std::sort(ts.begin(), ts.end());
    double mean = 0;
    for (double x : ts) mean += x / double(std::max<size_t>(ts.size(), 1));
    if (per_phase)
      std::snprintf(b, sizeof b, "  KV cache transfers: %lld resharded from the prefill plan to the decode plan, %lld chip "
                    "pairs each, %.2f GB in all (%.2f GB per chip pair); prefill end to arrival: mean %.2f ms, max %.2f ms\n",
                    (long long)xfer.count, (long long)xfer.pairs, xfer.total_bytes * 1e-9, xfer.bytes * 1e-9, mean * 1e3,
                    ts.empty() ? 0.0 : ts.back() * 1e3);
    else
      std::snprintf(b, sizeof b, "  KV cache transfers: %lld over the dp axis' links, %.2f GB per chip pair in all; prefill end "
                    "to arrival: mean %.2f ms, max %.2f ms\n", (long long)xfer.count, xfer.bytes * 1e-9, mean * 1e3,
                    ts.empty() ? 0.0 : ts.back() * 1e3);
    out += b;
    if (xfer.other_mode > 0)
      out += "  " + std::to_string(xfer.other_mode) + " batch" + (xfer.other_mode > 1 ? "es" : "") +
             " started with KV cache flows in flight on their chips and ran in the timeline's launch mode, not their own\n";
  } else if (dp > 1 || s.pp > 1) {
    const std::string balance = sv.least_tokens ? std::string("each request to the replica with the fewest outstanding tokens")
                                                : "request i on replica i mod " + std::to_string(dp);
    std::snprintf(b, sizeof b, "  %d replica%s (%s), %d batch%s in flight per replica (one "
                  "virtual engine per pipeline stage, %lld cache blocks each)\n", dp, dp > 1 ? "s" : "", balance.c_str(), s.pp,
                  s.pp > 1 ? "es" : "", (long long)(cap.blocks / s.pp));
    out += b;
  }
  if (per_phase)
    for (int g = 0; g < 2; ++g)
      out += "  KV cache per chip, " + r.phases->group[g].name + ": " + (*r.group_caps)[size_t(g)].formula() + "\n";
  else
    out += "  KV cache per chip: " + cap.formula() + "\n";
  if (s.plan.ep > 1)
    out += "  KV cache per replica: " + std::to_string(s.plan.ep) + " ep chips x " + std::to_string(cap.blocks) +
           " blocks, each sequence's on one chip\n";
  out += serving::metrics_text(m, sv.slo);
  std::snprintf(b, sizeof b, "  simulated %lld distinct iteration shapes of %lld iterations (memoised by exact batch shape) in %.1f s wall\n",
                (long long)r.simulated, (long long)m.iterations, r.wall);
  out += b;
  if (r.prof) out += "profile of " + r.prof_what + "\n" + reporting::profile_text(*r.prof);
  if (!r.what_if.empty()) out += what_if_table(m, r.wi);
  if (!r.trace_note.empty()) out += "trace: " + r.trace_note + "\n";
  return out;
}

// The report as JSON (--json): the text's figures, every iteration and every request.
nlohmann::json report_json(const ServeReport& r) {
  const TrainSetup& s = r.s;
  const ServeSetup& sv = r.sv;
  const serving::KvCapacity& cap = r.cap;
  nlohmann::json j = {{"config", s.config_name},
                      {"device", s.device.name},
                      {"chips", r.chips},
                      {"tp", s.tp},
                      {"pp", s.pp},
                      {"dp", r.dp},
                      {"ep", s.plan.ep},
                      {"policy", serving::policy_name(sv.sched.policy)},
                      {"max_num_seqs", sv.sched.max_num_seqs},
                      {"max_num_batched_tokens", sv.sched.max_num_batched_tokens},
                      {"preemption", sv.sched.swap ? "swap" : "recompute"},
                      {"load_balance", sv.least_tokens ? "least_tokens" : "round_robin"},
                      {"cuda_graph_max_batch", r.graph_max},
                      {"trace", sv.trace_text},
                      {"slo", {{"ttft_s", sv.slo.ttft_s}, {"tpot_s", sv.slo.tpot_s}}},
                      {"kv_cache",
                       {{"hbm_bytes", cap.hbm}, {"memory_fraction", cap.fraction}, {"weights_bytes", cap.weights},
                        {"activation_bytes", cap.activations}, {"bytes_per_token", cap.bytes_per_token},
                        {"block_size", cap.block_size}, {"blocks", cap.blocks}, {"tokens", cap.tokens()}}},
                      {"metrics", serving::metrics_json(r.m)},
                      {"iterations_simulated", r.simulated},
                      {"iterations", serving::iterations_json(r.run)},
                      {"requests", serving::requests_json(r.run)}};
  if (r.K > 0) {
    j["disaggregation"] = {{"prefill_replicas", r.K}, {"decode_replicas", r.dp - r.K}, {"transfers", r.xfer.count},
                           {"transfer_bytes_per_chip_pair", r.xfer.bytes}, {"transfer_bytes", r.xfer.total_bytes},
                           {"transfer_s", r.xfer.time_s}, {"batches_in_other_launch_mode", r.xfer.other_mode},
                           {"per_phase", r.phases->per_phase}};
    for (int g = 0; g < 2; ++g) {  // each group's plan (and, per phase, its cache per chip)
      const ServeGroup& G = r.phases->group[g];
      nlohmann::json o = {{"tp", G.plan.tp}, {"pp", G.plan.pp}, {"ep", G.plan.ep}, {"dp", G.plan.dp},
                          {"chips", G.ranks.size()}};
      const serving::KvCapacity& c = r.phases->per_phase ? (*r.group_caps)[size_t(g)] : cap;
      o["kv_cache"] = {{"weights_bytes", c.weights}, {"activation_bytes", c.activations},
                       {"bytes_per_token", c.bytes_per_token}, {"blocks", c.blocks}, {"tokens", c.tokens()}};
      j["disaggregation"][G.name] = o;
    }
    if (r.phases->per_phase) {  // no one plan: each group's above
      j["tp"] = nullptr;
      j["pp"] = nullptr;
      j["ep"] = nullptr;
    }
  }
  if (!r.trace_note.empty()) j["trace_note"] = r.trace_note;
  if (r.prof) j["profile"] = {{"iteration", r.prof_what}, {"critical_path", reporting::profile_json(*r.prof)}};
  if (!r.what_if.empty()) {
    nlohmann::json w = nlohmann::json::array();
    for (const auto& x : r.wi)
      w.push_back({{"change", x.change}, {"set", x.sets}, {"speedup", x.speedup}, {"metrics", serving::metrics_json(x.m)}});
    j["what_if"] = w;
  }
  return j;
}

int run_serve(const runtime::World& world, const ServeFlags& sf) {
  TrainFlags f;
  TrainSetup s;
  ServeSetup sv;
  std::vector<WhatIfPlan> what_if;
  load_serve(world, sf, f, s, sv, what_if);
  if (!what_if.empty()) check_what_if(world, sf, what_if);  // every change sized before the baseline runs
  const topology::Topology& topo = *s.topology;
  std::optional<sharding::DeviceMesh> mesh(run_mesh(world, s));
  sim::Timeline tl(mesh->placement().at(size_t(world.rank())), topo, s.device);
  tl.set_keep_events(false);  // the trace (--trace) is the scheduler's, not the kernels'

  runtime::Transport tp(world, tl, mesh->placement());
  tp.set_shape_only(true);
  tp.set_plan_algorithms(true);  // parallel.algorithm's rule, as train's (collectives::plan_algorithm)
  mesh->bind(tp);
  // Disaggregated, the two groups; with per-phase plans this chip's group runs its plan on its own mesh over its
  // chips (its rank q on world rank ranks[q]: the group's transport, split from the world's, carries the chips;
  // the mesh gives the executor its coordinates).
  std::optional<Phases> phases;
  if (sv.prefill_plan)
    phases = phases_of_plans(*sv.prefill_plan, *sv.decode_plan);
  else if (sv.prefill_replicas > 0)
    phases = phases_of_replicas(*mesh, s.plan, sv.prefill_replicas);
  sharding::ParallelPlan plan = s.plan;  // this chip's
  models::LmDpConfig dpc = s.dp;
  std::string plan_key = "parallel.";  // where this chip's plan keys are
  std::optional<runtime::Transport> group_tp;
  std::optional<sharding::DeviceMesh> group_mesh;
  int group = 0, group_rank = 0;
  if (phases) std::tie(group, group_rank) = phases->of(world.rank());
  if (phases && phases->per_phase) {
    plan = phases->group[group].plan;
    plan_key = "serve.disaggregation." + phases->group[group].name + ".parallel.";
    dpc.etp = plan.etp;
    dpc.pp_layers = plan.pp_layers;
    dpc.algorithm = plan.algorithm.empty() ? "auto" : plan.algorithm;
    group_tp.emplace(tp.split(group, group_rank));
    const int n = int(phases->group[group].ranks.size());
    group_mesh.emplace(std::map<std::string, int>{{"tp", plan.tp}, {"ep", plan.ep}, {"dp", plan.dp}, {"pp", plan.pp}},
                       topology::Topology::ring(n, topology::LinkSpec{100, 1000}));
    group_mesh->bind(*group_tp);
  }
  sharding::DeviceMesh& emesh = group_mesh ? *group_mesh : *mesh;
  runtime::Transport& etp = group_tp ? *group_tp : tp;
  std::optional<models::LmTpTrainer> exec;
  std::optional<sharding::plans::KvCache> kv;
  serving::KvCapacity cap;
  sharding::ModelSpec model = s.model;
  model.batch = plan.dp * plan.ep;  // the trainer's training layout (one sequence per replica and ep chip) is
                                    // unused in serving
  world.agree([&] {
    try {
      exec.emplace(model, s.train, emesh, etp, tl, dpc, s.sp, s.cp_zigzag, s.ulysses, s.fused);
      kv.emplace(exec->make_kv_cache(s.model.seq));
      (void)exec->serve_step({}, *kv);  // the serving plan's checks
    } catch (const std::invalid_argument& e) {
      // "parallel.sp: serving runs without ...": the key's FILE:LINE, or the --set that gave it
      const std::string what = e.what();
      const size_t colon = what.find(':');
      const std::string key = colon == std::string::npos ? std::string() : what.substr(0, colon);
      if (key.rfind("parallel.", 0) == 0 && key.find(' ') == std::string::npos)
        train_config(f).fail_at(plan_key + key.substr(9), what);
      throw UsageError(s.config_name + ": " + what);
    } catch (const ConfigKeyError& e) {  // a key the mesh's groups refuse: its FILE:LINE
      const std::string k = e.key();
      train_config(f).fail_at(k.rfind("parallel.", 0) == 0 ? plan_key + k.substr(9) : k, e.what());
    }
    const sharding::ModelSpec& l = exec->local_config();
    const double e = double(runtime::dtype_size(l.dtype));
    const double weights = exec->local_param_count() * e;
    const double acts = activation_bytes(l, sv.sched.max_num_batched_tokens, sv.sched.max_num_seqs);
    const double per_token = 2.0 * double(l.layers) * double(l.kv_heads) * double(l.head_dim) * e;
    try {
      cap = serving::kv_capacity(s.device.hbm_bytes(), sv.memory_fraction, weights, acts, per_token, sv.block_size);
    } catch (const std::invalid_argument& err) {
      // What can fix it: the weights alone past the whole HBM need more chips per replica (no memory_fraction or
      // block_size helps); else a larger memory_fraction, a smaller block or budget.
      char gib[160];
      std::snprintf(gib, sizeof gib, "the weights per chip (%.3f GiB) exceed the device's HBM (%.3f GiB)",
                    weights / double(1LL << 30), s.device.hbm_bytes() / double(1LL << 30));
      if (weights >= s.device.hbm_bytes())
        throw UsageError(s.config_name + ": " + gib + ": shard the model over more chips (" + plan_key + "tp, " +
                         plan_key + "pp)");
      throw UsageError(s.config_name + ": serve.memory_fraction / block_size / max_num_batched_tokens: the KV cache is "
                       "too small: " + err.what());
    }
  });
  if (sf.check_only) return kExitOk;
  // dp replicas: each replica's chips run its own scheduler and batches. pp: one virtual engine per stage, so pp
  // batches are in flight (serving/scheduler.h). ep: the replica's ep chips each hold their own sequences' cache
  // (one pool per chip, serving/kv_cache.h shards), swap space and host link.
  serving::SchedulerConfig sched = sv.sched;
  sched.engines = plan.pp;
  sched.swap_s_per_token = cap.bytes_per_token / (sv.host_link_gbps * 1e9);
  sched.swap_blocks = int64_t(sv.swap_space_gib * double(1LL << 30) / (double(cap.block_size) * cap.bytes_per_token));
  serving::KvCapacity pool = cap;
  pool.blocks = cap.blocks * plan.ep;
  pool.shards = plan.ep;
  Server srv{world, tp, emesh, tl, *exec, *kv, pool, sched, s.config_name};
  // vLLM's capture sizes: 1, 2, 4, then multiples of 8 (and of 16 from 256) up to min(2 max_num_seqs, 512)
  // (vllm/config/vllm.py _set_cudagraph_sizes); a batch of decodes up to the largest replays a graph (not padded
  // to its captured size here). A device that is not eager (cuda_graph already) runs every batch as it is.
  if (sv.cuda_graphs && !s.device.cuda_graph) srv.graph_max = std::min<int64_t>(2 * sv.sched.max_num_seqs, 512);
  srv.dp = mesh->size("dp");
  srv.replica = mesh->coordinate("dp", mesh->rank());
  for (const auto& a : emesh.axes())
    if (a.name != "dp" && emesh.coordinate(a.name, emesh.rank()) != 0) srv.lead = false;
  if (phases) {
    srv.phases = &*phases;
    srv.launch = &*mesh;
    srv.layers = s.model.layers;
    srv.kv_heads = s.model.kv_heads;
    srv.head_dim = s.model.head_dim;
    srv.element_bytes = double(runtime::dtype_size(s.model.dtype));
  }
  if (phases && phases->per_phase) {
    srv.dp = phases->group[0].plan.dp + phases->group[1].plan.dp;
    srv.replica = phases->group[group].first_replica + emesh.coordinate("dp", group_rank);
  }
  const int dp = srv.dp, K = sv.prefill_replicas;
  // Each group's cache per chip (its first chip's), on every chip: the report names both.
  std::vector<serving::KvCapacity> group_caps;
  if (phases) {
    std::vector<double> v(12, 0.0);
    if (group_rank == 0) {
      const double f[6] = {cap.hbm, cap.fraction, cap.weights, cap.activations, cap.bytes_per_token, double(cap.blocks)};
      std::copy(f, f + 6, v.begin() + 6 * group);
    }
    tp.allreduce(std::span<double>(v), runtime::Reduce::sum, "serve: the groups' caches");
    for (int g = 0; g < 2; ++g) {
      serving::KvCapacity c = cap;
      c.hbm = v[size_t(6 * g)];
      c.fraction = v[size_t(6 * g + 1)];
      c.weights = v[size_t(6 * g + 2)];
      c.activations = v[size_t(6 * g + 3)];
      c.bytes_per_token = v[size_t(6 * g + 4)];
      c.blocks = int64_t(v[size_t(6 * g + 5)]);
      group_caps.push_back(c);
    }
  }
  const auto wall0 = std::chrono::steady_clock::now();
  Transfers xfer;
  serving::ServeRun run = K > 0 ? srv.disaggregated(sv.requests, {K, sv.least_tokens}, xfer)
                                : srv.colocated(sv.requests, sv.least_tokens);
  int64_t simulated = srv.simulated;
  {
    std::vector<double> n{double(simulated)};
    tp.allreduce(std::span<double>(n), runtime::Reduce::max, "serve simulated shapes");
    simulated = int64_t(n[0]);
  }
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  const serving::ServeMetrics m = serving::summarise(run, sv.slo, world.size());
  if (sf.metrics_out) *sf.metrics_out = m;
  if (sf.quiet) return kExitOk;
  std::shared_ptr<const sim::Profile> prof;
  std::string prof_what;
  if (sf.profile)
    prof = srv.profile_longest(s.device.peak_flops_per_ns(runtime::precision_of(s.model.dtype)) / 1e3, prof_what);
  std::vector<ServeWhatIf> wi;
  if (!what_if.empty()) wi = serve_what_if(world, sf, what_if, m);
  if (world.rank() != 0) return kExitOk;
  bool trace = false;
  const std::string trace_note = sf.trace_path.empty() ? "" : serve_trace_note(sf.trace_path, sf.trace, run, trace);
  const ServeReport rep{s,    sv,        cap,     run, m,  xfer, world.size(), dp, K, simulated, srv.graph_max,
                        wall, prof,      prof_what, what_if, wi, trace_note, phases ? &*phases : nullptr, &group_caps};
  std::fputs(escape_lines(report_text(rep)).c_str(), stdout);  // paths and names in it are untrusted text
  if (!sf.json_path.empty()) write_file_atomic(sf.json_path, report_json(rep).dump(1) + "\n");
  if (trace) write_serve_trace(sf.trace_path, sf.trace, run);
  return kExitOk;
}

}  // namespace

std::map<std::string, double> run_serve_point(const runtime::World& world, const std::string& config_text,
                                              const std::string& where) {
  ServeFlags f;
  f.config = where;
  f.config_text = config_text;
  f.quiet = true;
  serving::ServeMetrics m;
  f.metrics_out = &m;
  run_serve(world, f);
  return {{"ttft_p50_ms", m.ttft.p50 * 1e3},
          {"ttft_p99_ms", m.ttft.p99 * 1e3},
          {"tpot_p50_ms", m.tpot.p50 * 1e3},
          {"tpot_p99_ms", m.tpot.p99 * 1e3},
          {"itl_p99_ms", m.itl.p99 * 1e3},
          {"e2e_p50_s", m.e2e.p50},
          {"e2e_p99_s", m.e2e.p99},
          {"requests_per_s", m.requests_per_s},
          {"output_tokens_per_s", m.output_tokens_per_s},
          {"goodput_requests_per_s", m.goodput_requests_per_s},
          {"batch_mean", m.mean_batch},
          {"kv_occupancy_peak", m.peak_kv},
          {"preemptions", double(m.preemptions)}};
}

Command add_serve(CLI::App& app, const runtime::World& world) {
  auto* sub = app.add_subcommand("serve", "inference serving: a request trace through a batching scheduler over a "
                                          "paged KV cache, every iteration simulated on the chips (TTFT, TPOT, "
                                          "throughput, goodput; docs/SERVING.md)");
  auto flags = std::make_shared<ServeFlags>();
  sub->add_option("config", flags->config, "serving YAML (configs/serve/)")->required();
  sub->add_option("--json", flags->json_path, "also write the report, the iterations and the requests as JSON");
  sub->add_option("--trace", flags->trace_path, "also write a Chrome / Perfetto trace of the iterations (per replica "
                                               "and engine), the batch and cache over time, and the requests");
  add_trace_window_flags(sub, flags->trace);
  sub->add_option("--requests", flags->requests, "a request trace (CSV or JSONL) instead of the config's serve.trace");
  sub->add_flag("--profile", flags->profile,
                "add the profile of the run's longest iteration: its critical path across chips, each op's class and "
                "the top bottlenecks (docs/PROFILE.md, as train --profile)");
  sub->add_option("--what-if", flags->what_if,
                  "serve the trace again with each change (as train's --what-if: link_bw=2x,hbm_bw=1.5x,parallel.tp=4, "
                  "...) and print its latencies and speedup on the mean end-to-end latency (docs/SERVING.md)");
  add_config_override_flags(sub, flags->overrides);
  return {sub, [&world, flags] { return run_serve(world, *flags); }};
}

}  // namespace shardsim::apps

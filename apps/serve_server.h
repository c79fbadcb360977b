// The `serve` command's machinery on one chip (apps/serve.cpp; docs/SERVING.md): the executor in its serving mode,
// the cache, the scheduler's configuration and the memo of simulated batch shapes, and the ways a run spreads over
// data-parallel replicas: colocated (each replica prefills and decodes its own requests) and disaggregated
// (apps/serve_disagg.cpp: prefill replicas hand each prompt's KV cache to decode replicas over the network).
// Internal to the shardsim executable.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/config.h"
#include "models/lm_tp.h"
#include "models/lm_tp_decode.h"
#include "reporting/trace_filter.h"
#include "runtime/transport.h"
#include "serving/kv_cache.h"
#include "serving/scheduler.h"
#include "sharding/device_mesh.h"
#include "sharding/model_spec.h"
#include "sim/critical_path.h"
#include "sim/timeline.h"

namespace shardsim::apps::serve_detail {

// V of every replica's first chip, concatenated in replica order, on every chip (SPMD over WORLD).
std::vector<double> gather_lead(runtime::Transport& world, int dp, int replica, bool lead, const std::vector<double>& v,
                                const char* what);
// The replicas' runs as one (requests by their global id GLOBAL_ID, iterations in start order with their replica).
serving::ServeRun gather_replicas(runtime::Transport& world, int dp, int replica, bool lead, const serving::ServeRun& run,
                                  const std::vector<int64_t>& global_id, size_t requests);

// --trace (apps/serve_trace.cpp; serving::write_trace). Before the run: the least the trace of REQUESTS will hold
// (serving::trace_size_at_least) past O.max_mib (--trace-max-mib) is UsageError naming PATH and the flags that
// shrink it; from 64 MiB a note on stderr (PRINT: rank 0). A bad --trace-window is UsageError.
void check_trace_size(const std::string& path, const reporting::TraceOptions& o,
                      const std::vector<serving::Request>& requests, bool print);
// After the run, before anything is written: the trace's events and size counted exactly ("N events, X MiB; kept:
// W"), stated on stderr from 64 MiB on; past O.max_mib WRITE is false and the line says why (a warning on stderr).
// Returns the report's `trace:` line.
std::string serve_trace_note(const std::string& path, const reporting::TraceOptions& o, const serving::ServeRun& run,
                             bool& write);
// The trace written event by event through common/output_file.h (atomic; host memory bounded).
void write_serve_trace(const std::string& path, const reporting::TraceOptions& o, const serving::ServeRun& run);

// The KV cache transfers of a disaggregated run, as every chip knows them.
struct Transfers {
  int64_t count = 0;
  double bytes = 0;            // per chip pair (a transfer's bytes over its chip pairs), all transfers
  double total_bytes = 0;      // over every chip pair, all transfers
  int64_t pairs = 0;           // chip pairs of the last transfer (its messages, models::kv_transfer)
  std::vector<double> time_s;  // each transfer's prefill end -> its cache at the decode replica
  // Batches that started with flows in flight on their chips and so ran in the timeline's launch mode rather than
  // their own (CUDA graphs: a decode-only batch eagerly or the other way round; switching would drop the flows).
  int64_t other_mode = 0;
};

// How a disaggregated run hands requests to replicas.
struct DisaggOptions {
  int prefill_replicas = 1;   // replicas [0, K) prefill, [K, dp) decode
  bool least_tokens = false;  // least outstanding tokens (else round-robin), on both sides
};

// One group of a disaggregated run's chips, the prefill or the decode replicas, with its plan (apps/serve_phases.cpp;
// DistServe's per-phase parallelism), as every chip knows it.
struct ServeGroup {
  std::string name;             // "prefill" | "decode"
  sharding::ParallelPlan plan;  // its tp, pp, ep, dp (its replicas), pp_layers
  std::vector<int> ranks;       // the world ranks of its chips in its mesh's rank order (tp, ep, dp, pp; tp innermost)
  int first_replica = 0;        // its replica r is replica first_replica + r of the run
  // Replica R (of this group) at ep coordinate E as a KV cache layout (models/lm_tp_decode.h): its tp x pp chips.
  models::KvLayout layout(int r, int e) const;
  // Every world rank of replica R.
  std::vector<int> replica_ranks(int r) const;
  std::string describe() const;  // "tp=4 x dp=2" (axes above 1; "tp=1" for one chip)
};

// The two groups of a disaggregated run. PER_PHASE: each has its own plan (serve.disaggregation.prefill / decode:
// chips [0, a) of the launch prefill, [a, a + b) decode); else both run the config's plan, the first K of its dp
// replicas prefilling (serve.disaggregation.prefill_replicas; each chip where the config's mesh puts it).
struct Phases {
  bool per_phase = false;
  ServeGroup group[2];
  // This world rank's group (0 prefill, 1 decode) and its rank in the group's mesh order.
  std::pair<int, int> of(int world_rank) const;
};
// The groups of prefill_replicas K over the config's MESH and PLAN.
Phases phases_of_replicas(const sharding::DeviceMesh& mesh, const sharding::ParallelPlan& plan, int K);
// The groups of two plans over the launch's chips in world rank order, the prefill group first.
Phases phases_of_plans(const sharding::ParallelPlan& prefill, const sharding::ParallelPlan& decode);
// serve.disaggregation.prefill and .decode (D's parallel: sections, read by the one plan parser in the serving mode,
// each on as many chips as its axes take) on a launch of CHIPS: ConfigError (exit 2) at the key when a group is
// missing, the config has a parallel: of its own, a group's plan breaks a rule of the parser or takes more chips
// than the launch, or the groups' chips do not add up to CHIPS.
std::pair<sharding::ParallelPlan, sharding::ParallelPlan> read_phase_plans(const ConfigNode& root, const ConfigNode& d,
                                                                      const sharding::ModelSpec& spec, int chips);

class DisaggRun;  // apps/serve_disagg.cpp

struct Server {
  const runtime::World& world;
  runtime::Transport& tp;  // the world's transport (every chip)
  sharding::DeviceMesh& mesh;
  sim::Timeline& tl;
  models::LmTpTrainer& exec;
  sharding::plans::KvCache& kv;
  const serving::KvCapacity& cap;
  const serving::SchedulerConfig& sched;
  const std::string& config_name;
  int dp = 1, replica = 0;
  bool lead = true;  // the replica's first chip: its results go into the report
  // Disaggregated: the two groups (MESH, EXEC, KV are this chip's group's) and the launch's mesh (world ranks ->
  // chips); the model's figures a KV cache transfer moves.
  const Phases* phases = nullptr;
  const sharding::DeviceMesh* launch = nullptr;
  int64_t layers = 0, kv_heads = 0, head_dim = 0;
  double element_bytes = 0;
  std::map<std::vector<int64_t>, std::vector<serving::StageSpan>> memo{};
  int64_t simulated = 0;
  std::vector<serving::BatchEntry> longest{};  // the batch of this replica's longest iteration (--profile)
  double longest_s = 0;
  // CUDA graphs for decode (serve.cuda_graphs; vLLM's FULL_DECODE_ONLY mode): a batch of decodes only, of at most
  // GRAPH_MAX sequences, replays a captured graph (the device's cuda_graph launch mode: no per-kernel host issue,
  // sim/device_spec.h); every other batch runs eagerly. GRAPH_MAX 0: never (or the device is not eager anyway).
  int64_t graph_max = 0;
  bool graph_now = false;  // the timeline's current launch mode
  // Whether BATCH replays a graph; set_launch_mode puts the chip's timeline in that mode (a fresh timeline: call
  // it only where the timeline would be reset).
  bool graphed(const std::vector<serving::BatchEntry>& batch) const;
  void set_launch_mode(bool graph);

  // A batch alone through this replica's chips (a fresh timeline; memoised by its exact shape).
  serving::StageFn stage_fn();
  // MINE (sorted by arrival, ids 0..) through this replica's scheduler, every batch simulated on its chips.
  serving::ServeRun run_replica(const std::vector<serving::Request>& mine);
  // Colocated: request i on replica i mod dp, or (LEAST_TOKENS) each at its arrival on the replica with the fewest
  // outstanding tokens; each replica prefills and decodes its own.
  serving::ServeRun colocated(const std::vector<serving::Request>& reqs, bool least_tokens);
  // Disaggregated (apps/serve_disagg.cpp).
  serving::ServeRun disaggregated(const std::vector<serving::Request>& reqs, const DisaggOptions& o, Transfers& xfer);
  // --profile: the run's longest iteration simulated again with its events recorded. Collective.
  std::shared_ptr<const sim::Profile> profile_longest(double peak_tflops, std::string& what);

 private:
  friend class DisaggRun;
  // A batch's key in the memo: every sequence's cached and new tokens, in order.
  static std::vector<int64_t> shape_key(const std::vector<serving::BatchEntry>& batch);
  void note_longest(const std::vector<serving::BatchEntry>& batch, double end_s);
};

}  // namespace shardsim::apps::serve_detail

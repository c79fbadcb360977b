// `shardsim sweep`: a grid of topologies x collectives x algorithms x sizes x dtypes and of workloads x parallel
// plans, expanded into an ordered list of points (this file: parsing, expansion, result rows and CSV, gnuplot
// scripts; pure, no MPI). Running the points on sub-communicators is apps/sweep.cpp.
//
//   name: collectives-16
//   output: out/sweeps/collectives-16   # directory for results.csv, results.json, *.png (relative to the cwd;
//                                       # default out/sweeps/NAME; --output overrides)
//   validate_max_bytes: 4M              # (default 4M) collective points up to this size (per-rank buffer, the nccl-tests
//                                       # size) run with real data and are checked; larger ones run the same schedule
//                                       # in shape-only mode (timing: shape_only, verdict not_validated)
//   validate: once                      # (default) workload points: each distinct plan is validated once with real
//                                       # data on a shrunk copy of the workload, every full-size point is timed in
//                                       # shape-only mode (below); `every`: every point runs and is validated with
//                                       # real data at full size (also `shardsim sweep --validate-every`)
//   axes:
//     topology:                         # inline topology sections (topology/topology_yaml.h) or file paths
//       - {kind: ring, chips: 16, bandwidth_gbps: 100, latency_ns: 1000, label: ring16}   # label: optional
//       - configs/topologies/switch_8.yaml            # relative to the sweep file's directory
//     device: [trainium1, {preset: generic, hbm_gib: 64, name: big}]   # presets or device sections
//     collective: [all_reduce, all_gather, reduce_scatter]
//     algorithm: [auto, ring, bidir_ring, torus]      # per collective; auto = the lowest replayed estimate
//     size: {from: 1K, to: 1G, factor: 4}             # or a list: [1K, 64K, 1048576]
//     dtype: [fp32, bf16]
//     workload:                                       # workload configs (`shardsim run` files) or
//       - ../blocks/llama2_7b_tp8.yaml                #   {config: PATH, label: NAME, set: {seq: 256}}
//                                                     # or `shardsim train` configs (model: without kind):
//                                                     #   training plans, run by train's runner (below)
//     plan:                                           # `parallel:` sections; the value `chips` means the
//       - {tp: chips}                                 #   point's chip count. Keys: tp, sp, cp, cp_split,
//       - {tp: chips, sp: true}                       #   ulysses (blocks), all_reduce (MLP: the algorithm),
//       - {tp: chips, fused: true}                    #   fused, chunks (sharding/fused.h; a workload file's own
//       - {tp: 4, sp: true, dp: fill}                 #   fused/chunks carry over unless the plan sets them), dp
//                                                     #   (blocks: a size, `chips`, or `fill` = the replicas that
//                                                     #   fill the point's chips, chips / (tp·cp·ulysses·pp));
//                                                     #   training plans also: pp, schedule, virtual_stages,
//                                                     #   micro_batch (model.micro_batch), zero, bucket_bytes,
//                                                     #   recompute
//     rate: [1, 2, 4, 8]                              # serve workloads (a `shardsim serve` config: a serve:
//                                                     #   section): serve.trace.rate, requests/s
//     batching:                                       # serve workloads: serve-section settings per point
//       - {policy: continuous}                        #   (policy, max_num_batched_tokens, max_num_seqs,
//       - {policy: chunked, max_num_batched_tokens: 2048, label: chunked2k}   # preemption; label optional)
//
// Serve workloads (a workload entry whose config has a `serve:` section; its `requests:` key sets
// serve.trace.count) expand workload x topology x device x plan x batching x rate and each point runs exactly
// what `shardsim serve` runs on the generated config (apps/serve.cpp, shape-only): its row holds the rate, the
// batching label and the TTFT / TPOT / ITL / e2e percentiles, throughput and goodput (run_mode serve, verdict
// not_validated); serve_latency.gp plots TTFT and TPOT p50 / p99 against the rate.
//
// Two sub-grids, each the cartesian product of its axes (axes a grid does not use are ignored by it):
//   collectives: topology x device x collective x algorithm x dtype x size (innermost last)
//   workloads:   workload x topology x device x plan   (topology/device default to the workload file's own)
// Defaults: device [generic] for collectives, algorithm [auto], dtype [fp32]. A collective grid needs
// collective, size and topology; a workload grid needs workload and plan.
//
// Every point has a stable key made of its axis values and a hash of its full specification (topology, device
// and, for workloads, the whole config), used to resume: a changed topology gets a new key. The validation mode is
// not part of the key: results files written before `validate:` existed (every point validated at full size)
// still resume, and with validate: every, rows timed shape_only are run again (apps/sweep.cpp).
//
// Validate once (workloads): the point's config is shrunk (shrink rule below) and parsed with the same plan,
// topology and device; points whose shrunk configs are identical share one validation run (validation_key). The
// shrink keeps the plan's divisibility: blocks: hidden = heads x 8 (head_dim 8), ffn = 2 x hidden, seq = the
// smallest multiple of 2 x chips >= 64, layers <= 2 (heads and kv_heads kept); MLP: hidden 128, ffn 256 rounded
// up to a multiple of the chips, tokens 32; a dimension already smaller stays. When nothing shrinks, or the
// shrunk config does not fit the plan, the point itself runs with real data (validated_at `self`). A workload file
// with mode: shape_only is never validated (verdict not_validated, validated_at empty).
//
// Errors (ConfigError "FILE:LINE: ...", exit 2): unknown top-level key or axis, an empty axis, an unknown
// collective / dtype / device preset, an algorithm no listed collective knows, a bad topology or size, an
// unknown plan key, duplicate labels. Combinations that cannot run (an algorithm another listed collective knows,
// a plan that does not fit the shape or chip count) are not errors: the point carries the reason and is
// recorded as failed.
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace shardsim::experiments {

enum class PointKind { collective, workload };

struct SweepPoint {
  int index = 0;
  PointKind kind = PointKind::collective;
  std::string key;  // stable id: axis values + hash of the spec
  int chips = 0;    // chips (ranks) the point needs
  // Axis values (labels) as they appear in the results.
  std::string topology, device;
  std::string collective, algorithm, dtype;
  size_t size_bytes = 0;  // as requested (the row reports the size actually used after rounding)
  std::string workload, plan;
  // What running it needs.
  std::string topology_yaml;  // the topology section, one line of flow YAML
  std::string device_yaml;    // the device section, one line of flow YAML
  std::string config_yaml;    // workloads: the whole config as generated (the key's hash; what the point runs)
  std::string origin;         // "FILE:LINE" of the axis entry that made it (for messages)
  std::string error;          // non-empty: cannot run (bad combination); recorded as failed with this reason
  // Workloads run through the one executor (apps/train.cpp), as the command would run CONFIG_YAML: a `shardsim
  // run` config (model.kind mlp | transformer_block) in its forward mode (TRAIN false: exactly what `run` computes
  // for it), a `shardsim train` config (model: without kind) in its training mode (TRAIN true: what `train`
  // computes). The config is checked by the executor's parser when the sweep is loaded (a plan that cannot run
  // sets ERROR). SHAPE_ONLY: the config says mode: shape_only (never validated). MICRO_BATCHES: per replica and
  // step (1 without model.micro_batch), from the parsed plan.
  bool train = false;
  bool shape_only = false;
  int micro_batches = 0;
  // Serve points (a `shardsim serve` config as the workload): run by serve's runner (experiments/scheduler.h
  // ServeRunner); RATE and BATCHING their axis values ("" when the axis is not given).
  bool serve = false;
  std::string rate, batching;
  // Forward points, validate once: the shrunk config that validates this point's plan with real data ("": the
  // point validates itself, or is never validated), the id shared by the points it validates, and the shrunk
  // dimensions ("hidden=256,ffn=512,seq=64,layers=2": the results' validated_at column).
  std::string validation_config_yaml;
  std::string validation_key, validation_dims;
};

struct SweepSpec {
  std::string file, name, output;
  double validate_max_bytes = 4.0 * 1024 * 1024;
  bool validate_every = false;  // validate: every (or --validate-every): workload points validate at full size
  std::string what_if;          // `sweep --what-if SPEC` (apps/profile.h): per workload point, each change's speedup
  std::vector<std::string> axes;  // the axis names given, in file order
  std::vector<SweepPoint> points;
};

// The keys the sweep parser accepts per section (docs/CONFIG.md documents each; tests/unit/config_doc_test.cpp
// checks): the file, axes:, a workload entry {config, label, set}, a size range {from, to, factor}, a plan entry.
inline constexpr std::string_view kSweepRootKeys[] = {"name", "output", "validate_max_bytes", "validate", "axes"};
inline constexpr std::string_view kSweepAxisKeys[] = {"topology", "device", "collective", "algorithm", "size",
                                                      "dtype",    "workload", "plan",     "rate",      "batching"};
inline constexpr std::string_view kSweepWorkloadKeys[] = {"config", "label", "set", "requests"};
inline constexpr std::string_view kSweepBatchingKeys[] = {"label", "policy", "max_num_batched_tokens", "max_num_seqs",
                                                          "preemption"};
inline constexpr std::string_view kSweepRangeKeys[] = {"from", "to", "factor"};
// kSweepPlanKeys: sharding/plans/registry.h's sweep_plan_keys() (every unit's swept keys and micro_batch).

SweepSpec load_sweep(const std::string& file);
// True when POINT runs in shape-only mode and takes its verdict from its plan's validation run (validate once, a
// forward point with a validation_config_yaml).
bool validated_separately(const SweepPoint& point, const SweepSpec& spec);
SweepSpec parse_sweep(const std::string& text, const std::string& file);

// common/byte_size.h's parse_byte_size with a minimum of 1 B (the one size parser, shared with the CLI).
size_t parse_size(const std::string& text);
// 1024 -> "1KiB", 1536 -> "1536B", 1<<30 -> "1GiB".
std::string size_label(size_t bytes);

// A result row: column -> value (strings as written to the CSV; numbers formatted with full precision).
// `ranks`: the world ranks the point ran on, e.g. "4-7" (empty if it did not run). `timing`: `run` (real data)
// or `shape_only` (the same schedule and kernels, no data). `validated_at`: where the point's code was checked
// against one device with real data: `self` (this point, at full size), the shrunk dimensions of its plan's
// validation run ("hidden=256,ffn=512,seq=64,layers=2"; the row's verdict and max_rel_error are that run's),
// or empty (not validated: collective points above validate_max_bytes, workloads with mode: shape_only, and rows
// written before the column existed). `verdict`: pass | fail | not_validated | error.
using Row = std::map<std::string, std::string>;
// The CSV columns, in order.
const std::vector<std::string>& result_columns();
// A row with the point's axis values filled in (key, kind, topology, ...).
Row base_row(const SweepPoint& p);

// CSV (RFC 4180 quoting). to_csv writes the header and ROWS. parse_csv returns the complete rows of TEXT: a
// last line without its newline (an interrupted write) and rows with the wrong field count are dropped and
// counted in DROPPED. Columns are matched by name (older files
// lacking a newer column resume); a header with a column that is not ours, or without `key`, is a ConfigError naming FILE.
// Formula injection (OWASP "CSV Injection", docs/SECURITY.md): csv_line writes every cell through csv_cell, which
// prefixes a ' to a cell that starts with = + - @ TAB or CR and is not a number, so a spreadsheet shows it as
// text; parse_csv undoes it (csv_uncell), so a label round-trips through resume unchanged.
std::string csv_cell(const std::string& value);
std::string csv_uncell(const std::string& cell);
std::string csv_line(const std::vector<std::string>& fields);
// EXTRA: the sweep's what-if columns after result_columns() (what_if_columns).
std::string csv_header(const std::vector<std::string>& extra = {});
std::string csv_row(const Row& row, const std::vector<std::string>& extra = {});
// `sweep --what-if`: the column of a change, "speedup[link_bw=2x]" (baseline time / the time with the change;
// workload points that ran; empty elsewhere). what_if_columns: such columns of ROWS (in first-seen order) followed
// by those of SPEC's changes, each once: a resumed results file keeps the columns it had.
std::string what_if_column(const std::string& change);
bool is_what_if_column(const std::string& column);
std::vector<std::string> what_if_columns(const std::vector<Row>& rows, const std::string& spec);
// The changes of a --what-if SPEC, split as apps/profile.h splits them (by commas), empty ones dropped.
std::vector<std::string> what_if_changes(const std::string& spec);
std::vector<Row> parse_csv(const std::string& text, const std::string& file, int* dropped = nullptr);
// The answer of a workload sweep: per workload x topology x device, the plan with the lowest simulated time
// among the points that ran and did not fail validation (verdict pass or not_validated), with its breakdown
// (the row), how many plans were compared, and the plans that could not run with their reasons (verdict error:
// e.g. a plan that cannot fill the chips). Groups in the rows' order of first appearance.
// Training plans (run_mode train) are ranked by throughput instead: the highest tokens_per_s at the workload's
// global batch among the plans that ran and fit in HBM (fits_hbm yes); plans over HBM are listed in over_hbm,
// never ranked or named best. Forward and training rows of one topology x device are separate groups.
struct BestPlan {
  std::string workload, topology, device;
  bool train = false;
  Row best;        // empty when no plan of the group ran
  int compared = 0;
  std::vector<Row> ranked;    // training: the fitting plans, highest tokens/s first (best = ranked.front())
  std::vector<Row> over_hbm;  // training: plans that ran but do not fit in the device's HBM
  std::vector<std::pair<std::string, std::string>> skipped;  // plan, reason
  std::vector<std::pair<std::string, std::string>> failed;   // plan, reason (validation failed)
};
std::vector<BestPlan> best_plans(const std::vector<Row>& rows);
// The "best plan per topology x device" table ("" when the rows hold no workload point).
std::string best_plans_text(const std::vector<BestPlan>& best);

// The rows as a JSON document {"sweep": NAME, "rows": [...], "best_plans": [...]} with numeric columns as numbers.
std::string rows_to_json(const std::string& name, const std::vector<Row>& rows);

// Gnuplot: writes FILE.dat/FILE.gp pairs for the plots the rows support into DIR and returns the script names
// (relative to DIR): busbw_<collective>.gp (busbw vs size, log x, one line per topology/algorithm[/dtype/device]),
// breakdown.gp (stacked bars of compute / exposed communication / rest per workload, plan, topology) and, for
// training plans, train.gp (step time as bars, pipeline bubble as points, per plan that ran).
std::vector<std::string> write_plot_scripts(const std::string& dir, const std::vector<Row>& rows);

// FNV-1a 64-bit of TEXT as 8 hex digits (the low 32 bits), for keys.
std::string short_hash(const std::string& text);

}  // namespace shardsim::experiments

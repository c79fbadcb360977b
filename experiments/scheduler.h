// Running a sweep's points on one MPI launch (experiments/sweep.h builds them; apps/sweep.cpp parses the command
// line, resumes results.csv and prints).
//
// Chips, not ranks: with one chip per rank (the default) a chip is an MPI rank; with several chips per rank
// (runtime/chips.h, --chips-per-rank K / --chips N) WORLD and the groups are chip-level and every sentence below
// reads "chip" for "rank": a group may sit on one MPI rank or span several, and the chips of a rank run their
// groups' points side by side as fibers. The rows do not depend on K: the same grouping of the same chip-level
// ranks, the same points on the same groups, the same simulated numbers (tests/e2e/sweep_chips.sh).
//
// run_point: one point on a group of ranks (GROUP: a runtime::World over exactly the point's chips). Collective
// points with size <= validate_max_bytes run with real data through verification::CaseRunner exactly as
// `shardsim bench` runs its out-of-place column and are checked element by element (verdict pass/fail,
// validated_at self); larger ones run the same CaseRunner and schedule in shape-only mode, as `bench --shape-only`
// (runtime/transport.h: messages carry only their timing headers; timing `shape_only`, verdict `not_validated`),
// so their simulated time equals the real-data run's (bench/sweep_vs_bench.sh). Workload points run their config
// through the one executor in the command's mode (PointRunners below), no checkpoint: with real data (validated
// against one device, validated_at self), or, when validated_separately (validate once), in shape-only mode with
// validated_at = the shrunk dimensions; the caller then merges the plan's validation row (apply_validation). A point that cannot run gives a row with verdict `error` and the reason. The row is complete on
// GROUP's rank 0. WORLD_SIZE: ranks of the whole launch (host-memory estimate).
//
// run_in_groups, the group scheduler: points are grouped by the chips they need (BY_CHIPS: k -> indices into
// SPEC.points, k ascending). For each k the world is split into floor(N/k) groups of k consecutive ranks
// (MPI_Comm_split, or runtime/chip_split.h's chips::split with several chips per rank; the remaining ranks idle) and the points go round-robin to the groups, which run them side by
// side in waves; after each wave every row goes to rank 0 (on_rows, inside World::agree so a failed write stops
// every rank with one line). Every point runs on a fresh simulated clock, so its simulated numbers do not depend
// on what runs beside it. Collective over WORLD.
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "experiments/sweep.h"
#include "reporting/report.h"
#include "runtime/world.h"

namespace shardsim::experiments {

// Workload points: the one executor (apps/train.cpp's run_executor_point; this library sits below apps/) on GROUP
// for the point's generated config, quiet, returning its report: RUN.train false is `run`'s forward mode, true
// `train`'s training mode, exactly what the command computes for the same config. RUN.validate: real data, compared
// with the single-device reference (the forward's output and loss, or the training losses); RUN.shape_only: the
// same program on shape-only tensors (validate once's full-size points). RUN.what_if: a --what-if spec ("" none)
// whose rows (the report's what_if) become the row's speedup columns. Errors every chip agreed on (AgreedError: a
// plan the executor refuses, host memory) make the row `error` with the reason.
struct ExecutorRun {
  std::string config_yaml, where;  // the config as generated; WHERE names it in messages
  bool train = false;
  bool validate = false;
  bool shape_only = false;
  std::string what_if;
};
using ExecutorRunner = std::function<reporting::RunReport(const runtime::World& group, const ExecutorRun& run)>;
// Serve points (SweepPoint::serve): `shardsim serve`'s run on GROUP for the point's generated config (CONFIG_YAML;
// WHERE names it in messages), quiet, returning its metrics by result column (ttft_p50_ms, ...; valid on GROUP's
// rank 0). apps/serve.cpp's run_serve_point. Errors every chip agreed on make the row `error` with the reason.
using ServeRunner = std::function<std::map<std::string, double>(const runtime::World& group,
                                                                const std::string& config_yaml, const std::string& where)>;
struct PointRunners {
  ExecutorRunner executor;
  ServeRunner serve;
};

Row run_point(const runtime::World& group, const SweepPoint& point, const SweepSpec& spec, int world_size,
              const PointRunners& runners = {});

// Validate once: ROW (a shape-only workload row) with the verdict and max_rel_error of its plan's validation row
// V (null: none ran). A failed validation fails the row; a validation that could not run, or a workload with
// validation disabled, leaves it not_validated with the reason and an empty validated_at.
Row apply_validation(Row row, const Row* v);
// The distinct validation runs the points TODO (indices into SPEC.points) need, one per validation_key: copies of
// the first such point with its validation_config_yaml as the config and the validation_key as the key.
std::vector<SweepPoint> validation_points(const SweepSpec& spec, const std::vector<size_t>& todo);

// ROW with verdict `error` and REASON.
Row failed_row(Row row, const std::string& reason);
// "all_reduce ring ring8 generic 1KiB fp32" / "llama2_7b tp8 ring8 trainium1": the progress line's point.
std::string point_text(const SweepPoint& point);

struct GroupCallbacks {
  std::function<void(int chips, size_t points, int groups)> on_chips;  // rank 0, before each chip count
  std::function<void(const std::vector<size_t>& wave)> on_wave;        // rank 0, the wave's points, before it runs
  std::function<void(const std::vector<Row>& rows)> on_rows;           // rank 0, the wave's rows (inside agree)
  PointRunners runners;                                                // workload points (run_point)
  // One MPI rank, chips started per point (apps/sweep.cpp): WORLD is the sweep's one chip, and LAUNCH(k, POINT,
  // RUN) starts k chips for POINT alone (folded where it folds), runs RUN on them and returns chip 0's row. The
  // points then run one at a time (on one rank the groups' fibers shared one thread anyway); the row's `ranks`
  // keeps the label of the group the point would have had among LAUNCH_CHIPS chips, so the rows equal those of
  // any other launch.
  std::function<Row(int k, const SweepPoint& point, const std::function<Row(const runtime::World&)>& run)> launch;
  int launch_chips = 0;
};
void run_in_groups(const runtime::World& world, const SweepSpec& spec,
                   const std::map<int, std::vector<size_t>>& by_chips, const GroupCallbacks& callbacks);

}  // namespace shardsim::experiments

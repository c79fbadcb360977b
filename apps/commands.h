// The CLI's subcommands besides `run`: each adds itself to the app and returns what to call when parsed.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <map>
#include <optional>
#include <string>

#include "experiments/scheduler.h"
#include "experiments/sweep.h"
#include "reporting/report.h"
#include "reporting/trace_filter.h"
#include "sharding/engine_config.h"
#include "runtime/chips.h"
#include "runtime/world.h"

namespace shardsim::apps {

// `run`'s options (apps/main.cpp): its output and resume flags, as the executor's forward mode takes them
// (run_forward below).
struct RunOptions {
  std::string resume_from;                     // --resume: read the weights from this checkpoint
  std::optional<std::string> checkpoint_path;  // --checkpoint: overrides the config's checkpoint: section
  bool no_checkpoint = false;                  // --no-checkpoint
  std::string trace_path;                      // --trace: a Chrome trace of the simulated timelines
  reporting::TraceOptions trace;                // its filters and size limit (reporting/trace_filter.h)
  bool profile = false;                        // --profile: the critical path across chips (reporting/profile.h)
  std::string plots_dir;                       // --plots: roofline and utilisation plots (reporting/profile_plots.h)
  bool shape_only = false;                     // --shape-only: shape-only mode whatever the config's mode: says
};

struct Command {
  CLI::App* app = nullptr;
  std::function<int()> run;
};

Command add_validate(CLI::App& app, const runtime::World& world);
Command add_bench(CLI::App& app, const runtime::World& world);
Command add_topo(CLI::App& app, const runtime::World& world);
Command add_ckpt(CLI::App& app, const runtime::World& world);  // ckpt.cpp
Command add_sweep(CLI::App& app, const runtime::World& world);  // sweep.cpp
Command add_calibrate(CLI::App& app, const runtime::World& world);  // calibrate.cpp
Command add_train(CLI::App& app, const runtime::World& world);  // train.cpp
Command add_serve(CLI::App& app, const runtime::World& world);  // serve.cpp
// The fold of `train` ARGS (the whole command line) on CHIPS chips and RANKS MPI ranks (docs/performance/fold.md):
// SPEC.on() where every data-parallel replica provably runs the same program at the same simulated times, else
// WHY_NOT (one line, for a train command that is not folded). Decided before any chip starts (main); never throws.
// The plan's collectives over the replicas are decided next, when the trainer is built (before its first step).
struct FoldDecision {
  runtime::FoldSpec spec;
  std::string why_not;    // why a train run is not folded ("" when it is, or for other commands)
  bool on = false;        // fold: on (and not --no-fold): not folding is an error, never a silent full run
  bool expected = false;  // a shape-only run with replicas that auto leaves unfolded: main says why in one note
};
FoldDecision train_fold(const std::vector<std::string>& args, int chips, int ranks);
// The fold of one training sweep point on one MPI rank (run_executor_point's config CONFIG_TEXT, WHERE, VALIDATE and
// WHAT_IF on CHIPS chips): the decision train_fold makes for the same run under `train`. Never throws.
FoldDecision train_point_fold(const std::string& config_text, const std::string& where, int chips, bool validate,
                              const std::string& what_if);
// `sweep` on one MPI rank with --chips N > 1 (apps/main.cpp): the sweep runs on one chip and starts each point's
// chips for that point alone (folded where the point folds as `train` would fold it; docs/performance/fold.md).
// CHIPS: the launch's chips (N); MAX_UNFOLDED: the most chips one rank may host unfolded. 0: not in that mode.
void set_sweep_point_launch(int chips, int max_unfolded);
Command add_help(CLI::App& app, const runtime::World& world);  // help.cpp: `help config`
Command add_import(CLI::App& app, const runtime::World& world);  // interop.cpp: import hf|megatron|torchtitan
Command add_export(CLI::App& app, const runtime::World& world);  // interop.cpp: export megatron|torchtitan
// interop.cpp, for `sweep --export KIND`: the launch arguments (KIND megatron) or job TOML (torchtitan) of each
// training group's best plan in BEST, exported from its point's generated config in SPEC; "" when KIND is empty or
// no training group has a best plan. A point that cannot be exported gets one line saying why (never an error).
std::string winner_exports(const std::string& kind, const experiments::SweepSpec& spec,
                           const std::vector<experiments::BestPlan>& best);

// One sweep point (train.cpp; experiments/scheduler.h's ExecutorRun): the one executor on WORLD for the point's
// config, quiet, in `run`'s forward mode or `train`'s training mode (RUN.train), exactly what the command runs for
// the same config (no checkpoint). The report is complete on rank 0. Errors as the command's (AgreedError on
// every rank).
reporting::RunReport run_executor_point(const runtime::World& world, const experiments::ExecutorRun& run);

// One serve sweep point (serve.cpp): `shardsim serve` on WORLD for the config CONFIG_TEXT (WHERE names it in
// messages), quiet; its metrics by sweep result column (experiments/scheduler.h ServeRunner), on every rank.
// Errors as `serve`'s (AgreedError on every rank).
std::map<std::string, double> run_serve_point(const runtime::World& world, const std::string& config_text,
                                              const std::string& where);

// `run` on a model with a vocabulary (model.kind lm, or no kind): the forward mode of the one executor
// (apps/train.cpp, models/lm_tp.h's LmTpTrainer::forward_step): one forward of the first step's batch through the
// plan (any of tp, sp, fused, cp, Ulysses, dp/ZeRO, pp with its schedule's forward actions), validated against the
// single-device forward's loss (unless shape-only); --checkpoint writes the weights as a training state at its
// step, --resume reads one. The report is train's, in forward mode. Errors as `train`'s.
int run_forward(const runtime::World& world, const std::string& config, const std::string& json_path,
                const RunOptions& opt, const sharding::ConfigOverrides& overrides,
                const std::string& what_if);

}  // namespace shardsim::apps

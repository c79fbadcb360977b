// Internal to apps/train*.cpp (not a public header): what `train` parses and loads, shared by the command
// (apps/train.cpp) and its setup (apps/train_setup.cpp: the config loader, the CLI options, the fold decision).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "common/config.h"
#include "models/lm_model.h"
#include "models/lm_train.h"
#include "models/lm_tp.h"
#include "reporting/report.h"
#include "reporting/trace_filter.h"
#include "runtime/world.h"
#include "sharding/device_mesh.h"
#include "sharding/engine_config.h"
#include "sharding/model_spec.h"
#include "sim/cost.h"
#include "topology/topology.h"

namespace shardsim::apps::train_detail {

// Upper limit of train.steps / --steps: every step computes on the host with real data (the default config takes
// ~4 ms per step here, so a million steps is about an hour); beyond that a typo (1e12) would run for years.
constexpr int64_t kMaxSteps = sharding::SpecBounds::steps;

struct TrainFlags {
  std::string config = std::string(SHARDSIM_CONFIG_DIR) + "/lm_train.yaml";
  int64_t steps = 0;  // 0: the config's
  std::string checkpoint;  // training-state checkpoint written every save_every steps and after the last one
  bool no_checkpoint = false;  // --no-checkpoint: write none (run's default target, the config's, is dropped)
  int64_t save_every = 0;  // 0: only after the last step
  std::string resume;      // continue from this training-state checkpoint
  bool shape_only = false; // --shape-only: no data (mode: shape_only in the config does the same)
  bool validate = false;   // --validate: compare the losses with the single-device reference
  std::string json_path;   // --json: the report as JSON (reporting/report.h, the same fields as run's)
  std::string trace_path;  // --trace: Chrome trace of the simulated timelines (reporting/trace.h, as run's)
  reporting::TraceOptions trace;  // its filters, step and size limit (reporting/trace_filter.h)
  bool profile = false;    // --profile: the last step's critical path across chips (reporting/profile.h)
  std::string plots_dir;   // --plots: roofline and utilisation plots of the last step (reporting/profile_plots.h)
  std::string what_if;     // --what-if: changes re-simulated in shape-only mode (apps/profile.h)
  bool no_fold = false;    // --no-fold: simulate every chip, never fold (fold: off does the same)
  // The executor's forward mode (`shardsim run` on a model with a vocabulary): one forward of the step's batch
  // through the plan, validated against the single-device forward (unless shape-only), no update.
  bool forward = false;
  bool serve = false;      // the serve command (apps/serve.cpp): its serve: section is a root key too
  bool quiet = false;      // a what-if re-simulation: print nothing
  double* step_ns_out = nullptr;  // set to the simulated step (a what-if re-simulation)
  std::string config_text;        // a sweep point: the config as generated (config names it in messages)
  reporting::RunReport* report_out = nullptr;  // a sweep point: set to the report (quiet: nothing printed)
  sharding::ConfigOverrides overrides;  // run's overrides: --topology/--ring/--torus/--mesh/--bandwidth/--latency/
                                        // --device/--plan/--set
};

struct TrainSetup {
  // The executor's model: SPEC (below) with, for a MoE model, the reference's token groups in moe->spec.capacity.
  sharding::ModelSpec model;
  models::LmTrainConfig train;
  sim::DeviceSpec device;
  models::LmDpConfig dp;
  int tp = 1;                                  // parallel.tp: tensor parallelism (models/lm_tp.h) when > 1
  bool sp = false;                             // parallel.sp: sequence parallelism on the tp axis
  int cp = 1;                                  // parallel.cp: context parallelism (ring attention) when > 1
  bool cp_zigzag = true;                       // parallel.cp_split: zigzag (default) or contiguous
  bool ulysses = false;                        // parallel.ulysses: U given (the cp axis runs Ulysses, size U)
  bool fused = false;                          // parallel.fused: sp collectives fused with their GEMMs
  int pp = 1;                                  // parallel.pp: pipeline stages (schedule etc. in dp)
  sharding::ModelSpec spec;                    // the model: section (the one parser)
  sharding::ParallelPlan plan;                 // the parallel: section: the mesh (build_mesh) and the plan line
  // The topology: section, or the default ring of the chips (default_topology); shared by the chips of a rank
  // (per_rank_topology: one copy per rank, not one per chip, whose links grow with the chips).
  std::shared_ptr<const topology::Topology> topology;
  bool default_topology = false;
  std::string config_name;                     // the config file, for messages
  std::string name;                            // the config's name: (printable text), "" when absent
  std::string config_text;                     // stored in checkpoints
  bool shape_only = false;                     // mode: shape_only or --shape-only
  // validate: {enabled: true} (a `run` config's section): compare with the single-device reference as --validate
  // does, in a real-data run (shape-only runs compute nothing to compare).
  bool validate_config = false;
  bool validate_off = false;  // validate: {enabled: false}: run's forward is not compared with the reference
  bool has_train_section = false;  // a train: section (run, the forward mode, reads none of it)
  // validate.tolerance: the forward mode's limit for a block stack's output rows, max|y - y_ref| / max|y_ref| (0: the
  // dtype's default, 1e-4 fp32 and 3e-2 bf16; the losses' limit follows models/lm_validate.h).
  double row_tolerance = 0;
  // fold: auto (the default) or on, and not --no-fold (docs/performance/fold.md): the run may be folded when
  // train_fold's conditions hold; auto falls back to every chip where the symmetry breaks, on stops with exit 3.
  bool fold = true;
};

// The config file (or a sweep point's text) with the run's overrides applied (run's loader).
ConfigNode train_config(const TrainFlags& f);
// The config through the one parser of every command (sharding/model_spec.h). RANKS: the chips of the run.
// Errors: ConfigError / UsageError (exit 2) naming the key.
TrainSetup load(const TrainFlags& f, int ranks);
// The plan's mesh on the topology (sharding/device_mesh.h's build_mesh, as run's: tp innermost, Megatron's order,
// mesh_dims honoured), agreed by every rank; a plan the topology cannot hold is a UsageError (exit 2) naming the
// config. Shared by train and serve.
sharding::DeviceMesh run_mesh(const runtime::World& world, const TrainSetup& s);
// The `train` subcommand's options and flags into FLAGS.
void train_options(CLI::App* sub, const std::shared_ptr<TrainFlags>& flags);

}  // namespace shardsim::apps::train_detail

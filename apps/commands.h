// The CLI's subcommands besides `run`: each adds itself to the app and returns what to call when parsed.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>

#include "models/report.h"
#include "runtime/chips.h"
#include "runtime/world.h"

namespace shardsim::apps {

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
// The fold of `train` ARGS (the whole command line) on CHIPS chips and RANKS MPI ranks (docs/performance/fold.md):
// replicas > 1 where every data-parallel replica provably runs the same program at the same simulated times, else
// none. Decided before any chip starts (main); never throws.
runtime::FoldSpec train_fold(const std::vector<std::string>& args, int chips, int ranks);
Command add_help(CLI::App& app, const runtime::World& world);  // help.cpp: `help config`
Command add_import(CLI::App& app, const runtime::World& world);  // interop.cpp: import hf|megatron|torchtitan
Command add_export(CLI::App& app, const runtime::World& world);  // interop.cpp: export megatron|torchtitan

// One training sweep point (train.cpp): `shardsim train`'s runner on WORLD for the config CONFIG_TEXT (WHERE names it
// in messages), quiet; VALIDATE compares the losses with the single-device reference; WHAT_IF (train's --what-if
// spec, "" none) fills the report's what_if rows. The report is complete on rank 0. Errors as `train`'s
// (AgreedError on every rank).
sharding::RunReport run_train_point(const runtime::World& world, const std::string& config_text, const std::string& where,
                                    bool validate, const std::string& what_if);

}  // namespace shardsim::apps

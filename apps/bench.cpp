// `shardsim bench`: placeholder until the nccl-tests-style benchmark lands.
#include "apps/commands.h"

namespace shardsim::apps {

Command add_bench(CLI::App& app, const runtime::World& world) {
  (void)world;
  auto* sub = app.add_subcommand("bench", "nccl-tests-style bandwidth tables (simulated and wall)");
  return {sub, [] { return 0; }};
}

}  // namespace shardsim::apps

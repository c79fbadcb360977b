// `shardsim help config`: every config section and the keys its parser accepts (experiments/config_keys.h),
// and where the full reference (defaults, units, meaning) is: docs/CONFIG.md.
#include <cstdio>
#include <memory>
#include <string>

#include "apps/commands.h"
#include "common/error.h"
#include "experiments/config_keys.h"

namespace shardsim::apps {

Command add_help(CLI::App& app, const runtime::World& world) {
  auto* cmd = app.add_subcommand("help", "reference: `shardsim help config` lists every config key (docs/CONFIG.md)");
  auto topic = std::make_shared<std::string>();
  cmd->add_option("topic", *topic, "config")->required()->check(CLI::IsMember({"config"}));
  return {cmd, [&world, topic]() -> int {
            if (world.rank() != 0) return kExitOk;
            std::printf("Config keys shardsim accepts, per section (full reference with defaults and units:\n"
                        "docs/CONFIG.md, also at %s/../docs/CONFIG.md)\n",
                        SHARDSIM_CONFIG_DIR);
            for (const auto& s : sharding::config_key_sections()) {
              std::string keys;
              for (auto k : s.keys) keys += (keys.empty() ? "" : ", ") + std::string(k);
              std::printf("\n%.*s  (%.*s)\n  %s\n", static_cast<int>(s.section.size()), s.section.data(),
                          static_cast<int>(s.applies.size()), s.applies.data(), keys.c_str());
            }
            std::printf("\nA run config's model: section is also read under its older name workload:.\n"
                        "run overrides: --topology FILE, --ring N, --torus AxB, --mesh AxB, --bandwidth GBPS, "
                        "--latency NS,\n  --device PRESET, --plan tp=2,cp=4, --set key.path=value\n");
            return kExitOk;
          }};
}

}  // namespace shardsim::apps

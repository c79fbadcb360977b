// The plan registry's modes (sharding/plans/registry.h, PlanModes): what `shardsim help plans` lists as running
// in a mode (forward: `run`, train, serve) is accepted by the executor's loader in that mode, what it lists as
// refused is refused (a ConfigError, exit 2, naming the key), and docs/CONFIG.md's modes column says the same.
// Every registered plan is enumerated: a new registration is tested without editing this file.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/error.h"
#include "tests/unit/config_doc.h"
#include "models/executor_config.h"
#include "sharding/plans/registry.h"

namespace shardsim::sharding::plans {
namespace {

// CASE loaded as the executor loads it in MODE (models/executor_config.h; the model: section as workload:). "" when
// accepted, else the ConfigError's message (its exit code must be 2).
std::string load_in(const PlanCase& c, PlanMode mode) {
  std::string yaml = c.yaml;
  if (yaml.rfind("model:", 0) == 0) yaml = "workload:" + yaml.substr(6);
  try {
    const ConfigNode root = ConfigNode::load_string(yaml, "t.yaml");
    (void)models::read_executor_config(root, c.chips, mode == PlanMode::forward, mode == PlanMode::serve);
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.exit_code(), 2) << e.what();
    return e.what();
  }
  return "";
}

// The parallel: keys CASE gives ("parallel: {tp: 2, sp: true}" -> tp, sp).
std::vector<std::string> keys_of(const PlanCase& c) {
  std::vector<std::string> keys;
  for (auto k : plan_keys()) {
    const std::string name(k);
    const size_t at = c.yaml.find("parallel:");
    const std::string par = c.yaml.substr(at);
    if (par.find("{" + name + ": ") != std::string::npos || par.find(" " + name + ": ") != std::string::npos)
      keys.push_back(name);
  }
  return keys;
}

// The cases of descriptor D: its mode cases, else its example (when it is a training-model config).
std::vector<PlanCase> cases_of(const PlanDescriptor& d) {
  if (!d.mode_cases.empty()) return d.mode_cases;
  if (d.example.use == SpecUse::train) return {d.example};
  return {};
}

class PlanModesTest : public ::testing::TestWithParam<std::string> {};

std::vector<std::string> plan_names() {
  std::vector<std::string> v;
  for (const auto& d : registered_plans()) v.push_back(d.name);
  return v;
}

TEST_P(PlanModesTest, AcceptedWhereHelpSaysItRunsRefusedWhereItSaysRefused) {
  const PlanDescriptor& d = *find_plan(GetParam());
  const std::vector<PlanCase> cases = cases_of(d);
  ASSERT_FALSE(cases.empty()) << d.name << ": no training-model case to load in each mode (mode_cases)";
  const std::string help = catalogue_text();
  for (const PlanCase& c : cases)
    for (const PlanMode mode : kPlanModes) {
      // Refused when a key the case gives is refused in MODE (its own modes, else its unit's), as help lists it.
      std::string refused_key;
      for (const std::string& k : keys_of(c)) {
        const PlanKey* key = nullptr;
        const PlanDescriptor* owner = plan_of_key(k, &key);
        ASSERT_NE(owner, nullptr) << k;
        const PlanModes& m = owner->modes_of(*key);
        // help prints the unit's modes on its block and a key's own modes beside it: the same text as the rule
        EXPECT_NE(help.find(key->modes ? "[modes: " + modes_text(m, true) : "  modes: " + modes_text(m, true)),
                  std::string::npos)
            << k;
        if (m.in(mode) == ModeUse::refused && refused_key.empty()) refused_key = k;
      }
      const std::string error = load_in(c, mode);
      if (refused_key.empty()) {
        EXPECT_EQ(error, "") << d.name << " in " << plan_mode_name(mode) << ": " << c.yaml;
      } else {
        EXPECT_NE(error.find("t.yaml:"), std::string::npos) << c.yaml << " -> " << error;
        EXPECT_NE(error.find("parallel."), std::string::npos) << c.yaml << " -> " << error;
        EXPECT_NE(error, "") << d.name << " in " << plan_mode_name(mode) << " should be refused (" << refused_key
                             << "): " << c.yaml;
      }
    }
}

// docs/CONFIG.md's parallel: table: each key's row has the modes column help derives from the same descriptor.
TEST_P(PlanModesTest, ConfigDocModesColumnIsTheRegistrys) {
  const std::string section = test::config_doc_section(test::read_config_doc(), "parallel");
  ASSERT_FALSE(section.empty()) << "docs/CONFIG.md has no ### `parallel` section";
  const PlanDescriptor& d = *find_plan(GetParam());
  for (const PlanKey& k : d.keys) {
    const size_t row = section.find("\n| `" + k.name + "` |");
    ASSERT_NE(row, std::string::npos) << k.name;
    const std::string line = section.substr(row + 1, section.find('\n', row + 1) - row - 1);
    EXPECT_NE(line.find("| " + modes_text(d.modes_of(k)) + " |"), std::string::npos)
        << k.name << ": the row should say '" << modes_text(d.modes_of(k)) << "': " << line;
  }
}

INSTANTIATE_TEST_SUITE_P(Registered, PlanModesTest, ::testing::ValuesIn(plan_names()),
                         [](const auto& info) { return info.param; });

// A unit that shards the attention (PlanDescriptor::needs_attention: cp, ulysses) is refused on the MLP-only
// model naming its key, in every mode, before any rule of its own (no "0 KV heads").
TEST(PlanModesAttention, ContextUnitsRefusedOnTheMlpOnlyModel) {
  int units = 0;
  for (const auto& d : registered_plans()) {
    if (!d.needs_attention) continue;
    ++units;
    for (const PlanMode mode : {PlanMode::forward, PlanMode::train}) {
      const PlanCase c{"workload: {kind: mlp, hidden: 64, ffn: 128, tokens: 16}\nparallel: {" + d.name + ": 2}\n",
                       SpecUse::train, 2, ""};
      const std::string error = load_in(c, mode);
      EXPECT_NE(error.find("parallel." + d.name + ": needs attention"), std::string::npos) << error;
      EXPECT_EQ(error.find("KV heads"), std::string::npos) << error;
    }
  }
  EXPECT_GE(units, 2);  // cp and ulysses
}

TEST(PlanModesText, GroupsTheModesByWhatTheyDo) {
  EXPECT_EQ(modes_text({}), "forward, train, serve");
  EXPECT_EQ(modes_text({ModeUse::runs, ModeUse::runs, ModeUse::refused, "why"}), "forward, train; serve: refused");
  EXPECT_EQ(modes_text({ModeUse::no_effect, ModeUse::runs, ModeUse::no_effect, "no backward"}, true),
            "train; forward, serve: no effect (no backward)");
}

}  // namespace
}  // namespace shardsim::sharding::plans

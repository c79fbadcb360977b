// Every config section shardsim reads and the keys its parser accepts, gathered from the parsers' own key lists
// (the arrays they pass to ConfigNode::expect_keys). `shardsim help config` prints them; docs/CONFIG.md documents
// each key under a heading "### `SECTION`", and tests/unit/config_doc_test.cpp checks that every key listed here
// has a row "| `KEY` |" under its section's heading, so the reference cannot fall behind the parsers.
#pragma once

#include <span>
#include <string_view>
#include <vector>

namespace shardsim::experiments {

struct ConfigKeySection {
  std::string_view section;  // the heading in docs/CONFIG.md, e.g. "parallel"
  std::string_view applies;  // which files / kinds, e.g. "run configs, model.kind: mlp"
  std::span<const std::string_view> keys;
};

// In the order docs/CONFIG.md presents them. Several entries may share a section (the MLP's and the block's
// parallel: keys differ).
const std::vector<ConfigKeySection>& config_key_sections();

}  // namespace shardsim::experiments

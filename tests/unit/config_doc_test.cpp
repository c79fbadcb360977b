// docs/CONFIG.md keeps in step with the parsers: every key a parser accepts (experiments/config_keys.h, built
// from the arrays the parsers pass to expect_keys) has a table row "| `KEY` |" under its section's heading
// "### `SECTION`", and every such heading exists once.
#include <gtest/gtest.h>

#include <string>

#include "experiments/config_keys.h"
#include "tests/unit/config_doc.h"

namespace {

using shardsim::test::config_doc_section;
using shardsim::test::read_config_doc;

TEST(ConfigDoc, EveryParserKeyHasARowUnderItsSection) {
  const std::string doc = read_config_doc();
  ASSERT_FALSE(doc.empty());
  int checked = 0;
  for (const auto& s : shardsim::experiments::config_key_sections()) {
    const std::string text = config_doc_section(doc, s.section);
    ASSERT_FALSE(text.empty()) << "docs/CONFIG.md has no heading ### `" << s.section << "`";
    ASSERT_FALSE(s.keys.empty()) << s.section;
    for (auto key : s.keys) {
      EXPECT_NE(text.find("| `" + std::string(key) + "` |"), std::string::npos)
          << "docs/CONFIG.md, section `" << s.section << "` (" << s.applies << "): no row for key '" << key << "'";
      ++checked;
    }
  }
  EXPECT_GT(checked, 50);
}

TEST(ConfigDoc, SectionLookupFindsOnlyItsOwnRows) {
  // The check above could pass by finding a key under another heading; make sure the cut works.
  const std::string doc = "intro\n### `a`\n| `x` | 1 |\n### `b`\n| `y` | 2 |\n## end\n| `z` |\n";
  EXPECT_NE(config_doc_section(doc, "a").find("| `x` |"), std::string::npos);
  EXPECT_EQ(config_doc_section(doc, "a").find("| `y` |"), std::string::npos);
  EXPECT_EQ(config_doc_section(doc, "b").find("| `z` |"), std::string::npos);
  EXPECT_EQ(config_doc_section(doc, "c"), "");
}

}  // namespace

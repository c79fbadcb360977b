// docs/CONFIG.md keeps in step with the parsers: every key a parser accepts (experiments/config_keys.h, built
// from the arrays the parsers pass to expect_keys) has a table row "| `KEY` |" under its section's heading
// "### `SECTION`", and every such heading exists once.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "experiments/config_keys.h"

namespace {

std::string read_doc() {
  const std::string path = std::string(SHARDSIM_CONFIG_DIR) + "/../docs/CONFIG.md";
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The text under "### `SECTION`" up to the next heading of level 2 or 3; "" when the heading is missing.
std::string section_text(const std::string& doc, std::string_view section) {
  const std::string heading = "\n### `" + std::string(section) + "`";
  const size_t at = doc.find(heading);
  if (at == std::string::npos) return "";
  const size_t body = doc.find('\n', at + 1);
  size_t end = doc.size();
  for (const char* next : {"\n### ", "\n## "}) {
    const size_t n = doc.find(next, body);
    if (n != std::string::npos) end = std::min(end, n);
  }
  return doc.substr(body, end - body);
}

TEST(ConfigDoc, EveryParserKeyHasARowUnderItsSection) {
  const std::string doc = read_doc();
  ASSERT_FALSE(doc.empty());
  int checked = 0;
  for (const auto& s : shardsim::experiments::config_key_sections()) {
    const std::string text = section_text(doc, s.section);
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
  EXPECT_NE(section_text(doc, "a").find("| `x` |"), std::string::npos);
  EXPECT_EQ(section_text(doc, "a").find("| `y` |"), std::string::npos);
  EXPECT_EQ(section_text(doc, "b").find("| `z` |"), std::string::npos);
  EXPECT_EQ(section_text(doc, "c"), "");
}

}  // namespace

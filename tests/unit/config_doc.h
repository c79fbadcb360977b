// docs/CONFIG.md as the tests read it (tests/unit/config_doc_test.cpp, plan_registry_test.cpp, plan_modes_test.cpp):
// the whole file, and the text of one of its "### `SECTION`" sections.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>

namespace shardsim::test {

// docs/CONFIG.md's text (a failed expectation when it cannot be read).
inline std::string read_config_doc() {
  const std::string path = std::string(SHARDSIM_CONFIG_DIR) + "/../docs/CONFIG.md";
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The text under "### `SECTION`" up to the next heading of level 2 or 3; "" when the heading is missing.
inline std::string config_doc_section(const std::string& doc, std::string_view section) {
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

}  // namespace shardsim::test

// JSON read with duplicate keys refused: RFC 8259 leaves an object with a repeated name undefined and readers
// disagree on which value wins (nlohmann keeps the last, others the first), so every JSON input shardsim reads
// (a request trace's lines, a Hugging Face config.json) is parsed through this and a repeated key is an error
// naming FILE:LINE, never a silent choice (docs/RELIABILITY.md). Header-only: common/ does not link nlohmann.
#pragma once

#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace shardsim::inline common {

// TEXT parsed as JSON (nlohmann::json::parse_error as usual); *DUPLICATE is set to the first key an object holds
// twice ("" when none), at any depth.
inline nlohmann::json parse_json_unique_keys(const std::string& text, std::string* duplicate) {
  std::vector<std::set<std::string>> keys;
  duplicate->clear();
  nlohmann::json::parser_callback_t cb = [&](int, nlohmann::json::parse_event_t ev, nlohmann::json& parsed) {
    using E = nlohmann::json::parse_event_t;
    if (ev == E::object_start) keys.emplace_back();
    else if (ev == E::object_end && !keys.empty()) keys.pop_back();
    else if (ev == E::key && !keys.empty() && !keys.back().insert(parsed.get<std::string>()).second &&
             duplicate->empty())
      *duplicate = parsed.get<std::string>();
    return true;
  };
  return nlohmann::json::parse(text, cb);
}

}  // namespace shardsim::common

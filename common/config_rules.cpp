#include "common/config_rules.h"

#include <algorithm>
#include <optional>

namespace shardsim::inline common {

namespace {

std::optional<std::string_view> first_of(const ConfigNode& n, const std::vector<std::string_view>& keys) {
  for (std::string_view k : keys)
    if (n.has(k)) return k;
  return std::nullopt;
}

bool from_override(const ConfigNode& n) { return n.where().find(", --") != std::string::npos; }

std::string key_of(const ConfigNode& n, std::string_view k) {
  return n.path().empty() ? std::string(k) : n.path() + "." + std::string(k);
}

}  // namespace

void refuse_together(const ConfigNode& n, const std::vector<std::string_view>& a,
                     const std::vector<std::string_view>& b, const std::string& why) {
  if (!n.is_map()) return;
  const auto ka = first_of(n, a), kb = first_of(n, b);
  if (!ka || !kb) return;
  // (ConfigNodes are not swapped: a YAML::Node's assignment writes into the node it refers to)
  const ConfigNode na = n.child(*ka), nb = n.child(*kb);
  const bool b_first = from_override(nb) && !from_override(na);
  const ConfigNode& at = b_first ? nb : na;
  const ConfigNode& other = b_first ? na : nb;
  const std::string blamed = key_of(n, b_first ? *kb : *ka), named = key_of(n, b_first ? *ka : *kb);
  at.fail(blamed + " and " + named + " (" + other.where() + ") exclude each other: " + why);
}

void refuse_keys_of_other_kinds(const ConfigNode& n, std::string_view discriminator, const std::string& kind,
                                const std::vector<std::string_view>& allowed) {
  if (!n.is_map()) return;
  std::string takes;
  for (std::string_view k : allowed)
    if (k != discriminator) takes += (takes.empty() ? "" : ", ") + std::string(k);
  const std::string origin = n.has(discriminator) ? n.child(discriminator).where() : std::string("the default");
  for (const auto& kv : n.yaml()) {
    const std::string k = kv.first.as<std::string>();
    if (k == discriminator || std::find(allowed.begin(), allowed.end(), k) != allowed.end() || !n.has(k)) continue;
    n.child(k).fail(key_of(n, k) + " is not a key of " + std::string(discriminator) + " " + kind + " (" + origin +
                    "); it takes " + (takes.empty() ? std::string("no other key") : takes));
  }
}

}  // namespace shardsim::common

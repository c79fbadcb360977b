// Reads configs/devices.yaml (sim/device_presets.h).
#include "sim/device_presets.h"

#include <cstdlib>
#include <set>
#include <sstream>

#include "common/error.h"
#include "common/input_file.h"
#include "common/text.h"
#include "sim/embedded_data.h"

namespace shardsim::sim {

namespace {

constexpr std::string_view kEntryKeys[] = {"aliases", "source", "kernel_source", "model", "sources", "facts"};
constexpr std::string_view kFactKeys[] = {"on_chip", "links", "node", "node_config", "kernel_table"};

// "a, b ,c" -> {a, b, c}
std::vector<std::string> split_keys(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string k;
  while (std::getline(ss, k, ',')) {
    const auto b = k.find_first_not_of(' '), e = k.find_last_not_of(' ');
    if (b != std::string::npos) out.push_back(k.substr(b, e - b + 1));
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> text_map(const ConfigNode& entry, std::string_view key) {
  std::vector<std::pair<std::string, std::string>> out;
  if (!entry.has(key)) return out;
  const ConfigNode m = entry.child(key);
  if (!m.is_map()) m.fail(m.path() + ": expected a map");
  for (const auto& kv : m.yaml()) {
    const std::string k = kv.first.as<std::string>();
    out.emplace_back(k, m.get_string(k));
  }
  return out;
}

DevicePreset read_entry(const ConfigNode& all, const std::string& name) {
  const ConfigNode e = all.child(name);
  if (!e.is_map()) e.fail(e.path() + ": expected a map with model: and sources:");
  e.expect_keys(kEntryKeys);
  DevicePreset p;
  p.name = name;
  const ConfigNode model = e.child("model");
  if (model.has("preset")) model.child("preset").fail(model.path() + ".preset: a preset cannot name another");
  p.spec = load_device(model);
  p.spec.name = name;
  p.spec.source = e.get_string("source", "");
  p.spec.kernel.source = e.get_string("kernel_source", "");
  if (e.has("aliases")) {
    const ConfigNode list = e.child("aliases");
    for (size_t i = 0; i < list.yaml().size(); ++i)  // printable_text: no control characters reach a terminal
      p.aliases.push_back(ConfigNode(list.yaml()[i], list.file(), list.path() + "[" + std::to_string(i) + "]").printable_text());
  }
  p.sources = text_map(e, "sources");
  p.facts = text_map(e, "facts");
  if (e.has("facts")) e.child("facts").expect_keys(kFactKeys);
  // Every number the model uses names its source (or says it is an assumption).
  std::set<std::string> sourced;
  for (const auto& [keys, text] : p.sources) {
    if (text.empty()) e.child("sources").fail(e.path() + ".sources." + keys + ": empty");
    for (const auto& k : split_keys(keys)) sourced.insert(k);
  }
  for (const auto& kv : model.yaml()) {
    const std::string k = kv.first.as<std::string>();
    if (!sourced.count(k)) model.child(k).fail(model.path() + "." + k + ": no entry of sources: names this key");
  }
  return p;
}

}  // namespace

namespace {

constexpr const char* kCompiledIn = "configs/devices.yaml (compiled in)";

const char* presets_env() {
  const char* env = std::getenv("SHARDSIM_DEVICES");
  return env && *env ? env : nullptr;
}

std::vector<DevicePreset> parse_device_presets(const ConfigNode& root, const std::string& file) {
  if (!root.is_map()) root.fail(file + ": expected a map with devices:");
  root.expect_keys({"devices"});
  const ConfigNode all = root.child("devices");
  if (!all.is_map() || all.yaml().size() == 0) all.fail("devices: expected a map of presets");
  std::vector<DevicePreset> out;
  std::set<std::string> names;
  for (const auto& kv : all.yaml()) {
    const std::string name = kv.first.as<std::string>();
    out.push_back(read_entry(all, name));
    for (const auto& n : out.back().aliases)
      if (!names.insert(n).second) all.child(name).fail("devices." + name + ": alias '" + n + "' is used twice");
    if (!names.insert(name).second) all.child(name).fail("devices." + name + ": the name is used twice");
  }
  return out;
}

}  // namespace

std::vector<DevicePreset> read_device_presets(const std::string& file) {
  return parse_device_presets(ConfigNode::load_file(file), file);
}

std::string device_presets_file() { return presets_env() ? presets_env() : kCompiledIn; }

const std::vector<DevicePreset>& device_presets() {
  static const std::vector<DevicePreset> presets = [] {
    if (presets_env()) return read_device_presets(presets_env());
    const auto text = embedded_file("devices.yaml");
    if (!text) throw ConfigError(std::string(kCompiledIn) + ": not in this binary (sim/embed_data.cmake)");
    return parse_device_presets(ConfigNode::load_string(std::string(*text), kCompiledIn), kCompiledIn);
  }();
  return presets;
}

std::string preset_data_text(const std::string& relative, const char* what) {
  if (const char* env = presets_env()) {
    const std::string presets = env;
    const auto slash = presets.find_last_of('/');
    return read_input_file((slash == std::string::npos ? std::string(".") : presets.substr(0, slash)) + "/" + relative,
                           1u << 20, what);
  }
  const auto text = embedded_file(relative);
  if (!text)
    throw ConfigError(std::string(kCompiledIn) + ": " + what + " '" + escape_control(relative) +
                      "' is not compiled into this binary (add it to sim/CMakeLists.txt's SHARDSIM_EMBEDDED_FILES)");
  return std::string(*text);
}

}  // namespace shardsim::sim

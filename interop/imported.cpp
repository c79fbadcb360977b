#include "interop/imported.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>

#include "common/config.h"
#include "common/text.h"
#include "sharding/model_spec.h"

namespace shardsim::interop {

namespace fs = std::filesystem;

std::vector<Mapped> moe_keys(const MoeFields& m) {
  std::vector<Mapped> k;
  if (!m.any()) return k;
  auto add = [&](const char* key, const std::string& v) { k.push_back({"moe", key, v, "MoE record"}); };
  add("experts", std::to_string(m.experts));
  if (m.top_k > 0) add("top_k", std::to_string(m.top_k));
  if (m.moe_ffn > 0) add("expert_ffn", std::to_string(m.moe_ffn));
  if (m.shared_ffn > 0) add("shared_ffn", std::to_string(m.shared_ffn));
  else if (m.shared_experts > 0) add("shared_experts", std::to_string(m.shared_experts));
  if (!m.score.empty()) add("router", m.score == "sigmoid" ? "sigmoid" : "softmax");
  if (m.normalize) add("normalize", *m.normalize ? "true" : "false");
  if (m.scale != 1) add("scale", number_text(m.scale));
  if (m.aux_coef > 0) add("aux_loss_coef", number_text(m.aux_coef));
  if (m.first_dense > 0) add("dense_layers", std::to_string(m.first_dense));
  if (m.layer_step > 1) add("layer_step", std::to_string(m.layer_step));
  return k;
}

bool moe_section_read() {
  for (std::string_view key : sharding::kModelKeys)
    if (key == "moe") return true;
  return false;
}

void Imported::set(const std::string& section, const std::string& key, const std::string& value,
                   const std::string& from) {
  for (Mapped& m : keys)
    if (m.section == section && m.key == key) {
      m.value = value;
      m.from = from;
      return;
    }
  keys.push_back({section, key, value, from});
}

std::optional<std::string> Imported::get(const std::string& section, const std::string& key) const {
  for (const Mapped& m : keys)
    if (m.section == section && m.key == key) return m.value;
  return std::nullopt;
}

std::string yaml_string(const std::string& s) {
  static const char* kReserved[] = {"true", "false", "yes", "no", "on", "off", "null", "y", "n", "~"};
  bool plain = !s.empty() && std::isalpha(static_cast<unsigned char>(s[0]));
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.')) plain = false;
  if (plain) {
    std::string lower = s;
    std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
    for (const char* r : kReserved)
      if (lower == r) plain = false;
  }
  if (plain) return s;
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c == 0x7f) {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", c);
      out += b;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

std::string number_text(double v) {
  char b[40];
  if (v == std::floor(v) && std::fabs(v) < 1e15) {
    std::snprintf(b, sizeof b, "%.0f", v);
    return b;
  }
  for (int p = 1; p <= 17; ++p) {
    std::snprintf(b, sizeof b, "%.*g", p, v);
    if (std::strtod(b, nullptr) == v) break;
  }
  return b;
}

std::string float_text(float v) {
  char b[40];
  for (int p = 1; p <= 9; ++p) {
    std::snprintf(b, sizeof b, "%.*g", p, static_cast<double>(v));
    if (std::strtof(b, nullptr) == v) break;
  }
  return b;
}

BaseConfig read_base(const std::string& file, const std::string& out_dir) {
  const ConfigNode root = ConfigNode::load_file(file);
  if (!root.is_map()) root.fail(file + ": expected a shardsim config (a map)");
  BaseConfig base;
  for (const auto& kv : root.yaml()) {
    const std::string key = kv.first.as<std::string>();
    if (key == "model" || key == "workload" || key == "parallel" || key == "train") continue;
    YAML::Node value = YAML::Clone(kv.second);
    if (key == "topology" && value.IsScalar()) {
      // A relative topology path is looked up next to the base config: keep it valid next to the written one.
      fs::path p = value.as<std::string>();
      const fs::path near = fs::path(file).parent_path() / p;
      std::error_code ec;
      if (p.is_relative() && fs::exists(near, ec)) {
        const fs::path abs = fs::absolute(near, ec).lexically_normal();
        const fs::path dir = fs::absolute(out_dir.empty() ? fs::path(".") : fs::path(out_dir), ec).lexically_normal();
        const fs::path rel = abs.lexically_relative(dir);
        value = (rel.empty() ? abs : rel).string();
      }
    }
    YAML::Emitter e;
    e << YAML::BeginMap << YAML::Key << key << YAML::Value << value << YAML::EndMap;
    base.root.emplace_back(key, std::string(e.c_str()));
  }
  return base;
}

namespace {

std::string one_line(const std::string& s) { return escape_control(s); }

void header(std::ostringstream& os, const Imported& imp) {
  os << "# " << one_line(imp.origin) << "\n";
  if (!imp.command.empty()) os << "# written by: " << one_line(imp.command) << "\n";
  os << "# Each source field or argument and the key it became (docs/IMPORT.md has the full mapping tables):\n";
  size_t width = 0;
  for (const Mapped& m : imp.keys) width = std::max(width, escape_control(m.from).size());
  width = std::min<size_t>(width, 48);
  for (const Mapped& m : imp.keys) {
    std::string from = one_line(m.from);
    if (from.size() < width) from.append(width - from.size(), ' ');
    os << "#   " << from << " -> " << (m.section.empty() ? "" : m.section + ".") << m.key << "\n";
  }
  if (!imp.dropped.empty()) {
    os << "# Not expressed in this config (each named, with why):\n";
    for (const Dropped& d : imp.dropped) os << "#   " << one_line(d.source) << ": " << one_line(d.why) << "\n";
  }
  if (imp.moe.any() && moe_section_read()) {
    os << "# Mixture of experts: the model.moe section below; the source's MoE fields:\n";
    for (const std::string& s : imp.moe.sources) os << "#   " << one_line(s) << "\n";
  } else if (imp.moe.any()) {
    os << "# Mixture of experts: not expressible until shardsim's train reads model.moe; each MoE MLP is written as "
          "one dense MLP (model.ffn), so parameters and expert compute are under-counted. The model.moe keys they map "
          "to are the commented block under model:. Recorded fields:\n";
    for (const std::string& s : imp.moe.sources) os << "#   " << one_line(s) << "\n";
  }
  for (const std::string& n : imp.notes) os << "# " << one_line(n) << "\n";
}

}  // namespace

std::string to_yaml(const Imported& imp, const BaseConfig& base) {
  std::ostringstream os;
  header(os, imp);
  bool has_mode = false;
  for (const auto& [key, text] : base.root) {
    has_mode = has_mode || key == "mode";
    os << text << "\n";
  }
  for (const Mapped& m : imp.keys)
    if (m.section.empty()) {
      bool in_base = false;
      for (const auto& kv : base.root) in_base = in_base || kv.first == m.key;
      if (!in_base) os << m.key << ": " << m.value << "\n";
      has_mode = has_mode || m.key == "mode";
    }
  if (!has_mode) os << "mode: shape_only\n";
  for (const char* section : {"model", "parallel", "train"}) {
    bool any = false;
    for (const Mapped& m : imp.keys)
      if (m.section == section) {
        if (!any) os << section << ":\n";
        any = true;
        os << "  " << m.key << ": " << m.value << "\n";
      }
    if (std::string(section) == "model" && imp.moe.any()) {
      const bool live = moe_section_read();
      os << (live ? "  moe:\n" : "  # moe:   (model.moe is not read by train yet: the dense skeleton above runs)\n");
      for (const Mapped& m : moe_keys(imp.moe)) os << (live ? "    " : "  #   ") << m.key << ": " << m.value << "\n";
    }
  }
  return os.str();
}

}  // namespace shardsim::interop

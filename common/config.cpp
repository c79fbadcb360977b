#include "common/config.h"

#include <utility>
#include <vector>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

#include "common/error.h"

namespace shardsim {

namespace {

std::string line_of(const YAML::Node& node, const std::string& file) {
  const YAML::Mark mark = node.Mark();
  if (mark.line < 0) return file;
  return file + ":" + std::to_string(mark.line + 1);
}

// yaml-cpp reports an unclosed '[' or '{' where it gave up looking (often the next line). The line a user must
// fix is the one with the bracket: find the innermost flow bracket still open before the error position.
int unclosed_flow_line(const std::string& text, int err_line) {
  std::vector<int> open_lines;
  int line = 0;
  bool in_single = false, in_double = false, in_comment = false;
  for (size_t i = 0; i < text.size() && line <= err_line; ++i) {
    const char c = text[i];
    if (c == '\n') {
      ++line;
      in_comment = false;
      continue;
    }
    if (in_comment) continue;
    if (in_double) {
      if (c == '\\') ++i;
      else if (c == '"') in_double = false;
      continue;
    }
    if (in_single) {
      if (c == '\'') in_single = false;
      continue;
    }
    if (c == '#' && (i == 0 || text[i - 1] == ' ' || text[i - 1] == '\t' || text[i - 1] == '\n')) in_comment = true;
    else if (c == '"') in_double = true;
    else if (c == '\'') in_single = true;
    else if (c == '[' || c == '{') open_lines.push_back(line);
    else if ((c == ']' || c == '}') && !open_lines.empty()) open_lines.pop_back();
  }
  return open_lines.empty() ? -1 : open_lines.back();
}

}  // namespace

ConfigNode::ConfigNode(YAML::Node node, std::string file, std::string path)
    : node_(std::move(node)), file_(std::move(file)), path_(std::move(path)) {}

ConfigNode ConfigNode::load_string(const std::string& text, const std::string& file) {
  try {
    YAML::Node root = YAML::Load(text);
    if (!root.IsMap()) {
      throw ConfigError(file + ":1: the config must be a YAML mapping (key: value pairs) at the top level");
    }
    ConfigNode node(root, file, "");
    node.text_ = std::make_shared<const std::string>(text);
    return node;
  } catch (const YAML::Exception& e) {
    std::ostringstream os;
    os << file;
    const int flow_line = e.msg.find("flow") != std::string::npos && e.mark.line >= 0
                              ? unclosed_flow_line(text, e.mark.line)
                              : -1;
    if (flow_line >= 0) {
      os << ":" << flow_line + 1 << ": malformed YAML: " << e.msg << " (unclosed '[' or '{' on this line)";
    } else {
      if (e.mark.line >= 0) os << ":" << e.mark.line + 1 << ":" << e.mark.column + 1;
      os << ": malformed YAML: " << e.msg;
    }
    throw ConfigError(os.str());
  }
}

ConfigNode ConfigNode::load_file(const std::string& file) {
  std::ifstream in(file);
  if (!in) {
    throw ConfigError("cannot open config file '" + file + "': " + std::strerror(errno));
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  return load_string(buffer.str(), file);
}

std::string ConfigNode::where() const { return line_of(node_, file_); }

std::string ConfigNode::key_path(std::string_view key) const {
  return path_.empty() ? std::string(key) : path_ + "." + std::string(key);
}

void ConfigNode::fail(const std::string& message) const {
  throw ConfigError(where() + ": " + message);
}

bool ConfigNode::has(std::string_view key) const {
  return node_.IsMap() && node_[std::string(key)].IsDefined() && !node_[std::string(key)].IsNull();
}

YAML::Node ConfigNode::raw(std::string_view key) const {
  if (!node_.IsMap()) fail((path_.empty() ? std::string("config") : path_) + ": expected a mapping");
  return node_[std::string(key)];
}

void ConfigNode::expect_keys(std::initializer_list<std::string_view> allowed) const {
  if (!node_.IsMap()) fail((path_.empty() ? std::string("config") : path_) + ": expected a mapping");
  std::vector<std::pair<std::string, std::string>> seen;  // key, where
  for (const auto& kv : node_) {
    const auto key = kv.first.as<std::string>();
    // yaml-cpp keeps both entries of a repeated key and lookups see only the first: a silent typo trap.
    for (const auto& [k, where] : seen)
      if (k == key)
        throw ConfigError(line_of(kv.first, file_) + ": duplicate key '" + key_path(key) + "' (first at " + where +
                          ")");
    seen.emplace_back(key, line_of(kv.first, file_));
    bool ok = false;
    for (auto a : allowed) ok = ok || key == a;
    if (!ok) {
      std::string list;
      for (auto a : allowed) list += (list.empty() ? "" : ", ") + std::string(a);
      throw ConfigError(line_of(kv.first, file_) + ": unknown key '" + key_path(key) + "' (allowed here: " +
                        list + ")");
    }
  }
}

ConfigNode ConfigNode::child(std::string_view key) const {
  auto n = raw(key);
  if (!n.IsDefined() || n.IsNull()) fail("missing required key '" + key_path(key) + "'");
  ConfigNode c(n, file_, key_path(key));
  c.text_ = text_;
  return c;
}

std::optional<ConfigNode> ConfigNode::maybe_child(std::string_view key) const {
  if (!has(key)) return std::nullopt;
  return child(key);
}

namespace {
template <typename T>
T convert(const YAML::Node& n, const std::string& file, const std::string& path, const char* what) {
  try {
    return n.as<T>();
  } catch (const YAML::Exception&) {
    std::string shown = n.IsScalar() ? n.Scalar() : std::string("<non-scalar>");
    throw ConfigError(line_of(n, file) + ": " + path + ": expected " + what + ", got '" + shown + "'");
  }
}
}  // namespace

std::string ConfigNode::get_string(std::string_view key) const {
  auto c = child(key);
  if (!c.node_.IsScalar()) c.fail(c.path_ + ": expected a string");
  return c.node_.Scalar();
}
std::string ConfigNode::get_string(std::string_view key, const std::string& fallback) const {
  return has(key) ? get_string(key) : fallback;
}
int64_t ConfigNode::get_int(std::string_view key) const {
  auto c = child(key);
  return convert<int64_t>(c.node_, file_, c.path_, "an integer");
}
int64_t ConfigNode::get_int(std::string_view key, int64_t fallback) const {
  return has(key) ? get_int(key) : fallback;
}
double ConfigNode::get_double(std::string_view key) const {
  auto c = child(key);
  double v = convert<double>(c.node_, file_, c.path_, "a number");
  // yaml-cpp reads .nan/.inf/-.inf as NaN and infinities: never a valid size, rate or time.
  if (!std::isfinite(v)) c.fail(c.path_ + ": must be a finite number (got " + c.node_.Scalar() + ")");
  return v;
}
double ConfigNode::get_double(std::string_view key, double fallback) const {
  return has(key) ? get_double(key) : fallback;
}
bool ConfigNode::get_bool(std::string_view key, bool fallback) const {
  if (!has(key)) return fallback;
  auto c = child(key);
  return convert<bool>(c.node_, file_, c.path_, "true or false");
}
std::vector<int64_t> ConfigNode::get_int_list(std::string_view key) const {
  auto c = child(key);
  if (!c.node_.IsSequence()) c.fail(c.path_ + ": expected a list of integers, e.g. [4, 4]");
  std::vector<int64_t> out;
  for (const auto& item : c.node_) out.push_back(convert<int64_t>(item, file_, c.path_, "an integer"));
  return out;
}

double ConfigNode::get_positive_double(std::string_view key) const {
  double v = get_double(key);
  if (!(v > 0)) child(key).fail(key_path(key) + ": must be > 0 (got " + child(key).node_.Scalar() + ")");
  return v;
}
double ConfigNode::get_nonnegative_double(std::string_view key, double fallback) const {
  if (!has(key)) return fallback;
  double v = get_double(key);
  if (v < 0) child(key).fail(key_path(key) + ": must be >= 0 (got " + child(key).node_.Scalar() + ")");
  return v;
}
int64_t ConfigNode::get_positive_int(std::string_view key) const {
  int64_t v = get_int(key);
  if (v <= 0) child(key).fail(key_path(key) + ": must be > 0 (got " + std::to_string(v) + ")");
  return v;
}
int64_t ConfigNode::get_positive_int(std::string_view key, int64_t fallback) const {
  return has(key) ? get_positive_int(key) : fallback;
}

}  // namespace shardsim

#include "common/config.h"

#include <algorithm>
#include <utility>
#include <vector>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <type_traits>

#include "common/error.h"
#include "common/input_file.h"
#include "common/number.h"
#include "common/text.h"

namespace shardsim::inline common {

namespace {

// The largest config file read (configs are a few KiB).
constexpr uint64_t kMaxConfigFileBytes = 16u << 20;

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

// Where a quoted scalar ('...' or "...") opens and is not closed on the same line: yaml-cpp folds such a string
// into the following lines (a missing closing quote then surfaces as a missing key further down, or as an
// error where the next quote happens to close it). Returns {line, column} (0-based) of the first such quote
// before line LIMIT, or {-1, -1}. A quote opens a scalar only where a value can start: at the start of a line's
// content or after ': ', '- ', '[', '{', ',', '? '. Block scalars (| and >) are skipped.
std::pair<int, int> open_quote(const std::string& text, int limit) {
  std::vector<std::string> lines;
  {
    std::string cur;
    for (char c : text) {
      if (c == '\n') {
        lines.push_back(cur);
        cur.clear();
      } else {
        cur += c;
      }
    }
    lines.push_back(cur);
  }
  int block_indent = -1;  // inside a block scalar: lines indented more than this belong to it
  for (int ln = 0; ln < static_cast<int>(lines.size()) && ln < limit; ++ln) {
    const std::string& l = lines[static_cast<size_t>(ln)];
    const size_t first = l.find_first_not_of(" \t");
    if (first == std::string::npos) continue;
    if (block_indent >= 0) {
      if (static_cast<int>(first) > block_indent) continue;
      block_indent = -1;
    }
    char prev = '\0';  // last non-blank character before the current position on this line
    for (size_t i = first; i < l.size(); ++i) {
      const char c = l[i];
      if (c == '#' && (i == 0 || l[i - 1] == ' ' || l[i - 1] == '\t')) break;  // comment
      const bool value_start = prev == '\0' || prev == '[' || prev == '{' || prev == ',' ||
                               ((prev == ':' || prev == '-' || prev == '?') && i > 0 &&
                                (l[i - 1] == ' ' || l[i - 1] == '\t'));
      if ((c == '"' || c == '\'') && value_start) {
        size_t j = i + 1;
        bool closed = false;
        for (; j < l.size(); ++j) {
          if (c == '"' && l[j] == '\\') {
            ++j;
          } else if (l[j] == c) {
            if (c == '\'' && j + 1 < l.size() && l[j + 1] == '\'') {
              ++j;  // '' inside single quotes
            } else {
              closed = true;
              break;
            }
          }
        }
        if (!closed) return {ln, static_cast<int>(i)};
        i = j;
        prev = c;
        continue;
      }
      if ((c == '|' || c == '>') && ((prev == ':' || prev == '-') || prev == '\0')) {
        const size_t rest = l.find_first_not_of("+-0123456789 \t", i + 1);
        if (rest == std::string::npos || l[rest] == '#') {
          block_indent = static_cast<int>(first);
          break;
        }
      }
      if (c != ' ' && c != '\t') prev = c;
    }
  }
  return {-1, -1};
}

// Line (0-based) of the '---' that starts the second document, searching from line FROM; -1 if none.
int document_marker_line(const std::string& text, int from) {
  int line = 0;
  size_t pos = 0;
  while (pos <= text.size()) {
    const size_t end = std::min(text.find('\n', pos), text.size());
    const std::string l = text.substr(pos, end - pos);
    if (line > from && l.rfind("---", 0) == 0 && (l.size() == 3 || l[3] == ' ' || l[3] == '\t' || l[3] == '\r'))
      return line;
    pos = end + 1;
    ++line;
  }
  return -1;
}

}  // namespace

std::string ConfigNode::control_character(const std::string& s) {
  for (size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f) {
      char b[64];
      std::snprintf(b, sizeof b, "control character U+%04X at position %zu", c, i + 1);
      return b;
    }
  }
  return "";
}

std::string ConfigNode::printable_text() const {
  if (!node_.IsScalar()) fail((path_.empty() ? std::string("value") : path_) + ": expected a string");
  const std::string& v = node_.Scalar();
  if (const auto bad = control_character(v); !bad.empty())
    fail(path_ + ": contains a " + bad + " (names and labels must be printable text on one line)");
  if (v.size() > 4096)  // a path's limit (PATH_MAX); a 10 MB name was printed whole in the report header
    fail(path_ + ": " + std::to_string(v.size()) + " characters; names, labels and paths are at most 4096");
  return v;
}

ConfigNode::ConfigNode(YAML::Node node, std::string file, std::string path)
    : node_(std::move(node)), file_(std::move(file)), path_(std::move(path)) {}

ConfigNode ConfigNode::load_string(const std::string& text, const std::string& file) {
  try {
    const std::vector<YAML::Node> docs = YAML::LoadAll(text);
    if (docs.size() > 1) {
      const int first = docs[0].Mark().line;
      const int marker = document_marker_line(text, std::max(first, 0));
      throw ConfigError(file + (marker >= 0 ? ":" + std::to_string(marker + 1) : std::string()) +
                        ": a second YAML document ('---'): a config file holds exactly one document (" +
                        std::to_string(docs.size()) + " found)");
    }
    if (const auto [ql, qc] = open_quote(text, 1 << 30); ql >= 0)
      throw ConfigError(file + ":" + std::to_string(ql + 1) + ":" + std::to_string(qc + 1) +
                        ": unterminated quote: the quoted string starting here is not closed on its line");
    YAML::Node root = docs.empty() ? YAML::Node() : docs[0];
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
    const auto [ql, qc] = e.mark.line >= 0 ? open_quote(text, e.mark.line + 1) : std::pair<int, int>{-1, -1};
    if (ql >= 0) {
      os << ":" << ql + 1 << ":" << qc + 1 << ": unterminated quote: the quoted string starting here is not closed on"
         << " its line (YAML then failed at line " << e.mark.line + 1 << ": " << e.msg << ")";
    } else if (flow_line >= 0) {
      os << ":" << flow_line + 1 << ": malformed YAML: " << e.msg << " (unclosed '[' or '{' on this line)";
    } else {
      if (e.mark.line >= 0) os << ":" << e.mark.line + 1 << ":" << e.mark.column + 1;
      os << ": malformed YAML: " << e.msg;
    }
    throw ConfigError(os.str());
  }
}

ConfigNode ConfigNode::from_edited_tree(YAML::Node root, const std::string& text, const std::string& file,
                                        std::vector<std::pair<std::string, std::string>> origins) {
  ConfigNode node(std::move(root), file, "");
  node.text_ = std::make_shared<const std::string>(text);
  node.origins_ = std::make_shared<const std::vector<std::pair<std::string, std::string>>>(std::move(origins));
  return node;
}

ConfigNode ConfigNode::sub(YAML::Node n, std::string path) const {
  ConfigNode c(std::move(n), file_, std::move(path));
  c.text_ = text_;
  c.shown_ = shown_;
  c.origins_ = origins_;
  return c;
}

std::string ConfigNode::locate(const YAML::Node& n, std::string_view path) const {
  if (n.Mark().line >= 0) return line_of(n, file_);
  // The last override at or above PATH made the node (a later --set of the same key wins, as it does in the tree).
  for (auto it = origins_->rbegin(); it != origins_->rend(); ++it) {
    const std::string& p = it->first;
    if (path.substr(0, p.size()) == p && (path.size() == p.size() || path[p.size()] == '.' || path[p.size()] == '['))
      return file_ + ", " + it->second;
  }
  return file_;
}

YAML::Node ConfigNode::unmarked(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Scalar: return YAML::Node(n.Scalar());
    case YAML::NodeType::Sequence: {
      YAML::Node out(YAML::NodeType::Sequence);
      out.SetStyle(n.Style());
      for (const auto& item : n) out.push_back(unmarked(item));
      return out;
    }
    case YAML::NodeType::Map: {
      YAML::Node out(YAML::NodeType::Map);
      out.SetStyle(n.Style());
      for (const auto& kv : n) out[unmarked(kv.first)] = unmarked(kv.second);
      return out;
    }
    default: return YAML::Node(YAML::NodeType::Null);
  }
}

ConfigNode ConfigNode::load_file(const std::string& file) {
  std::error_code ec;
  if (std::filesystem::is_directory(file, ec))
    throw ConfigError("config file '" + file + "' is a directory (expected a YAML file)");
  // A regular file of at most kMaxConfigFileBytes (a FIFO or a device cannot block or exhaust the reader).
  return load_string(read_input_file(file, kMaxConfigFileBytes, "a config file"), file);
}

std::string ConfigNode::where() const { return locate(node_, path_); }

std::string ConfigNode::key_path(std::string_view key) const {
  if (path_.empty()) {
    const auto it = shown_->find(key);
    return it == shown_->end() ? std::string(key) : it->second;
  }
  return path_ + "." + std::string(key);
}

void ConfigNode::show_key_as(const std::string& key, const std::string& shown) { (*shown_)[key] = shown; }

// Every message of a config parser goes through here or through convert(): the values and keys it echoes are
// escaped (common/text.h), so a config can neither drive the terminal nor forge a second line.
void ConfigNode::fail(const std::string& message) const {
  throw ConfigError(where() + ": " + escape_control(message));
}

void ConfigNode::fail_at(std::string_view dotted_key, const std::string& message) const {
  ConfigNode at = *this;
  const std::string full = path_.empty() ? key_path(dotted_key) : path_ + "." + std::string(dotted_key);
  while (!dotted_key.empty()) {
    const size_t dot = dotted_key.find('.');
    const std::string_view key = dotted_key.substr(0, dot);
    if (!at.node_.IsMap() || !at.has(key)) break;
    at = at.child(key);
    dotted_key = dot == std::string_view::npos ? std::string_view() : dotted_key.substr(dot + 1);
  }
  // A key no line of the document holds (its default applies): the file, not a parent's line that does not hold it.
  if (!dotted_key.empty())
    throw ConfigError(file_ + ": " + escape_control(message) + " (" + escape_control(full) +
                      " is not set: its default)");
  at.fail(message);
}

bool ConfigNode::has(std::string_view key) const {
  if (!node_.IsMap()) return false;
  const YAML::Node n = node_[std::string(key)];
  // A key written without a value (`key:`, `key: ~`, `key: null`, `--set key=`) used to read as absent, so the
  // default ran silently: one rule for every key, it is an error (issue 46, kind 8).
  if (n.IsDefined() && n.IsNull()) {
    YAML::Node at = n;  // an empty value's mark is where the next token starts: name the key's line instead
    for (const auto& kv : node_)
      if (kv.first.IsScalar() && kv.first.Scalar() == key) at = kv.first;
    sub(at, key_path(key)).fail(key_path(key) + ": no value (give one, or leave the key out for its default)");
  }
  return n.IsDefined();
}

YAML::Node ConfigNode::raw(std::string_view key) const {
  if (!node_.IsMap()) fail((path_.empty() ? std::string("config") : path_) + ": expected a mapping");
  return node_[std::string(key)];
}

void ConfigNode::expect_keys(std::initializer_list<std::string_view> allowed) const {
  expect_keys(std::span<const std::string_view>(allowed.begin(), allowed.size()));
}

void ConfigNode::expect_keys(std::span<const std::string_view> allowed) const {
  if (!node_.IsMap()) fail((path_.empty() ? std::string("config") : path_) + ": expected a mapping");
  std::vector<std::pair<std::string, std::string>> seen;  // key, where
  for (const auto& kv : node_) {
    const auto key = kv.first.as<std::string>();
    // yaml-cpp keeps both entries of a repeated key and lookups see only the first: a silent typo trap.
    for (const auto& [k, where] : seen)
      if (k == key)
        throw ConfigError(locate(kv.first, key_path(key)) + ": duplicate key '" + escape_control(key_path(key)) + "' (first at " +
                          where + ")");
    seen.emplace_back(key, locate(kv.first, key_path(key)));
    bool ok = false;
    for (auto a : allowed) ok = ok || key == a;
    if (!ok) {
      std::string list;
      for (auto a : allowed) list += (list.empty() ? "" : ", ") + std::string(a);
      // A key of the file that an override made unknown (`--set topology.kind=stacked` over a ring's
      // bandwidth_gbps): name the override, not only the file's line, which is fine on its own.
      std::string changed;
      const std::string here = locate(kv.first, key_path(key));
      if (here.find(", --") == std::string::npos)
        for (const auto& other : node_) {
          const std::string k2 = other.first.as<std::string>(), at = locate(other.second, key_path(k2));
          if (at.find(", --") != std::string::npos) {
            changed = "; " + escape_control(at.substr(at.find(", --") + 2)) + " changed this section: " + escape_control(key_path(key)) +
                      " belongs to another setting (remove it from the config)";
            break;
          }
        }
      throw ConfigError(here + ": unknown key '" + escape_control(key_path(key)) + "' (allowed here: " + list + ")" +
                        changed);
    }
  }
}

ConfigNode ConfigNode::child(std::string_view key) const {
  auto n = raw(key);
  if (!n.IsDefined() || n.IsNull()) fail("missing required key '" + key_path(key) + "'");
  return sub(n, key_path(key));
}

std::optional<ConfigNode> ConfigNode::maybe_child(std::string_view key) const {
  if (!has(key)) return std::nullopt;
  return child(key);
}

namespace {
// A bound as a message shows it: "0.001", "1e+12".
std::string number_text(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", v);
  return b;
}

// N as a T. Integers and numbers are decimal text only (common/number.h), in a file as in a --set/--plan value:
// yaml-cpp's own conversion read '0x10' as 16, '010' as 8, and took '+2' and '2 ' (quoted), so `--plan ep=0x2`
// ran as ep=2. YAML's .nan/.inf spellings read as NaN/infinity, for get_double to name them "not finite".
template <typename T>
T convert(const YAML::Node& n, const std::string& where, const std::string& path, const char* what) {
  const auto bad = [&]() -> ConfigError {
    std::string shown = n.IsScalar() ? n.Scalar() : std::string("<non-scalar>");
    return ConfigError(escape_control(where + ": " + path + ": expected " + what + ", got '" + shown + "'"));
  };
  if constexpr (std::is_same_v<T, int64_t>) {
    const auto v = n.IsScalar() ? decimal_int(n.Scalar()) : std::nullopt;
    if (!v) throw bad();
    return *v;
  } else if constexpr (std::is_same_v<T, double>) {
    if (!n.IsScalar()) throw bad();
    if (const auto v = decimal_double(n.Scalar())) return *v;
    if (!yaml_nonfinite(n.Scalar())) throw bad();
    const std::string& s = n.Scalar();
    return s.find_first_of("nN") != std::string::npos ? std::nan("")
                                                     : (s[0] == '-' ? -HUGE_VAL : HUGE_VAL);
  } else if constexpr (std::is_same_v<T, bool>) {
    // YAML 1.2's booleans only: yaml-cpp also took y, yes, on, n, no and off, while the message said true or false.
    static const char* const kTrue[] = {"true", "True", "TRUE"}, *const kFalse[] = {"false", "False", "FALSE"};
    if (n.IsScalar())
      for (int i = 0; i < 3; ++i) {
        if (n.Scalar() == kTrue[i]) return true;
        if (n.Scalar() == kFalse[i]) return false;
      }
    throw bad();
  } else {
    try {
      return n.as<T>();
    } catch (const YAML::Exception&) {
      throw bad();
    }
  }
}
}  // namespace

std::string ConfigNode::get_string(std::string_view key) const { return child(key).printable_text(); }
std::string ConfigNode::get_string(std::string_view key, const std::string& fallback) const {
  return has(key) ? get_string(key) : fallback;
}
int64_t ConfigNode::get_int(std::string_view key) const {
  auto c = child(key);
  return convert<int64_t>(c.node_, locate(c.node_, c.path_), c.path_, "an integer");
}
int64_t ConfigNode::get_int(std::string_view key, int64_t fallback) const {
  return has(key) ? get_int(key) : fallback;
}
double ConfigNode::get_double(std::string_view key) const {
  auto c = child(key);
  double v = convert<double>(c.node_, locate(c.node_, c.path_), c.path_, "a number");
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
  return convert<bool>(c.node_, locate(c.node_, c.path_), c.path_, "true or false");
}
std::vector<int64_t> ConfigNode::get_int_list(std::string_view key) const {
  auto c = child(key);
  if (!c.node_.IsSequence()) c.fail(c.path_ + ": expected a list of integers, e.g. [4, 4]");
  std::vector<int64_t> out;
  for (const auto& item : c.node_) out.push_back(convert<int64_t>(item, locate(item, c.path_), c.path_, "an integer"));
  return out;
}

std::vector<int64_t> ConfigNode::get_int_list_in(std::string_view key, int64_t lo, int64_t hi,
                                                 size_t min_entries) const {
  const YAML::Node n = raw(key);
  if (n.IsDefined() && n.IsNull())
    sub(n, key_path(key)).fail(key_path(key) + ": null (give a list of integers, or leave the key out)");
  const auto c = child(key);
  if (!c.node_.IsSequence()) c.fail(c.path_ + ": expected a list of integers, e.g. [4, 4]");
  if (c.node_.size() < min_entries)
    c.fail(c.path_ + ": needs at least " + std::to_string(min_entries) + " entr" + (min_entries == 1 ? "y" : "ies") +
           " (got " + std::to_string(c.node_.size()) + ")");
  std::vector<int64_t> out;
  for (size_t i = 0; i < c.node_.size(); ++i) {
    const std::string at = c.path_ + "[" + std::to_string(i) + "]";
    const int64_t v = convert<int64_t>(c.node_[i], locate(c.node_[i], at), at, "an integer");
    if (v < lo || v > hi)
      sub(c.node_[i], at)
          .fail(at + ": must be between " + std::to_string(lo) + " and " + std::to_string(hi) + " (got " +
                std::to_string(v) + ")");
    out.push_back(v);
  }
  return out;
}

double ConfigNode::get_double_in(std::string_view key, double lo, double hi) const {
  const double v = get_double(key);
  if (!(v >= lo && v <= hi))
    child(key).fail(key_path(key) + ": must be between " + number_text(lo) + " and " + number_text(hi) + " (got " +
                    child(key).node_.Scalar() + ")");
  return v;
}
double ConfigNode::get_double_in(std::string_view key, double lo, double hi, double fallback) const {
  return has(key) ? get_double_in(key, lo, hi) : fallback;
}
double ConfigNode::get_positive_double(std::string_view key) const {
  double v = get_double(key);
  if (!(v > 0)) child(key).fail(key_path(key) + ": must be > 0 (got " + child(key).node_.Scalar() + ")");
  if (v > kMaxFigure)
    child(key).fail(key_path(key) + ": must be at most " + number_text(kMaxFigure) + " (got " +
                    child(key).node_.Scalar() + ")");
  return v;
}
double ConfigNode::get_nonnegative_double(std::string_view key, double fallback) const {
  if (!has(key)) return fallback;
  double v = get_double(key);
  if (v < 0) child(key).fail(key_path(key) + ": must be >= 0 (got " + child(key).node_.Scalar() + ")");
  if (v > kMaxFigure)
    child(key).fail(key_path(key) + ": must be at most " + number_text(kMaxFigure) + " (got " +
                    child(key).node_.Scalar() + ")");
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
int64_t ConfigNode::get_int_in(std::string_view key, int64_t lo, int64_t hi) const {
  const int64_t v = get_int(key);
  if (v < lo || v > hi)
    child(key).fail(key_path(key) + ": must be between " + std::to_string(lo) + " and " + std::to_string(hi) +
                    " (got " + std::to_string(v) + ")");
  return v;
}
int64_t ConfigNode::get_int_in(std::string_view key, int64_t lo, int64_t hi, int64_t fallback) const {
  return has(key) ? get_int_in(key, lo, hi) : fallback;
}

}  // namespace shardsim::common

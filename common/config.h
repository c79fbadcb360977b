// Reading YAML config files with errors a user can act on.
//
// ConfigNode wraps a yaml-cpp node together with the file it came from and its dotted path, so every
// error names "FILE:LINE: key.path: what is wrong". Unknown keys are errors (a typo must not be silently
// ignored). Errors: shardsim::ConfigError (exit code 2).
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace shardsim::inline common {

class ConfigNode {
 public:
  ConfigNode(YAML::Node node, std::string file, std::string path);

  // Parses FILE. Missing/unreadable file, a directory, malformed YAML, more than one YAML document ('---'), or
  // a quoted string not closed on its line -> ConfigError naming FILE (and line).
  static ConfigNode load_file(const std::string& file);
  // Parses TEXT as if it came from FILE (for tests and embedded configs).
  static ConfigNode load_string(const std::string& text, const std::string& file);
  // ROOT, a tree parsed from a file and then edited (command-line overrides), as a document of FILE whose text is
  // TEXT: the nodes it kept keep their lines in the file they were parsed from; nodes made without a mark
  // (ConfigNode::unmarked) are named by FILE alone.
  // ORIGINS: (key path as errors show it, e.g. "model.seq", the flag that set it, e.g. "--set model.seq=4"): a
  // node without a source position at or below such a path is named "FILE, FLAG" in messages.
  static ConfigNode from_edited_tree(YAML::Node root, const std::string& text, const std::string& file,
                                     std::vector<std::pair<std::string, std::string>> origins = {});
  // A deep copy of N without source positions (a value parsed from a command-line flag: its "line 1" is not a line
  // of any config file).
  static YAML::Node unmarked(const YAML::Node& n);

  // "FILE:LINE" of this node (LINE is 1-based); "FILE, --set KEY=V" for a node a command-line override made.
  std::string where() const;
  const std::string& path() const { return path_; }
  const std::string& file() const { return file_; }
  const YAML::Node& yaml() const { return node_; }
  // The whole document this node came from, as written (empty for nodes built directly).
  const std::string& text() const { return *text_; }

  bool is_map() const { return node_.IsMap(); }
  // KEY is present with a value. A key present without one (`key:`, `key: ~`, `key: null`, `--set key=`) is a
  // ConfigError naming FILE:LINE and the key: it never reads as absent (its default) silently.
  bool has(std::string_view key) const;
  // Throws if this node is not a map or holds a key outside ALLOWED.
  void expect_keys(std::initializer_list<std::string_view> allowed) const;
  void expect_keys(std::span<const std::string_view> allowed) const;

  ConfigNode child(std::string_view key) const;  // required
  std::optional<ConfigNode> maybe_child(std::string_view key) const;

  // Strings: a scalar holding a control character (newline, tab, ESC, DEL...) is an error naming FILE:LINE and
  // the key: every string a config gives is a name, label, path or enum value, and may end up in a report,
  // a CSV or a plot script (docs/SECURITY.md).
  std::string get_string(std::string_view key) const;
  std::string get_string(std::string_view key, const std::string& fallback) const;
  int64_t get_int(std::string_view key) const;
  int64_t get_int(std::string_view key, int64_t fallback) const;
  double get_double(std::string_view key) const;
  double get_double(std::string_view key, double fallback) const;
  bool get_bool(std::string_view key, bool fallback) const;
  std::vector<int64_t> get_int_list(std::string_view key) const;
  // KEY as a list of at least MIN_ENTRIES integers, each in [LO, HI]: every entry is checked on its own and a bad
  // one is named with its line and index ("FILE:LINE: path.key[2]: must be between LO and HI (got X)"); a key
  // given as `null` or `[]` (when MIN_ENTRIES > 0) is an error too. Sums and products of the entries are the
  // caller's, with common/checked.h.
  std::vector<int64_t> get_int_list_in(std::string_view key, int64_t lo, int64_t hi, size_t min_entries = 1) const;

  // get_double and the validators below reject NaN and infinities (.nan, .inf, -.inf in YAML) with
  // "FILE:LINE: path.key: must be a finite number (got .nan)".
  // A figure in [LO, HI] (its documented physical range, docs/CONFIG.md "Bounds"): "FILE:LINE: path.key: must be
  // between LO and HI (got X)" otherwise. Every figure a config gives is bounded above (issue 46, kind 3).
  double get_double_in(std::string_view key, double lo, double hi) const;
  double get_double_in(std::string_view key, double lo, double hi, double fallback) const;
  // Validators: throw "FILE:LINE: path.key: must be > 0 (got X)" / ">= 0", and, for a key without a range of its
  // own, "must be at most 1e+12" (kMaxFigure: no unit a config uses needs more; keys with a physical range use
  // get_double_in).
  static constexpr double kMaxFigure = 1e12;
  double get_positive_double(std::string_view key) const;
  double get_nonnegative_double(std::string_view key, double fallback) const;
  int64_t get_positive_int(std::string_view key) const;
  int64_t get_positive_int(std::string_view key, int64_t fallback) const;
  // An integer in [LO, HI]: "FILE:LINE: path.key: must be between LO and HI (got X)" otherwise (the documented
  // bound of a size or count; docs/CONFIG.md).
  int64_t get_int_in(std::string_view key, int64_t lo, int64_t hi) const;
  int64_t get_int_in(std::string_view key, int64_t lo, int64_t hi, int64_t fallback) const;

  // This node as printable text (a scalar without control characters), else ConfigError naming FILE:LINE.
  std::string printable_text() const;
  // "" if S is free of control characters (C0 and DEL), else which one and where ("control character U+000A
  // at position 5").
  static std::string control_character(const std::string& s);

  // Error messages name the root key KEY as SHOWN (normalise reads `model:` as `workload:` and shows "model").
  // Shared by every node of the document.
  void show_key_as(const std::string& key, const std::string& shown);

  // Throws ConfigError with this node's location prefixed.
  [[noreturn]] void fail(const std::string& message) const;
  // Throws ConfigError with the location of the node at DOTTED_KEY below this one ("parallel.algorithm"), or of
  // the deepest of its parents this document has (this node when none), prefixed to MESSAGE.
  [[noreturn]] void fail_at(std::string_view dotted_key, const std::string& message) const;

 private:
  std::string key_path(std::string_view key) const;
  YAML::Node raw(std::string_view key) const;
  // A node of this document (sharing its text, shown keys and origins) at PATH.
  ConfigNode sub(YAML::Node n, std::string path) const;
  // Where N (at key path PATH) came from: FILE:LINE, or the override that made it (see from_edited_tree).
  std::string locate(const YAML::Node& n, std::string_view path) const;

  YAML::Node node_;
  std::string file_;
  std::string path_;
  std::shared_ptr<const std::string> text_ = std::make_shared<const std::string>();
  std::shared_ptr<std::map<std::string, std::string, std::less<>>> shown_ =
      std::make_shared<std::map<std::string, std::string, std::less<>>>();
  std::shared_ptr<const std::vector<std::pair<std::string, std::string>>> origins_ =
      std::make_shared<const std::vector<std::pair<std::string, std::string>>>();
};

}  // namespace shardsim::common

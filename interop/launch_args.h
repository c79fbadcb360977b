// The flags of a launch line or launch script (`torchrun ... pretrain_gpt.py --num-layers 32 ...`), read the way a
// shell would for the simple scripts launch examples are (megatron.h says what is read), with what the importer did
// with each flag (read() marks it used; the rest end as "not read" lines of the written config's header).
//
// Errors: ConfigError "WHERE:LINE: --flag: ..." (exit 2), values escaped.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace shardsim::interop {

class LaunchArgs {
 public:
  // Parses TEXT (WHERE names it in messages; LINES: whether line numbers mean anything, i.e. TEXT is a file).
  LaunchArgs(const std::string& text, std::string where, bool lines);

  bool has(const std::string& flag) const { return flags_.count(flag) > 0; }
  void use(const std::string& flag) { used_.insert(flag); }
  // "--flag v1 v2" (escaped) for the header; "--flag" for a switch.
  std::string show(const std::string& flag) const;
  // "WHERE:LINE: --flag" for messages.
  std::string at(const std::string& flag) const;
  [[noreturn]] void fail(const std::string& flag, const std::string& what) const;

  // A switch (present = true). A switch given a value is an error.
  bool flag(const std::string& flag);
  // The flag's one value; nullopt when absent. A missing value is an error.
  std::optional<std::string> text(const std::string& flag);
  std::optional<int64_t> integer(const std::string& flag, int64_t lo, int64_t hi);
  std::optional<double> real(const std::string& flag, double lo, double hi);

  // Flags given and never used, in the order they appeared.
  std::vector<std::string> unused() const;
  // Flags given twice (the last value wins, as argparse does), for the header.
  const std::vector<std::string>& repeated() const { return repeated_; }

 private:
  struct Flag {
    std::vector<std::string> values;
    int line = 0;
  };
  void add_words(const std::vector<std::pair<std::string, int>>& words);

  std::string where_;
  bool lines_;
  std::map<std::string, Flag> flags_;
  std::vector<std::string> order_;
  std::vector<std::string> repeated_;
  std::set<std::string> used_;
};

}  // namespace shardsim::interop

#include "interop/launch_args.h"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "common/error.h"
#include "common/number.h"
#include "common/text.h"
#include "interop/imported.h"

namespace shardsim::interop {

namespace {

using Words = std::vector<std::pair<std::string, int>>;  // word, line

// The logical lines of TEXT: continuations joined, comments removed; each with the line it starts on.
std::vector<std::pair<std::string, int>> logical_lines(const std::string& text) {
  std::vector<std::pair<std::string, int>> out;
  std::string cur;
  int line = 1, start = 1;
  char quote = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '\\' && i + 1 < text.size() && text[i + 1] == '\n' && quote != '\'') {
      ++i;
      ++line;
      cur += ' ';
      continue;
    }
    if (!quote && c == '#' && (cur.empty() || std::isspace(static_cast<unsigned char>(cur.back())))) {
      while (i + 1 < text.size() && text[i + 1] != '\n') ++i;
      continue;
    }
    if (c == '\n' || (!quote && c == ';')) {
      if (c == '\n' && quote) {  // a quoted newline stays in the word
        cur += c;
        ++line;
        continue;
      }
      out.emplace_back(cur, start);
      cur.clear();
      if (c == '\n') ++line;
      start = line;
      continue;
    }
    if ((c == '\'' || c == '"') && (!quote || quote == c)) quote = quote ? 0 : c;
    cur += c;
  }
  if (!cur.empty()) out.emplace_back(cur, start);
  return out;
}

bool is_name(const std::string& s) {
  if (s.empty() || !(std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_')) return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) return false;
  return true;
}

struct Shell {
  std::map<std::string, std::string> vars;
  std::map<std::string, std::vector<std::pair<std::string, int>>> arrays;  // word, line of its definition
  // A line's words after expansion are at most this many bytes (the script's own bound): a few lines of A="$A$A"
  // doubled a 2 KB script into GBs before anything checked it.
  static constexpr size_t kMaxExpanded = size_t(1) << 20;
  std::string where;  // the script, for errors
  void bounded(size_t bytes, int no) const {
    if (bytes > kMaxExpanded)
      throw ConfigError(where + ":" + std::to_string(no) + ": the line's variables expand past " +
                        std::to_string(kMaxExpanded) + " bytes (the limit of a launch script)");
  }

  // Expands one $-reference at S[I] (I at the '$'); appends to OUT, or sets SPLICE for an unquoted ${X[@]}.
  size_t expand(const std::string& s, size_t i, std::string& out,
                const std::vector<std::pair<std::string, int>>** splice) const {
    size_t j = i + 1;
    std::string name;
    if (j < s.size() && s[j] == '{') {
      const size_t close = s.find('}', j);
      if (close == std::string::npos) {
        out += s.substr(i);
        return s.size();
      }
      name = s.substr(j + 1, close - j - 1);
      j = close + 1;
    } else {
      while (j < s.size() && (std::isalnum(static_cast<unsigned char>(s[j])) || s[j] == '_')) name += s[j++];
    }
    std::string base = name;
    const bool all = name.size() > 3 && name.compare(name.size() - 3, 3, "[@]") == 0;
    if (all) base = name.substr(0, name.size() - 3);
    if (all && arrays.count(base) && splice) *splice = &arrays.at(base);
    else if (arrays.count(base) && !arrays.at(base).empty()) out += arrays.at(base)[0].first;
    else if (vars.count(base)) out += vars.at(base);
    else out += s.substr(i, j - i);  // unknown: literal
    return j;
  }

  // The words of LINE (on line NO), quotes removed and variables expanded; a spliced array's words keep the line
  // of their definition.
  std::vector<std::pair<std::string, int>> words(const std::string& line, int no) const {
    std::vector<std::pair<std::string, int>> out;
    std::string cur;
    bool have = false;
    char quote = 0;
    size_t bytes = 0;  // the finished words' bytes
    for (size_t i = 0; i < line.size();) {
      const char c = line[i];
      if (!quote && std::isspace(static_cast<unsigned char>(c))) {
        if (have) out.emplace_back(cur, no);
        bytes += cur.size() + 1;
        cur.clear();
        have = false;
        ++i;
        continue;
      }
      have = true;
      if ((c == '\'' || c == '"') && (!quote || quote == c)) {
        quote = quote ? 0 : c;
        ++i;
        continue;
      }
      if (c == '\\' && quote != '\'' && i + 1 < line.size()) {
        cur += line[i + 1];
        i += 2;
        continue;
      }
      if (c == '$' && quote != '\'') {
        const std::vector<std::pair<std::string, int>>* splice = nullptr;
        const size_t next = expand(line, i, cur, quote ? nullptr : &splice);
        if (splice) {
          if (!cur.empty()) out.emplace_back(cur, no);
          bytes += cur.size();
          for (const auto& w : *splice) bytes += w.first.size() + 1;
          bounded(bytes, no);
          out.insert(out.end(), splice->begin(), splice->end());
          cur.clear();
          have = false;
        }
        bounded(bytes + cur.size(), no);
        i = next;
        continue;
      }
      cur += c;
      ++i;
    }
    if (have) out.emplace_back(cur, no);
    return out;
  }
};

}  // namespace

LaunchArgs::LaunchArgs(const std::string& text, std::string where, bool lines) : where_(std::move(where)), lines_(lines) {
  Shell sh;
  sh.where = where_;
  Words command;
  std::string array;  // the array being defined
  // Adds W to the array being defined; false once its closing ')' is reached.
  auto into_array = [&](std::pair<std::string, int> w) {
    const bool end = !w.first.empty() && w.first.back() == ')';
    if (end) w.first.pop_back();
    if (!w.first.empty()) sh.arrays[array].push_back(w);
    if (end) array.clear();
    return !end;
  };
  for (const auto& [line, no] : logical_lines(text)) {
    auto ws = sh.words(line, no);
    if (!array.empty()) {
      for (const auto& w : ws)
        if (!into_array(w)) break;
      continue;
    }
    if (!ws.empty() && ws[0].first == "export") ws.erase(ws.begin());
    const size_t eq = ws.empty() ? std::string::npos : ws[0].first.find('=');
    if (eq != std::string::npos && is_name(ws[0].first.substr(0, eq))) {
      const std::string name = ws[0].first.substr(0, eq);
      const std::string value = ws[0].first.substr(eq + 1);
      if (value.rfind("(", 0) == 0) {  // NAME=( words... )
        sh.arrays[name].clear();
        array = name;
        bool open = into_array({value.substr(1), no});
        for (size_t i = 1; open && i < ws.size(); ++i) open = into_array(ws[i]);
      } else {
        sh.vars[name] = value;
      }
      continue;
    }
    command.insert(command.end(), ws.begin(), ws.end());
  }
  add_words(command);
}

void LaunchArgs::add_words(const Words& words) {
  std::string current;
  for (const auto& [w, line] : words) {
    if (w.size() > 2 && w.compare(0, 2, "--") == 0) {
      std::string name = w, value;
      const size_t eq = w.find('=');
      const bool inline_value = eq != std::string::npos;
      if (inline_value) {
        name = w.substr(0, eq);
        value = w.substr(eq + 1);
      }
      if (flags_.count(name)) {
        repeated_.push_back(name);
        flags_[name].values.clear();
      } else {
        order_.push_back(name);
      }
      flags_[name].line = line;
      if (inline_value) flags_[name].values.push_back(value);
      current = inline_value ? "" : name;
    } else if (w.size() > 3 && w.compare(w.size() - 3, 3, ".py") == 0) {
      current.clear();  // the training script (torchrun's flags end there)
    } else if (!current.empty()) {
      flags_[current].values.push_back(w);
    }
  }
}

std::string LaunchArgs::show(const std::string& flag) const {
  std::string s = flag;
  if (flags_.count(flag))
    for (const std::string& v : flags_.at(flag).values) s += " " + v;
  if (s.size() > 100) s = s.substr(0, 97) + "...";
  return escape_control(s);
}

std::string LaunchArgs::at(const std::string& flag) const {
  std::string s = where_;
  if (lines_ && flags_.count(flag)) s += ":" + std::to_string(flags_.at(flag).line);
  return s + ": " + escape_control(flag);
}

void LaunchArgs::fail(const std::string& flag, const std::string& what) const {
  throw ConfigError(at(flag) + ": " + what);
}

bool LaunchArgs::flag(const std::string& f) {
  use(f);
  if (!has(f)) return false;
  if (!flags_.at(f).values.empty())
    fail(f, "is a switch and takes no value (got '" + escape_control(flags_.at(f).values[0]) + "')");
  return true;
}

std::optional<std::string> LaunchArgs::text(const std::string& f) {
  use(f);
  if (!has(f)) return std::nullopt;
  const auto& v = flags_.at(f).values;
  if (v.empty()) fail(f, "needs a value");
  if (v.size() > 1) fail(f, "takes one value (got " + std::to_string(v.size()) + ": " + show(f) + ")");
  return v[0];
}

std::optional<int64_t> LaunchArgs::integer(const std::string& f, int64_t lo, int64_t hi) {
  const auto t = text(f);
  if (!t) return std::nullopt;
  const auto parsed = decimal_int(*t);  // decimal only (common/number.h)
  const int64_t v = parsed.value_or(0);
  if (!parsed)
    fail(f, "'" + escape_control(*t) + "' is not an integer" +
                (t->find('$') != std::string::npos ? " (a shell variable the script does not set?)" : ""));
  if (v < lo || v > hi)
    fail(f, "must be between " + std::to_string(lo) + " and " + std::to_string(hi) + " (got " + std::to_string(v) + ")");
  return v;
}

std::optional<double> LaunchArgs::real(const std::string& f, double lo, double hi) {
  const auto t = text(f);
  if (!t) return std::nullopt;
  const auto parsed = decimal_double(*t);  // decimal only (common/number.h): strtod took '0x10'
  const double v = parsed.value_or(0);
  if (!parsed)
    fail(f, "'" + escape_control(*t) + "' is not a number" +
                (t->find('$') != std::string::npos ? " (a shell variable the script does not set?)" : ""));
  if (v < lo || v > hi)
    fail(f, "must be between " + number_text(lo) + " and " + number_text(hi) + " (got " + escape_control(*t) + ")");
  return v;
}

std::vector<std::string> LaunchArgs::unused() const {
  std::vector<std::string> out;
  for (const std::string& f : order_)
    if (!used_.count(f)) out.push_back(f);
  return out;
}

}  // namespace shardsim::interop

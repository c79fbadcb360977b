#include "common/text.h"

#include <cstdio>
#include <stdexcept>

namespace shardsim::inline common {

namespace {

// Length of the well-formed UTF-8 sequence starting at S[I] (2..4), or 0 when it is not one (RFC 3629: no
// overlong forms, no surrogates, nothing above U+10FFFF).
size_t utf8_length(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const unsigned char c = b(0);
  size_t n = 0;
  unsigned char lo = 0x80, hi = 0xbf;  // the allowed range of the second byte
  if (c >= 0xc2 && c <= 0xdf) n = 2;
  else if (c == 0xe0) n = 3, lo = 0xa0;
  else if (c >= 0xe1 && c <= 0xec) n = 3;
  else if (c == 0xed) n = 3, hi = 0x9f;
  else if (c >= 0xee && c <= 0xef) n = 3;
  else if (c == 0xf0) n = 4, lo = 0x90;
  else if (c >= 0xf1 && c <= 0xf3) n = 4;
  else if (c == 0xf4) n = 4, hi = 0x8f;
  if (n == 0 || i + n > s.size()) return 0;
  if (b(1) < lo || b(1) > hi) return 0;
  for (size_t k = 2; k < n; ++k)
    if (b(k) < 0x80 || b(k) > 0xbf) return 0;
  return n;
}

void append_hex(std::string& out, unsigned char c) {
  char buf[5];
  std::snprintf(buf, sizeof buf, "\\x%02x", c);
  out += buf;
}

}  // namespace

std::string escape_control(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
      ++i;
      continue;
    }
    const size_t n = c >= 0x80 ? utf8_length(s, i) : 0;
    const bool c1 = n == 2 && c == 0xc2 && static_cast<unsigned char>(s[i + 1]) < 0xa0;  // U+0080..U+009F
    if (n == 0 || c1) {
      for (size_t k = 0; k < (c1 ? 2 : 1); ++k) append_hex(out, static_cast<unsigned char>(s[i + k]));
      i += c1 ? 2 : 1;
      continue;
    }
    out.append(s.substr(i, n));
    i += n;
  }
  return out;
}

std::string escape_lines(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i <= s.size();) {
    const size_t nl = s.find('\n', i);
    out += escape_control(s.substr(i, nl == std::string_view::npos ? std::string_view::npos : nl - i));
    if (nl == std::string_view::npos) break;
    out += '\n';
    i = nl + 1;
  }
  return out;
}

std::vector<std::string> split_items(std::string_view text) {
  if (text.empty()) throw std::invalid_argument("an empty list");
  std::vector<std::string> out;
  std::string cur;
  int depth = 0;
  for (const char c : text) {
    if (c == '[' || c == '{') ++depth;
    if ((c == ']' || c == '}') && depth > 0) --depth;
    if (c == ',' && depth == 0) {
      out.push_back(std::move(cur));
      cur.clear();
    } else {
      cur += c;
    }
  }
  out.push_back(std::move(cur));
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i].empty())
      throw std::invalid_argument("'" + escape_control(text) + "': an empty item (" +
                                  (i == 0 ? "a leading comma" : i + 1 == out.size() ? "a trailing comma" : "two commas") +
                                  ")");
    for (size_t j = 0; j < i; ++j)
      if (out[j] == out[i]) throw std::invalid_argument("'" + escape_control(out[i]) + "' given twice");
  }
  return out;
}

}  // namespace shardsim::common

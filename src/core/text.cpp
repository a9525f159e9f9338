// Printable, bounded echoes of user text and the one number formatter (src/core/text.hpp).
#include "core/text.hpp"

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>

namespace blasst::detail {

namespace {

// Length of the valid UTF-8 sequence at s[i] and its code point; 0 when the bytes are not one
// (truncated, overlong, a surrogate or beyond U+10FFFF).
std::size_t utf8_at(std::string_view s, std::size_t i, std::uint32_t& cp) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  std::size_t n = 0;
  std::uint32_t min = 0;
  if (b0 >= 0xc2 && b0 <= 0xdf) {
    n = 2;
    cp = b0 & 0x1fu;
    min = 0x80;
  } else if (b0 >= 0xe0 && b0 <= 0xef) {
    n = 3;
    cp = b0 & 0x0fu;
    min = 0x800;
  } else if (b0 >= 0xf0 && b0 <= 0xf4) {
    n = 4;
    cp = b0 & 0x07u;
    min = 0x10000;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  for (std::size_t k = 1; k < n; ++k) {
    const auto b = static_cast<unsigned char>(s[i + k]);
    if ((b & 0xc0u) != 0x80u) return 0;
    cp = (cp << 6) | (b & 0x3fu);
  }
  if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
  return n;
}

// Code points that move the cursor, end a line or reorder the text on a terminal.
bool invisible_control(std::uint32_t cp) {
  return (cp >= 0x80 && cp <= 0x9f) || cp == 0x061c || cp == 0x200e || cp == 0x200f ||
         (cp >= 0x2028 && cp <= 0x202e) || (cp >= 0x2066 && cp <= 0x2069) || cp == 0xfeff;
}

std::string hex_escape(unsigned char b) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "\\x%02x", b);
  return buf;
}

// The shared walk of printable() and single_quoted(): `quote` != 0 also escapes it and backslashes.
std::string escape(std::string_view s, std::size_t max_chars, char quote) {
  std::string out;
  std::size_t chars = 0;
  for (std::size_t i = 0; i < s.size();) {
    const auto b = static_cast<unsigned char>(s[i]);
    std::string piece;
    std::size_t step = 1;
    if (b == '\n') {
      piece = "\\n";
    } else if (b == '\t') {
      piece = "\\t";
    } else if (b == '\r') {
      piece = "\\r";
    } else if (b < 0x20 || b == 0x7f) {
      piece = hex_escape(b);
    } else if (quote != 0 && (b == static_cast<unsigned char>(quote) || b == '\\')) {
      piece = std::string("\\") + static_cast<char>(b);
    } else if (b < 0x80) {
      piece = std::string(1, static_cast<char>(b));
    } else {
      std::uint32_t cp = 0;
      const std::size_t n = utf8_at(s, i, cp);
      if (n == 0) {
        piece = hex_escape(b);
      } else if (invisible_control(cp)) {
        char buf[12];
        std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(cp));
        piece = buf;
        step = n;
      } else {
        piece.assign(s.substr(i, n));
        step = n;
      }
    }
    // Escapes count as what they print; a multi-byte character counts as one.
    const std::size_t width = piece.size() > 1 && piece[0] != '\\' ? 1 : piece.size();
    if (chars + width > max_chars) {
      out += "... (" + std::to_string(s.size()) + " bytes)";
      return out;
    }
    out += piece;
    chars += width;
    i += step;
  }
  return out;
}

bool plain_name(std::string_view s) {
  if (s.empty() || s.size() > 64) return false;
  for (char c : s) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

}  // namespace

std::string printable(std::string_view s, std::size_t max_chars) { return escape(s, max_chars, 0); }

std::string single_quoted(std::string_view s, std::size_t max_chars) {
  std::string out(1, '\'');
  out += escape(s, max_chars, '\'');
  out += '\'';
  return out;
}

std::string member(std::string_view parent, std::string_view name) {
  std::string out(parent);
  if (plain_name(name)) return out.append(".").append(name);
  return out + "[" + single_quoted(name) + "]";
}

std::string num(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  // Shortest round-trip digits; plain notation where it stays short ("100000", "0.0001"),
  // scientific elsewhere ("1e+300", "5e-324").
  const double ax = std::abs(x);
  const auto fmt = ax == 0.0 || (ax >= 1e-5 && ax < 1e16) ? std::chars_format::fixed
                                                           : std::chars_format::scientific;
  char buf[400];
  const auto r = std::to_chars(buf, buf + sizeof buf, x, fmt);
  return std::string(buf, r.ptr);
}

}  // namespace blasst::detail

// Internal: how user-supplied text and numbers appear in messages. Every error the library and
// the CLI print must stay one printable line of bounded length, whatever a hostile file or
// argument holds (newlines, escape sequences, NUL bytes, 100k-character names).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace blasst::detail {

// Longest user string echoed inside a message (longer ones are cut, with their length said).
inline constexpr std::size_t kMaxEchoChars = 80;
// Longest whole message the CLI prints.
inline constexpr std::size_t kMaxMessageChars = 2000;

// `s` made printable: valid UTF-8 of printable characters is kept; C0/C1 controls, DEL, Unicode
// bidirectional overrides and invalid bytes become \n, \t, \r, \\x1b, \u202e-style escapes.
// More than `max_chars` output characters: cut, then "... (N bytes)" appended.
std::string printable(std::string_view s, std::size_t max_chars = kMaxMessageChars);
// The same in single quotes ('...'), a quote inside escaped as \'; for names and values.
std::string single_quoted(std::string_view s, std::size_t max_chars = kMaxEchoChars);
// A member of a JSON path for messages: parent + "." + name when `name` is short and made of
// [A-Za-z0-9_-] only, else parent + "['...']" with single_quoted(): member("config_groups", "group_0")
// == "config_groups.group_0", member("config_groups", "a.b") == "config_groups['a.b']".
std::string member(std::string_view parent, std::string_view name);

// The shortest decimal that reads back as exactly x ("0.1", "1e+300", "5e-324"); "nan", "inf",
// "-inf" for the non-finite values. The one number formatter of the messages.
std::string num(double x);

}  // namespace blasst::detail

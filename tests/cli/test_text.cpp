// src/core/text.hpp: what user text and numbers look like inside messages (issue 21, class 7):
// one printable line of bounded length whatever the input holds.
#include <gtest/gtest.h>

#include <cstdlib>
#include <limits>
#include <string>

#include "core/text.hpp"

namespace {

using blasst::detail::member;
using blasst::detail::num;
using blasst::detail::printable;
using blasst::detail::single_quoted;

// True when every byte is printable ASCII or part of a multi-byte UTF-8 character.
bool one_printable_line(const std::string& s) {
  for (unsigned char c : s)
    if (c < 0x20 || c == 0x7f) return false;
  return true;
}

TEST(Text, ControlCharactersAreEscaped) {
  EXPECT_EQ(printable("a\nb\tc\rd"), "a\\nb\\tc\\rd");
  EXPECT_EQ(printable(std::string("x\0y", 3)), "x\\x00y");  // a NUL no longer cuts the message
  EXPECT_EQ(printable("\x1b[31mred"), "\\x1b[31mred");       // no escape sequence reaches a terminal
  EXPECT_EQ(printable("del\x7f"), "del\\x7f");
  // Valid UTF-8 stays; C1 controls, bidi overrides and invalid bytes are escaped.
  EXPECT_EQ(printable("gr\xc3\xbc\xc3\x9f"), "gr\xc3\xbc\xc3\x9f");
  EXPECT_EQ(printable("\xc2\x9b" "2J"), "\\u009b2J");
  EXPECT_EQ(printable("abc\xe2\x80\xae" "fed"), "abc\\u202efed");
  EXPECT_EQ(printable("\xff\xfe"), "\\xff\\xfe");
  EXPECT_EQ(printable("\xe2\x82"), "\\xe2\\x82");          // truncated sequence
  EXPECT_EQ(printable("\xc0\xaf"), "\\xc0\\xaf");          // overlong '/'
  EXPECT_EQ(printable("\xed\xa0\x80"), "\\xed\\xa0\\x80");  // a surrogate
  // printable() keeps backslashes and quotes (it is applied to whole messages).
  EXPECT_EQ(printable("it's a\\b"), "it's a\\b");
}

TEST(Text, QuotedEscapesItsQuoteAndBackslash) {
  EXPECT_EQ(single_quoted("topk"), "'topk'");
  EXPECT_EQ(single_quoted("it's"), "'it\\'s'");
  EXPECT_EQ(single_quoted("a\\n"), "'a\\\\n'");  // a literal backslash-n differs from a newline
  EXPECT_EQ(single_quoted("a\nb"), "'a\\nb'");
}

TEST(Text, LongTextIsCutWithItsLength) {
  const std::string name(100000, 'x');
  const std::string q = single_quoted(name);
  EXPECT_LT(q.size(), 120u);
  EXPECT_NE(q.find("... (100000 bytes)"), std::string::npos) << q;
  EXPECT_EQ(q.rfind("'xxxx", 0), 0u);
  // An escape is never cut in half.
  const std::string nl(1000, '\n');
  const std::string p = printable(nl, 11);
  EXPECT_EQ(p, "\\n\\n\\n\\n\\n... (1000 bytes)");
  EXPECT_LE(printable(std::string(5000, 'y')).size(), blasst::detail::kMaxMessageChars + 32);
  // Random bytes: always one printable line.
  std::srand(21);
  for (int round = 0; round < 200; ++round) {
    std::string s(static_cast<std::size_t>(std::rand() % 300), '\0');
    for (char& c : s) c = static_cast<char>(std::rand() % 256);
    EXPECT_TRUE(one_printable_line(printable(s))) << round;
    EXPECT_TRUE(one_printable_line(single_quoted(s))) << round;
  }
}

TEST(Text, JsonPathMembers) {
  EXPECT_EQ(member("config_groups", "group_0"), "config_groups.group_0");
  EXPECT_EQ(member("config_groups", "a.b"), "config_groups['a.b']");
  EXPECT_EQ(member("config_groups", "evil\nname"), "config_groups['evil\\nname']");
  EXPECT_EQ(member("config_groups", ""), "config_groups['']");
  EXPECT_LT(member("config_groups", std::string(100000, 'g')).size(), 140u);
}

TEST(Text, NumbersReadBackExactly) {
  EXPECT_EQ(num(0.1), "0.1");
  EXPECT_EQ(num(100000), "100000");
  EXPECT_EQ(num(1443.49), "1443.49");
  EXPECT_EQ(num(0.0001), "0.0001");
  EXPECT_EQ(num(1e300), "1e+300");
  EXPECT_EQ(num(5e-324), "5e-324");
  EXPECT_EQ(num(-2), "-2");
  EXPECT_EQ(num(0.0), "0");
  EXPECT_EQ(num(std::numeric_limits<double>::quiet_NaN()), "nan");
  EXPECT_EQ(num(std::numeric_limits<double>::infinity()), "inf");
  EXPECT_EQ(num(-std::numeric_limits<double>::infinity()), "-inf");
  for (double x : {0.3, 1.0 / 3.0, 4.303654042880227, 1e-5, 9.999999999999999e15, 1e16, 2.5e-300})
    EXPECT_EQ(std::strtod(num(x).c_str(), nullptr), x) << num(x);
}

}  // namespace

// The exposition's label values: escaped, and valid UTF-8 whatever a process is called.
#include "common/exposition.h"

#include <gtest/gtest.h>

#include <string>

namespace nvshare {
namespace {

std::string label(std::string_view value) { return Labels().add("process", value).text(); }

// True when `text` is valid UTF-8 and holds no control character but the newline.
bool clean_utf8(const std::string& text) {
  for (std::size_t i = 0; i < text.size();) {
    const auto b = static_cast<unsigned char>(text[i]);
    std::size_t n = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > text.size()) return false;
    for (std::size_t k = 1; k < n; ++k) {
      if ((static_cast<unsigned char>(text[i + k]) >> 6) != 2) return false;
    }
    if (n == 1 && (b < 0x20 || b == 0x7F) && b != '\n') return false;
    i += n;
  }
  return true;
}

TEST(Exposition, LabelValuesAreEscaped) {
  EXPECT_EQ(label("a\\b\"c\nd"), R"(process="a\\b\"c\nd")");
  EXPECT_EQ(label(""), "");
  EXPECT_EQ(label("python3 train.py"), R"(process="python3 train.py")");
  EXPECT_EQ(label("\xC3\xA9t\xC3\xA9 \xE6\x97\xA5\xF0\x9F\x98\x80"),
            "process=\"\xC3\xA9t\xC3\xA9 \xE6\x97\xA5\xF0\x9F\x98\x80\"");  // kept as it is
}

// A Latin-1 file name, the bytes 0xff 0xfe of a hostile hello, a NUL, a tab, an overlong slash, a
// surrogate, a sequence cut short: each becomes U+FFFD, so the scrape stays valid.
TEST(Exposition, InvalidBytesAndControlsBecomeReplacementCharacters) {
  const std::string r = "\xEF\xBF\xBD";
  EXPECT_EQ(label("caf\xE9"), "process=\"caf" + r + "\"");
  EXPECT_EQ(label("\xFF\xFE"), "process=\"" + r + r + "\"");
  EXPECT_EQ(label(std::string("a\0b", 3)), "process=\"a" + r + "b\"");
  EXPECT_EQ(label("a\tb\x7F"), "process=\"a" + r + "b" + r + "\"");
  EXPECT_EQ(label("\xC0\xAF"), "process=\"" + r + r + "\"");
  EXPECT_EQ(label("\xED\xA0\x80"), "process=\"" + r + r + r + "\"");
  EXPECT_EQ(label("x\xE6\x97"), "process=\"x" + r + r + "\"");
  std::string all;
  for (int b = 0; b < 256; ++b) all += static_cast<char>(b);
  EXPECT_TRUE(clean_utf8(label(all))) << label(all);
}

}  // namespace
}  // namespace nvshare

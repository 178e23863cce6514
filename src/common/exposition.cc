#include "common/exposition.h"

#include <charconv>
#include <cmath>

namespace nvshare {

namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// The length of the valid UTF-8 sequence at the start of `text` (1 to 4), or 0 when none starts
// there (a stray continuation byte, an overlong form, a surrogate, past U+10FFFF, cut short).
std::size_t utf8_sequence(std::string_view text) {
  const auto byte = [&](std::size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char lead = byte(0);
  if (lead < 0x80) return 1;
  std::size_t length = 0;
  unsigned char low = 0x80;
  unsigned char high = 0xBF;
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) low = 0xA0;   // no overlong forms
    if (lead == 0xED) high = 0x9F;  // no surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) low = 0x90;
    if (lead == 0xF4) high = 0x8F;  // nothing past U+10FFFF
  } else {
    return 0;
  }
  if (text.size() < length) return 0;
  if (byte(1) < low || byte(1) > high) return 0;
  for (std::size_t i = 2; i < length; ++i) {
    if (byte(i) < 0x80 || byte(i) > 0xBF) return 0;
  }
  return length;
}

}  // namespace

// Label values come from processes (their names, their pods): Prometheus drops a whole scrape whose
// text is not valid UTF-8, so every invalid byte becomes U+FFFD, and so does every control
// character but the newline, which the format escapes.
Labels& Labels::add(std::string_view name, std::string_view value) {
  if (value.empty()) return *this;  // an empty value is the same as no label
  if (!text_.empty()) text_ += ',';
  text_ += name;
  text_ += "=\"";
  while (!value.empty()) {
    const std::size_t length = utf8_sequence(value);
    const char ch = value[0];
    if (length == 0) {
      text_ += kReplacement;
      value.remove_prefix(1);
      continue;
    }
    if (ch == '\\') {
      text_ += "\\\\";
    } else if (ch == '"') {
      text_ += "\\\"";
    } else if (ch == '\n') {
      text_ += "\\n";
    } else if ((length == 1 && static_cast<unsigned char>(ch) < 0x20) || ch == 0x7F) {
      text_ += kReplacement;
    } else {
      text_.append(value.substr(0, length));
    }
    value.remove_prefix(length);
  }
  text_ += '"';
  return *this;
}

Labels Labels::with(std::string_view name, std::string_view value) const {
  Labels copy = *this;
  copy.add(name, value);
  return copy;
}

void append_number(std::string& out, double value) {
  if (std::isnan(value)) {
    out += "NaN";
    return;
  }
  if (std::isinf(value)) {
    out += value > 0 ? "+Inf" : "-Inf";
    return;
  }
  char buffer[64];
  const auto [end, ec] = std::to_chars(buffer, buffer + sizeof buffer, value);
  out.append(buffer, ec == std::errc{} ? end : buffer);
}

void append_number(std::string& out, std::uint64_t value) {
  char buffer[32];
  const auto [end, ec] = std::to_chars(buffer, buffer + sizeof buffer, value);
  out.append(buffer, ec == std::errc{} ? end : buffer);
}

void Exposition::family(std::string_view name, std::string_view type, std::string_view help) {
  name_ = name;
  out_ += "# HELP ";
  out_ += name;
  out_ += ' ';
  out_ += help;
  out_ += "\n# TYPE ";
  out_ += name;
  out_ += ' ';
  out_ += type;
  out_ += '\n';
}

void Exposition::begin_sample(const Labels& labels, std::string_view suffix) {
  out_ += name_;
  out_ += suffix;
  if (!labels.text().empty()) {
    out_ += '{';
    out_ += labels.text();
    out_ += '}';
  }
  out_ += ' ';
}

}  // namespace nvshare

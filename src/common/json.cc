#include "common/json.h"

#include <cassert>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>

namespace nvshare {
namespace {

// ---- UTF-8
// ---------------------------------------------------------------------------------------

// Length of the valid UTF-8 sequence at the start of `s`, or 0 when it is not valid (overlong
// forms, surrogates and code points above U+10FFFF are invalid).
std::size_t utf8_sequence_length(std::string_view s) {
  const auto byte = [&](std::size_t i) { return static_cast<unsigned char>(s[i]); };
  const unsigned char b0 = byte(0);
  if (b0 < 0x80) return 1;
  std::size_t length;
  std::uint32_t code;
  std::uint32_t min_code;
  if ((b0 & 0xE0) == 0xC0) {
    length = 2, code = b0 & 0x1F, min_code = 0x80;
  } else if ((b0 & 0xF0) == 0xE0) {
    length = 3, code = b0 & 0x0F, min_code = 0x800;
  } else if ((b0 & 0xF8) == 0xF0) {
    length = 4, code = b0 & 0x07, min_code = 0x10000;
  } else {
    return 0;
  }
  if (s.size() < length) return 0;
  for (std::size_t i = 1; i < length; ++i) {
    if ((byte(i) & 0xC0) != 0x80) return 0;
    code = (code << 6) | (byte(i) & 0x3F);
  }
  if (code < min_code || code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF)) return 0;
  return length;
}

void append_utf8(std::string& out, std::uint32_t code) {
  if (code < 0x80) {
    out += static_cast<char>(code);
  } else if (code < 0x800) {
    out += static_cast<char>(0xC0 | (code >> 6));
    out += static_cast<char>(0x80 | (code & 0x3F));
  } else if (code < 0x10000) {
    out += static_cast<char>(0xE0 | (code >> 12));
    out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (code & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (code >> 18));
    out += static_cast<char>(0x80 | ((code >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (code & 0x3F));
  }
}

// ---- parser
// --------------------------------------------------------------------------------------

class Parser {
 public:
  Parser(std::string_view text, JsonLimits limits) : text_(text), limits_(limits) {}

  Result<Json> parse_document() {
    if (text_.size() > limits_.max_bytes) {
      return make_error("JSON document of " + std::to_string(text_.size()) +
                        " bytes exceeds the limit of " + std::to_string(limits_.max_bytes));
    }
    skip_whitespace();
    Json value;
    if (!parse_value(value, 0)) return make_error(error_);
    skip_whitespace();
    if (pos_ != text_.size()) {
      fail("unexpected " + describe_here() + " after the JSON value");
      return make_error(error_);
    }
    return value;
  }

 private:
  bool at_end() const { return pos_ >= text_.size(); }
  char peek() const { return text_[pos_]; }

  void skip_whitespace() {
    while (!at_end() && (peek() == ' ' || peek() == '\t' || peek() == '\n' || peek() == '\r'))
      ++pos_;
  }

  std::string describe_here() const {
    if (at_end()) return "end of input";
    const unsigned char c = static_cast<unsigned char>(peek());
    if (c >= 0x20 && c < 0x7F) return std::string("'") + static_cast<char>(c) + "'";
    char hex[16];
    std::snprintf(hex, sizeof hex, "byte 0x%02X", c);
    return hex;
  }

  // Records the first error with its position (line and column, both from 1).
  bool fail(const std::string& what) {
    if (!error_.empty()) return false;
    std::size_t line = 1;
    std::size_t column = 1;
    for (std::size_t i = 0; i < pos_ && i < text_.size(); ++i) {
      if (text_[i] == '\n') {
        ++line;
        column = 1;
      } else {
        ++column;
      }
    }
    error_ = "invalid JSON at line " + std::to_string(line) + " column " + std::to_string(column) +
             ": " + what;
    return false;
  }

  bool parse_value(Json& out, int depth) {
    if (at_end()) return fail("expected a value, found end of input");
    switch (peek()) {
      case '{':
        return parse_object(out, depth + 1);
      case '[':
        return parse_array(out, depth + 1);
      case '"': {
        std::string s;
        if (!parse_string(s)) return false;
        out = Json(std::move(s));
        return true;
      }
      case 't':
        return parse_literal("true", Json(true), out);
      case 'f':
        return parse_literal("false", Json(false), out);
      case 'n':
        return parse_literal("null", Json(), out);
      default:
        if (peek() == '-' || (peek() >= '0' && peek() <= '9')) return parse_number(out);
        return fail("expected a value, found " + describe_here());
    }
  }

  bool parse_literal(std::string_view word, Json value, Json& out) {
    if (text_.substr(pos_, word.size()) != word) {
      return fail("expected '" + std::string(word) + "', found " + describe_here());
    }
    pos_ += word.size();
    out = std::move(value);
    return true;
  }

  bool check_depth(int depth) {
    if (depth > limits_.max_depth) {
      return fail("nesting deeper than " + std::to_string(limits_.max_depth) + " levels");
    }
    return true;
  }

  bool parse_array(Json& out, int depth) {
    if (!check_depth(depth)) return false;
    ++pos_;  // '['
    Json::Array items;
    skip_whitespace();
    if (!at_end() && peek() == ']') {
      ++pos_;
      out = Json(std::move(items));
      return true;
    }
    for (;;) {
      skip_whitespace();
      Json item;
      if (!parse_value(item, depth)) return false;
      items.push_back(std::move(item));
      skip_whitespace();
      if (at_end()) return fail("expected ',' or ']' in array, found end of input");
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      if (peek() == ']') {
        ++pos_;
        out = Json(std::move(items));
        return true;
      }
      return fail("expected ',' or ']' in array, found " + describe_here());
    }
  }

  bool parse_object(Json& out, int depth) {
    if (!check_depth(depth)) return false;
    ++pos_;  // '{'
    Json::Object members;
    skip_whitespace();
    if (!at_end() && peek() == '}') {
      ++pos_;
      out = Json(std::move(members));
      return true;
    }
    for (;;) {
      skip_whitespace();
      if (at_end() || peek() != '"') {
        return fail("expected a string key in object, found " + describe_here());
      }
      std::string key;
      if (!parse_string(key)) return false;
      for (const auto& member : members) {
        if (member.first == key) return fail("duplicate key \"" + key + "\"");
      }
      skip_whitespace();
      if (at_end() || peek() != ':')
        return fail("expected ':' after key, found " + describe_here());
      ++pos_;
      skip_whitespace();
      Json value;
      if (!parse_value(value, depth)) return false;
      members.emplace_back(std::move(key), std::move(value));
      skip_whitespace();
      if (at_end()) return fail("expected ',' or '}' in object, found end of input");
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      if (peek() == '}') {
        ++pos_;
        out = Json(std::move(members));
        return true;
      }
      return fail("expected ',' or '}' in object, found " + describe_here());
    }
  }

  bool parse_hex4(std::uint32_t& out) {
    if (text_.size() - pos_ < 4) return fail("truncated \\u escape");
    out = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = text_[pos_ + i];
      std::uint32_t digit;
      if (c >= '0' && c <= '9') {
        digit = static_cast<std::uint32_t>(c - '0');
      } else if (c >= 'a' && c <= 'f') {
        digit = static_cast<std::uint32_t>(c - 'a' + 10);
      } else if (c >= 'A' && c <= 'F') {
        digit = static_cast<std::uint32_t>(c - 'A' + 10);
      } else {
        pos_ += static_cast<std::size_t>(i);
        return fail("expected a hex digit in \\u escape, found " + describe_here());
      }
      out = out * 16 + digit;
    }
    pos_ += 4;
    return true;
  }

  bool parse_string(std::string& out) {
    ++pos_;  // opening quote
    for (;;) {
      if (at_end()) return fail("unterminated string");
      const unsigned char c = static_cast<unsigned char>(peek());
      if (c == '"') {
        ++pos_;
        return true;
      }
      if (c < 0x20) return fail("raw control character " + describe_here() + " in string");
      if (c == '\\') {
        ++pos_;
        if (at_end()) return fail("unterminated escape in string");
        const char e = peek();
        ++pos_;
        switch (e) {
          case '"':
            out += '"';
            break;
          case '\\':
            out += '\\';
            break;
          case '/':
            out += '/';
            break;
          case 'b':
            out += '\b';
            break;
          case 'f':
            out += '\f';
            break;
          case 'n':
            out += '\n';
            break;
          case 'r':
            out += '\r';
            break;
          case 't':
            out += '\t';
            break;
          case 'u': {
            std::uint32_t code;
            if (!parse_hex4(code)) return false;
            if (code >= 0xDC00 && code <= 0xDFFF) return fail("lone low surrogate in \\u escape");
            if (code >= 0xD800 && code <= 0xDBFF) {
              if (text_.substr(pos_, 2) != "\\u") return fail("high surrogate without a low one");
              pos_ += 2;
              std::uint32_t low;
              if (!parse_hex4(low)) return false;
              if (low < 0xDC00 || low > 0xDFFF) return fail("high surrogate without a low one");
              code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
            }
            append_utf8(out, code);
            break;
          }
          default:
            --pos_;
            return fail("unknown escape \\" + describe_here().substr(1, 1));
        }
        continue;
      }
      const std::size_t length = utf8_sequence_length(text_.substr(pos_));
      if (length == 0) return fail("invalid UTF-8 (" + describe_here() + ") in string");
      out.append(text_.substr(pos_, length));
      pos_ += length;
    }
  }

  bool parse_number(Json& out) {
    const std::size_t start = pos_;
    bool integral = true;
    if (peek() == '-') ++pos_;
    if (at_end() || !(peek() >= '0' && peek() <= '9')) {
      return fail("expected a digit in number, found " + describe_here());
    }
    if (peek() == '0') {
      ++pos_;
      if (!at_end() && peek() >= '0' && peek() <= '9') return fail("leading zero in number");
    } else {
      while (!at_end() && peek() >= '0' && peek() <= '9') ++pos_;
    }
    if (!at_end() && peek() == '.') {
      integral = false;
      ++pos_;
      if (at_end() || !(peek() >= '0' && peek() <= '9')) {
        return fail("expected a digit after '.', found " + describe_here());
      }
      while (!at_end() && peek() >= '0' && peek() <= '9') ++pos_;
    }
    if (!at_end() && (peek() == 'e' || peek() == 'E')) {
      integral = false;
      ++pos_;
      if (!at_end() && (peek() == '+' || peek() == '-')) ++pos_;
      if (at_end() || !(peek() >= '0' && peek() <= '9')) {
        return fail("expected a digit in exponent, found " + describe_here());
      }
      while (!at_end() && peek() >= '0' && peek() <= '9') ++pos_;
    }
    const char* first = text_.data() + start;
    const char* last = text_.data() + pos_;
    if (integral) {
      std::int64_t value = 0;
      const auto [ptr, ec] = std::from_chars(first, last, value);
      if (ec == std::errc() && ptr == last) {
        out = Json(static_cast<long long>(value));
        return true;
      }
      // Too large for int64: fall through to a double.
    }
    double value = 0;
    const auto [ptr, ec] = std::from_chars(first, last, value);
    if (ec != std::errc() || ptr != last || !std::isfinite(value)) {
      pos_ = start;
      return fail("number " + std::string(first, last) + " is out of range");
    }
    out = Json(value);
    return true;
  }

  std::string_view text_;
  JsonLimits limits_;
  std::size_t pos_ = 0;
  std::string error_;
};

// ---- serializer
// ----------------------------------------------------------------------------------

void dump_number(std::string& out, double value) {
  if (!std::isfinite(value)) {
    out += "null";
    return;
  }
  char buffer[32];
  const auto [ptr, ec] = std::to_chars(buffer, buffer + sizeof buffer, value);
  if (ec != std::errc()) {
    out += "null";
    return;
  }
  std::string_view text(buffer, static_cast<std::size_t>(ptr - buffer));
  out += text;
  // Shortest round-trip form may look like an integer ("3"); that still reads back as the same
  // value.
}

void dump_value(const Json& value, std::string& out, int indent, int level);

void newline(std::string& out, int indent, int level) {
  if (indent <= 0) return;
  out += '\n';
  out.append(static_cast<std::size_t>(indent) * static_cast<std::size_t>(level), ' ');
}

void dump_value(const Json& value, std::string& out, int indent, int level) {
  switch (value.kind()) {
    case Json::Kind::kNull:
      out += "null";
      return;
    case Json::Kind::kBool:
      out += *value.as_bool() ? "true" : "false";
      return;
    case Json::Kind::kNumber: {
      if (const auto exact = value.as_int64();
          exact && value.as_double() == static_cast<double>(*exact)) {
        // Integers (including integral doubles within range) print without a fraction.
        char buffer[24];
        const auto [ptr, ec] = std::to_chars(buffer, buffer + sizeof buffer, *exact);
        out.append(buffer, static_cast<std::size_t>(ptr - buffer));
        (void)ec;
      } else {
        dump_number(out, *value.as_double());
      }
      return;
    }
    case Json::Kind::kString:
      append_json_string(out, *value.as_string());
      return;
    case Json::Kind::kArray: {
      const auto& items = *value.as_array();
      out += '[';
      for (std::size_t i = 0; i < items.size(); ++i) {
        if (i > 0) out += ',';
        newline(out, indent, level + 1);
        dump_value(items[i], out, indent, level + 1);
      }
      if (!items.empty()) newline(out, indent, level);
      out += ']';
      return;
    }
    case Json::Kind::kObject: {
      const auto& members = *value.as_object();
      out += '{';
      for (std::size_t i = 0; i < members.size(); ++i) {
        if (i > 0) out += ',';
        newline(out, indent, level + 1);
        append_json_string(out, members[i].first);
        out += indent > 0 ? ": " : ":";
        dump_value(members[i].second, out, indent, level + 1);
      }
      if (!members.empty()) newline(out, indent, level);
      out += '}';
      return;
    }
  }
}

}  // namespace

void Json::set_unsigned(unsigned long long value) {
  if (value <= static_cast<unsigned long long>(std::numeric_limits<std::int64_t>::max())) {
    value_ = static_cast<std::int64_t>(value);
  } else {
    value_ = static_cast<double>(value);
  }
}

Json::Kind Json::kind() const {
  switch (value_.index()) {
    case 0:
      return Kind::kNull;
    case 1:
      return Kind::kBool;
    case 2:
    case 3:
      return Kind::kNumber;
    case 4:
      return Kind::kString;
    case 5:
      return Kind::kArray;
    default:
      return Kind::kObject;
  }
}

std::optional<bool> Json::as_bool() const {
  if (const bool* b = std::get_if<bool>(&value_)) return *b;
  return std::nullopt;
}

std::optional<double> Json::as_double() const {
  if (const auto* i = std::get_if<std::int64_t>(&value_)) return static_cast<double>(*i);
  if (const auto* d = std::get_if<double>(&value_)) return *d;
  return std::nullopt;
}

std::optional<std::int64_t> Json::as_int64() const {
  if (const auto* i = std::get_if<std::int64_t>(&value_)) return *i;
  if (const auto* d = std::get_if<double>(&value_)) {
    // 2^63 is exactly representable; anything at or above it does not fit.
    if (std::isfinite(*d) && std::trunc(*d) == *d && *d >= -9223372036854775808.0 &&
        *d < 9223372036854775808.0) {
      return static_cast<std::int64_t>(*d);
    }
  }
  return std::nullopt;
}

const std::string* Json::as_string() const { return std::get_if<std::string>(&value_); }
const Json::Array* Json::as_array() const { return std::get_if<Array>(&value_); }
const Json::Object* Json::as_object() const { return std::get_if<Object>(&value_); }
Json::Array* Json::as_array() { return std::get_if<Array>(&value_); }
Json::Object* Json::as_object() { return std::get_if<Object>(&value_); }

const Json* Json::find(std::string_view key) const {
  const Object* members = as_object();
  if (members == nullptr) return nullptr;
  for (const auto& member : *members) {
    if (member.first == key) return &member.second;
  }
  return nullptr;
}

Json& Json::set(std::string key, Json value) {
  if (is_null()) value_ = Object{};
  Object* members = as_object();
  assert(members != nullptr);
  for (auto& member : *members) {
    if (member.first == key) {
      member.second = std::move(value);
      return member.second;
    }
  }
  members->emplace_back(std::move(key), std::move(value));
  return members->back().second;
}

void Json::push_back(Json value) {
  if (is_null()) value_ = Array{};
  Array* items = as_array();
  assert(items != nullptr);
  items->push_back(std::move(value));
}

std::string Json::dump() const {
  std::string out;
  dump_to(out);
  return out;
}

void Json::dump_to(std::string& out) const { dump_value(*this, out, 0, 0); }

std::string Json::dump_pretty(int indent) const {
  std::string out;
  dump_value(*this, out, indent, 0);
  return out;
}

bool Json::operator==(const Json& other) const {
  if (is_number() && other.is_number()) {
    const auto a = as_int64();
    const auto b = other.as_int64();
    if (a && b && value_.index() == 2 && other.value_.index() == 2) return *a == *b;
    return *as_double() == *other.as_double();
  }
  return value_ == other.value_;
}

Result<Json> parse_json(std::string_view text, JsonLimits limits) {
  return Parser(text, limits).parse_document();
}

void append_json_string(std::string& out, std::string_view text) {
  static constexpr char kHex[] = "0123456789abcdef";
  out += '"';
  std::size_t i = 0;
  while (i < text.size()) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
      ++i;
    } else if (c < 0x20 || c == 0x7F) {
      switch (c) {
        case '\n':
          out += "\\n";
          break;
        case '\r':
          out += "\\r";
          break;
        case '\t':
          out += "\\t";
          break;
        case '\b':
          out += "\\b";
          break;
        case '\f':
          out += "\\f";
          break;
        default:
          out += "\\u00";
          out += kHex[c >> 4];
          out += kHex[c & 0xF];
      }
      ++i;
    } else if (c < 0x80) {
      out += static_cast<char>(c);
      ++i;
    } else {
      const std::size_t length = utf8_sequence_length(text.substr(i));
      if (length == 0) {
        out += "\xEF\xBF\xBD";  // U+FFFD for each invalid byte
        ++i;
      } else {
        out.append(text.substr(i, length));
        i += length;
      }
    }
  }
  out += '"';
}

}  // namespace nvshare

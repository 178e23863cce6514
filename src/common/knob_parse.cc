#include "common/knob_parse.h"

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace nvshare::knobparse {

Result<double> parse_decimal(std::string_view text, double min, double max, std::string_view unit) {
  double value = 0;
  const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || ptr != text.data() + text.size() ||
      !std::isfinite(value)) {
    return make_error("\"" + std::string(text) + "\" is not a decimal number");
  }
  if (value < min || value > max) {
    char range[96];
    std::snprintf(range, sizeof range, "%g..%g", min, max);
    return make_error(std::string(text) + " is outside " + range + std::string(unit));
  }
  return value;
}

Result<Duration> parse_seconds(std::string_view text, double min, double max) {
  auto seconds = parse_decimal(text, min, max, " seconds");
  if (!seconds) return seconds.error();
  return Duration(static_cast<std::int64_t>(std::llround(seconds.value() * 1e9)));
}

Result<Duration> parse_seconds_with_unit(std::string_view text, double min, double max) {
  std::string_view number = text;
  if (!number.empty() && number.back() == 's') number.remove_suffix(1);
  auto parsed = parse_seconds(number, min, max);
  if (!parsed && number.size() != text.size()) {
    return make_error("\"" + std::string(text) + "\": " + parsed.error().message);
  }
  return parsed;
}

Result<std::int64_t> parse_integer(std::string_view text, std::int64_t min, std::int64_t max) {
  std::int64_t value = 0;
  const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || ptr != text.data() + text.size()) {
    return make_error("\"" + std::string(text) + "\" is not an integer");
  }
  if (value < min || value > max) {
    return make_error(std::string(text) + " is outside " + std::to_string(min) + ".." +
                      std::to_string(max));
  }
  return value;
}

Result<std::string> parse_socket_path(std::string_view text) {
  constexpr std::size_t kMaxUnixPath = 107;  // sun_path holds 108 bytes with the terminating NUL
  if (text.empty()) return make_error("the path is empty");
  if (text.front() != '/')
    return make_error("\"" + std::string(text) + "\" is not an absolute path");
  if (text.size() > kMaxUnixPath) {
    return make_error("\"" + std::string(text) + "\" is longer than " +
                      std::to_string(kMaxUnixPath) + " bytes (a unix socket path)");
  }
  return std::string(text);
}

Result<bool> parse_bool(std::string_view text) {
  std::string lower(text);
  for (char& c : lower) c = (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
  if (lower == "true" || lower == "1" || lower == "yes" || lower == "on") return true;
  if (lower == "false" || lower == "0" || lower == "no" || lower == "off") return false;
  return make_error(
      "\"" + std::string(text) +
      "\" is not a boolean (1, 0, true, false, yes, no, on, off, in any letter case)");
}

Result<LogLevel> parse_log_level(std::string_view text) {
  if (auto level = log_level_from_name(text)) return *level;
  return make_error("\"" + std::string(text) + "\" is not one of error, warn, info, debug, trace");
}

Result<std::optional<MemoryMode>> parse_memory_mode_setting(std::string_view text) {
  if (text.empty()) return std::optional<MemoryMode>();
  if (const std::optional<MemoryMode> mode = parse_memory_mode(text)) return mode;
  return make_error("\"" + std::string(text) + "\" is not one of " + std::string(kMemoryModeWords));
}

std::string upper_snake(std::string_view name) {
  std::string out;
  for (char ch : name) {
    out += ch == '-' ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  }
  return out;
}

Result<std::vector<std::string_view>> split_list(std::string_view text, std::string_view what) {
  std::vector<std::string_view> items;
  std::size_t start = 0;
  while (start <= text.size()) {
    std::size_t end = text.find(',', start);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view item = text.substr(start, end - start);
    if (item.empty()) {
      return make_error("empty item in " + std::string(what) + " \"" + std::string(text) + "\"");
    }
    items.push_back(item);
    start = end + 1;
  }
  return items;
}

std::string wrap(std::string_view text, std::size_t width, std::string_view indent) {
  std::string out;
  std::size_t column = 0;
  std::size_t start = 0;
  while (start < text.size()) {
    std::size_t end = text.find(' ', start);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view word = text.substr(start, end - start);
    start = end + 1;
    if (word.empty()) continue;
    if (column == 0) {
      out += indent;
      column = indent.size();
    } else if (column + 1 + word.size() > width) {
      out += '\n';
      out += indent;
      column = indent.size();
    } else {
      out += ' ';
      ++column;
    }
    out += word;
    column += word.size();
  }
  out += '\n';
  return out;
}

std::string strip_backticks(std::string_view text) {
  std::string out;
  for (char ch : text) {
    if (ch != '`') out += ch;
  }
  return out;
}

}  // namespace nvshare::knobparse

#include "common/quantity.h"

#include <array>
#include <cstdio>
#include <limits>

namespace nvshare {
namespace {

using u128 = unsigned __int128;

constexpr int kMaxFractionDigits = 9;  // Kubernetes keeps nano precision
constexpr int kMaxExponent = 18;

struct Suffix {
  std::string_view text;
  int binary_shift;  // multiply by 2^binary_shift
  int decimal_exp;   // and by 10^decimal_exp
};
constexpr std::array<Suffix, 13> kSuffixes{{
    {"", 0, 0},
    {"Ki", 10, 0},
    {"Mi", 20, 0},
    {"Gi", 30, 0},
    {"Ti", 40, 0},
    {"Pi", 50, 0},
    {"Ei", 60, 0},
    {"k", 0, 3},
    {"M", 0, 6},
    {"G", 0, 9},
    {"T", 0, 12},
    {"P", 0, 15},
    {"E", 0, 18},
}};

bool is_digit(char c) { return c >= '0' && c <= '9'; }

Error quantity_error(std::string_view text, std::string_view what) {
  return make_error("memory quantity \"" + std::string(text) + "\": " + std::string(what));
}

u128 pow10(int n) {
  u128 v = 1;
  for (int i = 0; i < n; ++i) v *= 10;
  return v;
}

}  // namespace

Result<std::uint64_t> parse_memory_quantity(std::string_view text) {
  if (text.empty()) return make_error("memory quantity is empty (expected e.g. 4Gi, 512Mi, 4G)");
  for (char c : text) {
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
      return quantity_error(text, "must not contain whitespace");
    }
  }
  std::size_t pos = 0;
  if (text[0] == '-') return quantity_error(text, "must not be negative");
  if (text[0] == '+') ++pos;
  if (text.size() - pos >= 2 && text[pos] == '0' && (text[pos + 1] == 'x' || text[pos + 1] == 'X')) {
    return quantity_error(text, "hexadecimal numbers are not quantities");
  }

  // Integer and fraction digits.
  u128 integer = 0;
  int digits = 0;
  while (pos < text.size() && is_digit(text[pos])) {
    integer = integer * 10 + static_cast<unsigned>(text[pos] - '0');
    if (integer > std::numeric_limits<std::uint64_t>::max()) {
      return quantity_error(text, "does not fit in 64 bits");
    }
    ++pos;
    ++digits;
  }
  std::string_view fraction;
  if (pos < text.size() && text[pos] == '.') {
    const std::size_t begin = ++pos;
    while (pos < text.size() && is_digit(text[pos])) ++pos;
    fraction = text.substr(begin, pos - begin);
    digits += static_cast<int>(fraction.size());
  }
  if (digits == 0) return quantity_error(text, "must start with a number (e.g. 4Gi, 512Mi, 4G)");
  while (!fraction.empty() && fraction.back() == '0') fraction.remove_suffix(1);
  if (fraction.size() > kMaxFractionDigits) {
    return quantity_error(text, "has more than 9 fractional digits");
  }

  // Suffix or exponent.
  const std::string_view rest = text.substr(pos);
  int binary_shift = 0;
  int decimal_exp = 0;
  if (!rest.empty() && (rest[0] == 'e' || rest[0] == 'E') && rest.size() > 1 &&
      (is_digit(rest[1]) || rest[1] == '-' || rest[1] == '+')) {
    std::size_t i = 1;
    const bool negative = rest[i] == '-';
    if (rest[i] == '-' || rest[i] == '+') ++i;
    if (i == rest.size()) return quantity_error(text, "exponent has no digits");
    int exponent = 0;
    for (; i < rest.size(); ++i) {
      if (!is_digit(rest[i])) return quantity_error(text, "exponent must be an integer");
      exponent = exponent * 10 + (rest[i] - '0');
      if (exponent > kMaxExponent) return quantity_error(text, "exponent is out of range");
    }
    decimal_exp = negative ? -exponent : exponent;
  } else {
    const Suffix* match = nullptr;
    for (const Suffix& s : kSuffixes) {
      if (s.text == rest) match = &s;
    }
    if (match == nullptr) {
      if (rest == "m") {
        return quantity_error(text, "milli-units are not meaningful for memory (did you mean Mi?)");
      }
      return quantity_error(text, "unknown suffix \"" + std::string(rest) +
                                      "\" (use Ki, Mi, Gi, Ti, Pi, Ei or k, M, G, T, P, E)");
    }
    binary_shift = match->binary_shift;
    decimal_exp = match->decimal_exp;
  }

  // value = (integer.fraction) * 2^binary_shift * 10^decimal_exp, exact, fractional bytes rounded up.
  u128 mantissa = integer * pow10(static_cast<int>(fraction.size()));
  u128 fraction_value = 0;
  for (char c : fraction) fraction_value = fraction_value * 10 + static_cast<unsigned>(c - '0');
  mantissa += fraction_value;
  // mantissa < 2^64 * 10^9 < 2^94, and binary_shift <= 60: check before shifting.
  if (binary_shift > 0 && mantissa > (~u128{0} >> binary_shift)) {
    return quantity_error(text, "does not fit in 64 bits");
  }
  u128 value = mantissa << binary_shift;
  const int scale = decimal_exp - static_cast<int>(fraction.size());
  if (scale >= 0) {
    for (int i = 0; i < scale; ++i) {
      if (value > std::numeric_limits<std::uint64_t>::max()) break;
      value *= 10;
    }
  } else {
    const u128 divisor = pow10(-scale);
    value = value / divisor + (value % divisor != 0 ? 1 : 0);
  }
  if (value > std::numeric_limits<std::uint64_t>::max()) {
    return quantity_error(text, "does not fit in 64 bits");
  }
  return static_cast<std::uint64_t>(value);
}

Result<int> parse_percent(std::string_view text) {
  const std::string quoted = "\"" + std::string(text) + "\"";
  std::string_view digits = text;
  if (!digits.empty() && digits.back() == '%') digits.remove_suffix(1);
  if (digits.empty() || digits.size() > 3) {
    return make_error("percentage " + quoted + ": expected an integer from 1 to 100");
  }
  int value = 0;
  for (char c : digits) {
    if (!is_digit(c)) return make_error("percentage " + quoted + ": expected an integer from 1 to 100");
    value = value * 10 + (c - '0');
  }
  if (value < 1 || value > 100) {
    return make_error("percentage " + quoted + ": must be from 1 to 100");
  }
  return value;
}

std::string format_bytes(std::uint64_t bytes) {
  static constexpr std::array<const char*, 6> kUnits{"Ki", "Mi", "Gi", "Ti", "Pi", "Ei"};
  int unit = -1;
  while (unit + 1 < static_cast<int>(kUnits.size()) && (bytes >> (10 * (unit + 2))) > 0) ++unit;
  if (unit < 0) return std::to_string(bytes);
  const int shift = 10 * (unit + 1);
  const std::uint64_t whole = bytes >> shift;
  const std::uint64_t rest = bytes & ((std::uint64_t{1} << shift) - 1);
  char out[32];
  if (rest == 0) {
    std::snprintf(out, sizeof out, "%llu%s", static_cast<unsigned long long>(whole), kUnits[unit]);
  } else {
    // Truncated to one decimal, never rounded up, so the text never names more than `bytes`.
    const auto tenths = static_cast<std::uint64_t>((static_cast<u128>(bytes) * 10) >> shift);
    std::snprintf(out, sizeof out, "%llu.%llu%s", static_cast<unsigned long long>(tenths / 10),
                  static_cast<unsigned long long>(tenths % 10), kUnits[unit]);
  }
  return out;
}

}  // namespace nvshare

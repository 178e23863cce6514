// JSON values for the control socket: a small value type, a strict parser and a serializer.
//
// The control socket (nvsharectl, the device plugin) speaks one JSON document per line, so the
// daemon parses text written by other programs and by people. The parser is therefore strict and
// bounded:
//  - RFC 8259 grammar only: no comments, no trailing commas, no single quotes, no NaN/Infinity, no
//    leading zeros or '+' in numbers, exactly one value with optional surrounding whitespace.
//  - Strings must be valid UTF-8 (no overlong forms, no surrogates) and may not contain raw control
//    characters; \uXXXX escapes (with surrogate pairs) decode to UTF-8; a lone surrogate escape is
//    an error. Duplicate keys in an object are an error (a request that says "core" twice is
//    ambiguous).
//  - Input size and nesting depth are capped (JsonLimits); exceeding either is an error, never a
//  crash.
//  - Errors are values whose message names the line, column and what was expected.
// Numbers: an integer literal that fits in int64 is kept exactly (as_int64); any other number is a
// double. Objects keep insertion order, so serialized output is stable and reads the way it was
// built. The serializer always produces valid JSON: invalid UTF-8 in a string (a process name, say)
// is replaced by U+FFFD and non-finite doubles are written as null.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "common/result.h"

namespace nvshare {

class Json {
 public:
  enum class Kind { kNull, kBool, kNumber, kString, kArray, kObject };
  using Array = std::vector<Json>;
  using Object = std::vector<std::pair<std::string, Json>>;

  Json() = default;
  Json(std::nullptr_t) {}                                              // NOLINT: implicit by design
  Json(bool value) : value_(value) {}                                  // NOLINT
  Json(int value) : value_(static_cast<std::int64_t>(value)) {}        // NOLINT
  Json(long value) : value_(static_cast<std::int64_t>(value)) {}       // NOLINT
  Json(long long value) : value_(static_cast<std::int64_t>(value)) {}  // NOLINT
  Json(unsigned value) : value_(static_cast<std::int64_t>(value)) {}   // NOLINT
  // Values above INT64_MAX become doubles (they lose exactness, as they would in any JSON reader).
  Json(unsigned long value) { set_unsigned(value); }            // NOLINT
  Json(unsigned long long value) { set_unsigned(value); }       // NOLINT
  Json(double value) : value_(value) {}                         // NOLINT
  Json(const char* value) : value_(std::string(value)) {}       // NOLINT
  Json(std::string value) : value_(std::move(value)) {}         // NOLINT
  Json(std::string_view value) : value_(std::string(value)) {}  // NOLINT
  Json(Array value) : value_(std::move(value)) {}               // NOLINT
  Json(Object value) : value_(std::move(value)) {}              // NOLINT

  static Json array() { return Json(Array{}); }
  static Json object() { return Json(Object{}); }

  Kind kind() const;
  bool is_null() const { return kind() == Kind::kNull; }
  bool is_bool() const { return kind() == Kind::kBool; }
  bool is_number() const { return kind() == Kind::kNumber; }
  bool is_string() const { return kind() == Kind::kString; }
  bool is_array() const { return kind() == Kind::kArray; }
  bool is_object() const { return kind() == Kind::kObject; }

  // Typed reads. Each returns nullopt/nullptr when the value is of another kind, so callers can
  // turn a wrong type into an error message instead of aborting.
  std::optional<bool> as_bool() const;
  std::optional<double> as_double() const;
  // The exact integer: an int64 literal, or a double with no fractional part within int64 range.
  std::optional<std::int64_t> as_int64() const;
  const std::string* as_string() const;
  const Array* as_array() const;
  const Object* as_object() const;
  Array* as_array();
  Object* as_object();

  // Object member lookup (nullptr when absent or when this is not an object).
  const Json* find(std::string_view key) const;
  // Sets a member of an object (replacing an existing one); turns null into an empty object first.
  Json& set(std::string key, Json value);
  // Appends to an array; turns null into an empty array first.
  void push_back(Json value);

  // Compact serialization (no whitespace), or indented with `indent` spaces per level.
  std::string dump() const;
  std::string dump_pretty(int indent = 2) const;
  void dump_to(std::string& out) const;

  bool operator==(const Json& other) const;

 private:
  void set_unsigned(unsigned long long value);
  std::variant<std::monostate, bool, std::int64_t, double, std::string, Array, Object> value_;
};

struct JsonLimits {
  std::size_t max_bytes = 1 << 20;  // whole document
  int max_depth = 64;               // nested arrays/objects
};

// Parses exactly one JSON value from `text` (whitespace around it allowed).
Result<Json> parse_json(std::string_view text, JsonLimits limits = {});

// Writes `text` as a JSON string literal (with quotes) to `out`, replacing invalid UTF-8 by U+FFFD.
void append_json_string(std::string& out, std::string_view text);

}  // namespace nvshare

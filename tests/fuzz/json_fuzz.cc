// Fuzz target: the control socket's JSON parser.
//
// Properties: parsing never crashes or reads out of bounds; an accepted document serializes to text
// that parses back to an equal value, and serializing that again gives the same text.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/json.h"

namespace {
void check(bool condition) {
  if (!condition) __builtin_trap();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto parsed = nvshare::parse_json(text);
  if (!parsed.ok()) {
    check(!parsed.error().message.empty());
    return 0;
  }
  const std::string once = parsed.value().dump();
  auto again = nvshare::parse_json(once);
  check(again.ok());
  check(again.value() == parsed.value());
  check(again.value().dump() == once);
  return 0;
}

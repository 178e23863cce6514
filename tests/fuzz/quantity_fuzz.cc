// Fuzz target: the quantity and percentage parsers.
//
// Properties: parsing never crashes or reads out of bounds; an accepted percentage is within 1..100;
// an accepted memory quantity that format_bytes renders exactly parses back to the same value; and any
// value rendered from an accepted quantity is itself accepted.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/quantity.h"

namespace {
void check(bool condition) {
  if (!condition) __builtin_trap();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);

  if (auto percent = nvshare::parse_percent(text); percent.ok()) {
    check(percent.value() >= 1 && percent.value() <= 100);
  } else {
    check(!percent.error().message.empty());
  }

  auto bytes = nvshare::parse_memory_quantity(text);
  if (!bytes.ok()) {
    check(!bytes.error().message.empty());
    return 0;
  }
  const std::string shown = nvshare::format_bytes(bytes.value());
  auto reparsed = nvshare::parse_memory_quantity(shown);
  check(reparsed.ok());
  if (shown.find('.') == std::string::npos) check(reparsed.value() == bytes.value());
  return 0;
}

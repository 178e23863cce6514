// How the client library backs the device allocations an application makes (cuMemAlloc,
// cuMemAllocPitch). One word, shared by the client's knob, the scheduler's default, the pod
// annotation and nvshare-run:
//
//  - kDevice (default, "device"): physical device memory mapped at an address reserved for the
//    allocation (the driver's virtual memory management API). The application's pointer never
//    changes; a swap copies the contents to pinned host memory at copy bandwidth and gives the
//    physical memory back, a swap-in maps new physical memory at the same address and copies back.
//    Allocations smaller than the mapping granularity stay ordinary device memory (never swapped).
//  - kUnified ("unified"): managed memory placed on the GPU; a swap is a bulk prefetch. The only
//    mode in which one job may allocate more than its GPU holds (the driver pages on demand).
//  - kPlain ("plain"): the driver's own device memory, never swapped (counted and limited).
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace nvshare {

enum class MemoryMode : std::uint8_t { kDevice = 0, kUnified = 1, kPlain = 2 };

inline constexpr std::string_view kMemoryModeWords = "`device`, `unified`, `plain`";

inline std::string_view to_string(MemoryMode mode) {
  switch (mode) {
    case MemoryMode::kDevice:
      return "device";
    case MemoryMode::kUnified:
      return "unified";
    case MemoryMode::kPlain:
      return "plain";
  }
  return "?";
}

inline std::optional<MemoryMode> parse_memory_mode(std::string_view text) {
  for (MemoryMode mode : {MemoryMode::kDevice, MemoryMode::kUnified, MemoryMode::kPlain}) {
    if (text == to_string(mode)) return mode;
  }
  return std::nullopt;
}

}  // namespace nvshare

// A client's priority class. One word, shared by the pod annotation `nvshare.com/gpu-priority`,
// `nvsharectl set-limits --priority`, `nvshare-run --priority` and the scheduler's state file:
//
//  - kHigh ("high"): never waits behind a lower class for longer than that class's drain. A waiting
//    high client has every lower-class runner revoked at once (reason priority); a lower-class
//    client never runs beside it; while one waits, a high holder hands over at its first idle
//    moment (a yield) and gets the GPU back as soon as it asks.
//  - kNormal ("normal", the default): as high towards low, as low towards high.
//  - kLow ("low"): runs in the time the classes above it leave; its queued GPU work is held to a
//    short drain bound, so that a hand-over to a higher class is quick.
// Within a class, caps, turns and memory behave as without classes.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace nvshare {

enum class Priority : std::uint8_t { kLow = 0, kNormal = 1, kHigh = 2 };

inline constexpr std::string_view kPriorityWords = "`high`, `normal`, `low`";

inline std::string_view to_string(Priority priority) {
  switch (priority) {
    case Priority::kLow:
      return "low";
    case Priority::kNormal:
      return "normal";
    case Priority::kHigh:
      return "high";
  }
  return "?";
}

inline std::optional<Priority> parse_priority(std::string_view text) {
  for (Priority p : {Priority::kLow, Priority::kNormal, Priority::kHigh}) {
    if (text == to_string(p)) return p;
  }
  return std::nullopt;
}

}  // namespace nvshare

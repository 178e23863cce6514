// Time as values: a duration and a point on the monotonic clock, with no way to read a clock. Pure
// state machines (the policy, the client's grant session) take time as an argument of these types;
// reading time is common/clock.h's.
#pragma once

#include <chrono>
#include <cstdint>

namespace nvshare {

using Duration = std::chrono::nanoseconds;

struct MonoTime {
  Duration since_origin{0};
  auto operator<=>(const MonoTime&) const = default;
  MonoTime operator+(Duration d) const { return MonoTime{since_origin + d}; }
  MonoTime operator-(Duration d) const { return MonoTime{since_origin - d}; }
  Duration operator-(MonoTime other) const { return since_origin - other.since_origin; }
  MonoTime& operator+=(Duration d) {
    since_origin += d;
    return *this;
  }
  static constexpr MonoTime max() { return MonoTime{Duration::max()}; }
};

// Whole microseconds / milliseconds of a duration, for wire fields and display.
inline std::uint64_t to_us(Duration d) {
  return d.count() <= 0 ? 0 : static_cast<std::uint64_t>(d.count() / 1000);
}
inline double to_ms(Duration d) { return static_cast<double>(d.count()) / 1e6; }
inline double to_seconds(Duration d) { return static_cast<double>(d.count()) / 1e9; }

}  // namespace nvshare

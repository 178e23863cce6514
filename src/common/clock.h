// Time as nvshare reads it: a monotonic clock behind an interface, so that everything that reads time
// can be driven by a manual clock in tests and simulations.
//
// MonoTime is nanoseconds since an arbitrary fixed origin (CLOCK_MONOTONIC's, for SteadyClock). It only
// moves forward. ManualClock starts at a given time and moves only when told; it is not thread-safe
// beyond atomic reads and advances (tests drive it from one thread).
#pragma once

#include <atomic>
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

class Clock {
 public:
  virtual ~Clock() = default;
  virtual MonoTime now() const = 0;
};

class SteadyClock final : public Clock {
 public:
  MonoTime now() const override;
  // The process-wide instance (stateless, so sharing it is free).
  static const SteadyClock& instance();
};

class ManualClock final : public Clock {
 public:
  explicit ManualClock(MonoTime start = MonoTime{}) : now_ns_(start.since_origin.count()) {}
  MonoTime now() const override { return MonoTime{Duration(now_ns_.load())}; }
  void advance(Duration d) { now_ns_ += d.count(); }
  void set(MonoTime t) { now_ns_ = t.since_origin.count(); }

 private:
  std::atomic<std::int64_t> now_ns_;
};

// Whole microseconds / milliseconds of a duration, for wire fields and display.
inline std::uint64_t to_us(Duration d) {
  return d.count() <= 0 ? 0 : static_cast<std::uint64_t>(d.count() / 1000);
}
inline double to_ms(Duration d) { return static_cast<double>(d.count()) / 1e6; }

}  // namespace nvshare

// Time as nvshare reads it: a monotonic clock behind an interface, so that everything that reads
// time can be driven by a manual clock in tests and simulations.
//
// MonoTime is nanoseconds since an arbitrary fixed origin (CLOCK_MONOTONIC's, for SteadyClock). It
// only moves forward. ManualClock starts at a given time and moves only when told; it is not
// thread-safe beyond atomic reads and advances (tests drive it from one thread).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

#include "common/mono_time.h"

namespace nvshare {

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

}  // namespace nvshare

// BucketHistogram: counts of durations in fixed buckets, as a Prometheus histogram exposes them
// (cumulative per upper bound, plus sum and count). The bounds span 10 us .. 10 s, enough for
// decision latencies and drains alike. Recording is O(log buckets), no allocation.
#pragma once

#include <array>
#include <cstdint>

#include "common/clock.h"

namespace nvshare::scheduler {

class BucketHistogram {
 public:
  // Upper bounds, in seconds; a last, implicit bucket is +Inf.
  static constexpr std::array<double, 19> kBounds = {
      1e-5,   2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2,
      2.5e-2, 5e-2,   0.1,  0.25, 0.5,    1,    2.5,  5,      10};

  void record(Duration d);

  // Observations at or below kBounds[i] (cumulative); i == kBounds.size() is the count.
  std::uint64_t cumulative(std::size_t i) const;
  std::uint64_t count() const { return count_; }
  double sum_seconds() const { return sum_s_; }

 private:
  std::array<std::uint64_t, kBounds.size() + 1> buckets_{};
  std::uint64_t count_ = 0;
  double sum_s_ = 0;
};

}  // namespace nvshare::scheduler

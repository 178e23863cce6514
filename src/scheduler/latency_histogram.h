// LatencyHistogram: a fixed-size log-linear histogram of durations, for the scheduler's decision
// latency (a request or release arriving -> the grant it caused being written).
//
// Recording is O(1) with no allocation, so it can run on every decision in the reactor. Buckets are
// powers of two split into 32 linear sub-buckets: a reported percentile is the upper edge of its
// bucket, at most ~3% above the true value. Covers 1 ns .. ~73 minutes; longer durations land in
// the last bucket.
#pragma once

#include <array>
#include <cstdint>

#include "common/clock.h"

namespace nvshare::scheduler {

class LatencyHistogram {
 public:
  void record(Duration d);
  void reset() { *this = LatencyHistogram{}; }

  std::uint64_t count() const { return count_; }
  Duration max() const { return Duration(max_ns_); }
  Duration mean() const;
  // q in [0, 1]; 0 when empty.
  Duration percentile(double q) const;

 private:
  static constexpr int kSubBits = 5;
  static constexpr int kSub = 1 << kSubBits;
  static constexpr int kOctaves = 42 - kSubBits;  // values below 2^42 ns
  static constexpr int kBuckets = kSub + kOctaves * kSub;

  static int bucket_of(std::uint64_t ns);
  static std::uint64_t upper_edge(int bucket);

  std::array<std::uint64_t, kBuckets> buckets_{};
  std::uint64_t count_ = 0;
  std::uint64_t sum_ns_ = 0;
  std::int64_t max_ns_ = 0;
};

}  // namespace nvshare::scheduler

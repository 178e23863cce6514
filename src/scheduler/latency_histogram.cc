#include "scheduler/latency_histogram.h"

#include <algorithm>
#include <bit>

namespace nvshare::scheduler {

// Values below kSub get one bucket each; above, octave o (the position of the top bit, from
// kSubBits) is split into kSub buckets by the kSubBits bits under the top bit.
int LatencyHistogram::bucket_of(std::uint64_t ns) {
  if (ns < static_cast<std::uint64_t>(kSub)) return static_cast<int>(ns);
  const int top = 63 - std::countl_zero(ns);
  const int octave = top - kSubBits;
  if (octave >= kOctaves) return kBuckets - 1;
  const int sub = static_cast<int>((ns >> (top - kSubBits)) & (kSub - 1));
  return kSub + octave * kSub + sub;
}

std::uint64_t LatencyHistogram::upper_edge(int bucket) {
  if (bucket < kSub) return static_cast<std::uint64_t>(bucket);
  const int octave = (bucket - kSub) / kSub;
  const int sub = (bucket - kSub) % kSub;
  const int top = octave + kSubBits;
  const std::uint64_t base = std::uint64_t{1} << top;
  const std::uint64_t step = std::uint64_t{1} << (top - kSubBits);
  return base + static_cast<std::uint64_t>(sub + 1) * step - 1;
}

void LatencyHistogram::record(Duration d) {
  const std::int64_t ns = std::max<std::int64_t>(d.count(), 0);
  ++buckets_[static_cast<std::size_t>(bucket_of(static_cast<std::uint64_t>(ns)))];
  ++count_;
  sum_ns_ += static_cast<std::uint64_t>(ns);
  max_ns_ = std::max(max_ns_, ns);
}

Duration LatencyHistogram::mean() const {
  return count_ == 0 ? Duration(0) : Duration(static_cast<std::int64_t>(sum_ns_ / count_));
}

Duration LatencyHistogram::percentile(double q) const {
  if (count_ == 0) return Duration(0);
  q = std::clamp(q, 0.0, 1.0);
  auto rank = static_cast<std::uint64_t>(q * static_cast<double>(count_) + 0.5);
  rank = std::clamp<std::uint64_t>(rank, 1, count_);
  std::uint64_t seen = 0;
  for (int b = 0; b < kBuckets; ++b) {
    seen += buckets_[static_cast<std::size_t>(b)];
    if (seen >= rank) {
      return Duration(std::min<std::int64_t>(static_cast<std::int64_t>(upper_edge(b)), max_ns_));
    }
  }
  return Duration(max_ns_);
}

}  // namespace nvshare::scheduler

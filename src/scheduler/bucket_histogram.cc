#include "scheduler/bucket_histogram.h"

#include <algorithm>

namespace nvshare::scheduler {

void BucketHistogram::record(Duration d) {
  const double s = std::max(0.0, to_seconds(d));
  const auto it = std::lower_bound(kBounds.begin(), kBounds.end(), s);
  ++buckets_[static_cast<std::size_t>(it - kBounds.begin())];
  ++count_;
  sum_s_ += s;
}

std::uint64_t BucketHistogram::cumulative(std::size_t i) const {
  std::uint64_t n = 0;
  for (std::size_t b = 0; b <= i && b < buckets_.size(); ++b) n += buckets_[b];
  return n;
}

}  // namespace nvshare::scheduler

#include "scheduler/latency_histogram.h"

#include <gtest/gtest.h>

namespace nvshare::scheduler {
namespace {

using namespace std::chrono_literals;

TEST(LatencyHistogram, EmptyReportsZero) {
  LatencyHistogram h;
  EXPECT_EQ(h.count(), 0u);
  EXPECT_EQ(h.percentile(0.99), Duration(0));
  EXPECT_EQ(h.mean(), Duration(0));
}

TEST(LatencyHistogram, PercentilesAreWithinThreePercent) {
  LatencyHistogram h;
  for (int us = 1; us <= 1000; ++us) h.record(std::chrono::microseconds(us));
  EXPECT_EQ(h.count(), 1000u);
  const auto near = [](Duration got, double want_us) {
    const double got_us = static_cast<double>(got.count()) / 1000;
    return got_us >= want_us * 0.999 && got_us <= want_us * 1.035;
  };
  EXPECT_TRUE(near(h.percentile(0.5), 500)) << h.percentile(0.5).count();
  EXPECT_TRUE(near(h.percentile(0.99), 990)) << h.percentile(0.99).count();
  EXPECT_EQ(h.percentile(1.0), Duration(1000us));  // capped at the true maximum
  EXPECT_EQ(h.max(), Duration(1000us));
  EXPECT_EQ(h.mean(), Duration(500500ns));
}

TEST(LatencyHistogram, HandlesExtremes) {
  LatencyHistogram h;
  h.record(Duration(-5));  // clock skew never goes negative
  h.record(Duration(0));
  h.record(std::chrono::hours(5));  // beyond the last bucket
  EXPECT_EQ(h.count(), 3u);
  EXPECT_EQ(h.percentile(0.0), Duration(0));
  EXPECT_EQ(h.max(), std::chrono::hours(5));
  h.reset();
  EXPECT_EQ(h.count(), 0u);
}

}  // namespace
}  // namespace nvshare::scheduler

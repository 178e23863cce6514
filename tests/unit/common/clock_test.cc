#include "common/clock.h"

#include <gtest/gtest.h>

namespace nvshare {
namespace {

using namespace std::chrono_literals;

TEST(Clock, SteadyClockMovesForward) {
  const MonoTime a = SteadyClock::instance().now();
  const MonoTime b = SteadyClock::instance().now();
  EXPECT_LE(a, b);
  EXPECT_GT(a.since_origin.count(), 0);
}

TEST(Clock, ManualClockMovesOnlyWhenTold) {
  ManualClock clock(MonoTime{5s});
  const Clock& as_interface = clock;
  EXPECT_EQ(as_interface.now(), MonoTime{5s});
  clock.advance(250ms);
  EXPECT_EQ(as_interface.now() - MonoTime{5s}, 250ms);
  clock.set(MonoTime{1s});
  EXPECT_EQ(as_interface.now(), MonoTime{1s});
}

TEST(Clock, Conversions) {
  EXPECT_EQ(to_us(1500us), 1500u);
  EXPECT_EQ(to_us(-5us), 0u);
  EXPECT_DOUBLE_EQ(to_ms(2500us), 2.5);
  EXPECT_EQ(MonoTime{1s} + 1s, MonoTime{2s});
}

}  // namespace
}  // namespace nvshare

#include "client/link/pace_meter.h"

#include <gtest/gtest.h>

namespace nvshare::client {
namespace {

using namespace std::chrono_literals;

TEST(PaceMeter, AWindowIsHalfASecondHeld) {
  PaceMeter m;
  EXPECT_EQ(m.observe(MonoTime{0ms}, true, 0ms), std::nullopt);
  EXPECT_EQ(m.window_end(), MonoTime{500ms});
  EXPECT_EQ(m.observe(MonoTime{499ms}, true, 499ms), std::nullopt);
  EXPECT_EQ(m.observe(MonoTime{500ms}, true, 500ms), std::optional<std::uint16_t>(1000));
  EXPECT_EQ(m.window_end(), MonoTime{1000ms});
}

TEST(PaceMeter, TimeNotHeldIsSkipped) {
  PaceMeter m;
  m.observe(MonoTime{0ms}, true, 0ms);
  m.observe(MonoTime{300ms}, false, 0ms);  // 300 ms held, no waits
  EXPECT_EQ(m.window_end(), std::nullopt);
  m.observe(MonoTime{5s}, true, 2s);  // the waits while not held do not count
  EXPECT_EQ(m.window_end(), MonoTime{5200ms});
  EXPECT_EQ(m.observe(MonoTime{5200ms}, true, 2200ms), std::optional<std::uint16_t>(400));
}

TEST(PaceMeter, SharesAreRoundedToTheStepAndAtMostAll) {
  PaceMeter m;
  m.observe(MonoTime{0ms}, true, 0ms);
  EXPECT_EQ(m.observe(MonoTime{500ms}, true, 160ms), std::optional<std::uint16_t>(300));  // 32%
  // Two threads waiting at once report more waiting than time: at most all of it.
  EXPECT_EQ(m.observe(MonoTime{1000ms}, true, 1160ms), std::optional<std::uint16_t>(1000));
}

TEST(PaceMeter, AWaitIsCountedWholeWhenItEnds) {
  PaceMeter m;
  m.observe(MonoTime{0ms}, true, 0ms);
  m.observe(MonoTime{20ms}, true, 0ms);
  m.observe(MonoTime{499ms}, true, 0ms);
  // A wait of 480 ms that ended within the last millisecond observed.
  EXPECT_EQ(m.observe(MonoTime{500ms}, true, 480ms), std::optional<std::uint16_t>(950));
}

TEST(PaceMeter, ACounterGoingBackwardsCountsNothing) {
  PaceMeter m;
  m.observe(MonoTime{0ms}, true, 5s);
  EXPECT_EQ(m.observe(MonoTime{500ms}, true, 1s), std::optional<std::uint16_t>(0));
}

}  // namespace
}  // namespace nvshare::client

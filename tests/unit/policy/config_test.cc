// Policy modes and configuration ranges.
#include "scheduler/policy/config.h"

#include <gtest/gtest.h>

#include <cmath>

namespace nvshare::policy {
namespace {

TEST(PolicyConfig, ParsesModesAndTheSerialAlias) {
  EXPECT_EQ(parse_mode("auto").value(), Mode::kAuto);
  EXPECT_EQ(parse_mode("exclusive").value(), Mode::kExclusive);
  EXPECT_EQ(parse_mode("serial").value(), Mode::kExclusive);
  const Result<Mode> bad = parse_mode("fifo");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("\"fifo\""), std::string::npos);
  EXPECT_FALSE(parse_mode("").ok());
  EXPECT_FALSE(parse_mode("Auto").ok());
}

TEST(PolicyConfig, ModeNamesRoundTrip) {
  for (Mode mode : {Mode::kAuto, Mode::kExclusive}) {
    EXPECT_EQ(parse_mode(to_string(mode)).value(), mode);
  }
  EXPECT_EQ(to_string(Mode::kExclusive), "exclusive");
}

TEST(PolicyConfig, DefaultsAreValid) {
  const PolicyConfig config;
  EXPECT_TRUE(validate(config).ok());
  EXPECT_EQ(config.mode, Mode::kAuto);
  EXPECT_DOUBLE_EQ(config.reserve_fraction, 0.10);
  EXPECT_DOUBLE_EQ(config.quantum_swap_multiple, 50.0);
  EXPECT_EQ(config.quantum_min, std::chrono::seconds(5));
  EXPECT_EQ(config.quantum_max, std::chrono::seconds(15));
  EXPECT_EQ(config.turn_slice, std::chrono::milliseconds(500));
  EXPECT_EQ(config.cap_cycle, std::chrono::milliseconds(250));
  EXPECT_EQ(config.quota_window, std::chrono::milliseconds(2000));
  EXPECT_EQ(config.revoke_grace, std::chrono::seconds(5));
  EXPECT_EQ(config.swap_allowance_max, std::chrono::seconds(10));
  EXPECT_EQ(config.swap_bandwidth_floor, 1'000'000'000u);
  // What a holder that ignores revokes can cost a waiting client with the defaults: 30 s.
  EXPECT_EQ(hog_bound(config), std::chrono::seconds(30));
}

TEST(PolicyConfig, RejectsOutOfRangeValues) {
  auto invalid = [](auto change) {
    PolicyConfig config;
    change(config);
    return !validate(config).ok();
  };
  using namespace std::chrono_literals;
  EXPECT_TRUE(invalid([](PolicyConfig& c) { c.reserve_fraction = -0.1; }));
  EXPECT_TRUE(invalid([](PolicyConfig& c) { c.reserve_fraction = 0.95; }));
  EXPECT_TRUE(invalid([](PolicyConfig& c) { c.reserve_fraction = std::nan(""); }));
  EXPECT_TRUE(invalid([](PolicyConfig& c) { c.capacity_bytes = 0; }));
  EXPECT_TRUE(invalid([](PolicyConfig& c) { c.fixed_quantum = 0s; }));
  EXPECT_TRUE(invalid([](PolicyConfig& c) { c.quantum_swap_multiple = 0; }));
  EXPECT_TRUE(invalid([](PolicyConfig& c) { c.quantum_min = 0s; }));
  EXPECT_TRUE(invalid([](PolicyConfig& c) { c.quantum_min = 400s; }));
  EXPECT_TRUE(invalid([](PolicyConfig& c) { c.default_swap_bytes_per_s = 0; }));
  EXPECT_TRUE(invalid([](PolicyConfig& c) { c.quota_window = 9ms; }));
  EXPECT_TRUE(invalid([](PolicyConfig& c) { c.turn_slice = 9ms; }));
  EXPECT_TRUE(invalid([](PolicyConfig& c) { c.cap_cycle = 9ms; }));
  EXPECT_TRUE(invalid([](PolicyConfig& c) { c.revoke_grace = 0s; }));
  EXPECT_TRUE(invalid([](PolicyConfig& c) { c.swap_bandwidth_floor = 0; }));
  EXPECT_TRUE(invalid([](PolicyConfig& c) { c.swap_allowance_max = -1s; }));
  EXPECT_FALSE(invalid([](PolicyConfig& c) { c.swap_allowance_max = 0s; }));
  EXPECT_FALSE(invalid([](PolicyConfig& c) { c.reserve_fraction = 0.9; }));
  EXPECT_FALSE(invalid([](PolicyConfig& c) { c.quota_window = 10ms; }));
  EXPECT_FALSE(invalid([](PolicyConfig& c) { c.quantum_min = c.quantum_max; }));
}

}  // namespace
}  // namespace nvshare::policy

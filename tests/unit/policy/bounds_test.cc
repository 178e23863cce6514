// Bounds that no client can stretch: a holder that ignores revokes keeps a waiting client out for
// at most hog_bound(config), whatever it reports about its memory and its swap bandwidth, and it
// cannot do it twice as long.
#include <gtest/gtest.h>

#include "harness.h"

namespace nvshare::policy::testing {
namespace {

constexpr std::uint64_t kAbsurdBytes = std::uint64_t{1} << 60;

// The hog never answers; time runs, deadline by deadline, until `client` is granted.
void run_until_running(Harness& h, ClientId client) {
  for (int i = 0; i < 100 && h.state(client) != ClientState::kRunning; ++i) {
    if (!h.policy.next_deadline()) break;
    h.fire();
  }
}

// A hog on a 24Gi GPU (device memory, defaults otherwise): it is granted, reports what it likes,
// then a client that cannot run beside it asks. Returns how long that client waited.
Duration hog_delay(Mode mode, std::uint64_t reported_bytes, std::uint64_t reported_bandwidth) {
  Harness h(device_gpu(mode));
  h.add_and_request(1, 8 * kGiB);
  EXPECT_EQ(h.state(1), ClientState::kRunning);
  h.feed(UsageReported{1, reported_bytes, reported_bytes, reported_bandwidth, {}});
  h.now += 1s;
  const MonoTime asked = h.now;
  h.add_and_request(2, 20 * kGiB);
  run_until_running(h, 2);
  EXPECT_EQ(h.state(2), ClientState::kRunning);
  // Either it no longer blocks, or (auto) its report let 2 run beside it.
  EXPECT_TRUE(h.state(1) == ClientState::kUnresponsive ||
              (mode == Mode::kAuto && h.state(1) == ClientState::kRunning));
  return h.now - asked;
}

TEST(Bounds, AHogWhateverItReportsDelaysOthersAtMostTheHogBound) {
  const Duration bound = hog_bound(PolicyConfig{});
  EXPECT_EQ(bound, 30s);
  for (const Mode mode : {Mode::kAuto, Mode::kExclusive}) {
    for (const std::uint64_t bytes : {std::uint64_t{0}, 8 * kGiB, kAbsurdBytes}) {
      for (const std::uint64_t bandwidth :
           {std::uint64_t{0}, std::uint64_t{1}, std::uint64_t{10000000000}}) {
        const Duration delay = hog_delay(mode, bytes, bandwidth);
        EXPECT_LE(delay, bound) << to_string(mode) << " bytes " << bytes << " bandwidth "
                                << bandwidth;
      }
    }
  }
  // The worst report reaches the bound exactly: quantum_max, grace, the whole swap allowance.
  EXPECT_EQ(hog_delay(Mode::kAuto, kAbsurdBytes, 1), 30s - 1s);  // it was granted 1 s earlier
}

TEST(Bounds, SwapAllowanceUsesBoundedFigures) {
  PolicyConfig config = device_gpu();
  config.fixed_quantum = 1s;
  config.revoke_grace = 2s;
  Harness h(config);
  h.add_and_request(1, 4 * kGiB);
  h.feed(UsageReported{1, kAbsurdBytes, kAbsurdBytes, 1, {}});  // 2^60 bytes at 1 byte/s
  h.add_and_request(2, 20 * kGiB);
  const auto revoke = revoke_of(h.fire(), 1);
  ASSERT_TRUE(revoke && revoke->swap_out);
  // Clamped to the 24Gi the device holds at the 1 GB/s floor (25.8 s), capped at 10 s.
  EXPECT_EQ(h.client(1).unresponsive_at, h.now + 2s + 10s);
}

TEST(Bounds, HonestSwapTimeIsAllowedInFull) {
  PolicyConfig config = device_gpu();
  config.fixed_quantum = 1s;
  config.revoke_grace = 2s;
  Harness h(config);
  h.add_and_request(1, 4 * kGiB);
  h.feed(UsageReported{1, 6'000'000'000, 6'000'000'000, 3'000'000'000, {}});  // 2 s at 3 GB/s
  h.add_and_request(2, 20 * kGiB);
  ASSERT_TRUE(revoke_of(h.fire(), 1));
  EXPECT_EQ(h.client(1).unresponsive_at, h.now + 2s + 2s);
}

TEST(Bounds, AHolderRevokedWhileItSwapsInHasItsGraceCountedFromTheSwapInsEnd) {
  PolicyConfig config = device_gpu();
  config.fixed_quantum = 1s;
  config.revoke_grace = 2s;
  Harness h(config);
  // Its memory is on the host (resident 0): the grant starts a swap-in of 2 s at 3 GB/s.
  h.feed(Registered{1, Limits{}});
  h.feed(UsageReported{1, 6'000'000'000, 0, 3'000'000'000, {}});
  h.request(1);
  ASSERT_EQ(h.state(1), ClientState::kRunning);
  const MonoTime granted = h.now;
  h.add_and_request(2, 20 * kGiB);
  const auto revoke = revoke_of(h.fire(), 1);  // its turn ends 1 s after the grant
  ASSERT_TRUE(revoke && revoke->swap_out);
  EXPECT_EQ(h.now, granted + 1s);
  // Not 1 s + grace + swap-out: the swap-in must end first.
  // (A resident holder's grace counts from the revoke: HonestSwapTimeIsAllowedInFull.)
  EXPECT_EQ(h.client(1).unresponsive_at, granted + 2s + 2s + 2s);
}

TEST(Bounds, AHogThatSaysItIsSwappedOutDelaysOthersAtMostTheHogBound) {
  for (const Mode mode : {Mode::kAuto, Mode::kExclusive}) {
    Harness h(device_gpu(mode));
    h.feed(Registered{1, Limits{}});
    h.feed(UsageReported{1, kAbsurdBytes, 0, 1, {}});  // everything on the host, at 1 byte/s
    h.request(1);
    ASSERT_EQ(h.state(1), ClientState::kRunning);
    const MonoTime asked = h.now;
    h.add_and_request(2, 20 * kGiB);
    run_until_running(h, 2);
    ASSERT_EQ(h.state(2), ClientState::kRunning);
    EXPECT_LE(h.now - asked, hog_bound(PolicyConfig{})) << to_string(mode);
  }
}

TEST(Bounds, AHolderThatIgnoredARevokeGetsNoAllowanceAndTheShortestQuantumAfterwards) {
  PolicyConfig config = device_gpu();
  config.revoke_grace = 2s;
  Harness h(config);
  h.add_and_request(1, 10 * kGiB);
  h.add_on_host(2, 20 * kGiB);
  h.request(2);  // does not fit beside 1: turns
  // 1's quantum: k x (10Gi + 20Gi at 2 GB/s) = 80 s -> 15 s.
  EXPECT_EQ(h.policy.next_deadline(), h.now + 15s);
  ASSERT_TRUE(revoke_of(h.fire(), 1));
  h.fire();  // grace and allowance over: unresponsive, 2 runs
  EXPECT_EQ(h.state(1), ClientState::kUnresponsive);
  EXPECT_EQ(h.state(2), ClientState::kRunning);
  h.release(1);  // it wakes up: queued behind 2
  EXPECT_EQ(h.state(1), ClientState::kWaiting);
  ASSERT_TRUE(revoke_of(h.fire(), 2));  // 2's turn ends
  const auto granted_1 = h.release(2);
  ASSERT_TRUE(granted(granted_1, 1));
  h.request(2);
  // With its strike, 1 gets the 5 s minimum and no swap allowance when revoked.
  EXPECT_EQ(h.policy.next_deadline(), h.now + 5s);
  const auto revoke = revoke_of(h.fire(), 1);
  ASSERT_TRUE(revoke && revoke->swap_out);
  EXPECT_EQ(h.client(1).unresponsive_at, h.now + 2s);
}

}  // namespace
}  // namespace nvshare::policy::testing

// ClientCounters: what the engine counts for monitoring, checked against decisions whose times the
// other tests pin.
#include <gtest/gtest.h>

#include "harness.h"

namespace nvshare::policy::testing {
namespace {

// A 30% cap alone: spent at t0 + 75 ms (revoke, reason quota), released at once, throttled (reason
// quota) until t0 + 425 ms, granted again; then it goes idle by itself.
TEST(Counters, GrantsRevokesReleasesAndWaitsByReason) {
  Harness h(virtual_gpu());
  const MonoTime t0 = h.now;
  h.add_and_request(1, 1 * kGiB, 30);
  ASSERT_TRUE(revoke_of(h.fire(), 1));
  h.release(1);
  h.now = t0 + 200ms;
  ClientCounters c = h.client(1).counters;
  EXPECT_EQ(c.grants, 1u);
  EXPECT_EQ(c.revokes_for(RevokeReason::kQuota), 1u);
  EXPECT_EQ(c.releases, 1u);
  EXPECT_EQ(c.waited_for(WaitReason::kQuota), 125ms);  // the wait in progress counts

  ASSERT_TRUE(granted(h.fire(), 1));
  EXPECT_EQ(h.now, t0 + 425ms);
  h.release(1);  // unasked: idle
  h.now += 1s;
  c = h.client(1).counters;
  EXPECT_EQ(c.grants, 2u);
  EXPECT_EQ(c.idle_releases, 1u);
  EXPECT_EQ(c.releases, 1u);
  EXPECT_EQ(c.waited_for(WaitReason::kQuota), 350ms);  // idle time is not waiting
  EXPECT_EQ(c.waited_for(WaitReason::kTurn) + c.waited_for(WaitReason::kMemory), 0ms);
}

// A wait whose reason changes is split between the reasons: client 2 waits for its turn behind 1
// (a cap binds: one at a time), then for memory once 1 reports a working set that leaves no room
// for it beside it (18Gi usable).
TEST(Counters, AWaitIsSplitByItsReasons) {
  Harness h(virtual_gpu());
  h.add_and_request(1, 1 * kGiB, 50);
  h.add_and_request(2, 1 * kGiB);
  ASSERT_EQ(h.client(2).waiting_for, WaitReason::kTurn);
  h.now += 50ms;
  EXPECT_EQ(h.client(2).counters.waited_for(WaitReason::kTurn), 50ms);
  EXPECT_EQ(h.client(2).counters.grants, 0u);
  h.feed(UsageReported{1, 17 * kGiB + kGiB / 2, 17 * kGiB + kGiB / 2, 0, {}});
  ASSERT_EQ(h.client(2).waiting_for, WaitReason::kMemory);
  h.now += 40ms;
  h.answer_evictions(h.release(1));  // 1 idles, its memory is evicted, and 2 runs
  EXPECT_EQ(h.state(2), ClientState::kRunning);
  EXPECT_EQ(h.client(2).counters.waited_for(WaitReason::kTurn), 50ms);
  EXPECT_EQ(h.client(2).counters.waited_for(WaitReason::kMemory), 40ms);
  EXPECT_EQ(h.client(2).counters.grants, 1u);
  EXPECT_EQ(h.client(1).counters.idle_releases, 1u);
}

}  // namespace
}  // namespace nvshare::policy::testing

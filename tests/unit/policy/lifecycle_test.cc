// Grant epochs, failures (disconnect, unresponsive holders), limits, wait reasons, idle release,
// reconfiguration and deadlines.
#include <gtest/gtest.h>

#include "harness.h"

namespace nvshare::policy::testing {
namespace {

TEST(Epochs, GrowWithEveryGrant) {
  Harness h(virtual_gpu());
  h.add_and_request(1, 1 * kGiB);
  h.add_and_request(2, 1 * kGiB);
  EXPECT_EQ(h.epoch(1), 1u);
  EXPECT_EQ(h.epoch(2), 2u);
  h.release(1);
  h.request(1);
  EXPECT_EQ(h.epoch(1), 3u);
  EXPECT_EQ(h.policy.view(h.now).last_epoch, 3u);
}

TEST(Epochs, StaleReleaseNeverAffectsTheCurrentHolder) {
  Harness h(virtual_gpu(Mode::kExclusive));
  h.add_and_request(1, 1 * kGiB);
  const GrantEpoch old_epoch = h.epoch(1);
  h.release(1);
  h.request(1);  // granted again, new epoch
  ASSERT_NE(h.epoch(1), old_epoch);

  EXPECT_TRUE(h.feed(Released{1, old_epoch, 0ms, 0ms}).empty());  // late duplicate
  EXPECT_EQ(h.state(1), ClientState::kRunning);
  EXPECT_TRUE(
      h.feed(Released{1, h.epoch(1) + 7, 0ms, 0ms}).empty());  // from the future: ignored too
  EXPECT_EQ(h.state(1), ClientState::kRunning);

  // A release for the other client's epoch does not touch this one either.
  h.add_and_request(2, 1 * kGiB);
  EXPECT_TRUE(h.feed(Released{2, h.epoch(1), 0ms, 0ms}).empty());
  EXPECT_EQ(h.state(1), ClientState::kRunning);
  EXPECT_EQ(h.state(2), ClientState::kWaiting);
}

TEST(Epochs, StaleReleaseDuringARevokeIsIgnored) {
  PolicyConfig config = virtual_gpu(Mode::kExclusive);
  config.fixed_quantum = 1s;
  Harness h(config);
  h.add_and_request(1, 1 * kGiB);
  const GrantEpoch first = h.epoch(1);
  h.release(1);
  h.request(1);
  h.add_and_request(2, 1 * kGiB);
  ASSERT_TRUE(revoke_of(h.fire(), 1));
  EXPECT_TRUE(h.feed(Released{1, first, 0ms, 0ms}).empty());
  EXPECT_EQ(h.state(1), ClientState::kRevoking);  // still blocks: the revoke is unanswered
}

TEST(Failures, DisconnectFreesEverythingAndGrantsTheNext) {
  Harness h(virtual_gpu());
  h.add_and_request(1, 16 * kGiB);
  h.add_and_request(2, 16 * kGiB);
  EXPECT_EQ(h.state(2), ClientState::kWaiting);
  const auto actions = h.feed(Disconnected{1});
  EXPECT_TRUE(granted(actions, 2));
  const GpuView v = h.policy.view(h.now);
  EXPECT_EQ(v.running_bytes, 16 * kGiB);
  ASSERT_EQ(v.clients.size(), 1u);
  // Late messages from the gone client are ignored.
  EXPECT_TRUE(h.feed(Released{1, 1, 0ms, 0ms}).empty());
  EXPECT_TRUE(h.feed(Requested{1}).empty());
  EXPECT_EQ(h.policy.view(h.now).clients.size(), 1u);
}

TEST(Failures, DisconnectWhileWaitingOrRevokingLeavesTheQueueConsistent) {
  PolicyConfig config = virtual_gpu(Mode::kExclusive);
  config.fixed_quantum = 1s;
  Harness h(config);
  h.add_and_request(1, 1 * kGiB);
  h.add_and_request(2, 1 * kGiB);
  h.add_and_request(3, 1 * kGiB);
  h.feed(Disconnected{2});
  EXPECT_EQ(h.policy.view(h.now).queue, (std::vector<ClientId>{3}));
  ASSERT_TRUE(revoke_of(h.fire(), 1));
  EXPECT_TRUE(granted(h.feed(Disconnected{1}), 3));  // crashed mid-revoke
}

TEST(Failures, HolderIgnoringARevokeStopsBlockingAfterTheGrace) {
  PolicyConfig config = virtual_gpu(Mode::kExclusive);
  config.fixed_quantum = 1s;
  config.turn_slice = 10s;  // turns by the quantum
  config.revoke_grace = 3s;
  Harness h(config);
  h.add_and_request(1, 1 * kGiB);
  h.add_and_request(2, 1 * kGiB);
  const MonoTime revoked_at = h.now + 1s;
  ASSERT_TRUE(revoke_of(h.fire(), 1));
  EXPECT_EQ(h.policy.next_deadline(), revoked_at + 3s);
  EXPECT_EQ(h.client(1).unresponsive_at, revoked_at + 3s);

  const auto actions = h.fire();
  ASSERT_EQ(only<HolderUnresponsive>(actions).size(), 1u);
  EXPECT_EQ(only<HolderUnresponsive>(actions)[0].client, 1u);
  EXPECT_EQ(only<HolderUnresponsive>(actions)[0].epoch, h.epoch(1));
  EXPECT_TRUE(granted(actions, 2));  // no longer blocked
  EXPECT_EQ(h.state(1), ClientState::kUnresponsive);
  EXPECT_EQ(h.policy.view(h.now).unresponsive_holders, 1u);

  // When it finally releases it is a normal client again: queued for its next turn.
  h.now += 5s;
  h.release(1);
  EXPECT_EQ(h.state(1), ClientState::kWaiting);
  ASSERT_TRUE(revoke_of(h.last, 2));  // 2's quantum has long ended and 1 now waits behind it
  EXPECT_TRUE(granted(h.release(2), 1));
  EXPECT_EQ(h.policy.view(h.now).unresponsive_holders, 1u);  // a count since start
}

TEST(Failures, GraceIncludesTheEstimatedSwapOut) {
  PolicyConfig config = virtual_gpu();
  config.fixed_quantum = 1s;
  config.revoke_grace = 2s;
  Harness h(config);
  h.add_and_request(1, 10 * kGiB);
  h.add_and_request(2, 10 * kGiB);
  const auto revoke = revoke_of(h.fire(), 1);
  ASSERT_TRUE(revoke && revoke->swap_out);
  // 10Gi at the default 2 GB/s: 5.37 s of legitimate swapping on top of the grace.
  EXPECT_EQ(h.client(1).unresponsive_at, h.now + 2s + std::chrono::nanoseconds(5'368'709'120));
}

TEST(Limits, SentOnRegistrationAndForwardedAtOnce) {
  Harness h(virtual_gpu());
  const auto on_register = h.feed(Registered{1, Limits{4 * kGiB, 50}});
  ASSERT_EQ(only<SendLimits>(on_register).size(), 1u);
  EXPECT_EQ(only<SendLimits>(on_register)[0].client, 1u);
  EXPECT_EQ(only<SendLimits>(on_register)[0].limits, (Limits{4 * kGiB, 50}));

  const auto changed = h.feed(LimitsChanged{1, Limits{2 * kGiB, 20}});
  ASSERT_EQ(only<SendLimits>(changed).size(), 1u);
  EXPECT_EQ(only<SendLimits>(changed)[0].limits, (Limits{2 * kGiB, 20}));
  EXPECT_EQ(h.client(1).limits, (Limits{2 * kGiB, 20}));
  EXPECT_TRUE(h.feed(LimitsChanged{9, Limits{}}).empty());  // unknown client
}

TEST(Limits, NewCapTakesEffectForARunningClient) {
  Harness h(virtual_gpu());
  h.add_and_request(1, 1 * kGiB);
  EXPECT_EQ(h.policy.next_deadline(), std::nullopt);
  h.feed(LimitsChanged{1, Limits{0, 50}});
  // Capped now: a fresh bucket at the entry level of its 0.5 s slice cycle, 0.0625 s, falling
  // at 0.5/s.
  EXPECT_TIME_NEAR(h.policy.next_deadline(), h.now + 125ms);
  EXPECT_EQ(revoke_of(h.fire(), 1)->reason, RevokeReason::kQuota);
}

TEST(WaitReasons, SentWhenWaitingStartsAndWhenTheReasonChanges) {
  Harness h(virtual_gpu());
  h.add_and_request(1, 10 * kGiB);
  h.add_and_request(2, 6 * kGiB);  // fits: runs
  // 3's memory is on the host (it would otherwise count where it is, parked on the device).
  h.add(3, 12 * kGiB);
  h.swapped_out(3);
  EXPECT_EQ(wait_of(h.request(3), 3), WaitReason::kMemory);
  // 4 would fit beside the runners but is behind 3: its turn.
  EXPECT_EQ(wait_of(h.add_and_request(4, 1 * kGiB), 4), WaitReason::kTurn);
  // 4 grows and no longer fits: the reason changes to memory, and is sent again.
  EXPECT_EQ(wait_of(h.feed(UsageReported{4, 5 * kGiB, 0, 0, {}}), 4), WaitReason::kMemory);
  // A report that changes nothing sends nothing.
  EXPECT_TRUE(only<SendWait>(h.feed(UsageReported{4, 5 * kGiB, 0, 0, {}})).empty());
  EXPECT_EQ(h.client(3).waiting_for, WaitReason::kMemory);
  EXPECT_EQ(h.client(4).waiting_for, WaitReason::kMemory);
}

TEST(WaitReasons, QuotaThenTurn) {
  Harness h(virtual_gpu(Mode::kExclusive));
  h.add_and_request(1, 1 * kGiB, 30);
  ASSERT_TRUE(revoke_of(h.fire(), 1));
  EXPECT_EQ(wait_of(h.release(1), 1), WaitReason::kQuota);
  h.add_and_request(2, 1 * kGiB);  // runs while 1 refills
  const auto refilled = h.fire();
  EXPECT_EQ(wait_of(refilled, 1), WaitReason::kTurn);  // refilled, now behind the runner
}

TEST(IdleRelease, UnaskedReleaseMakesTheClientIdleAndLetsOthersRun) {
  Harness h(virtual_gpu(Mode::kExclusive));
  h.add_and_request(1, 1 * kGiB);
  h.add_and_request(2, 1 * kGiB);
  h.add_and_request(3, 1 * kGiB);
  const auto actions = h.release(1);  // no revoke preceded it
  EXPECT_TRUE(granted(actions, 2));
  EXPECT_EQ(h.state(1), ClientState::kIdle);
  EXPECT_TRUE(only<SendWait>(actions).empty() || !wait_of(actions, 1));
  EXPECT_EQ(h.policy.view(h.now).queue, (std::vector<ClientId>{3}));
  h.request(1);  // asks again: queued normally, at the tail
  EXPECT_EQ(h.policy.view(h.now).queue, (std::vector<ClientId>{3, 1}));
}

TEST(Reconfigure, ExclusiveToAutoGrantsWhoFitsAtOnce) {
  Harness h(virtual_gpu(Mode::kExclusive));
  h.add_and_request(1, 1 * kGiB);
  h.add_and_request(2, 1 * kGiB);
  EXPECT_TRUE(granted(h.policy.reconfigure(virtual_gpu(Mode::kAuto), h.now), 2));
  EXPECT_EQ(h.policy.config().mode, Mode::kAuto);
}

TEST(Reconfigure, AutoToExclusiveTakesTurnsFromThen) {
  PolicyConfig config = virtual_gpu();
  config.fixed_quantum = 1s;
  Harness h(config);
  h.add_and_request(1, 1 * kGiB);
  h.add_and_request(2, 1 * kGiB);
  config.mode = Mode::kExclusive;
  EXPECT_TRUE(h.policy.reconfigure(config, h.now).empty());  // nobody waits: nothing to do yet
  h.add_and_request(3, 1 * kGiB);
  EXPECT_EQ(wait_of(h.last, 3), WaitReason::kTurn);
  const auto actions = h.fire();  // both runners' turns end; 3 runs alone after them
  EXPECT_TRUE(revoke_of(actions, 1));
  EXPECT_TRUE(revoke_of(actions, 2));
}

TEST(Reconfigure, SmallerCapacityRevokesWhatNoLongerFits) {
  Harness h(virtual_gpu());
  h.add_and_request(1, 8 * kGiB);
  h.add_and_request(2, 8 * kGiB);
  PolicyConfig smaller = virtual_gpu();
  smaller.capacity_bytes = 10 * kGiB;
  const auto actions = h.policy.reconfigure(smaller, h.now);
  ASSERT_TRUE(revoke_of(actions, 2));
  EXPECT_EQ(revoke_of(actions, 2)->reason, RevokeReason::kMemory);
}

TEST(Reconfigure, InvalidConfigurationIsIgnored) {
  Harness h(virtual_gpu());
  PolicyConfig bad = virtual_gpu(Mode::kExclusive);
  bad.reserve_fraction = 2;
  EXPECT_TRUE(h.policy.reconfigure(bad, h.now).empty());
  EXPECT_EQ(h.policy.config().mode, Mode::kAuto);
}

TEST(Reconfigure, NewQuotaWindowChangesBucketsAtOnce) {
  Harness h(virtual_gpu());
  h.add_and_request(1, 1 * kGiB, 50);  // entry level 0.0625 s, falling 0.5/s: 0.125 s
  EXPECT_TIME_NEAR(h.policy.next_deadline(), h.now + 125ms);
  PolicyConfig config = virtual_gpu();
  config.quota_window = 100ms;  // depth now 0.05 s: the level is clamped
  h.policy.reconfigure(config, h.now);
  EXPECT_TIME_NEAR(h.policy.next_deadline(), h.now + 100ms);
}

TEST(Deadlines, NothingDueMeansNullopt) {
  Harness h(virtual_gpu());
  EXPECT_EQ(h.policy.next_deadline(), std::nullopt);
  h.add_and_request(1, 1 * kGiB);
  h.add_and_request(2, 1 * kGiB);
  EXPECT_EQ(h.policy.next_deadline(), std::nullopt);
}

TEST(Deadlines, EarliestOfQuantumQuotaRefillAndGrace) {
  PolicyConfig config = virtual_gpu(Mode::kExclusive);
  config.fixed_quantum = 10s;
  config.turn_slice = 20s;  // turns by the quantum
  config.cap_cycle = 20s;   // buckets cycling by the window
  config.revoke_grace = 4s;
  Harness h(config);
  const MonoTime t0 = h.now;
  h.add_and_request(1, 1 * kGiB, 50);  // quota spent at t0 + 0.5 s
  h.add_and_request(2, 1 * kGiB);      // turn ends at t0 + 10 s
  EXPECT_TIME_NEAR(h.policy.next_deadline(), t0 + 500ms);
  h.fire();  // quota revoke of 1: grace until t0 + 5 s
  EXPECT_TIME_NEAR(h.policy.next_deadline(), h.now + 4s);
  h.now += 100ms;
  h.release(1);  // 2 runs; 1 refills 0.55 s at 0.5/s
  EXPECT_TIME_NEAR(h.policy.next_deadline(), h.now + 1100ms);
  // 1 is refilled: uncapped 2 is now held to the rest (50%), which it used up running alone while 1
  // could not run, so it is revoked (quota) at once instead of at the end of its quantum, 10 s.
  EXPECT_TRUE(revoke_of(h.fire(), 2));
  EXPECT_TIME_NEAR(h.policy.next_deadline(), h.now + 4s);  // 2's grace
}

TEST(Deadlines, FiringEarlyOrTwiceIsHarmless) {
  PolicyConfig config = virtual_gpu(Mode::kExclusive);
  config.fixed_quantum = 2s;
  config.turn_slice = 10s;  // turns by the quantum
  Harness h(config);
  h.add_and_request(1, 1 * kGiB);
  h.add_and_request(2, 1 * kGiB);
  const auto deadline = h.policy.next_deadline();
  h.now += 1s;
  EXPECT_TRUE(h.feed(DeadlineReached{}).empty());  // not due yet
  EXPECT_EQ(h.policy.next_deadline(), deadline);
  h.now = *deadline;
  EXPECT_TRUE(revoke_of(h.feed(DeadlineReached{}), 1));
  EXPECT_TRUE(h.feed(DeadlineReached{}).empty());
}

TEST(Deadlines, TimeNeverGoesBackwards) {
  Harness h(virtual_gpu());
  h.add_and_request(1, 1 * kGiB, 30);
  h.now = MonoTime{1s};  // earlier than already seen: treated as the last time seen
  h.feed(DeadlineReached{});
  EXPECT_EQ(h.state(1), ClientState::kRunning);
  EXPECT_TIME_NEAR(h.policy.next_deadline(), MonoTime{100s} + 75ms);
}

}  // namespace
}  // namespace nvshare::policy::testing

// Compute caps: the quota bucket, 1/n billing, proportional scaling, overshoot, work conservation.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "harness.h"
#include "scheduler/policy/quota.h"
#include "scheduler/policy/usage_window.h"

namespace nvshare::policy::testing {
namespace {

using ::testing::HasSubstr;

double seconds(Duration d) { return static_cast<double>(d.count()) / 1e9; }

TEST(QuotaLedger, LevelMovesAtCapMinusBillingRateUpToTheDepth) {
  const MonoTime t0{10s};
  QuotaLedger ledger(0.3, 2s, 2s, t0);
  EXPECT_DOUBLE_EQ(ledger.depth(), 0.6);
  EXPECT_DOUBLE_EQ(ledger.resume_level(), 0.42);
  EXPECT_DOUBLE_EQ(ledger.entry_level(), 0.21);
  EXPECT_DOUBLE_EQ(ledger.level(), 0.21);  // starts at the entry level: may run, no full burst
  EXPECT_TRUE(ledger.may_enter());
  EXPECT_FALSE(ledger.refilled());

  ledger.set_rates(0.3, 1.0, 2s, true);  // running alone: falls at 0.7/s
  EXPECT_TIME_NEAR(ledger.spent_at(), t0 + 300ms);
  ledger.settle(t0 + 300ms);
  EXPECT_TRUE(ledger.spent());

  ledger.set_rates(0.3, 1.0, 2s, true);  // the drain after the revoke: still billed
  ledger.settle(t0 + 400ms);
  EXPECT_NEAR(ledger.level(), -0.07, 1e-9);  // overshoot

  ledger.set_rates(0.3, 0.0, 2s, false);  // released and idle: refills at 0.3/s
  EXPECT_TIME_NEAR(ledger.refilled_at(), t0 + 400ms + std::chrono::nanoseconds(1'633'333'333));
  ledger.settle(t0 + 60s);
  EXPECT_DOUBLE_EQ(ledger.level(), 0.6);  // never above the depth
  EXPECT_EQ(ledger.spent_at(), std::nullopt);
}

// A client that waits for its turn behind others keeps what it is owed: its level rises past the
// depth until it runs or stops wanting the GPU (then it is clamped back).
TEST(QuotaLedger, AClientWaitingForItsTurnKeepsWhatItIsOwed) {
  QuotaLedger ledger(0.1, 2s, 2s, MonoTime{});
  ledger.set_rates(0.1, 0.0, 2s, true);
  ledger.settle(MonoTime{5s});
  EXPECT_NEAR(ledger.level(), 0.09 + 0.5, 1e-9);  // the entry level, plus 0.1/s x 5 s
  ledger.set_rates(0.1, 1.0, 2s, true);           // its turn: falls at 0.9/s from there
  EXPECT_TIME_NEAR(ledger.spent_at(), MonoTime{5s} + std::chrono::nanoseconds(655'555'556));
  ledger.set_rates(0.1, 0.0, 2s, false);  // idle: clamped to the depth
  EXPECT_DOUBLE_EQ(ledger.level(), 0.2);
}

TEST(QuotaLedger, LoweringTheCapClampsTheLevelToTheNewDepth) {
  QuotaLedger ledger(0.5, 2s, 2s, MonoTime{});
  ledger.settle(MonoTime{10s});
  EXPECT_DOUBLE_EQ(ledger.level(), 1.0);
  ledger.set_rates(0.25, 0, 2s, false);
  EXPECT_DOUBLE_EQ(ledger.level(), 0.5);
}

TEST(UsageWindow, ShareOverTheLastWindow) {
  UsageWindow usage(MonoTime{0s});
  usage.set_rate(1.0);
  usage.settle(MonoTime{1s}, 2s);
  usage.set_rate(0.5);
  usage.settle(MonoTime{3s}, 2s);
  usage.set_rate(0);
  EXPECT_DOUBLE_EQ(usage.total_seconds(MonoTime{5s}), 2.0);
  EXPECT_DOUBLE_EQ(usage.share(MonoTime{3s}, 2s), 0.5);
  EXPECT_DOUBLE_EQ(usage.share(MonoTime{2s}, 2s), 0.75);  // projected: 1 s at 1, 1 s at 0.5
  EXPECT_DOUBLE_EQ(usage.share(MonoTime{4s}, 2s), 0.25);
}

// share() reads prefix totals: over random rate changes it equals the billed time summed by hand
// over every window within what it keeps (2 s back from the last settle), ending at or before the
// last settle or after it (projected).
TEST(UsageWindow, ShareEqualsTheBilledTimeSummedByHand) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> step_ms(1, 40);
  std::uniform_int_distribution<int> holders(0, 4);
  UsageWindow usage(MonoTime{0s});
  struct Piece {
    MonoTime begin, end;
    double rate;
  };
  std::vector<Piece> pieces;
  MonoTime t{0s};
  double rate = 0;
  for (int i = 0; i < 2000; ++i) {
    const MonoTime next = t + std::chrono::milliseconds(step_ms(rng));
    usage.settle(next, 2s);
    pieces.push_back({t, next, rate});
    const int n = holders(rng);
    rate = n == 0 ? 0.0 : 1.0 / n;
    usage.set_rate(rate);
    t = next;
  }
  const auto by_hand = [&](MonoTime now, Duration window) {
    double billed = 0;
    const MonoTime from = now - window;
    for (Piece p : pieces) {
      const MonoTime b = std::max(p.begin, from);
      const MonoTime e = std::min(p.end, now);
      if (e > b) billed += p.rate * to_seconds(e - b);
    }
    if (now > t) billed += rate * to_seconds(now - std::max(t, from));
    return billed / to_seconds(window);
  };
  for (const Duration back : {0ms, 5ms, 300ms, 1000ms}) {
    for (const Duration window : {100ms, 700ms, 2000ms}) {
      if (back + window > 2s) continue;  // older than what is kept
      EXPECT_NEAR(usage.share(t - back, window), by_hand(t - back, window), 1e-9);
    }
  }
  EXPECT_NEAR(usage.share(t + 50ms, 2s), by_hand(t + 50ms, 2s), 1e-9);  // projected
}

TEST(Caps, SpentBudgetRevokesWithReasonQuotaAndRefillGrantsAgain) {
  Harness h(virtual_gpu());
  const MonoTime t0 = h.now;
  EXPECT_TRUE(granted(h.add_and_request(1, 1 * kGiB, 30), 1));
  // Its memory stays on the device, so it cycles by the 0.5 s cap cycle: resume level
  // 0.3 x 0.7 x 0.5 s = 0.105 s, entry level half that, 0.0525 s, spent at 0.7/s.
  EXPECT_TIME_NEAR(h.policy.next_deadline(), t0 + 75ms);

  const auto revoke = revoke_of(h.fire(), 1);
  ASSERT_TRUE(revoke);
  EXPECT_EQ(revoke->reason, RevokeReason::kQuota);
  EXPECT_FALSE(revoke->swap_out);  // nobody waits for its memory

  const auto released = h.release(1);
  EXPECT_EQ(wait_of(released, 1), WaitReason::kQuota);
  EXPECT_EQ(h.client(1).waiting_for, WaitReason::kQuota);
  // It refills to the resume level 0.105 s at 0.3/s, a pause of 0.35 s.
  EXPECT_TIME_NEAR(h.policy.next_deadline(), t0 + 425ms);
  EXPECT_TRUE(granted(h.fire(), 1));

  // From then on one cycle per 0.5 s: runs 0.15 s (0.105 s at 0.7/s), pauses 0.35 s: 30%.
  EXPECT_TIME_NEAR(h.policy.next_deadline(), t0 + 575ms);
  h.fire();
  h.release(1);
  EXPECT_TIME_NEAR(h.policy.next_deadline(), t0 + 925ms);
}

// With the default cap cycle, 0.25 s, a 30% client whose memory stays on the device runs 75 ms and
// pauses 175 ms: its bucket swings by 0.3 x 0.7 x 0.25 s = 52.5 ms, so its share over a few seconds
// stays within a point or two of its cap.
TEST(Caps, TheDefaultCycleIsAQuarterSecond) {
  PolicyConfig config;
  config.device_bytes = 24 * kGiB;
  config.capacity_bytes = 20 * kGiB;
  ASSERT_EQ(config.cap_cycle, 250ms);
  Harness h(config);
  const MonoTime t0 = h.now;
  EXPECT_TRUE(granted(h.add_and_request(1, 1 * kGiB, 30), 1));
  // Entry level 26.25 ms, spent at 0.7/s.
  EXPECT_TIME_NEAR(h.policy.next_deadline(), t0 + 37500us);
  ASSERT_TRUE(revoke_of(h.fire(), 1));
  h.release(1);
  // Refills to the resume level 52.5 ms at 0.3/s: 175 ms.
  EXPECT_TIME_NEAR(h.policy.next_deadline(), t0 + 212500us);
  EXPECT_TRUE(granted(h.fire(), 1));
  EXPECT_TIME_NEAR(h.policy.next_deadline(), t0 + 287500us);  // runs 75 ms
  h.fire();
  h.release(1);
  EXPECT_TIME_NEAR(h.policy.next_deadline(), t0 + 462500us);  // pauses 175 ms: 30%
}

// A client whose memory went to the host pays a swap-in for every run: its bucket cycles by the
// whole window (runs 0.6 s, pauses 1.4 s at 30%) instead of by the cap cycle.
TEST(Caps, AClientSwappedOutCyclesByTheWindow) {
  Harness h(virtual_gpu());
  const MonoTime t0 = h.now;
  h.add_and_request(1, 1 * kGiB, 30);
  ASSERT_TRUE(revoke_of(h.fire(), 1));  // spent at t0 + 75 ms
  h.release(1);
  h.feed(UsageReported{1, 1 * kGiB, 0, 0, {}});  // its memory is on the host now
  // Refills to 0.3 x 0.7 x 2 s = 0.42 s at 0.3/s: pauses 1.4 s.
  EXPECT_TIME_NEAR(h.policy.next_deadline(), t0 + 1475ms);
  EXPECT_TRUE(granted(h.fire(), 1));
  h.feed(UsageReported{1, 1 * kGiB, 1 * kGiB, 0, {}});      // swapped in: short cycles again
  EXPECT_TIME_NEAR(h.policy.next_deadline(), t0 + 2075ms);  // 0.42 s at 0.7/s
  h.fire();
  h.release(1);
  EXPECT_TIME_NEAR(h.policy.next_deadline(), t0 + 2425ms);  // back at 0.105 s after 0.35 s
}

TEST(Caps, CoRunnersAreEachBilledOneNth) {
  Harness h(virtual_gpu());
  h.add_and_request(1, 1 * kGiB);
  h.add_and_request(2, 1 * kGiB);
  h.advance(1s);
  EXPECT_NEAR(seconds(h.client(1).held_total), 0.5, 1e-9);
  EXPECT_NEAR(h.client(1).share_percent, 25.0, 1e-6);  // 0.5 s billed in the last 2 s
  EXPECT_EQ(h.state(2), ClientState::kRunning);
}

// In every mode a capped client runs alone while its cap binds: what it holds is what it has. The
// hand-off moves no memory, so turns follow the fair clocks: each turn half a slice (0.25 s) of
// fair clock ahead of the other, 0.075 s of wall time at a weight of 0.3. (Both were idle for a
// second first, so their buckets hold more than a turn: a fresh bucket's entry level lasts exactly
// a first turn, and a tie ends it for quota.)
TEST(Caps, ACappedClientRunsAloneInEveryMode) {
  Harness h(virtual_gpu());
  h.add(1, 1 * kGiB, 30);
  h.add(2, 1 * kGiB, 30);
  h.advance(1s);
  const MonoTime t0 = h.now;
  EXPECT_TRUE(granted(h.request(1), 1));
  EXPECT_EQ(wait_of(h.request(2), 2), WaitReason::kTurn);
  EXPECT_THAT(h.policy.explain(2, h.now),
              HasSubstr("while a compute cap binds this GPU runs one client at a time"));
  EXPECT_THAT(h.policy.explain(2, h.now),
              HasSubstr("its turn comes when client 1's fair turn ends, in 0.1 s"));
  EXPECT_TIME_NEAR(h.policy.next_deadline(), t0 + 75ms);
  const auto revoke = revoke_of(h.fire(), 1);
  ASSERT_TRUE(revoke);
  EXPECT_EQ(revoke->reason, RevokeReason::kTurn);
  EXPECT_FALSE(revoke->swap_out);
  EXPECT_TRUE(granted(h.release(1), 2));
  EXPECT_EQ(h.client(1).waiting_for, WaitReason::kTurn);  // budget left: back in line
  // 2 is asked to yield once within the slack (0.125 s of fair clock) of 1, at t0 + 112.5 ms, and
  // runs until it is the lead ahead of 1: 0.5 s of fair clock, 0.15 s.
  EXPECT_EQ(only<SendYield>(h.fire()).size(), 1u);
  EXPECT_TIME_NEAR(h.policy.next_deadline(), t0 + 225ms);
  // An uncapped client waits too while a cap binds, for its turn (its memory would fit).
  EXPECT_EQ(wait_of(h.add_and_request(3, 1 * kGiB), 3), WaitReason::kTurn);
  EXPECT_THAT(h.policy.explain(3, h.now), HasSubstr("queued behind client 1 (first in line)"));
}

// A capped client kept waiting behind others' turns keeps accruing budget past its depth: a 6%
// cap beside a 90% one on 5 s quanta still gets 6%.
TEST(Caps, ALowCapWaitingForTurnsLosesNothing) {
  Harness h(virtual_gpu());
  h.add_and_request(1, 1 * kGiB, 90);
  h.add_and_request(2, 1 * kGiB, 6);
  const MonoTime start = h.now;
  for (int i = 0; i < 400; ++i) {
    for (const SendRevoke& r : only<SendRevoke>(h.fire())) {
      h.now += 5ms;
      h.feed(Released{r.client, r.epoch, 0ms, 5ms});
      h.feed(Requested{r.client});
    }
  }
  const double wall = seconds(h.now - start);
  ASSERT_GT(wall, 30.0);
  // Clamped to its depth while waiting, it got 5.74%.
  EXPECT_NEAR(100 * seconds(h.client(2).held_total) / wall, 6.0, 0.1);
  EXPECT_NEAR(100 * seconds(h.client(1).held_total) / wall, 90.0, 1.0);
}

// An unresponsive holder may be computing or only still swapping out (a host copy slower than the
// grace): whoever runs beside it is billed all of its time, so that a capped client cannot run over
// its cap there, while the unresponsive holder is billed as though it shared the GPU.
TEST(Caps, AnUnresponsiveHolderDoesNotLowerWhatTheRunnerIsBilled) {
  PolicyConfig config = virtual_gpu();
  config.revoke_grace = 1s;
  Harness h(config);
  h.add_and_request(1, 1 * kGiB, 30);
  h.add_and_request(2, 1 * kGiB);
  // 1 runs alone, is revoked at the end of its fair turn at 0.075 s (0.25 s of fair clock at a
  // weight of 0.3), never releases, is unresponsive at 1.075 s; 2 runs from then on beside it.
  h.advance(3s);
  EXPECT_EQ(h.state(1), ClientState::kUnresponsive);
  ASSERT_EQ(h.state(2), ClientState::kRunning);
  EXPECT_NEAR(seconds(h.client(2).held_total), 1.925, 1e-6);  // all of it: 1 does not block
  EXPECT_NEAR(seconds(h.client(1).held_total), 0.075 + 1.0 + 1.925 / 2, 1e-6);  // as if shared
}

// The demo's case: a capped client granted once the holder before it is unresponsive (its swap-out
// outlasted the grace) keeps to its cap, measured by the time it held the GPU. Billed half of its
// time, as when an unresponsive holder counted as a sharer, it ran at about 60%.
TEST(Caps, ACappedClientBesideAnUnresponsiveHolderKeepsItsCap) {
  PolicyConfig config = virtual_gpu();
  config.revoke_grace = 1s;
  Harness h(config);
  h.add_and_request(1, 1 * kGiB);
  h.add_and_request(2, 1 * kGiB, 30);
  for (int i = 0; i < 100 && h.state(1) != ClientState::kUnresponsive; ++i) h.fire();
  ASSERT_EQ(h.state(1), ClientState::kUnresponsive);
  ASSERT_EQ(h.state(2), ClientState::kRunning);
  // What 2 was owed while it waited is spent in the first seconds; the share is measured after.
  const MonoTime start = h.now + 5s;
  MonoTime since = h.now;
  Duration ran{};
  std::vector<Action> step;
  const auto count_until = [&](MonoTime t) {
    return std::max(since, start) < t ? t - std::max(since, start) : Duration{};
  };
  while (h.now - start < 30s) {
    step = h.fire();
    for (std::size_t k = 0; k < step.size(); ++k) {
      if (const auto* g = std::get_if<SendGrant>(&step[k]); g != nullptr && g->client == 2) {
        since = h.now;
      }
      if (const auto* r = std::get_if<SendRevoke>(&step[k]); r != nullptr && r->client == 2) {
        ran += count_until(h.now);
        h.feed(Released{2, r->epoch, 0ms, 0ms});
        for (const Action& a : h.feed(Requested{2})) step.push_back(a);
      }
    }
  }
  if (h.state(2) == ClientState::kRunning) ran += count_until(h.now);
  EXPECT_NEAR(seconds(ran) / seconds(h.now - start), 0.30, 0.015);
}

TEST(Caps, CapsOverOneHundredPercentAreScaledAndRecomputedWhenClientsLeave) {
  Harness h(virtual_gpu());
  h.add_and_request(1, 1 * kGiB, 60);
  h.add_and_request(2, 1 * kGiB, 60);
  h.add_and_request(3, 1 * kGiB, 30);
  EXPECT_NEAR(h.client(1).effective_cap_percent, 40, 1e-9);  // 60 x 100/150
  EXPECT_NEAR(h.client(3).effective_cap_percent, 20, 1e-9);
  h.add(4, 1 * kGiB, 90);  // idle: not active, does not count
  EXPECT_NEAR(h.client(1).effective_cap_percent, 40, 1e-9);
  EXPECT_NEAR(h.client(4).effective_cap_percent, 90, 1e-9);

  h.feed(Disconnected{3});
  EXPECT_NEAR(h.client(1).effective_cap_percent, 50, 1e-9);  // 60 x 100/120
  h.release(1);                                              // the runner is idle now
  EXPECT_NEAR(h.client(1).effective_cap_percent, 60, 1e-9);
  EXPECT_NEAR(h.client(2).effective_cap_percent, 60, 1e-9);
  h.add_and_request(5, 1 * kGiB);  // uncapped clients are not part of the sum
  EXPECT_NEAR(h.client(2).effective_cap_percent, 60, 1e-9);
}

TEST(Caps, OvershootCarriesForward) {
  Harness h(virtual_gpu());
  const MonoTime t0 = h.now;
  h.add_and_request(1, 1 * kGiB, 30);
  h.fire();        // spent at t0 + 75 ms
  h.now += 500ms;  // a long drain, billed: level -0.35 s
  EXPECT_NEAR(seconds(*h.client(1).budget_left), -0.35, 1e-6);
  h.release(1);
  // Back to the resume level 0.105 s at 0.3/s takes 0.455 / 0.3 = 1.517 s: the overshoot is
  // repaid before it runs again.
  ASSERT_TRUE(h.policy.next_deadline());
  EXPECT_NEAR(seconds(*h.policy.next_deadline() - (t0 + 575ms)), 0.455 / 0.3, 1e-6);

  // Over many cycles with such drains the share still converges to the cap.
  const MonoTime start = t0;
  for (int cycle = 0; cycle < 50; ++cycle) {
    ASSERT_TRUE(granted(h.fire(), 1));
    ASSERT_TRUE(revoke_of(h.fire(), 1));
    h.now += 200ms;
    h.release(1);
  }
  const double share = seconds(h.client(1).held_total) / seconds(h.now - start);
  EXPECT_NEAR(share, 0.30, 0.01);
}

TEST(Caps, UncappedClientsAreNeverBilledOrThrottled) {
  Harness h(virtual_gpu());
  h.add_and_request(1, 1 * kGiB);
  EXPECT_EQ(h.client(1).budget_left, std::nullopt);
  EXPECT_EQ(h.policy.next_deadline(), std::nullopt);
  EXPECT_TRUE(h.advance(1h).empty());
  EXPECT_EQ(h.state(1), ClientState::kRunning);
  EXPECT_NEAR(h.client(1).share_percent, 100, 1e-9);  // measured for status, never charged
}

TEST(Caps, ThrottledClientDoesNotBlockOthers) {
  Harness h(virtual_gpu(Mode::kExclusive));
  h.add_and_request(1, 1 * kGiB, 3);  // its shortest turn (50 ms) spends its bucket
  h.add_and_request(2, 1 * kGiB);
  // Quota revokes and turns alternate; revoked clients release after a 5 ms drain. Whenever 1
  // waits for quota, somebody holds the GPU: no idle GPU while a grantable client waits.
  int quota_waits = 0;
  for (int i = 0; i < 200; ++i) {
    for (const SendRevoke& r : only<SendRevoke>(h.fire())) {
      h.now += 5ms;
      h.feed(Released{r.client, r.epoch, 0ms, 5ms});
    }
    const GpuView v = h.policy.view(h.now);
    const bool someone_holds = std::any_of(v.clients.begin(), v.clients.end(), [](auto& c) {
      return c.state == ClientState::kRunning || c.state == ClientState::kRevoking;
    });
    const bool grantable_waits = std::any_of(v.clients.begin(), v.clients.end(), [](auto& c) {
      return c.state == ClientState::kWaiting && c.waiting_for != WaitReason::kQuota;
    });
    ASSERT_TRUE(someone_holds || !grantable_waits) << "idle GPU at step " << i;
    quota_waits += h.client(1).waiting_for == WaitReason::kQuota ? 1 : 0;
  }
  EXPECT_GT(quota_waits, 10);
  EXPECT_EQ(h.policy.view(h.now).unresponsive_holders, 0u);
}

TEST(Caps, ClientEnteringWithALowBucketWaitsForQuota) {
  Harness h(virtual_gpu());
  h.add_and_request(1, 1 * kGiB, 30);
  h.now += 250ms;  // 0.21 - 0.175 = 0.035 s left, under the entry level (0.0525 s)
  h.release(1);    // idle release
  EXPECT_EQ(h.state(1), ClientState::kIdle);
  const auto actions = h.request(1);
  EXPECT_FALSE(granted(actions, 1));
  EXPECT_EQ(wait_of(actions, 1), WaitReason::kQuota);
  // And someone else runs meanwhile.
  EXPECT_TRUE(granted(h.add_and_request(2, 1 * kGiB), 2));
}

TEST(Caps, LimitChangeToUncappedReleasesAThrottledClient) {
  Harness h(virtual_gpu());
  h.add_and_request(1, 1 * kGiB, 30);
  h.fire();
  h.release(1);
  EXPECT_EQ(h.client(1).waiting_for, WaitReason::kQuota);
  const auto actions = h.feed(LimitsChanged{1, Limits{0, 100}});
  EXPECT_TRUE(granted(actions, 1));
}

}  // namespace
}  // namespace nvshare::policy::testing

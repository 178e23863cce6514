// Turn-taking: the quantum (fixed, auto and its clamp), when runners are revoked, and the swap_out
// flag.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "harness.h"
#include "scheduler/policy/quantum.h"

namespace nvshare::policy::testing {
namespace {

TEST(Quantum, FixedQuantumEndsTheTurnOfARunnerThatBlocksTheHead) {
  PolicyConfig config = virtual_gpu();
  config.fixed_quantum = 7s;
  Harness h(config);
  h.add_and_request(1, 10 * kGiB);
  const MonoTime granted_at = h.now;
  h.now += 1s;
  h.add_and_request(2, 10 * kGiB);
  EXPECT_EQ(h.policy.next_deadline(), granted_at + 7s);  // counted from the grant

  const auto actions = h.advance(6s - 1ns);
  EXPECT_TRUE(actions.empty());
  const auto revoke = revoke_of(h.advance(1ns), 1);
  ASSERT_TRUE(revoke);
  EXPECT_EQ(revoke->reason, RevokeReason::kTurn);
  EXPECT_TRUE(revoke->swap_out);
  EXPECT_EQ(revoke->epoch, h.epoch(1));
}

TEST(Quantum, NoTurnEndsWhileNobodyWaits) {
  PolicyConfig config = virtual_gpu();
  config.fixed_quantum = 1s;
  Harness h(config);
  h.add_and_request(1, 10 * kGiB);
  h.add_and_request(2, 2 * kGiB);  // fits: runs beside 1
  EXPECT_EQ(h.policy.next_deadline(), std::nullopt);
  EXPECT_TRUE(h.advance(1h).empty());
}

TEST(Quantum, AutoIsAMultipleOfTheSwapTime) {
  PolicyConfig config = virtual_gpu();  // k = 50, 5 s .. 15 s, 2 GB/s until measured
  config.quantum_max = 1000s;
  // 4Gi + 16Gi move: 21.47 GB at 2 GB/s = 10.74 s, x50 = 536.9 s.
  const Duration at_default =
      client_swap_time(config, 4 * kGiB, 0, 0) + client_swap_time(config, 16 * kGiB, 0, 0);
  EXPECT_NEAR(to_ms(quantum_for(config, at_default)) / 1e3, 536.871, 0.001);
  // Measured 20 GB/s: 10x shorter.
  const Duration measured = client_swap_time(config, 4 * kGiB, 20'000'000'000, 0) +
                            client_swap_time(config, 16 * kGiB, 20'000'000'000, 0);
  EXPECT_NEAR(to_ms(quantum_for(config, measured)) / 1e3, 53.687, 0.001);
}

TEST(Quantum, AutoIsClampedToItsBounds) {
  PolicyConfig config = virtual_gpu();
  EXPECT_EQ(quantum_for(config, 50ms), 5s);    // 2.5 s -> min
  EXPECT_EQ(quantum_for(config, 200ms), 10s);  // x50, within the bounds
  EXPECT_EQ(quantum_for(config, 100s), 15s);   // 5000 s -> max
  EXPECT_EQ(quantum_for(config, 0s), 5s);
  config.fixed_quantum = 42ms;
  EXPECT_EQ(quantum_for(config, 100s), 42ms);  // fixed ignores the estimate
}

TEST(Quantum, ClientFiguresAreBoundedBeforeUse) {
  const PolicyConfig config = virtual_gpu();  // floor 1 GB/s
  // Bytes beyond what the GPU holds are not moved: clamped to the bound.
  EXPECT_EQ(client_swap_time(config, std::uint64_t{1} << 60, 10'000'000'000, 20'000'000'000), 2s);
  // A bandwidth below the floor counts as the floor.
  EXPECT_EQ(client_swap_time(config, 3'000'000'000, 1, 0), 3s);
  // Not measured yet: the default (2 GB/s).
  EXPECT_EQ(client_swap_time(config, 3'000'000'000, 0, 0), 1500ms);
  EXPECT_EQ(time_to_move(std::uint64_t{1} << 63, 1), std::chrono::seconds(1'000'000'000));
}

TEST(Quantum, AutoQuantumDrivesTheRevoke) {
  PolicyConfig config = virtual_gpu();
  config.quantum_max = 1000s;
  Harness h(config);
  h.add_and_request(1, 4 * kGiB);
  h.add_on_host(2, 16 * kGiB);  // all of it has to come in
  h.request(2);
  const MonoTime expected = h.now + std::chrono::nanoseconds(536'870'912'000);  // see above
  ASSERT_TRUE(h.policy.next_deadline());
  EXPECT_EQ(*h.policy.next_deadline(), expected);
  EXPECT_EQ(h.policy.view(h.now).quantum, expected - h.now);
  // Both measured 20 GB/s: the quantum shortens at once.
  h.feed(UsageReported{1, 4 * kGiB, 4 * kGiB, 20'000'000'000, {}});
  h.feed(UsageReported{2, 16 * kGiB, 0, 20'000'000'000, {}});
  const Duration swap = client_swap_time(config, 4 * kGiB, 20'000'000'000, 0) +
                        client_swap_time(config, 16 * kGiB, 20'000'000'000, 0);
  EXPECT_EQ(*h.policy.next_deadline(), h.now + quantum_for(config, swap));
  EXPECT_NEAR(static_cast<double>(quantum_for(config, swap).count()), 53'687'091'200.0, 100.0);
}

TEST(Quantum, ExclusiveClientsAlternateByQuantum) {
  PolicyConfig config = virtual_gpu(Mode::kExclusive);
  config.fixed_quantum = 2s;
  Harness h(config);
  h.add_and_request(1, 1 * kGiB);
  h.add_and_request(2, 1 * kGiB);
  std::vector<ClientId> runners{1};
  for (int turn = 0; turn < 4; ++turn) {
    // A turn: the quantum from the grant (a yield may come before; the client is busy).
    const auto revoke = revoke_of(h.advance(2s), runners.back());
    ASSERT_TRUE(revoke) << "turn " << turn;
    EXPECT_FALSE(revoke->swap_out);  // 1Gi + 1Gi fit together: nothing has to move
    h.now += 10ms;                   // the drain
    const auto grants = only<SendGrant>(h.release(runners.back()));
    ASSERT_EQ(grants.size(), 1u);
    runners.push_back(grants[0].client);
  }
  EXPECT_EQ(runners, (std::vector<ClientId>{1, 2, 1, 2, 1}));
}

TEST(SwapOut, SetOnlyWhenTheNextRunnerDoesNotFitBeside) {
  PolicyConfig config = virtual_gpu(Mode::kExclusive);
  config.fixed_quantum = 1s;
  {
    Harness h(config);
    h.add_and_request(1, 9 * kGiB);
    h.add_and_request(2, 9 * kGiB);  // 18Gi: fit together
    EXPECT_FALSE(revoke_of(h.fire(), 1)->swap_out);
  }
  {
    Harness h(config);
    h.add_and_request(1, 9 * kGiB);
    h.add_and_request(2, 9 * kGiB + 1);  // one byte too many
    EXPECT_TRUE(revoke_of(h.fire(), 1)->swap_out);
  }
}

TEST(SwapOut, OnlyTheRunnersNeededForTheHeadAreRevoked) {
  PolicyConfig config = virtual_gpu();
  config.fixed_quantum = 4s;
  Harness h(config);
  h.add_and_request(1, 6 * kGiB);
  h.now += 1s;
  h.add_and_request(2, 6 * kGiB);
  h.add_and_request(3, 8 * kGiB);  // needs one of them gone: 6 + 8 fits, 12 + 8 does not
  const auto actions = h.fire();
  EXPECT_EQ(h.now, MonoTime{100s} + 4s);  // 1's turn ends first
  ASSERT_TRUE(revoke_of(actions, 1));
  EXPECT_TRUE(revoke_of(actions, 1)->swap_out);  // 8 + 6 + 6 > 18: 1 must leave the device
  EXPECT_FALSE(revoke_of(actions, 2));           // 2 keeps running
  h.release(1);
  EXPECT_TRUE(granted(h.last, 3));
  EXPECT_EQ(h.state(2), ClientState::kRunning);
}

TEST(SwapOut, WaitsUntilEnoughTurnsHaveEnded) {
  PolicyConfig config = virtual_gpu();
  config.fixed_quantum = 4s;
  Harness h(config);
  h.add_and_request(1, 6 * kGiB);
  h.now += 1s;
  h.add_and_request(2, 6 * kGiB);
  h.add_and_request(3, 14 * kGiB);  // needs both gone
  // Revoking 1 alone would not help 3, so 1 keeps running until 2's turn ends as well.
  EXPECT_EQ(h.policy.next_deadline(), MonoTime{100s} + 5s);
  const auto actions = h.fire();
  EXPECT_TRUE(revoke_of(actions, 1));
  EXPECT_TRUE(revoke_of(actions, 2));
}

// A runner whose turn will end with a swap-out is told as soon as the head starts waiting for it,
// once per grant, so it can ready the swap during its turn; one that will leave its memory on the
// device, or that nobody waits for, is told nothing.
TEST(SwapOut, ARunnerIsToldOfItsSwapOutWhenTheTurnIsPlanned) {
  PolicyConfig config = virtual_gpu(Mode::kExclusive);
  config.fixed_quantum = 4s;
  Harness h(config);
  EXPECT_TRUE(only<SendSwapNotice>(h.add_and_request(1, 9 * kGiB)).empty()) << "nobody waits";
  h.now += 1s;
  const std::vector<Action> planned = h.add_and_request(2, 10 * kGiB);  // 19Gi: does not fit
  ASSERT_EQ(only<SendSwapNotice>(planned).size(), 1u);
  EXPECT_EQ(only<SendSwapNotice>(planned)[0].client, 1u);
  EXPECT_EQ(only<SendSwapNotice>(planned)[0].epoch, h.epoch(1));
  const std::uint64_t announced = only<SendSwapNotice>(planned)[0].bytes;
  EXPECT_EQ(h.state(1), ClientState::kRunning) << "advice: its turn goes on";
  EXPECT_EQ(h.client(1).counters.swap_notices, 1u);
  h.now += 1s;
  EXPECT_TRUE(only<SendSwapNotice>(h.feed(UsageReported{1, 9 * kGiB, 9 * kGiB})).empty())
      << "once per grant";
  const auto revoke = revoke_of(h.fire(), 1);
  ASSERT_TRUE(revoke);
  EXPECT_TRUE(revoke->swap_out);
  EXPECT_EQ(revoke->swap_bytes, announced) << "the notice named the revoke's target";
  // 2 runs next and 1 waits for it: 2 is told at its grant.
  const std::vector<Action> next = h.release(1);
  EXPECT_TRUE(granted(next, 2));
  ASSERT_EQ(only<SendSwapNotice>(next).size(), 1u);
  EXPECT_EQ(only<SendSwapNotice>(next)[0].client, 2u);
  EXPECT_EQ(only<SendSwapNotice>(next)[0].epoch, h.epoch(2));
}

TEST(SwapOut, NoNoticeWhenTheHandOffMovesNoMemory) {
  PolicyConfig config = virtual_gpu(Mode::kExclusive);
  config.fixed_quantum = 1s;
  Harness h(config);
  h.add_and_request(1, 9 * kGiB);
  EXPECT_TRUE(only<SendSwapNotice>(h.add_and_request(2, 9 * kGiB)).empty());  // 18Gi fit
  EXPECT_FALSE(revoke_of(h.fire(), 1)->swap_out);
}

TEST(Turns, RevokedClientIsRequeuedBehindTheOthers) {
  PolicyConfig config = virtual_gpu(Mode::kExclusive);
  config.fixed_quantum = 1s;
  Harness h(config);
  h.add_and_request(1, 1 * kGiB);
  h.add_and_request(2, 1 * kGiB);
  h.add_and_request(3, 1 * kGiB);
  h.fire();
  const auto actions = h.release(1);
  EXPECT_TRUE(granted(actions, 2));
  EXPECT_EQ(wait_of(actions, 1), WaitReason::kTurn);  // told why it waits again
  EXPECT_EQ(h.policy.view(h.now).queue, (std::vector<ClientId>{3, 1}));
  h.request(1);  // asking again while queued changes nothing
  EXPECT_EQ(h.policy.view(h.now).queue, (std::vector<ClientId>{3, 1}));
}

}  // namespace
}  // namespace nvshare::policy::testing

namespace nvshare::policy::testing {
namespace {

// Exclusive mode: a waiter that fits beside the holder's memory makes the scheduler ask the holder,
// once per grant, to hand over as soon as it is idle; the holder keeps its grant until it releases.
TEST(Yield, ExclusiveHolderIsAskedOnceWhenAFittingClientWaits) {
  Harness h(virtual_gpu(Mode::kExclusive));
  h.add_and_request(1, 4 * kGiB);
  EXPECT_TRUE(only<SendYield>(h.last).empty()) << "nobody waits yet";
  const std::vector<Action> actions = h.add_and_request(2, 4 * kGiB);
  ASSERT_EQ(only<SendYield>(actions).size(), 1u);
  EXPECT_EQ(only<SendYield>(actions)[0].client, 1u);
  EXPECT_EQ(only<SendYield>(actions)[0].epoch, h.epoch(1));
  EXPECT_EQ(h.state(1), ClientState::kRunning);
  EXPECT_TRUE(only<SendYield>(h.add_and_request(3, 4 * kGiB)).empty()) << "once per grant";
  // The holder releases (its idle release): the head runs, and is asked in turn while 3 waits.
  const std::vector<Action> after = h.release(1);
  EXPECT_TRUE(granted(after, 2));
  ASSERT_EQ(only<SendYield>(after).size(), 1u);
  EXPECT_EQ(only<SendYield>(after)[0].client, 2u);
}

// A holder that has had less of the GPU than the head keeps its turn until its fair clock has
// caught up: a job that idles between steps is not handed over at every gap to one that never
// idles.
TEST(Yield, AHolderIsAskedOnlyOnceItHasHadAsMuchAsTheHead) {
  PolicyConfig config = virtual_gpu(Mode::kExclusive);
  config.fixed_quantum = 5s;
  Harness h(config);
  h.add_and_request(1, 4 * kGiB);
  ASSERT_EQ(only<SendYield>(h.add_and_request(2, 4 * kGiB)).size(), 1u) << "both at 0 s";
  h.advance(3s);
  std::vector<Action> actions = h.release(1);  // 1 answers the yield after 3 s of work
  ASSERT_TRUE(granted(actions, 2));
  actions = h.request(1);  // and wants the GPU again at once: 3 s billed, 2 has had none
  EXPECT_TRUE(only<SendYield>(actions).empty());
  // When 2 is within the slack (a quarter of the 0.5 s slice) of the 3 s 1 has had.
  const MonoTime from = h.now;
  EXPECT_TIME_NEAR(h.policy.next_deadline(), from + 2875ms);
  actions = h.fire();
  ASSERT_EQ(only<SendYield>(actions).size(), 1u);
  EXPECT_EQ(only<SendYield>(actions)[0].client, 2u);
  EXPECT_EQ(h.state(2), ClientState::kRunning) << "a yield is not a revoke";
  // 2 never idles: its turn ends once it is half a slice ahead of 1, well before its quantum.
  EXPECT_TIME_NEAR(h.policy.next_deadline(), from + 3250ms);
  const auto revoke = revoke_of(h.fire(), 2);
  ASSERT_TRUE(revoke);
  EXPECT_EQ(revoke->reason, RevokeReason::kTurn);
  EXPECT_FALSE(revoke->swap_out);
}

// Turns that move no memory follow the fair clocks: two clients that never idle alternate in turns
// of a slice (0.5 s) each, with nothing to swap, long before a quantum would end them; a 30% cap
// beside an uncapped client (entitled 70%) takes turns of 0.15 s against 0.35 s. Their buckets
// cycle by the same slice (0.15 s on, 0.35 s off; 0.35 s on, 0.15 s off), so turns end by either
// rule.
TEST(Turns, TurnsThatMoveNoMemoryLastASliceTimesTheWeight) {
  for (const std::uint8_t cap : {std::uint8_t{100}, std::uint8_t{30}}) {
    SCOPED_TRACE(static_cast<int>(cap));
    Harness h(virtual_gpu(cap == 100 ? Mode::kExclusive : Mode::kAuto));
    h.add_and_request(1, 4 * kGiB, cap);
    h.add_and_request(2, 4 * kGiB);
    std::vector<Duration> turns[3];
    MonoTime granted_at = h.now;
    ClientId holder = 1;
    for (int i = 0; i < 40; ++i) {
      std::vector<SendRevoke> revokes;
      while (revokes.empty()) revokes = only<SendRevoke>(h.fire());  // yields come first
      ASSERT_EQ(revokes.size(), 1u);
      EXPECT_EQ(revokes[0].client, holder);
      if (cap == 100) {
        EXPECT_EQ(revokes[0].reason, RevokeReason::kTurn);
      } else {
        EXPECT_THAT(revokes[0].reason, ::testing::AnyOf(RevokeReason::kTurn, RevokeReason::kQuota));
      }
      EXPECT_FALSE(revokes[0].swap_out);
      h.now += 2ms;  // the drain
      turns[holder].push_back(h.now - granted_at);
      const std::vector<Action> actions = h.feed(Released{holder, revokes[0].epoch, 0ms, 2ms});
      holder = holder == 1 ? 2 : 1;
      ASSERT_TRUE(granted(actions, holder));
      granted_at = h.now;
    }
    const double weight = cap / 100.0;
    const double other = cap == 100 ? 1.0 : 1.0 - weight;
    // Past the first turns, every turn is the slice times the weight, within a few drains (each
    // drain is billed to the client that drains, which the next turn makes up for).
    EXPECT_NEAR(to_seconds(turns[1].back()), 0.5 * weight, 0.01);
    EXPECT_NEAR(to_seconds(turns[2].back()), 0.5 * other, 0.01);
  }
}

// Idle time earns no precedence: a client that comes back starts level with the least-served
// active client, so the holder it interrupted is not kept waiting for the time it was away.
TEST(Yield, ComingBackFromIdleEarnsNoPrecedence) {
  Harness h(virtual_gpu(Mode::kExclusive));
  h.add(2, 4 * kGiB);
  h.add_and_request(1, 4 * kGiB);
  h.advance(10s);  // 1 alone for 10 s; 2 idle
  ASSERT_EQ(only<SendYield>(h.request(2)).size(), 1u);
  ASSERT_TRUE(granted(h.release(1), 2));
  const std::vector<Action> actions = h.request(1);
  ASSERT_EQ(only<SendYield>(actions).size(), 1u) << "2 came in level with 1, not 10 s behind";
  EXPECT_EQ(only<SendYield>(actions)[0].client, 2u);
}

TEST(Yield, NoYieldWhenTheHandOffWouldMoveMemory) {
  Harness h(virtual_gpu(Mode::kExclusive));  // 18 GiB usable
  h.add_and_request(1, 12 * kGiB);
  EXPECT_TRUE(only<SendYield>(h.add_and_request(2, 12 * kGiB)).empty());
}

TEST(Yield, AutoModeNeverAsks) {
  Harness h(virtual_gpu(Mode::kAuto));
  h.add_and_request(1, 12 * kGiB);
  EXPECT_TRUE(only<SendYield>(h.add_and_request(2, 12 * kGiB)).empty());
  EXPECT_TRUE(only<SendYield>(h.advance(60s)).empty());
}

}  // namespace
}  // namespace nvshare::policy::testing

// Priority classes: the interference budget and the floor (docs/scheduling.md, "Priority
// classes"). A high service and a low trainer on a 24 GiB GPU, each 1 GiB.
#include <gtest/gtest.h>

#include "harness.h"

namespace nvshare::policy::testing {
namespace {

constexpr ClientId kService = 1;
constexpr ClientId kTrainer = 2;

class Interference : public ::testing::Test {
 protected:
  explicit Interference(PolicyConfig config = device_gpu()) : h(config) {
    h.feed(Registered{kService, high()});
    h.feed(UsageReported{kService, kGiB, kGiB, 0, {}});
    h.feed(Registered{kTrainer, low()});
    h.feed(UsageReported{kTrainer, kGiB, kGiB, 0, {}});
    h.request(kService);
    h.request(kTrainer);
  }

  static Limits high() {
    Limits l;
    l.priority = protocol::priority_code(Priority::kHigh);
    return l;
  }
  static Limits low() {
    Limits l;
    l.priority = protocol::priority_code(Priority::kLow);
    return l;
  }

  bool yield_sent(const std::vector<Action>& actions) const {
    return !only<SendYield>(actions).empty();
  }

  // The service hands over at an idle moment (it was asked to yield), the trainer runs in the gap
  // for `gap`, the service comes back (the trainer is revoked and drains beside it for `drain`),
  // and the service's step lasts `step` until its next hand-over.
  std::vector<Action> one_step(Duration gap, Duration drain, Duration step) {
    h.release(kService);
    EXPECT_TRUE(granted(h.last, kTrainer)) << "the trainer runs in the service's idle moment";
    h.now += gap;
    h.request(kService);
    EXPECT_TRUE(granted(h.last, kService)) << "the service is granted at once";
    EXPECT_EQ(revoke_of(h.last, kTrainer)->reason, RevokeReason::kPriority);
    h.now += drain;
    std::vector<Action> after_drain = h.release(kTrainer);
    h.now += step - drain;
    return after_drain;
  }

  Harness h;
};

TEST_F(Interference, AShortDrainIsFreeAndTheTrainerKeepsEveryGap) {
  ASSERT_EQ(h.state(kService), ClientState::kRunning);
  // Steps of 20 ms; drains of 1 ms (a twentieth of a step) cost nothing once the service's step is
  // known. Charged, 50 of them would spend the budget (20 ms, and 0.5% of the 1 s they take).
  for (int i = 0; i < 50; ++i) {
    const std::vector<Action> after = one_step(1ms, 1ms, 20ms);
    EXPECT_TRUE(yield_sent(after)) << "step " << i << ": the trainer was held back";
    EXPECT_TRUE(only<SendContended>(after).empty()) << "step " << i;
  }
}

TEST_F(Interference, LongDrainsSpendTheBudgetAndHoldTheTrainerBack) {
  // Steps of 2 ms; drains of 40 ms (a kernel much longer than the service's idle moments).
  one_step(1ms, 40ms, 2ms);
  std::vector<Action> after = one_step(1ms, 40ms, 2ms);
  // 20 ms of burst, 80 ms charged (the first drain had no step to compare with, the second is 20
  // steps long): the trainer waits, and the service is not asked to yield.
  EXPECT_EQ(wait_of(after, kTrainer), WaitReason::kPriority);
  EXPECT_FALSE(yield_sent(after));
  EXPECT_EQ(h.client(kTrainer).state, ClientState::kWaiting);
  const std::string text = h.policy.explain(kTrainer, h.now);
  EXPECT_NE(text.find("past the interference budget"), std::string::npos) << text;
  // It runs again once the budget is repaid (0.5% of wall time) or at the floor (4 s), whichever
  // comes first: here the floor.
  const std::vector<Action> soon = h.advance(3900ms);
  EXPECT_FALSE(yield_sent(soon)) << "held back for less than the floor";
  const std::vector<Action> at_floor = h.advance(200ms);
  EXPECT_TRUE(yield_sent(at_floor)) << "the floor lets the trainer through";
}

// Drains short in time but over the free share slow one step each: each costs a whole cycle of the
// service (a step and its gap), so the budget bounds how many of its steps are slowed, not only
// for how long. Steps of 2 ms, gaps of 1 ms, drains of 0.5 ms: charged as 0.5 ms each, the 20 ms
// burst would last about 40 steps; charged as 3 ms cycles, about 7.
TEST_F(Interference, AShortChargedDrainCostsACycleOfTheService) {
  int steps = 0;
  while (steps < 100) {
    const std::vector<Action> after = one_step(1ms, 500us, 2ms);
    ++steps;
    if (!yield_sent(after)) break;
  }
  EXPECT_EQ(h.client(kTrainer).state, ClientState::kWaiting);
  EXPECT_GE(steps, 6);
  EXPECT_LE(steps, 9) << "the trainer slowed " << steps << " steps on a 20 ms budget";
}

TEST_F(Interference, AFloorGrantTheTrainerCouldNotUseDoesNotCount) {
  one_step(1ms, 40ms, 2ms);
  one_step(1ms, 40ms, 2ms);
  h.advance(4100ms);  // the floor has passed: the service was asked to yield
  // The service comes back before the trainer submitted anything (its drain takes 30 us).
  const std::vector<Action> unused = one_step(1ms, 30us, 2ms);
  EXPECT_TRUE(yield_sent(unused)) << "the next idle moment goes to the trainer again";
  // This time it had a kernel in flight: the next floor counts from its release.
  const std::vector<Action> used = one_step(1ms, 40ms, 2ms);
  EXPECT_FALSE(yield_sent(used));
  EXPECT_EQ(wait_of(used, kTrainer), WaitReason::kPriority);
}

// Held back, the trainer gets none of the service's idle moments while the service's grant spans
// its steps: the service is told once per grant (contended), so that it releases at its next pause
// rather than after its whole idle release.
TEST_F(Interference, AHeldBackTrainerHasTheServiceToldOncePerGrant) {
  one_step(1ms, 40ms, 2ms);
  const std::vector<Action> held = one_step(1ms, 40ms, 2ms);
  ASSERT_EQ(wait_of(held, kTrainer), WaitReason::kPriority);
  const std::vector<SendContended> told = only<SendContended>(held);
  ASSERT_EQ(told.size(), 1u);
  EXPECT_EQ(told[0].client, kService);
  EXPECT_EQ(told[0].epoch, h.client(kService).epoch);
  EXPECT_TRUE(only<SendContended>(h.advance(1s)).empty()) << "once per grant";
  const std::uint64_t counted = h.client(kService).counters.contended;
  // The service pauses and releases; the trainer runs until the service comes back, and drains
  // 40 ms beside it: held back again, the service is told again for its new grant.
  h.release(kService);
  ASSERT_TRUE(granted(h.last, kTrainer));
  h.now += 500ms;
  h.request(kService);
  ASSERT_TRUE(granted(h.last, kService));
  h.now += 40ms;
  const std::vector<Action> again = h.release(kTrainer);
  const std::vector<SendContended> told_again = only<SendContended>(again);
  ASSERT_EQ(told_again.size(), 1u);
  EXPECT_EQ(told_again[0].epoch, h.client(kService).epoch);
  EXPECT_GT(told_again[0].epoch, told[0].epoch);
  EXPECT_EQ(h.client(kService).counters.contended, counted + 1);
}

TEST_F(Interference, TheTrainerRunsAtOnceWhenTheServiceGoesIdle) {
  one_step(1ms, 40ms, 2ms);
  one_step(1ms, 40ms, 2ms);
  // The service releases by itself after its idle release (it was asked to yield by nobody): it is
  // no longer between steps, and the trainer runs although the budget is spent.
  h.now += 100ms;
  h.release(kService);
  EXPECT_TRUE(granted(h.last, kTrainer));
}

TEST(InterferenceConfig, TheKnobsAreChecked) {
  PolicyConfig config = device_gpu();
  config.priority_interference = 1.5;
  EXPECT_FALSE(validate(config).ok());
  config.priority_interference = 0.005;
  config.priority_floor = 1ms;
  EXPECT_FALSE(validate(config).ok());
  config.priority_floor = 4s;
  EXPECT_TRUE(validate(config).ok());
}

}  // namespace
}  // namespace nvshare::policy::testing

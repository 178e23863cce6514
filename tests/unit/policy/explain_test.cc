// explain(): one sentence with the numbers that decide.
#include <gtest/gtest.h>

#include "harness.h"

namespace nvshare::policy::testing {
namespace {

// EXPECT_THAT(text, HasSubstr(part)) without depending on gmock.
::testing::AssertionResult HasSubstrImpl(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "\n  text: " << text << "\n  lacks: " << part;
}
#define EXPECT_THAT(text, part) EXPECT_TRUE(HasSubstrImpl((text), (part)))
std::string HasSubstr(std::string part) { return part; }

TEST(Explain, WaitingForMemoryNamesSizesRunnersAndTheTurn) {
  PolicyConfig config = device_gpu();  // 24Gi reported by the clients, 21.6Gi usable
  config.fixed_quantum = 5s;
  Harness h(config);
  h.add_and_request(3, 10 * kGiB);
  h.now += 900ms;
  h.add_and_request(5, 8 * kGiB);
  h.add_and_request(7, 13 * kGiB);  // fits once 3 has left
  h.now += 1200ms;
  const std::string text = h.policy.explain(7, h.now);
  EXPECT_THAT(text, HasSubstr("client 7 waits for memory: it needs 13Gi but 3.6Gi of 21.6Gi usable "
                              "is free beside clients 3, 5 (running for 2.1 s, 1.2 s)"));
  EXPECT_THAT(text, HasSubstr("its turn comes when client 3's quantum of 5.0 s ends in 2.9 s"));
}

// A holder revoked with a swap-out that outlasts its grace and allowance: the view says it is
// (late at) swapping out, and explain says what that may be and what it costs others.
TEST(Explain, AHolderLateAtItsSwapOutIsSaidToBeSo) {
  PolicyConfig config = virtual_gpu();  // 18Gi usable
  config.revoke_grace = 1s;
  Harness h(config);
  h.add_and_request(1, 10 * kGiB);
  h.add_and_request(2, 10 * kGiB);  // does not fit beside 1: 1 is revoked with a swap-out
  ASSERT_TRUE(revoke_of(until_revoked(h, 1), 1));
  EXPECT_TRUE(h.client(1).swapping_out);
  EXPECT_FALSE(h.client(2).swapping_out);
  h.advance(30s);  // never releases
  ASSERT_EQ(h.state(1), ClientState::kUnresponsive);
  EXPECT_TRUE(h.client(1).swapping_out);
  EXPECT_THAT(h.policy.explain(1, h.now),
              HasSubstr("it was asked to swap out: its copy to the host "
                        "may be slower than its grace and swap "
                        "allowance, or it hangs"));
  h.release(1);
  EXPECT_FALSE(h.client(1).swapping_out);
}

TEST(Explain, RunningCappedClientShowsCapShareAndBudget) {
  Harness h(virtual_gpu());
  h.add_and_request(4, 2 * kGiB, 20);  // entry level 0.2 x 0.8 x 0.5 s / 2 = 40 ms
  h.now += 20ms;                       // at 0.8/s
  const std::string text = h.policy.explain(4, h.now);
  EXPECT_THAT(text, HasSubstr("client 4 runs alone"));
  EXPECT_THAT(text, HasSubstr("capped at 20% (effective 20%), used 1.0% over the last 2.0 s, "
                              "budget 24 ms left"));
  EXPECT_THAT(text, HasSubstr("2Gi of 18Gi usable in use"));
}

TEST(Explain, ScaledCapShowsTheEffectivePercent) {
  Harness h(virtual_gpu());
  h.add_and_request(1, 1 * kGiB, 50);
  h.add_and_request(2, 1 * kGiB, 50);
  h.add_and_request(3, 1 * kGiB, 50);
  EXPECT_THAT(h.policy.explain(1, h.now), HasSubstr("capped at 50% (effective 33.3%)"));
  EXPECT_THAT(h.policy.explain(1, h.now), HasSubstr("client 1 runs alone"));
}

TEST(Explain, WaitingForQuotaSaysWhenItMayRunAgain) {
  Harness h(virtual_gpu());
  h.add_and_request(4, 1 * kGiB, 30);
  h.fire();
  h.release(4);
  const std::string text = h.policy.explain(4, h.now + 100ms);
  EXPECT_THAT(text, HasSubstr("client 4 waits for quota: capped at 30% (effective 30%)"));
  EXPECT_THAT(text, HasSubstr("budget 30 ms; it may run again at 105 ms, in 0.2 s"));
}

TEST(Explain, QueuedBehindTheHeadAndExclusiveTurns) {
  PolicyConfig config = virtual_gpu(Mode::kExclusive);
  config.fixed_quantum = 4s;
  config.turn_slice = 10s;  // turns by the quantum
  Harness h(config);
  h.add_and_request(1, 1 * kGiB);
  h.add_and_request(2, 1 * kGiB);
  h.add_and_request(3, 1 * kGiB);
  h.now += 1s;
  EXPECT_THAT(h.policy.explain(2, h.now),
              HasSubstr("client 2 waits for its turn: this GPU runs one client at a time "
                        "(exclusive) and client 1 holds it (for 1.0 s); its turn comes when "
                        "client 1's quantum of 4.0 s ends in 3.0 s"));
  EXPECT_THAT(h.policy.explain(3, h.now),
              HasSubstr("queued behind client 2 (first in line), position 2 of 2"));
  EXPECT_THAT(h.policy.explain(1, h.now),
              HasSubstr("client 2 waits, so its quantum of 4.0 s ends in 3.0 s"));
}

TEST(Explain, ExclusiveHolderSaysWhenItHandsOverAtItsNextIdleMoment) {
  PolicyConfig config = virtual_gpu(Mode::kExclusive);
  config.fixed_quantum = 5s;
  Harness h(config);
  h.add_and_request(1, 1 * kGiB);
  h.add_and_request(2, 1 * kGiB);
  EXPECT_THAT(h.policy.explain(1, h.now),
              HasSubstr("; it was asked to hand over as soon as it is idle"));
  h.now += 3s;
  h.release(1);  // 2 runs; 1 has had 3 s and wants the GPU again at once
  h.request(1);
  const std::string text = h.policy.explain(2, h.now);
  EXPECT_THAT(text, HasSubstr("; it keeps its turn through idle moments until it has had its fair "
                              "part beside client 1, in 2.9 s"));
  EXPECT_THAT(text, HasSubstr("; its fair turn beside client 1 ends in 3.2 s"));
}

TEST(Explain, RevokingUnresponsiveIdleAndUnknown) {
  PolicyConfig config = virtual_gpu(Mode::kExclusive);
  config.fixed_quantum = 1s;
  config.revoke_grace = 2s;
  Harness h(config);
  h.add_and_request(1, 1 * kGiB);
  h.add_and_request(2, 1 * kGiB);
  h.fire();
  h.now += 500ms;
  EXPECT_THAT(h.policy.explain(1, h.now),
              HasSubstr("revoked (turn) 0.5 s ago; it stops blocking others in 1.5 s"));
  EXPECT_THAT(h.policy.explain(2, h.now), HasSubstr("it runs once client 1 releases"));
  h.fire();
  EXPECT_THAT(h.policy.explain(1, h.now + 1s),
              HasSubstr("client 1 ignored a revoke (turn) for 3.0 s and no longer blocks others"));
  h.add(9, 1 * kGiB);
  EXPECT_THAT(h.policy.explain(9, h.now + 2s), HasSubstr("client 9 is idle"));
  EXPECT_THAT(h.policy.explain(9, h.now + 2s), HasSubstr("(idle for 2.0 s)"));
  EXPECT_EQ(h.policy.explain(42, h.now), "");
}

TEST(View, ReportsStateNumbersAndQueue) {
  PolicyConfig config = virtual_gpu();
  config.fixed_quantum = 3s;
  Harness h(config);
  h.add_and_request(1, 12 * kGiB, 40);
  h.add_and_request(2, 12 * kGiB);
  h.now += 1s;
  const GpuView v = h.policy.view(h.now);
  EXPECT_EQ(v.capacity_bytes, 20 * kGiB);
  EXPECT_EQ(v.usable_bytes, 18 * kGiB);
  EXPECT_EQ(v.running_bytes, 12 * kGiB);
  EXPECT_EQ(v.quantum, 3s);
  EXPECT_EQ(v.queue, (std::vector<ClientId>{2}));
  EXPECT_FALSE(v.swap_measured);
  ASSERT_EQ(v.clients.size(), 2u);
  EXPECT_EQ(v.clients[0].state, ClientState::kRunning);
  EXPECT_EQ(v.clients[0].turn_ends, h.now + 2s);
  EXPECT_EQ(v.clients[1].waiting_for, WaitReason::kMemory);
  EXPECT_EQ(v.clients[1].waited_total, 1s);
  EXPECT_EQ(to_string(v.clients[1].state), "waiting");
}

}  // namespace
}  // namespace nvshare::policy::testing

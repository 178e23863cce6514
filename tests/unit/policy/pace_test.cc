// Mode auto with pace reports: saturating clients (a deep queue most of the time they hold the GPU)
// take turns by the fair clocks; the others run beside anyone they fit beside.
#include <gtest/gtest.h>

#include "harness.h"

namespace nvshare::policy::testing {
namespace {

std::vector<Action> report_pace(Harness& h, ClientId id, std::uint16_t permille) {
  const std::uint64_t bytes = h.client(id).allocated_bytes;
  return h.feed(UsageReported{id, bytes, bytes, 0, permille});
}

// Registers a client with a working set and a reported pace.
void add_paced(Harness& h, ClientId id, std::uint64_t bytes, std::uint16_t permille) {
  h.add(id, bytes);
  report_pace(h, id, permille);
}

int running(const Harness& h) {
  int n = 0;
  for (const ClientView& c : h.policy.view(h.now).clients) n += c.state == ClientState::kRunning;
  return n;
}

TEST(Pace, ClassificationHasAGap) {
  EXPECT_FALSE(classify_pace(false, 0));
  EXPECT_FALSE(classify_pace(false, kSaturatingFrom - 1));
  EXPECT_TRUE(classify_pace(false, kSaturatingFrom));
  EXPECT_TRUE(classify_pace(true, kSaturatingUntil));
  EXPECT_FALSE(classify_pace(true, kSaturatingUntil - 1));
}

TEST(Pace, ClientsThatHaveNotReportedRunTogether) {
  Harness h(virtual_gpu());
  h.add_and_request(1, 4 * kGiB);
  EXPECT_TRUE(granted(h.add_and_request(2, 4 * kGiB), 2));
  EXPECT_FALSE(h.client(2).saturating);
}

TEST(Pace, TwoSaturatingClientsTakeTurnsByTheFairClocks) {
  Harness h(virtual_gpu());
  add_paced(h, 1, 4 * kGiB, 950);
  add_paced(h, 2, 4 * kGiB, 900);
  EXPECT_TRUE(granted(h.request(1), 1));
  const auto waits = h.request(2);
  EXPECT_FALSE(granted(waits, 2));
  EXPECT_EQ(wait_of(waits, 2), WaitReason::kTurn);
  EXPECT_NE(h.policy.explain(2, h.now).find("deep queue 90%"), std::string::npos)
      << h.policy.explain(2, h.now);
  // Equal weights, one runner billed at full rate: its turn ends when its clock is the lead (half
  // a slice) ahead of the head's, which entered the slack (a quarter slice) behind it.
  const Duration slice = h.policy.config().turn_slice;
  const auto actions = h.advance(slice);
  const auto revoke = revoke_of(actions, 1);
  ASSERT_TRUE(revoke.has_value());
  EXPECT_EQ(revoke->reason, RevokeReason::kTurn);
  EXPECT_FALSE(revoke->swap_out);
  EXPECT_TRUE(granted(h.release(1), 2));
  EXPECT_EQ(h.state(1), ClientState::kWaiting);
  EXPECT_EQ(running(h), 1);
}

TEST(Pace, ASaturatingAndAnInteractiveClientRunTogether) {
  Harness h(virtual_gpu());
  add_paced(h, 1, 4 * kGiB, 1000);
  add_paced(h, 2, 4 * kGiB, 100);
  h.request(1);
  EXPECT_TRUE(granted(h.request(2), 2));
  EXPECT_TRUE(only<SendRevoke>(h.advance(10s)).empty());
  EXPECT_EQ(running(h), 2);
}

TEST(Pace, ClientsThatBecomeSaturatingWhileRunningTogetherAreSeparated) {
  Harness h(virtual_gpu());
  h.add_and_request(1, 4 * kGiB);
  h.add_and_request(2, 4 * kGiB);
  ASSERT_EQ(running(h), 2);
  EXPECT_TRUE(only<SendRevoke>(report_pace(h, 1, 1000)).empty());
  // Both saturating: the one ahead by its fair clock (here the later grant, clocks equal) leaves,
  // nothing to swap, and waits for its turn.
  const auto actions = report_pace(h, 2, 1000);
  const auto revoke = revoke_of(actions, 2);
  ASSERT_TRUE(revoke.has_value());
  EXPECT_EQ(revoke->reason, RevokeReason::kTurn);
  EXPECT_FALSE(revoke->swap_out);
  h.release(2);
  EXPECT_EQ(h.state(2), ClientState::kWaiting);
  EXPECT_EQ(h.client(2).waiting_for, WaitReason::kTurn);
}

TEST(Pace, AClientThatStopsSaturatingRunsBesideAgain) {
  Harness h(virtual_gpu());
  add_paced(h, 1, 4 * kGiB, 1000);
  add_paced(h, 2, 4 * kGiB, 1000);
  h.request(1);
  h.request(2);
  ASSERT_EQ(h.state(2), ClientState::kWaiting);
  // Above the lower threshold it stays saturating; below it, it is granted beside client 1.
  EXPECT_FALSE(granted(report_pace(h, 2, kSaturatingUntil), 2));
  EXPECT_TRUE(granted(report_pace(h, 2, 0), 2));
  EXPECT_EQ(running(h), 2);
}

TEST(Pace, AnInteractiveClientPassesAHeadThatWaitsOnlyForItsTurn) {
  Harness h(virtual_gpu());
  add_paced(h, 1, 4 * kGiB, 1000);
  add_paced(h, 2, 4 * kGiB, 1000);
  add_paced(h, 3, 4 * kGiB, 0);
  h.request(1);
  h.request(2);  // waits for its turn
  EXPECT_TRUE(granted(h.request(3), 3));
  EXPECT_EQ(h.state(2), ClientState::kWaiting);
}

TEST(Pace, NoClientPassesAHeadItWouldLeaveNoRoomFor) {
  Harness h(virtual_gpu());  // 18 GiB usable
  add_paced(h, 1, 8 * kGiB, 1000);
  add_paced(h, 2, 8 * kGiB, 1000);
  add_paced(h, 3, 4 * kGiB, 0);
  h.swapped_out(2);  // their memory comes in when they run
  h.swapped_out(3);
  h.request(1);
  h.request(2);
  // 8 + 4 fits beside client 1, but then client 2 would no longer fit when its turn comes.
  EXPECT_FALSE(granted(h.request(3), 3));
  EXPECT_EQ(h.client(3).waiting_for, WaitReason::kTurn);
}

// Explain names the wait a runner's neighbour has: a turn among saturating clients it runs beside,
// or memory, whose quantum applies to it too.
TEST(Pace, ExplainTellsATurnAmongSaturatingFromAWaitForMemory) {
  Harness h(virtual_gpu());  // 18 GiB usable
  add_paced(h, 1, 4 * kGiB, 0);
  add_paced(h, 2, 4 * kGiB, 1000);
  add_paced(h, 3, 4 * kGiB, 1000);
  h.request(1);
  h.request(2);
  h.request(3);  // fits, waits for its turn with client 2
  EXPECT_NE(h.policy.explain(1, h.now).find("waits for a turn among saturating clients"),
            std::string::npos)
      << h.policy.explain(1, h.now);

  Harness m(virtual_gpu());
  add_paced(m, 1, 4 * kGiB, 0);
  add_paced(m, 2, 8 * kGiB, 1000);
  add_paced(m, 3, 8 * kGiB, 1000);
  m.swapped_out(2);  // their memory comes in when they run
  m.swapped_out(3);
  m.request(1);
  m.request(2);
  m.request(3);  // 4 + 8 + 8 GiB do not fit: it waits for memory
  ASSERT_EQ(m.client(3).waiting_for, WaitReason::kMemory);
  const std::string text = m.policy.explain(1, m.now);
  EXPECT_EQ(text.find("turn among saturating"), std::string::npos) << text;
  EXPECT_NE(text.find("quantum"), std::string::npos) << text;
}

TEST(Pace, ExclusiveModeIgnoresThePace) {
  Harness h(virtual_gpu(Mode::kExclusive));
  add_paced(h, 1, 4 * kGiB, 0);
  add_paced(h, 2, 4 * kGiB, 0);
  h.request(1);
  EXPECT_FALSE(granted(h.request(2), 2));
}

TEST(Pace, StatusShowsThePace) {
  Harness h(virtual_gpu());
  h.add(1, 4 * kGiB);
  EXPECT_FALSE(h.client(1).deep_queue_permille.has_value());
  report_pace(h, 1, 650);
  EXPECT_EQ(h.client(1).deep_queue_permille, std::optional<std::uint16_t>(650));
  EXPECT_TRUE(h.client(1).saturating);
}

}  // namespace
}  // namespace nvshare::policy::testing

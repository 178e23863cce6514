// Parked memory: what a client keeps on the device while it holds no grant (it idles with its
// memory in place, waits after a turn that moved none, or allocated before its first grant) counts
// in every fit check, and is evicted (SendEvict) when the head of the queue needs the room.
#include <gtest/gtest.h>

#include "harness.h"

namespace nvshare::policy::testing {
namespace {

void report(Harness& h, ClientId id, std::uint64_t bytes, std::uint16_t permille) {
  h.feed(UsageReported{id, bytes, bytes, 0, permille});
}

std::uint64_t parked_of(const Harness& h, ClientId id) { return h.client(id).parked_bytes; }

// Everything on the device: the holders' working sets and the memory parked by the others.
std::uint64_t on_device(const Harness& h) {
  const GpuView view = h.policy.view(h.now);
  std::uint64_t bytes = view.running_bytes;
  for (const ClientView& c : view.clients) bytes += c.parked_bytes;
  return bytes;
}

TEST(Parked, AWaiterWhoseMemoryStayedOnTheDeviceCountsForOthers) {
  Harness h(virtual_gpu());  // 18 GiB usable
  h.add(1, 6 * kGiB);
  report(h, 1, 6 * kGiB, 1000);
  h.add(2, 6 * kGiB);
  report(h, 2, 6 * kGiB, 1000);
  h.request(1);
  h.request(2);  // two saturating clients that fit take turns: 2 waits, its memory in place
  ASSERT_EQ(h.state(2), ClientState::kWaiting);
  EXPECT_EQ(parked_of(h, 2), 6 * kGiB);
  h.add_on_host(3, 8 * kGiB);
  // 6 (running) + 8 would fit, but 2's 6 GiB are there too: 20 > 18.
  const auto actions = h.request(3);
  EXPECT_FALSE(granted(actions, 3));
  EXPECT_EQ(wait_of(actions, 3), WaitReason::kMemory);
  // Turns go on, and whoever runs, the device never holds more than usable.
  for (int i = 0; i < 400; ++i) {
    for (const SendRevoke& r : only<SendRevoke>(h.advance(100ms))) {
      if (h.state(r.client) == ClientState::kRevoking) h.release(r.client);
    }
    ASSERT_LE(on_device(h), 18 * kGiB) << "at step " << i;
  }
  EXPECT_GE(h.client(3).counters.grants, 1u) << "the third client never ran";
}

TEST(Parked, AHeadThatDoesNotFitBesideAnIdleClientsMemoryHasItEvicted) {
  Harness h(virtual_gpu());
  h.add_and_request(1, 12 * kGiB);
  h.release(1);  // idle, its 12 GiB still on the device
  EXPECT_EQ(h.state(1), ClientState::kIdle);
  EXPECT_EQ(parked_of(h, 1), 12 * kGiB);
  h.add_on_host(2, 12 * kGiB);
  const auto asked = h.request(2);
  EXPECT_FALSE(granted(asked, 2));
  ASSERT_EQ(only<SendEvict>(asked).size(), 1u);
  EXPECT_EQ(only<SendEvict>(asked)[0].client, 1u);
  EXPECT_EQ(h.client(1).counters.evictions, 1u);
  EXPECT_NE(h.policy.explain(2, h.now).find("asked to move it to the host"), std::string::npos)
      << h.policy.explain(2, h.now);
  // Nothing is asked twice while the eviction runs.
  EXPECT_TRUE(only<SendEvict>(h.feed(UsageReported{2, 12 * kGiB, 0, 0, {}})).empty());
  // Its usage shows the memory moved: the head runs.
  EXPECT_TRUE(granted(h.swapped_out(1), 2));
  EXPECT_EQ(parked_of(h, 1), 0u);
}

TEST(Parked, AnEvictionLeftUnansweredStopsCountingAfterTheGraceAndTheSwapAllowance) {
  PolicyConfig config = virtual_gpu();
  Harness h(config);
  h.add_and_request(1, 12 * kGiB);
  h.release(1);
  h.add_on_host(2, 12 * kGiB);
  const MonoTime asked_at = h.now;
  ASSERT_EQ(only<SendEvict>(h.request(2)).size(), 1u);
  const Duration allowance = std::min(client_swap_time(config, 12 * kGiB, 0, config.device_bytes),
                                      config.swap_allowance_max);
  ASSERT_TRUE(h.policy.next_deadline());
  EXPECT_EQ(*h.policy.next_deadline(), asked_at + config.revoke_grace + allowance);
  EXPECT_FALSE(granted(h.advance(config.revoke_grace + allowance - 1ms), 2));
  EXPECT_TRUE(granted(h.advance(1ms), 2));
  EXPECT_EQ(parked_of(h, 1), 0u);
  // Its memory counts again once it has held a grant since (2, idle in its turn, is evicted for
  // it).
  h.answer_evictions(h.release(2));
  h.request(1);
  h.answer_evictions(h.last);
  EXPECT_EQ(h.state(1), ClientState::kRunning);
  h.release(1);
  EXPECT_EQ(parked_of(h, 1), 12 * kGiB);
}

TEST(Parked, IdleClientsGoFirstAndNoMoreThanTheHeadNeeds) {
  Harness h(virtual_gpu());  // 18 GiB usable
  h.add(1, 4 * kGiB);        // idle, its 4 GiB on the device
  h.add_and_request(2, 6 * kGiB);
  ASSERT_EQ(h.state(2), ClientState::kRunning);
  h.add_on_host(4, 12 * kGiB);
  h.request(4);  // 6 + 12 + 4 > 18: waits for 2's turn to end (12 + 4 fit on an idle GPU)
  EXPECT_TRUE(only<SendEvict>(h.last).empty());
  h.feed(Registered{3, Limits{}});
  h.request(3);  // behind the head
  ASSERT_EQ(h.state(3), ClientState::kWaiting);
  // 3 allocates 4 GiB while it waits: 12 + 8 > 18, so 2 GiB must go. The idle client goes, the
  // waiter keeps its memory.
  const auto actions = h.feed(UsageReported{3, 4 * kGiB, 4 * kGiB, 0, {}});
  ASSERT_EQ(only<SendEvict>(actions).size(), 1u);
  EXPECT_EQ(only<SendEvict>(actions)[0].client, 1u);
  EXPECT_TRUE(only<SendEvict>(h.feed(UsageReported{3, 4 * kGiB, 4 * kGiB, 0, {}})).empty())
      << "asked once";
  EXPECT_EQ(h.client(3).counters.evictions, 0u);
}

// A lower class never moves a higher class's memory: a low head that cannot fit beside a high
// client's parked memory waits for it (reason priority), and evicts only lower or equal classes.
TEST(Parked, ALowerClassNeverEvictsAHigherClassesMemory) {
  Harness h(virtual_gpu());  // 18 GiB usable
  Limits high;
  high.priority = protocol::priority_code(Priority::kHigh);
  Limits low;
  low.priority = protocol::priority_code(Priority::kLow);
  h.feed(Registered{1, high});
  h.feed(UsageReported{1, 10 * kGiB, 10 * kGiB, 0, {}});
  h.request(1);
  h.release(1);  // the high service idles, its 10 GiB kept on the device
  h.feed(Registered{2, low});
  h.feed(UsageReported{2, 12 * kGiB, 0, 0, {}});  // on the host
  const auto actions = h.request(2);
  EXPECT_FALSE(granted(actions, 2));
  EXPECT_TRUE(only<SendEvict>(actions).empty());
  EXPECT_EQ(wait_of(actions, 2), WaitReason::kPriority);
  EXPECT_NE(h.policy.explain(2, h.now).find("a lower class never moves a higher class's memory"),
            std::string::npos)
      << h.policy.explain(2, h.now);
  // An idle client of its own class has its memory moved for it.
  h.feed(Registered{3, low});
  h.feed(UsageReported{3, 8 * kGiB, 8 * kGiB, 0, {}});
  h.request(3);  // runs beside the parked 10 GiB
  ASSERT_EQ(h.state(3), ClientState::kRunning);
  h.release(3);  // and idles, 8 GiB parked
  EXPECT_EQ(h.state(3), ClientState::kIdle);
  h.feed(Disconnected{1});  // the high service leaves: 2 fits once 3's memory goes
  const auto next = h.last;
  ASSERT_EQ(only<SendEvict>(next).size(), 1u);
  EXPECT_EQ(only<SendEvict>(next)[0].client, 3u);
  EXPECT_TRUE(granted(h.answer_evictions(next), 2));
}

// A runner that allocates more after its grant, past what fits beside the memory others keep
// parked, has that memory moved out for it (a runner is never revoked for parked memory).
TEST(Parked, ARunnerThatGrowsHasParkedMemoryEvicted) {
  Harness h(virtual_gpu());  // 18 GiB usable
  h.add_and_request(1, 4 * kGiB);
  h.add(2, 8 * kGiB);  // idle, 8 GiB on the device: 12 fit
  EXPECT_TRUE(only<SendEvict>(h.last).empty());
  const auto grown = h.feed(UsageReported{1, 12 * kGiB, 12 * kGiB, 0, {}});
  ASSERT_EQ(only<SendEvict>(grown).size(), 1u);
  EXPECT_EQ(only<SendEvict>(grown)[0].client, 2u);
  EXPECT_FALSE(revoke_of(grown, 1)) << "the runner keeps running";
  h.swapped_out(2);
  EXPECT_EQ(on_device(h), 12 * kGiB);
}

TEST(Parked, AnOlderClientsMemoryIsNotCounted) {
  Harness h(virtual_gpu());
  h.feed(Registered{1, Limits{}, /*evictable=*/false});
  h.feed(UsageReported{1, 12 * kGiB, 12 * kGiB, 0, {}});
  h.request(1);
  h.release(1);
  EXPECT_EQ(parked_of(h, 1), 0u);
  h.add_on_host(2, 12 * kGiB);
  const auto actions = h.request(2);
  EXPECT_TRUE(granted(actions, 2));
  EXPECT_TRUE(only<SendEvict>(actions).empty());
}

TEST(Parked, AGrantOvertakesAPendingEviction) {
  Harness h(virtual_gpu());
  h.add_and_request(1, 12 * kGiB);
  h.release(1);
  h.add_on_host(2, 12 * kGiB);
  ASSERT_EQ(only<SendEvict>(h.request(2)).size(), 1u);
  h.feed(Disconnected{2});  // the head leaves before the eviction is answered
  EXPECT_TRUE(granted(h.request(1), 1));
  EXPECT_EQ(h.policy.next_deadline(), std::nullopt) << "no eviction deadline is left";
  h.release(1);
  EXPECT_EQ(parked_of(h, 1), 12 * kGiB);
}

}  // namespace
}  // namespace nvshare::policy::testing

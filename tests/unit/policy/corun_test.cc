// Who runs together: the fit rule, the reserve, capacity, exclusive mode, FIFO order, oversize
// clients.
#include <gtest/gtest.h>

#include "harness.h"

namespace nvshare::policy::testing {
namespace {

TEST(CoRun, ClientsThatFitRunTogether) {
  Harness h(virtual_gpu());
  EXPECT_TRUE(granted(h.add_and_request(1, 8 * kGiB), 1));
  EXPECT_TRUE(granted(h.add_and_request(2, 10 * kGiB), 2));  // 8 + 10 = 18Gi usable exactly
  EXPECT_EQ(h.state(1), ClientState::kRunning);
  EXPECT_EQ(h.state(2), ClientState::kRunning);
  EXPECT_EQ(h.policy.view(h.now).running_bytes, 18 * kGiB);
}

TEST(CoRun, ClientThatDoesNotFitWaitsForMemory) {
  Harness h(virtual_gpu());
  h.add_and_request(1, 8 * kGiB);
  const auto actions = h.add_and_request(2, 10 * kGiB + 1);
  EXPECT_FALSE(granted(actions, 2));
  EXPECT_EQ(wait_of(actions, 2), WaitReason::kMemory);
  EXPECT_EQ(h.state(2), ClientState::kWaiting);
  EXPECT_EQ(h.client(2).waiting_for, WaitReason::kMemory);
}

TEST(CoRun, ReserveIsKeptFree) {
  PolicyConfig config = virtual_gpu();
  config.reserve_fraction = 0.5;  // 10Gi usable of 20Gi
  Harness h(config);
  h.add_and_request(1, 6 * kGiB);
  EXPECT_FALSE(granted(h.add_and_request(2, 5 * kGiB), 2));
  EXPECT_EQ(h.policy.view(h.now).usable_bytes, 10 * kGiB);

  config.reserve_fraction = 0;  // the whole 20Gi: now 6 + 5 fits
  EXPECT_TRUE(granted(h.policy.reconfigure(config, h.now), 2));
}

TEST(CoRun, CapacityIsTheDevicesMemory) {
  Harness h(device_gpu());  // no virtual capacity: the 24Gi the device has
  h.add(1, 8 * kGiB);
  h.add(2, 11 * kGiB);
  EXPECT_EQ(h.policy.view(h.now).capacity_bytes, 24 * kGiB);
  h.request(1);
  EXPECT_TRUE(granted(h.request(2), 2));  // 19Gi of 21.6Gi usable
  h.add(3, 3 * kGiB);
  EXPECT_FALSE(granted(h.request(3), 3));  // 22Gi would not fit
}

TEST(CoRun, VirtualCapacityOverridesTheDevicesMemory) {
  PolicyConfig config = device_gpu();
  config.device_bytes = 80 * kGiB;
  config.capacity_bytes = 10 * kGiB;  // a small GPU emulated on a big one: 9Gi usable
  Harness h(config);
  EXPECT_EQ(h.policy.view(h.now).capacity_bytes, 10 * kGiB);
  EXPECT_TRUE(granted(h.add_and_request(1, 5 * kGiB), 1));
  EXPECT_FALSE(granted(h.add_and_request(2, 5 * kGiB), 2));
}

TEST(CoRun, UnknownCapacityRunsOneAtATime) {
  PolicyConfig config = device_gpu();
  config.device_bytes = 0;
  Harness h(config);
  h.add(1, 1 * kGiB);
  h.add(2, 1 * kGiB);
  EXPECT_TRUE(granted(h.request(1), 1));
  EXPECT_EQ(wait_of(h.request(2), 2), WaitReason::kMemory);
}

TEST(Exclusive, OneRunnerEvenWhenTheyFit) {
  Harness h(virtual_gpu(Mode::kExclusive));
  EXPECT_TRUE(granted(h.add_and_request(1, 1 * kGiB), 1));
  const auto actions = h.add_and_request(2, 1 * kGiB);
  EXPECT_FALSE(granted(actions, 2));
  EXPECT_EQ(wait_of(actions, 2), WaitReason::kTurn);
  h.release(1);
  EXPECT_TRUE(granted(h.last, 2));
}

TEST(Fifo, LaterArrivalsDoNotOvertakeABlockedHead) {
  Harness h(virtual_gpu());
  h.add_and_request(1, 10 * kGiB);
  h.add_and_request(2, 12 * kGiB);                      // does not fit: head of the queue
  const auto actions = h.add_and_request(3, 1 * kGiB);  // would fit beside 1, but 2 is first
  EXPECT_FALSE(granted(actions, 3));
  // 2's memory, allocated before its turn, is on the device too: 3 does not fit beside it.
  EXPECT_EQ(wait_of(actions, 3), WaitReason::kMemory);
  EXPECT_EQ(h.policy.view(h.now).queue, (std::vector<ClientId>{2, 3}));

  // When 1 leaves (idle, its memory kept on the device until the eviction moves it), 2 runs
  // first; 3 then fits beside 2 and follows in the same pass.
  const auto released = h.release(1);
  EXPECT_TRUE(only<SendGrant>(released).empty());
  const auto next = h.answer_evictions(released);
  ASSERT_EQ(only<SendGrant>(next).size(), 2u);
  EXPECT_EQ(only<SendGrant>(next)[0].client, 2u);
  EXPECT_EQ(only<SendGrant>(next)[1].client, 3u);
}

TEST(Fifo, GrantsInArrivalOrder) {
  Harness h(virtual_gpu(Mode::kExclusive));
  for (ClientId id = 1; id <= 4; ++id) h.add_and_request(id, 1 * kGiB);
  std::vector<ClientId> order{1};
  for (int i = 0; i < 3; ++i) {
    const auto actions = h.release(order.back());
    ASSERT_EQ(only<SendGrant>(actions).size(), 1u);
    order.push_back(only<SendGrant>(actions)[0].client);
  }
  EXPECT_EQ(order, (std::vector<ClientId>{1, 2, 3, 4}));
}

TEST(Oversize, ClientLargerThanTheGpuRunsAlone) {
  Harness h(virtual_gpu());
  h.add_and_request(1, 2 * kGiB);
  const auto waiting = h.add_and_request(2, 30 * kGiB);  // larger than the whole GPU
  EXPECT_EQ(wait_of(waiting, 2), WaitReason::kMemory);
  h.add_on_host(3, 1 * kGiB);
  EXPECT_FALSE(granted(h.request(3), 3));  // queued behind it

  // 1 idles: once the memory others keep parked is evicted, the idle GPU grants the head, however
  // large, and nobody runs beside it.
  EXPECT_TRUE(granted(h.answer_evictions(h.release(1)), 2));
  EXPECT_FALSE(granted(h.last, 3));
  EXPECT_EQ(h.state(3), ClientState::kWaiting);
  EXPECT_EQ(h.client(3).waiting_for, WaitReason::kMemory);
}

TEST(Oversize, GrowthPastUsableRevokesTheNewestRunner) {
  Harness h(virtual_gpu());
  h.add_and_request(1, 6 * kGiB);
  h.add_and_request(2, 6 * kGiB);
  const auto actions = h.feed(UsageReported{1, 14 * kGiB, 14 * kGiB, 0, {}});  // 20Gi > 18Gi usable
  const auto revoke = revoke_of(actions, 2);
  ASSERT_TRUE(revoke);
  EXPECT_EQ(revoke->reason, RevokeReason::kMemory);
  EXPECT_TRUE(revoke->swap_out);
  EXPECT_FALSE(revoke_of(actions, 1));

  // A single runner may exceed usable: nobody else to make room for.
  EXPECT_TRUE(revoke_of(h.feed(UsageReported{1, 19 * kGiB, 19 * kGiB, 0, {}}), 1) == std::nullopt);
}

}  // namespace
}  // namespace nvshare::policy::testing

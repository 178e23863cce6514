// Pinned memory (CUDA IPC: bytes another process maps, which a swap cannot move): counted in every
// fit check whatever its owner's state, never planned to move, and never a reason for the queue to
// stall.
#include <gtest/gtest.h>

#include "harness.h"

namespace nvshare::policy::testing {
namespace {

// Registers a client whose working set has `pinned` bytes that stay on the device.
void add_pinned(Harness& h, ClientId id, std::uint64_t working_set, std::uint64_t pinned) {
  h.feed(Registered{id, Limits{0, 100}});
  h.feed(UsageReported{id, working_set, working_set, 0, {}, pinned});
}

TEST(Pinned, ATurnMovesOnlyTheMovableBytesAndTheirOwnerKeepsThemWhileOut) {
  PolicyConfig config = virtual_gpu();  // 18 GiB usable
  config.fixed_quantum = 1s;
  Harness h(config);
  add_pinned(h, 1, 10 * kGiB, 6 * kGiB);
  h.request(1);
  h.add_and_request(2, 10 * kGiB);
  EXPECT_EQ(wait_of(h.last, 2), WaitReason::kMemory);
  const auto revoke = revoke_of(h.advance(1s), 1);
  ASSERT_TRUE(revoke);
  EXPECT_TRUE(revoke->swap_out);  // 10 + 4 movable + 6 pinned do not fit in 18
  h.release(1);
  EXPECT_TRUE(granted(h.last, 2));  // 10 movable beside 6 pinned: 16 of 18
  // The owner's pinned bytes still count while it waits: 16 of the usable 18 are in use.
  EXPECT_EQ(h.policy.view(h.now).running_bytes, 16 * kGiB);
}

TEST(Pinned, WithoutPinnedBytesTheSamePairTakesTurnsAsBefore) {
  PolicyConfig config = virtual_gpu();
  config.fixed_quantum = 1s;
  Harness h(config);
  add_pinned(h, 1, 10 * kGiB, 0);
  h.request(1);
  h.add_and_request(2, 10 * kGiB);
  const auto revoke = revoke_of(h.advance(1s), 1);
  ASSERT_TRUE(revoke);
  h.release(1);
  EXPECT_TRUE(granted(h.last, 2));
  EXPECT_EQ(h.policy.view(h.now).running_bytes, 10 * kGiB);
}

TEST(Pinned, AClientThatCannotFitBesidePinnedMemoryWaitsWithoutHoldingUpOthers) {
  Harness h(virtual_gpu());
  add_pinned(h, 1, 14 * kGiB, 12 * kGiB);  // registered, not running: 12 GiB stay pinned
  h.add_on_host(2, 10 * kGiB);
  h.request(2);  // 10 + 12 > 18, even on an idle GPU
  EXPECT_FALSE(granted(h.last, 2));
  EXPECT_EQ(wait_of(h.last, 2), WaitReason::kMemory);
  h.add_on_host(3, 4 * kGiB);
  h.request(3);  // 4 + 12 (+ the 2 GiB client 1 keeps parked) fit: not held up by 2
  EXPECT_TRUE(granted(h.last, 3));
  EXPECT_EQ(h.state(2), ClientState::kWaiting);
  // The owner frees its shared memory: 2 fits beside 3 now.
  h.feed(UsageReported{1, 2 * kGiB, 2 * kGiB, 0, {}, 0});
  EXPECT_TRUE(granted(h.last, 2));
}

TEST(Pinned, TheOwnerOfPinnedMemoryStillRunsAloneHoweverLarge) {
  Harness h(virtual_gpu());
  add_pinned(h, 1, 30 * kGiB, 4 * kGiB);  // larger than the GPU; only its own bytes are pinned
  h.request(1);
  EXPECT_TRUE(granted(h.last, 1));
}

TEST(Pinned, PinnedBytesAreClampedToTheWorkingSet) {
  Harness h(virtual_gpu());
  add_pinned(h, 1, 2 * kGiB, 100 * kGiB);  // says more is pinned than it has
  EXPECT_EQ(h.client(1).pinned_bytes, 2 * kGiB);
  h.add_and_request(2, 16 * kGiB);  // 16 + 2 pinned = 18: fits
  EXPECT_TRUE(granted(h.last, 2));
}

}  // namespace
}  // namespace nvshare::policy::testing

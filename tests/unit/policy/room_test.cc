// Room (protocol version 12): while memory leaves the device for the head of the queue (a revoked
// holder swapping out and reporting as it goes, or an eviction), a head that takes room is told how
// much of its memory may be on the device already (SendRoom), so that it brings that much back
// while the leaver is still moving its memory out.
#include <gtest/gtest.h>

#include <optional>

#include "harness.h"

namespace nvshare::policy::testing {
namespace {

// Registers a client that takes byte targets and room, its `bytes` on the device.
void add_roomy(Harness& h, ClientId id, std::uint64_t bytes, bool takes_room = true) {
  add_partial(h, id, bytes, takes_room);
}

std::optional<std::uint64_t> room_for(const std::vector<Action>& actions, ClientId id) {
  std::optional<std::uint64_t> room;
  for (const SendRoom& r : only<SendRoom>(actions)) {
    if (r.client == id) room = r.bytes;
  }
  return room;
}

// Two 10 GiB jobs under 18 GiB usable. Nothing while the head only waits for its turn; at the
// revoke, the 8 GiB nobody holds; then, as the leaver reports its swap-out, what each report frees,
// up to all of the head's memory. What came back counts as the head's parked memory, evicts
// nobody, and the head runs at the leaver's release.
TEST(Room, TheHeadIsGivenTheRoomTheLeaverMakesAsItGoes) {
  Harness h(virtual_gpu());  // 18 GiB usable
  add_roomy(h, 1, 10 * kGiB);
  h.request(1);
  add_roomy(h, 2, 10 * kGiB);
  keeps(h, 2, 0);  // its memory on the host
  EXPECT_FALSE(room_for(h.request(2), 2)) << "nothing leaves yet";
  EXPECT_FALSE(room_for(h.advance(100ms), 2));
  const std::vector<Action> revoked = until_revoked(h, 1);
  ASSERT_FALSE(revoked.empty());
  EXPECT_EQ(room_for(revoked, 2), 8 * kGiB);
  EXPECT_TRUE(only<SendEvict>(keeps(h, 2, 8 * kGiB)).empty()) << "the room it took";
  EXPECT_EQ(h.client(2).parked_bytes, 8 * kGiB);
  const std::string explained = h.policy.explain(2, h.now);
  EXPECT_NE(explained.find("given room for 8Gi of its memory while it waits (8Gi of it back on "
                           "the GPU)"),
            std::string::npos)
      << explained;
  // The leaver reports as it goes; a report that frees less than a step gives no room.
  EXPECT_FALSE(room_for(keeps(h, 1, 10 * kGiB - (32ull << 20)), 2));
  EXPECT_EQ(room_for(keeps(h, 1, 9 * kGiB), 2), 9 * kGiB);
  EXPECT_EQ(room_for(keeps(h, 1, 8 * kGiB), 2), 10 * kGiB);  // all of it
  EXPECT_FALSE(room_for(keeps(h, 2, 10 * kGiB), 2)) << "nothing more to give";
  EXPECT_TRUE(granted(h.feed(Released{1, h.epoch(1), 0ms, 0ms}), 2));
  EXPECT_EQ(h.client(1).parked_bytes, 8 * kGiB);
  EXPECT_EQ(h.client(2).counters.rooms, 3u);
}

// The last job leaves its memory parked (idle) and is evicted for the head: the head is given the
// room at once and as the eviction's reports free more.
TEST(Room, AnEvictionGivesTheHeadRoomToo) {
  Harness h(virtual_gpu());
  add_roomy(h, 1, 12 * kGiB);
  h.request(1);
  h.release(1);  // idle, 12 GiB parked
  add_roomy(h, 2, 10 * kGiB);
  keeps(h, 2, 0);
  const std::vector<Action> asked = h.request(2);
  ASSERT_EQ(only<SendEvict>(asked).size(), 1u);
  EXPECT_EQ(room_for(asked, 2), 6 * kGiB);
  keeps(h, 2, 6 * kGiB);
  EXPECT_EQ(room_for(keeps(h, 1, 10 * kGiB), 2), 8 * kGiB);
  keeps(h, 2, 8 * kGiB);
  EXPECT_TRUE(granted(keeps(h, 1, 8 * kGiB), 2));
}

// A head that does not take room (an older client) gets none; nor does one whose memory is all on
// the device.
TEST(Room, OnlyAHeadThatTakesRoomAndLacksMemoryGetsIt) {
  Harness h(virtual_gpu());
  add_roomy(h, 1, 10 * kGiB);
  h.request(1);
  add_roomy(h, 2, 10 * kGiB, /*takes_room=*/false);
  keeps(h, 2, 0);
  h.request(2);
  EXPECT_FALSE(room_for(until_revoked(h, 1), 2));
  EXPECT_FALSE(room_for(keeps(h, 1, 8 * kGiB), 2));
}

}  // namespace
}  // namespace nvshare::policy::testing

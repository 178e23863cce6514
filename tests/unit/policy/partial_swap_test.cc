// Partial swap-outs: a client that takes byte targets (protocol version 10) is asked to move only
// the part of its memory the next runner needs room for (SendRevoke::swap_bytes, SendEvict::bytes);
// what it keeps counts as parked. A client that moves less than asked is evicted for the rest.
#include <gtest/gtest.h>

#include <string>
#include <utility>

#include "harness.h"

namespace nvshare::policy::testing {
namespace {

// Advances until `id` is revoked; returns the revoke.
std::optional<SendRevoke> revoke_of(Harness& h, ClientId id) {
  return testing::revoke_of(until_revoked(h, id), id);
}

// Two 10 GiB jobs under 18 GiB usable: each hand-off moves the 2 GiB that do not fit, not 10.
TEST(PartialSwap, ALeaverMovesOnlyWhatTheHeadNeeds) {
  Harness h(virtual_gpu());  // 18 GiB usable
  add_partial(h, 1, 10 * kGiB);
  h.request(1);
  add_partial(h, 2, 10 * kGiB);
  keeps(h, 2, 0);  // its memory on the host
  h.request(2);
  ASSERT_EQ(h.state(2), ClientState::kWaiting);
  // 1 hands over to 2, then 2 back to 1 (which needs its 2 GiB back beside its own 8): each time
  // the leaver is asked for 2 GiB and keeps 8 parked.
  for (const auto& [leaver, head] : {std::pair<ClientId, ClientId>{1, 2}, {2, 1}}) {
    SCOPED_TRACE("client " + std::to_string(leaver) + " hands over");
    const std::optional<SendRevoke> revoke = revoke_of(h, leaver);
    ASSERT_TRUE(revoke);
    EXPECT_TRUE(revoke->swap_out);
    EXPECT_EQ(revoke->swap_bytes, 2 * kGiB);
    keeps(h, leaver, 8 * kGiB);
    EXPECT_TRUE(granted(h.feed(Released{leaver, h.epoch(leaver), 0ms, 0ms}), head));
    EXPECT_EQ(h.client(leaver).parked_bytes, 8 * kGiB);
  }
}

// The swap notice names the revoke's target (protocol version 11), so the leaver readies host
// copies for what it will move, not for all of its memory.
TEST(PartialSwap, TheSwapNoticeNamesTheTargetOfTheRevoke) {
  Harness h(virtual_gpu());  // 18 GiB usable
  add_partial(h, 1, 10 * kGiB);
  h.request(1);
  add_partial(h, 2, 10 * kGiB);
  keeps(h, 2, 0);
  const std::vector<Action> planned = h.request(2);
  ASSERT_EQ(only<SendSwapNotice>(planned).size(), 1u);
  EXPECT_EQ(only<SendSwapNotice>(planned)[0].client, 1u);
  EXPECT_EQ(only<SendSwapNotice>(planned)[0].bytes, 2 * kGiB);
  const std::optional<SendRevoke> revoke = revoke_of(h, 1);
  ASSERT_TRUE(revoke);
  EXPECT_EQ(revoke->swap_bytes, 2 * kGiB);
}

// A client that moves all or nothing (older than version 10) is asked for all of it.
TEST(PartialSwap, AClientWithoutByteTargetsMovesAll) {
  Harness h(virtual_gpu());
  h.add_and_request(1, 10 * kGiB);
  add_partial(h, 2, 10 * kGiB);
  keeps(h, 2, 0);
  h.request(2);
  const std::optional<SendRevoke> revoke = revoke_of(h, 1);
  ASSERT_TRUE(revoke);
  EXPECT_TRUE(revoke->swap_out);
  EXPECT_EQ(revoke->swap_bytes, 0u);
}

// An idle client's parked memory: only the excess is asked for, and its answer lets the head run.
TEST(PartialSwap, AnEvictionAsksOnlyForTheExcess) {
  Harness h(virtual_gpu());
  add_partial(h, 1, 12 * kGiB);
  h.request(1);
  h.release(1);  // idle, 12 GiB parked
  add_partial(h, 2, 10 * kGiB);
  keeps(h, 2, 0);
  const auto asked = h.request(2);
  ASSERT_EQ(only<SendEvict>(asked).size(), 1u);
  EXPECT_EQ(only<SendEvict>(asked)[0].client, 1u);
  EXPECT_EQ(only<SendEvict>(asked)[0].bytes, 4 * kGiB);  // 12 + 10 - 18
  EXPECT_TRUE(granted(keeps(h, 1, 8 * kGiB), 2));
  EXPECT_EQ(h.client(1).parked_bytes, 8 * kGiB);
}

// A leaver that moved less than it was asked to leaves the head short: the rest is evicted.
TEST(PartialSwap, ALeaverThatMovesTooLittleIsEvictedForTheRest) {
  Harness h(virtual_gpu());
  add_partial(h, 1, 10 * kGiB);
  h.request(1);
  add_partial(h, 2, 10 * kGiB);
  keeps(h, 2, 0);
  h.request(2);
  const std::optional<SendRevoke> revoke = revoke_of(h, 1);
  ASSERT_TRUE(revoke);
  ASSERT_EQ(revoke->swap_bytes, 2 * kGiB);
  keeps(h, 1, 9 * kGiB);  // 1 GiB moved of the 2 asked
  const auto released = h.feed(Released{1, h.epoch(1), 0ms, 0ms});
  EXPECT_FALSE(granted(released, 2));
  ASSERT_EQ(only<SendEvict>(released).size(), 1u);
  EXPECT_EQ(only<SendEvict>(released)[0].bytes, 1 * kGiB);
  EXPECT_TRUE(granted(keeps(h, 1, 8 * kGiB), 2));
}

}  // namespace
}  // namespace nvshare::policy::testing

#include "client/link/grant_gate.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <thread>
#include <vector>

namespace nvshare::client {
namespace {

// Threads entering and leaving an open gate at once: every submission that queued work gets its
// own number, and the numbers are 1..N with none missing (the tracker's count, kept in the gate's
// word).
std::vector<std::uint64_t> submit_from_threads(GrantGate& gate, int threads, int each) {
  std::vector<std::vector<std::uint64_t>> seen(threads);
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&gate, &seen, t, each] {
      for (int i = 0; i < each; ++i) {
        if (gate.try_enter() != GrantGate::Entry::kEntered) continue;
        if (i % 3 == 0) {
          (void)gate.leave_and_check_last();  // a call that failed: not counted
        } else {
          seen[t].push_back(gate.leave_queued().count);
        }
      }
    });
  }
  for (std::thread& w : workers) w.join();
  std::vector<std::uint64_t> all;
  for (const auto& s : seen) all.insert(all.end(), s.begin(), s.end());
  std::sort(all.begin(), all.end());
  return all;
}

TEST(GrantGate, EverySubmissionThatQueuedWorkGetsItsOwnNumber) {
  GrantGate gate;
  gate.open();
  const std::vector<std::uint64_t> counts = submit_from_threads(gate, 4, 30'000);
  ASSERT_EQ(counts.size(), 4u * 20'000u);
  for (std::size_t i = 0; i < counts.size(); ++i) ASSERT_EQ(counts[i], i + 1);
  EXPECT_EQ(gate.inside(), 0u);
}

TEST(GrantGate, TheCountGoesOnPastTheWidthOfItsField) {
  const std::uint64_t start = GrantGate::kQueuedMask - 5'000;  // the field wraps 5,001 on
  GrantGate gate(start);
  gate.open();
  const std::vector<std::uint64_t> counts = submit_from_threads(gate, 4, 6'000);
  ASSERT_EQ(counts.size(), 4u * 4'000u);
  for (std::size_t i = 0; i < counts.size(); ++i) ASSERT_EQ(counts[i], start + i + 1);
  EXPECT_GT(counts.back(), GrantGate::kQueuedMask);
}

// The count shares the word with the pass bit and the threads inside: closing says how many are
// inside, and the last one out of a closed gate is told so, however many submissions came before.
TEST(GrantGate, TheInsideCountIsExactBesideTheSubmissionCount) {
  GrantGate gate(GrantGate::kQueuedMask - 1);
  gate.open();
  for (int i = 0; i < 3; ++i) ASSERT_EQ(gate.try_enter(), GrantGate::Entry::kEntered);
  EXPECT_EQ(gate.inside(), 3u);
  EXPECT_EQ(gate.close(), 3u);
  EXPECT_EQ(gate.try_enter(), GrantGate::Entry::kClosed);  // backs out: three still inside
  const GrantGate::Left first = gate.leave_queued();
  EXPECT_FALSE(first.last_out);
  EXPECT_EQ(first.count, GrantGate::kQueuedMask);
  EXPECT_FALSE(gate.leave_and_check_last());
  const GrantGate::Left last = gate.leave_queued();
  EXPECT_TRUE(last.last_out);
  EXPECT_EQ(last.count, GrantGate::kQueuedMask + 1);
  EXPECT_EQ(gate.inside(), 0u);
  EXPECT_FALSE(gate.is_open());
  // A lone thread that backs out of the closed gate is the last one out.
  EXPECT_EQ(gate.try_enter(), GrantGate::Entry::kClosedLastOut);
  gate.open();
  EXPECT_TRUE(gate.is_open());
  EXPECT_EQ(gate.try_enter(), GrantGate::Entry::kEntered);
  EXPECT_EQ(gate.leave_queued().count, GrantGate::kQueuedMask + 2);
}

// After fork(): the child has no threads inside, a closed gate, and counts from one again, as its
// new work tracker does (a tracker that got the parent's numbers would take them all for work
// queued before its first marker).
TEST(GrantGate, ResetAfterForkStartsTheCountAgain) {
  GrantGate gate;
  gate.open();
  for (int i = 0; i < 5; ++i) {
    ASSERT_EQ(gate.try_enter(), GrantGate::Entry::kEntered);
    (void)gate.leave_queued();
  }
  ASSERT_EQ(gate.try_enter(), GrantGate::Entry::kEntered);  // a thread of the parent, inside
  gate.reset_closed();
  EXPECT_FALSE(gate.is_open());
  EXPECT_EQ(gate.inside(), 0u);
  gate.open();
  ASSERT_EQ(gate.try_enter(), GrantGate::Entry::kEntered);
  EXPECT_EQ(gate.leave_queued().count, 1u);
}

}  // namespace
}  // namespace nvshare::client

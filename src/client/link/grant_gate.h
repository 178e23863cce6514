// GrantGate: the per-GPU word every submission passes through.
//
// One 64-bit atomic holds a pass bit (the process holds the grant, or the link is open because the
// scheduler is unreachable) and, above it, the number of application threads inside a submission
// (between a successful try_enter() and its leave_and_check_last()). Keeping both in one word makes
// the fast path a single atomic read-modify-write whose result says whether the thread may go on:
// no lock, no syscall, and no ordering subtleties between two locations.
//
// Closing the gate (close()) returns the word as it was, so the link thread knows how many threads
// were already inside; those finish their submission (leave_and_check_last()), and the last one out
// of a closed gate is told to wake the link thread, which waits for it before draining. A thread
// that finds the gate closed backs out (also through leave_and_check_last()) and takes the slow
// path.
//
// Contract: try_enter()/leave_and_check_last() are called by application threads and never block;
// open()/close() only by the link thread (under the device's mutex, so waiters see a consistent
// state).
#pragma once

#include <atomic>
#include <cstdint>

namespace nvshare::client {

class GrantGate {
 public:
  static constexpr std::uint64_t kPass = 1;
  static constexpr std::uint64_t kOneInside = 2;

  enum class Entry {
    kEntered,        // go on; call leave_and_check_last() after the submission
    kClosed,         // take the slow path
    kClosedLastOut,  // take the slow path, and wake the link thread first: backing out of the
                     // closed gate let the count of threads inside reach zero
  };

  Entry try_enter() {
    const std::uint64_t before = word_.fetch_add(kOneInside, std::memory_order_acq_rel);
    if ((before & kPass) != 0) return Entry::kEntered;
    return leave_and_check_last() ? Entry::kClosedLastOut : Entry::kClosed;
  }

  // Leaves after a submission. Returns true when this was the last thread inside a closed gate (the
  // caller wakes the link thread).
  [[nodiscard]] bool leave_and_check_last() {
    const std::uint64_t before = word_.fetch_sub(kOneInside, std::memory_order_acq_rel);
    return before == kOneInside;  // the pass bit was clear and this thread was the only one inside
  }

  // Counts the caller inside whatever the pass bit says (the engine's own thread, which must
  // never wait for a grant it would deliver itself).
  void enter_unconditionally() { word_.fetch_add(kOneInside, std::memory_order_acq_rel); }

  // Link thread: opens the gate (grant held, or fail-open).
  void open() { word_.fetch_or(kPass, std::memory_order_acq_rel); }
  // Link thread: closes the gate; returns how many threads were inside at that instant.
  std::uint64_t close() { return word_.fetch_and(~kPass, std::memory_order_acq_rel) / kOneInside; }

  bool is_open() const { return (word_.load(std::memory_order_acquire) & kPass) != 0; }
  std::uint64_t inside() const { return word_.load(std::memory_order_acquire) / kOneInside; }

  // After fork(): threads inside in the parent do not exist in the child.
  void reset_closed() { word_.store(0, std::memory_order_release); }

 private:
  std::atomic<std::uint64_t> word_{0};
};

}  // namespace nvshare::client

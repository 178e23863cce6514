// GrantGate: the per-GPU word every submission passes through.
//
// One 64-bit atomic holds a pass bit (the process holds the grant, or the link is open because the
// scheduler is unreachable), above it the number of application threads inside a submission
// (between a successful try_enter() and its leave), and above that the number of submissions that
// queued work (counted as their thread leaves: leave_queued()). Keeping them in one word makes each
// end of a submission a single atomic read-modify-write: entering says whether the thread may go
// on, leaving says whether it was the last one out of a closed gate and which submission it was
// (the work tracker's count, which would otherwise cost a third atomic per submission). No lock,
// no syscall, and no ordering subtleties between locations.
//
// Widths: kInsideBits hold more threads than Linux lets a process have (PID_MAX_LIMIT is 2^22),
// so the inside count never carries into the submission count. The submission count keeps its low
// kQueuedBits bits and wraps (at a million submissions a second, after 12 days): leave_queued()
// widens it to 64 bits against the newest count any thread widened (`newest_`, a plain store, not
// a second read-modify-write), which is never half the field's range away.
//
// Closing the gate (close()) returns the word as it was, so the link thread knows how many threads
// were already inside; those finish their submission (and leave), and the last one out of a closed
// gate is told to wake the link thread, which waits for it before draining. A thread
// that finds the gate closed backs out (also through leave_and_check_last()) and takes the slow
// path.
//
// Contract: try_enter(), leave_queued() and leave_and_check_last() are called by application
// threads and never block; open()/close() only by the link thread (under the device's mutex, so
// waiters see a consistent state).
#pragma once

#include <atomic>
#include <cstdint>

namespace nvshare::client {

class GrantGate {
 public:
  static constexpr std::uint64_t kPass = 1;
  static constexpr std::uint64_t kOneInside = 2;
  static constexpr int kInsideBits = 23;
  static constexpr std::uint64_t kInsideMask = ((std::uint64_t{1} << kInsideBits) - 1) * kOneInside;
  static constexpr int kQueuedShift = 1 + kInsideBits;
  static constexpr int kQueuedBits = 64 - kQueuedShift;
  static constexpr std::uint64_t kOneQueued = std::uint64_t{1} << kQueuedShift;
  static constexpr std::uint64_t kQueuedMask = (std::uint64_t{1} << kQueuedBits) - 1;

  enum class Entry {
    kEntered,        // go on; after the submission call leave_queued() if it queued work,
                     // leave_and_check_last() if not
    kClosed,         // take the slow path
    kClosedLastOut,  // take the slow path, and wake the link thread first: backing out of the
                     // closed gate let the count of threads inside reach zero
  };

  GrantGate() = default;
  // Counts on from `counted` submissions (tests: the count's field wrapping).
  explicit GrantGate(std::uint64_t counted)
      : word_((counted & kQueuedMask) << kQueuedShift), newest_(counted) {}

  Entry try_enter() {
    const std::uint64_t before = word_.fetch_add(kOneInside, std::memory_order_acq_rel);
    if ((before & kPass) != 0) return Entry::kEntered;
    return leave_and_check_last() ? Entry::kClosedLastOut : Entry::kClosed;
  }

  // Leaves after a submission that queued nothing (the call failed), or when backing out of a
  // closed gate. Returns true when this was the last thread inside a closed gate (the caller wakes
  // the link thread).
  [[nodiscard]] bool leave_and_check_last() {
    return last_out(word_.fetch_sub(kOneInside, std::memory_order_acq_rel));
  }

  // Leaves after a submission that queued work, and counts it.
  struct Left {
    bool last_out;        // the last thread inside a closed gate: wake the link thread
    std::uint64_t count;  // this submission's number among those that queued work (1, 2, ...)
  };
  Left leave_queued() {
    const std::uint64_t before =
        word_.fetch_add(kOneQueued - kOneInside, std::memory_order_acq_rel);
    return {last_out(before), widen((before >> kQueuedShift) + 1)};
  }

  // Counts the caller inside whatever the pass bit says (the engine's own thread, which must
  // never wait for a grant it would deliver itself).
  void enter_unconditionally() { word_.fetch_add(kOneInside, std::memory_order_acq_rel); }

  // Link thread: opens the gate (grant held, or fail-open).
  void open() { word_.fetch_or(kPass, std::memory_order_acq_rel); }
  // Link thread: closes the gate; returns how many threads were inside at that instant.
  std::uint64_t close() {
    return (word_.fetch_and(~kPass, std::memory_order_acq_rel) & kInsideMask) / kOneInside;
  }

  bool is_open() const { return (word_.load(std::memory_order_acquire) & kPass) != 0; }
  std::uint64_t inside() const {
    return (word_.load(std::memory_order_acquire) & kInsideMask) / kOneInside;
  }

  // After fork(): threads inside in the parent do not exist in the child, and the count starts
  // again, as the child's work trackers do (the parent's are abandoned with its device state).
  void reset_closed() {
    word_.store(0, std::memory_order_release);
    newest_.store(0, std::memory_order_relaxed);
  }

 private:
  // The pass bit was clear and the leaving thread was the only one inside.
  static bool last_out(std::uint64_t before) {
    return (before & (kPass | kInsideMask)) == kOneInside;
  }

  // The 64-bit count whose low kQueuedBits bits are `low`: the one nearest to `newest_`.
  std::uint64_t widen(std::uint64_t low) {
    const std::uint64_t newest = newest_.load(std::memory_order_relaxed);
    const std::uint64_t ahead = (low - newest) & kQueuedMask;
    if (ahead == 0) return newest;
    if (ahead < kQueuedMask / 2) {
      newest_.store(newest + ahead, std::memory_order_relaxed);
      return newest + ahead;
    }
    return newest - ((newest - low) & kQueuedMask);  // another thread widened a later one first
  }

  std::atomic<std::uint64_t> word_{0};
  std::atomic<std::uint64_t> newest_{0};
};

}  // namespace nvshare::client

// The device worker: runs one context's GPU work, in submission order, on simulated time.
//
// Every context owns a WorkQueue with one worker thread (started at the first operation that has to
// wait). API calls submit operations and return at once; the worker executes them one at a time:
//  - a kernel takes simulated time on the device's shared virtual clock (SimDevice): it starts at
//  the
//    context's virtual cursor (the end of the previous kernel, or the instant it was submitted to
//    an idle queue) and ends when the clock has advanced by its alone-duration, which takes n times
//    as long in wall time while n contexts share the device. Its end is computed from the clock,
//    not from when the worker woke up, so sleep overshoot never accumulates;
//  - a migration (managed-memory prefetch) takes wall time bytes / bandwidth, measured from the end
//  of
//    the previous operation; it uses the copy engines, not the SMs, so it neither counts toward n
//    nor slows down;
//  - host actions (copies, memsets), event records and cross-context event waits take no GPU time;
//  they
//    complete at the end of the operation before them.
//
// Contract:
//  - submit() returns the operation's sequence number. Numbers grow by one per submission and
//  complete
//    in order. An operation that takes no time, submitted to an idle queue, runs inside submit().
//  - The context is counted in the device's n from the submission of a kernel to an idle queue (or
//  the
//    start of a kernel after a migration or wait) until the queue empties or a migration or wait
//    reaches its head.
//  - wait_for() and drain() block on a condition variable; stop() drains and joins the worker.
//  - Event timestamps are the simulated completion times (CLOCK_MONOTONIC ns).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "shared_state.h"

namespace fakecuda {

class WorkQueue;

// What an event knows about its latest record. Shared by the CUevent handle and queued record ops.
struct EventState {
  explicit EventState(unsigned event_flags) : flags(event_flags) {}
  void stamp(std::uint64_t id, std::int64_t timestamp);

  const unsigned flags;
  std::mutex mu;
  std::shared_ptr<WorkQueue> queue;  // where it was last recorded; null before the first record
  std::uint64_t seq = 0;             // that record's sequence number in queue
  std::uint64_t record_id = 0;       // process-unique id of the latest record
  std::uint64_t stamped_id = 0;      // id of the record timestamp_ns belongs to
  std::int64_t timestamp_ns = 0;
  std::atomic<int> awaited{0};  // threads inside cuEventSynchronize on it
};

struct Op {
  enum class Kind { kKernel, kMigration, kHostAction, kEventRecord, kEventWait };
  Kind kind = Kind::kHostAction;
  std::uint64_t kernel_ns = 0;  // kKernel: duration when alone on the device
  // kKernel: runs when the kernel starts, returns extra alone-ns (demand faults).
  // kMigration: performs the move when it starts, returns its wall-clock ns.
  std::function<std::uint64_t()> prologue;
  std::function<void()> action;           // kHostAction
  std::shared_ptr<EventState> event;      // kEventRecord, kEventWait
  std::uint64_t record_id = 0;            // kEventRecord
  std::shared_ptr<WorkQueue> wait_queue;  // kEventWait: the other context's queue
  std::uint64_t wait_seq = 0;             // kEventWait
  // Set by submit.
  std::uint64_t seq = 0;
  std::int64_t submit_ns = 0;
};

class WorkQueue {
 public:
  WorkQueue(SimDevice* device, SlotRef slot) : device_(device), slot_(slot) {}
  ~WorkQueue();
  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;

  std::uint64_t submit(Op op);
  bool done(std::uint64_t seq);
  void wait_for(std::uint64_t seq);
  std::uint64_t last_submitted();
  // Waits until everything submitted so far has completed.
  void drain();
  // Drains, then ends the worker thread. Idempotent.
  void stop();

 private:
  void run();
  std::int64_t execute(Op& op);
  std::int64_t run_kernel(Op& op);
  // Counts this context in n, or stops, as of wall time `since` (see SimDevice::set_counted).
  void set_counted(bool counted, std::int64_t since);

  SimDevice* const device_;
  const SlotRef slot_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Op> ops_;  // ops_.front() is executing; references stay valid across push_back
  std::uint64_t next_seq_ = 0;
  std::uint64_t completed_seq_ = 0;
  bool stopping_ = false;
  std::thread worker_;

  // Owned by whoever executes operations: submit() while the queue is empty (under mu_), the worker
  // while it is not. Hand-over happens under mu_, which orders the accesses.
  bool counted_ = false;
  double cursor_v_ = 0;                // virtual time at which the next kernel may start
  std::int64_t last_complete_ns_ = 0;  // wall time the previous operation completed
};

}  // namespace fakecuda

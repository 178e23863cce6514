#include "work_queue.h"

#include <errno.h>
#include <sys/prctl.h>
#include <time.h>

#include <algorithm>

namespace fakecuda {
namespace {

// Upper bound of one sleep while a kernel runs, so that dead processes are reaped and their share
// of the device given back even when no other process changes n.
constexpr std::int64_t kMaxSleepNs = 100'000'000;

void sleep_until(std::int64_t deadline_ns) {
  timespec ts{static_cast<time_t>(deadline_ns / 1'000'000'000),
              static_cast<long>(deadline_ns % 1'000'000'000)};
  while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, nullptr) == EINTR) {
  }
}

}  // namespace

void EventState::stamp(std::uint64_t id, std::int64_t timestamp) {
  std::lock_guard lock(mu);
  if (id != record_id) return;  // re-recorded since: the newer record owns the timestamp
  stamped_id = id;
  timestamp_ns = timestamp;
}

WorkQueue::~WorkQueue() { stop(); }

std::uint64_t WorkQueue::submit(Op op) {
  if (op.kind == Op::Kind::kEventWait &&
      (op.wait_queue.get() == this || op.wait_queue->done(op.wait_seq))) {
    // Already satisfied (one queue runs in order): nothing to wait for.
    std::lock_guard lock(mu_);
    return next_seq_;
  }
  std::unique_lock lock(mu_);
  op.seq = ++next_seq_;
  op.submit_ns = mono_ns();
  const std::uint64_t seq = op.seq;
  bool instant = op.kind == Op::Kind::kHostAction || op.kind == Op::Kind::kEventRecord;
  if (ops_.empty() && instant) {
    // Idle queue: the operation would complete the moment it is submitted, so do it here and spare
    // a thread hand-off (this also makes copies from pageable memory synchronous, as on a real
    // GPU).
    if (op.kind == Op::Kind::kHostAction) {
      op.action();
    } else {
      op.event->stamp(op.record_id, op.submit_ns);
    }
    completed_seq_ = seq;
    last_complete_ns_ = op.submit_ns;
    cv_.notify_all();
    return seq;
  }
  if (!worker_.joinable()) worker_ = std::thread(&WorkQueue::run, this);
  if (ops_.empty() && op.kind == Op::Kind::kKernel) {
    // Counted from submission, so the kernel starts now in virtual time, however late the worker
    // wakes.
    set_counted(true, op.submit_ns);
  }
  ops_.push_back(std::move(op));
  cv_.notify_all();
  return seq;
}

bool WorkQueue::done(std::uint64_t seq) {
  std::lock_guard lock(mu_);
  return completed_seq_ >= seq;
}

void WorkQueue::wait_for(std::uint64_t seq) {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return completed_seq_ >= seq; });
}

std::uint64_t WorkQueue::last_submitted() {
  std::lock_guard lock(mu_);
  return next_seq_;
}

void WorkQueue::drain() {
  std::unique_lock lock(mu_);
  const std::uint64_t target = next_seq_;
  cv_.wait(lock, [&] { return completed_seq_ >= target; });
}

void WorkQueue::stop() {
  std::unique_lock lock(mu_);
  const std::uint64_t target = next_seq_;
  cv_.wait(lock, [&] { return completed_seq_ >= target; });
  stopping_ = true;
  cv_.notify_all();
  lock.unlock();
  if (!worker_.joinable()) return;
  // The last reference to a queue can be dropped by a queued operation that the worker itself runs
  // (an event wait holding another context's queue); a thread cannot join itself.
  if (worker_.get_id() == std::this_thread::get_id()) {
    worker_.detach();
  } else {
    worker_.join();
  }
}

void WorkQueue::set_counted(bool counted, std::int64_t since) {
  if (counted_ == counted) return;
  counted_ = counted;
  double v = device_->set_counted(slot_, counted, since);
  if (counted) cursor_v_ = v;
}

void WorkQueue::run() {
  // Wake-ups at the predicted kernel ends should be as punctual as the kernel allows; the default
  // 50 us timer slack would add to every completion.
  prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stopping_ || !ops_.empty(); });
    if (ops_.empty()) return;
    Op& op = ops_.front();
    lock.unlock();
    std::int64_t completed_at = execute(op);
    lock.lock();
    last_complete_ns_ = completed_at;
    completed_seq_ = op.seq;
    ops_.pop_front();
    if (ops_.empty()) set_counted(false, completed_at);
    cv_.notify_all();
  }
}

std::int64_t WorkQueue::execute(Op& op) {
  // Nothing starts before it was submitted nor before the operation ahead of it completed.
  const std::int64_t start = std::max(last_complete_ns_, op.submit_ns);
  switch (op.kind) {
    case Op::Kind::kKernel:
      return run_kernel(op);
    case Op::Kind::kMigration: {
      set_counted(false, start);
      const std::uint64_t ns = op.prologue ? op.prologue() : 0;
      const std::int64_t end = start + static_cast<std::int64_t>(ns);
      sleep_until(end);
      return end;
    }
    case Op::Kind::kHostAction:
      op.action();
      return start;
    case Op::Kind::kEventRecord:
      op.event->stamp(op.record_id, start);
      return start;
    case Op::Kind::kEventWait: {
      set_counted(false, start);
      op.wait_queue->wait_for(op.wait_seq);
      std::lock_guard event_lock(op.event->mu);
      return std::max(start, op.event->timestamp_ns);
    }
  }
  return start;
}

std::int64_t WorkQueue::run_kernel(Op& op) {
  // A crashed process must not keep a share of the device it will never use.
  device_->maybe_reap();
  // After a migration or an event wait the kernel could start when that operation completed, not
  // when this thread noticed: it is counted, and starts on the clock, from then.
  set_counted(true, std::max(last_complete_ns_, op.submit_ns));
  // A kernel submitted behind a running one starts where that one ends, unless it was submitted
  // later than that (the device was idle for this context in between).
  const double start_v = std::max(cursor_v_, device_->virtual_at(op.submit_ns));
  const std::uint64_t extra_ns = op.prologue ? op.prologue() : 0;
  const double target = start_v + static_cast<double>(op.kernel_ns + extra_ns);
  KernelProgress progress = device_->poll_kernel(slot_, target);
  while (!progress.done) {
    device_->wait_for_change(progress.generation,
                             std::min(progress.wake_at_ns, mono_ns() + kMaxSleepNs));
    device_->maybe_reap();
    progress = device_->poll_kernel(slot_, target);
  }
  cursor_v_ = target;
  return progress.finish_wall_ns;
}

}  // namespace fakecuda

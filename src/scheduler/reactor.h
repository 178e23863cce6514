// Reactor: the scheduler's one event loop (epoll), with one timer (timerfd) and signals (signalfd).
//
// In the spirit of redis' ae.c: one thread calls run(); every handler runs on that thread, so the
// state the handlers touch needs no locks. Nothing here blocks except epoll_wait.
//
// Contract
//  - add(fd, events, handler): the handler is called with the ready epoll events (EPOLLIN,
//  EPOLLOUT,
//    EPOLLHUP, ...) while the fd is registered. Level-triggered. A handler may add, modify or
//    remove any fd, including its own; an event already fetched for an fd that was removed (or
//    removed and reused by a new registration) in the same batch is dropped, never delivered to the
//    wrong handler.
//  - set_timer(deadline): one absolute CLOCK_MONOTONIC deadline (the MonoTime of SteadyClock);
//    nullopt disarms. When it passes, the timer handler runs once; re-arm from the handler or from
//    before_sleep. A deadline in the past fires on the next loop iteration.
//  - watch_signals: blocks the signals for the calling thread (call before starting other threads,
//  so
//    they inherit the mask) and delivers them through a signalfd as ordinary events.
//  - before_sleep runs before every epoll_wait: the daemon flushes output there and arms the timer,
//  so
//    everything a batch of events produced is written with one send per connection.
//  - defer(task): the task runs once on the loop's thread after the current batch's before_sleep
//    (so after everything the batch decided was written) and before the loop sleeps; before_sleep
//    runs again after deferred tasks, so what they queue is written too. For work that must not
//    sit between a frame being read and the answers it caused being written (a metrics snapshot).
//  - stop() makes run() return after the current batch. Not thread-safe (call it from a handler).
#pragma once

#include <sys/epoll.h>

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <vector>

#include "common/clock.h"
#include "common/result.h"
#include "common/unix_socket.h"

namespace nvshare::scheduler {

class Reactor {
 public:
  using Handler = std::function<void(std::uint32_t events)>;

  static Result<std::unique_ptr<Reactor>> create();
  Reactor(const Reactor&) = delete;
  Reactor& operator=(const Reactor&) = delete;
  ~Reactor();

  Status add(int fd, std::uint32_t events, Handler handler);
  Status set_events(int fd, std::uint32_t events);
  void remove(int fd);

  Status set_timer(std::optional<MonoTime> deadline);
  void on_timer(std::function<void()> handler) { timer_handler_ = std::move(handler); }
  Status watch_signals(std::initializer_list<int> signals, std::function<void(int)> handler);
  void before_sleep(std::function<void()> hook) { before_sleep_ = std::move(hook); }
  void defer(std::function<void()> task) { deferred_.push_back(std::move(task)); }

  // Runs until stop(). Fails only when epoll_wait itself fails.
  Status run();
  void stop() { stopped_ = true; }

  std::uint64_t iterations() const { return iterations_; }

 private:
  Reactor() = default;
  // Runs the deferred tasks (and those they defer in turn); true when any ran.
  bool run_deferred();

  struct Entry {
    // Shared so that a running handler survives its slot being resized away or re-registered.
    std::shared_ptr<Handler> handler;
    std::uint32_t generation = 0;  // bumped on every add, so stale events can be recognized
    bool active = false;
  };

  UniqueFd epoll_;
  UniqueFd timer_;
  UniqueFd signals_;
  std::vector<Entry> entries_;  // indexed by fd
  std::uint32_t next_generation_ = 1;
  std::function<void()> timer_handler_;
  std::function<void()> before_sleep_;
  std::vector<std::function<void()>> deferred_;
  std::optional<MonoTime> armed_;
  bool stopped_ = false;
  std::uint64_t iterations_ = 0;
};

}  // namespace nvshare::scheduler

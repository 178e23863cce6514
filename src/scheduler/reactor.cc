#include "scheduler/reactor.h"

#include <signal.h>
#include <sys/signalfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>

namespace nvshare::scheduler {
namespace {

Error errno_error(const std::string& what, int err = errno) {
  return make_error(what + ": " + std::strerror(err));
}

// epoll_event.data packs the fd with the generation of its registration.
std::uint64_t pack(int fd, std::uint32_t generation) {
  return (static_cast<std::uint64_t>(generation) << 32) | static_cast<std::uint32_t>(fd);
}

}  // namespace

Result<std::unique_ptr<Reactor>> Reactor::create() {
  std::unique_ptr<Reactor> reactor(new Reactor());
  reactor->epoll_.reset(::epoll_create1(EPOLL_CLOEXEC));
  if (!reactor->epoll_.valid()) return errno_error("epoll_create1");
  reactor->timer_.reset(::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC));
  if (!reactor->timer_.valid()) return errno_error("timerfd_create");
  Reactor* self = reactor.get();
  Status added = reactor->add(reactor->timer_.get(), EPOLLIN, [self](std::uint32_t) {
    std::uint64_t expirations;
    // The count is irrelevant: the handler re-evaluates everything that is due.
    while (::read(self->timer_.get(), &expirations, sizeof expirations) < 0 && errno == EINTR) {
    }
    self->armed_.reset();
    if (self->timer_handler_) self->timer_handler_();
  });
  if (!added) return added.error();
  return reactor;
}

Reactor::~Reactor() = default;

Status Reactor::add(int fd, std::uint32_t events, Handler handler) {
  if (fd < 0) return make_error("reactor: invalid fd");
  if (static_cast<std::size_t>(fd) >= entries_.size())
    entries_.resize(static_cast<std::size_t>(fd) + 1);
  Entry& entry = entries_[static_cast<std::size_t>(fd)];
  if (entry.active)
    return make_error("reactor: fd " + std::to_string(fd) + " is already registered");
  const std::uint32_t generation = next_generation_++;
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = pack(fd, generation);
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) return errno_error("epoll_ctl ADD");
  entry.handler = std::make_shared<Handler>(std::move(handler));
  entry.generation = generation;
  entry.active = true;
  return Status::Ok();
}

Status Reactor::set_events(int fd, std::uint32_t events) {
  if (fd < 0 || static_cast<std::size_t>(fd) >= entries_.size() ||
      !entries_[static_cast<std::size_t>(fd)].active) {
    return make_error("reactor: fd " + std::to_string(fd) + " is not registered");
  }
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = pack(fd, entries_[static_cast<std::size_t>(fd)].generation);
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, fd, &ev) != 0) return errno_error("epoll_ctl MOD");
  return Status::Ok();
}

void Reactor::remove(int fd) {
  if (fd < 0 || static_cast<std::size_t>(fd) >= entries_.size()) return;
  Entry& entry = entries_[static_cast<std::size_t>(fd)];
  if (!entry.active) return;
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, fd, nullptr);
  entry.active = false;
  entry.handler.reset();  // run() holds its own reference while a handler executes
}

Status Reactor::set_timer(std::optional<MonoTime> deadline) {
  if (deadline == armed_) return Status::Ok();
  itimerspec spec{};
  if (deadline) {
    // A deadline at or before the clock's origin would read as "disarm"; one nanosecond fires at
    // once.
    const std::int64_t ns = std::max<std::int64_t>(deadline->since_origin.count(), 1);
    spec.it_value.tv_sec = static_cast<time_t>(ns / 1'000'000'000);
    spec.it_value.tv_nsec = static_cast<long>(ns % 1'000'000'000);
  }
  if (::timerfd_settime(timer_.get(), TFD_TIMER_ABSTIME, &spec, nullptr) != 0) {
    return errno_error("timerfd_settime");
  }
  armed_ = deadline;
  return Status::Ok();
}

Status Reactor::watch_signals(std::initializer_list<int> signals,
                              std::function<void(int)> handler) {
  sigset_t mask;
  sigemptyset(&mask);
  for (int sig : signals) sigaddset(&mask, sig);
  if (::pthread_sigmask(SIG_BLOCK, &mask, nullptr) != 0)
    return make_error("pthread_sigmask failed");
  signals_.reset(::signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC));
  if (!signals_.valid()) return errno_error("signalfd");
  const int fd = signals_.get();
  return add(fd, EPOLLIN, [fd, handler = std::move(handler)](std::uint32_t) {
    signalfd_siginfo info{};
    while (::read(fd, &info, sizeof info) == static_cast<ssize_t>(sizeof info)) {
      handler(static_cast<int>(info.ssi_signo));
    }
  });
}

bool Reactor::run_deferred() {
  bool ran = false;
  while (!deferred_.empty()) {
    std::vector<std::function<void()>> tasks;
    tasks.swap(deferred_);
    for (auto& task : tasks) task();
    ran = true;
  }
  return ran;
}

Status Reactor::run() {
  std::array<epoll_event, 256> events;
  stopped_ = false;
  while (!stopped_) {
    if (before_sleep_) before_sleep_();
    if (run_deferred() && before_sleep_) before_sleep_();
    if (stopped_) break;
    const int n = ::epoll_wait(epoll_.get(), events.data(), static_cast<int>(events.size()), -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno_error("epoll_wait");
    }
    ++iterations_;
    for (int i = 0; i < n; ++i) {
      const int fd = static_cast<int>(events[i].data.u64 & 0xFFFFFFFFu);
      const auto generation = static_cast<std::uint32_t>(events[i].data.u64 >> 32);
      if (static_cast<std::size_t>(fd) >= entries_.size()) continue;
      Entry& entry = entries_[static_cast<std::size_t>(fd)];
      if (!entry.active || entry.generation != generation) continue;
      const std::shared_ptr<Handler> handler = entry.handler;
      (*handler)(events[i].events);
    }
  }
  return Status::Ok();
}

}  // namespace nvshare::scheduler

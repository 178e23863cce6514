#include "scheduler/reactor.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "common/unix_socket.h"

namespace nvshare::scheduler {
namespace {

using namespace std::chrono_literals;

TEST(Reactor, DispatchesReadyDescriptorsAndTimers) {
  auto reactor = Reactor::create();
  ASSERT_TRUE(reactor.ok()) << reactor.error().message;
  Reactor& r = *reactor.value();
  auto pair = unix_socketpair();
  ASSERT_TRUE(pair.ok());
  int reads = 0;
  int timers = 0;
  int sleeps = 0;
  const int fd = pair.value().second.get();
  ASSERT_TRUE(r.add(fd, EPOLLIN, [&](std::uint32_t events) {
                 EXPECT_TRUE(events & EPOLLIN);
                 char buffer[16];
                 EXPECT_EQ(::read(fd, buffer, sizeof buffer), 1);
                 ++reads;
                 // Timer in the past: fires on the next iteration.
                 EXPECT_TRUE(r.set_timer(SteadyClock::instance().now() - 1ms).ok());
               }).ok());
  r.on_timer([&] {
    ++timers;
    r.stop();
  });
  r.before_sleep([&] { ++sleeps; });
  ASSERT_EQ(::write(pair.value().first.get(), "x", 1), 1);
  ASSERT_TRUE(r.run().ok());
  EXPECT_EQ(reads, 1);
  EXPECT_EQ(timers, 1);
  EXPECT_GE(sleeps, 2);
  EXPECT_FALSE(r.add(fd, EPOLLIN, [](std::uint32_t) {}).ok());  // already registered
}

TEST(Reactor, DeferredTasksRunAfterTheBatchOutputAndBeforeSleeping) {
  // A task deferred by a handler runs after before_sleep (the batch's output is written first),
  // before_sleep runs again after it, and a task it defers in turn runs in the same pass.
  auto reactor = Reactor::create();
  ASSERT_TRUE(reactor.ok());
  Reactor& r = *reactor.value();
  auto pair = unix_socketpair();
  ASSERT_TRUE(pair.ok());
  const int fd = pair.value().second.get();
  std::vector<std::string> order;
  ASSERT_TRUE(r.add(fd, EPOLLIN, [&](std::uint32_t) {
                 char buffer[16];
                 EXPECT_EQ(::read(fd, buffer, sizeof buffer), 1);
                 order.push_back("read");
                 r.defer([&] {
                   order.push_back("deferred");
                   r.defer([&] {
                     order.push_back("deferred again");
                     r.stop();
                   });
                 });
               }).ok());
  r.before_sleep([&] { order.push_back("sleep"); });
  ASSERT_EQ(::write(pair.value().first.get(), "x", 1), 1);
  ASSERT_TRUE(r.run().ok());
  const std::vector<std::string> expected = {"sleep",    "read",           "sleep",
                                             "deferred", "deferred again", "sleep"};
  EXPECT_EQ(order, expected);
}

TEST(Reactor, ARemovedDescriptorGetsNoStaleEventsInTheSameBatch) {
  auto reactor = Reactor::create();
  ASSERT_TRUE(reactor.ok());
  Reactor& r = *reactor.value();
  auto a = unix_socketpair();
  auto b = unix_socketpair();
  ASSERT_TRUE(a.ok() && b.ok());
  const int fa = a.value().second.get();
  const int fb = b.value().second.get();
  int calls = 0;
  // Whichever handler runs first removes the other; the other's already-fetched event is dropped.
  ASSERT_TRUE(r.add(fa, EPOLLIN, [&](std::uint32_t) {
                 ++calls;
                 r.remove(fb);
                 r.stop();
               }).ok());
  ASSERT_TRUE(r.add(fb, EPOLLIN, [&](std::uint32_t) {
                 ++calls;
                 r.remove(fa);
                 r.stop();
               }).ok());
  ASSERT_EQ(::write(a.value().first.get(), "x", 1), 1);
  ASSERT_EQ(::write(b.value().first.get(), "x", 1), 1);
  ASSERT_TRUE(r.run().ok());
  EXPECT_EQ(calls, 1);
}

TEST(Reactor, AHandlerMayRegisterManyDescriptorsWhileRunning) {
  // Growing the table from inside a handler must not disturb the running handler.
  auto reactor = Reactor::create();
  ASSERT_TRUE(reactor.ok());
  Reactor& r = *reactor.value();
  auto pair = unix_socketpair();
  ASSERT_TRUE(pair.ok());
  std::vector<UniqueFd> extra;
  int captured = 41;
  ASSERT_TRUE(r.add(pair.value().second.get(), EPOLLIN, [&, captured](std::uint32_t) {
                 for (int i = 0; i < 200; ++i) {
                   auto p = unix_socketpair();
                   ASSERT_TRUE(p.ok());
                   ASSERT_TRUE(r.add(p.value().first.get(), EPOLLIN, [](std::uint32_t) {}).ok());
                   extra.push_back(std::move(p.value().first));
                   extra.push_back(std::move(p.value().second));
                 }
                 EXPECT_EQ(captured, 41);
                 r.stop();
               }).ok());
  ASSERT_EQ(::write(pair.value().first.get(), "x", 1), 1);
  ASSERT_TRUE(r.run().ok());
  for (auto& fd : extra) r.remove(fd.get());
}

}  // namespace
}  // namespace nvshare::scheduler

// The link engine against the real nvshare-scheduler: two clients (two engines, so two sessions,
// as two processes would have) on one GPU hand the grant over by idle release, by turns, and with a
// swap when their memory does not fit together.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <future>
#include <string>
#include <vector>

#include "client/link/link_engine.h"
#include "common/json.h"
#include "test_support.h"

namespace nvshare::client {
namespace {

using namespace std::chrono_literals;
using testing::FakeAgent;
using testing::SchedulerProcess;
using testing::TempDir;
using testing::wait_until;

constexpr std::uint64_t kGpuMemory = 1ull << 30;
constexpr const char* kGpu = "GPU-00000000-1111-2222-3333-444444444444";

class Client {
 public:
  Client(const std::string& socket, Duration idle_release, std::string trace_file = "") {
    LinkOptions options;
    options.socket_path = socket;
    options.timing.idle_release = idle_release;
    options.trace_file = std::move(trace_file);
    options.process_name = "itest";
    engine_ = std::make_unique<LinkEngine>(options);
    link_ = &engine_->device({kGpu, kGpuMemory}, agent_);
  }
  ~Client() {
    engine_->stop(1s);  // opens the gate for a thread a failed test left waiting
    if (pending_.valid()) pending_.wait();
  }
  // Starts one submission on another thread.
  void submit() {
    pending_ = std::async(std::launch::async, [this] {
      link_->before_submit();
      link_->after_submit(true);
    });
  }
  bool submitted_within(std::chrono::milliseconds timeout) {
    return pending_.wait_for(timeout) == std::future_status::ready;
  }
  // What the library does after an allocation: the new usage, announced to the link, which reports
  // it before its next request (the scheduler judges fit on it).
  void set_usage(DeviceUsage usage) {
    agent_.set_usage(usage);
    link_->usage_changed();
  }
  GrantState state() const { return static_cast<DeviceChannel*>(link_)->state(); }
  FakeAgent& agent() { return agent_; }

 private:
  FakeAgent agent_;
  std::unique_ptr<LinkEngine> engine_;
  DeviceLink* link_ = nullptr;
  std::future<void> pending_;
};

TEST(LinkWithScheduler, IdleReleaseHandsTheGpuOver) {
  TempDir dir;
  SchedulerProcess scheduler(dir, {"--mode", "exclusive", "--quantum", "60", "--turn-slice", "60"});
  ASSERT_TRUE(scheduler.ready()) << scheduler.log();
  Client a(scheduler.socket(), 50ms);
  Client b(scheduler.socket(), 50ms);
  a.submit();
  ASSERT_TRUE(a.submitted_within(3s)) << scheduler.log();
  EXPECT_EQ(a.state(), GrantState::kHeld);
  b.submit();
  EXPECT_FALSE(b.submitted_within(300ms)) << "exclusive mode granted two clients";
  EXPECT_EQ(b.state(), GrantState::kRequested);
  a.agent().set_idle(1s);  // a's work is done
  ASSERT_TRUE(b.submitted_within(3s)) << scheduler.log();
  EXPECT_EQ(b.state(), GrantState::kHeld);
  EXPECT_EQ(a.state(), GrantState::kIdle);
  EXPECT_EQ(a.agent().drains.load(), 0) << "an idle release does not drain";
}

TEST(LinkWithScheduler, TurnsRevokeDrainAndHandOverBothWays) {
  TempDir dir;
  SchedulerProcess scheduler(dir, {"--mode", "exclusive", "--quantum", "0.2"});
  ASSERT_TRUE(scheduler.ready()) << scheduler.log();
  Client a(scheduler.socket(), 0ms);  // no idle release: only revokes move the grant
  Client b(scheduler.socket(), 0ms);
  a.submit();
  ASSERT_TRUE(a.submitted_within(3s)) << scheduler.log();
  b.submit();
  // After a's quantum the scheduler revokes it: a drains, releases, and b runs.
  ASSERT_TRUE(b.submitted_within(5s)) << scheduler.log();
  EXPECT_EQ(a.agent().drains.load(), 1);
  EXPECT_EQ(a.agent().swap_outs.load(), 0) << "two small clients take turns without swapping";
  EXPECT_EQ(a.state(), GrantState::kRequested);  // re-queued by the scheduler, no new request
  // a waits again; after b's quantum it runs.
  a.submit();
  ASSERT_TRUE(a.submitted_within(5s)) << scheduler.log();
  EXPECT_EQ(b.agent().drains.load(), 1);
}

// Both clients append to one trace file: each line is whole JSON, and the hand-over reads in order
// request, grant (a), request (b), yield (a is asked to hand over once idle; it stays busy; only
// while its turn lasts), revoke, release (a), grant (b), with monotonic times.
TEST(LinkWithScheduler, TraceRecordsTheHandOverInOrder) {
  TempDir dir;
  SchedulerProcess scheduler(dir, {"--mode", "exclusive", "--quantum", "0.2"});
  ASSERT_TRUE(scheduler.ready()) << scheduler.log();
  const std::string trace = dir.file("trace.jsonl");
  {
    Client a(scheduler.socket(), 0ms, trace);
    Client b(scheduler.socket(), 0ms, trace);
    a.submit();
    ASSERT_TRUE(a.submitted_within(3s)) << scheduler.log();
    b.submit();
    ASSERT_TRUE(b.submitted_within(5s)) << scheduler.log();
  }
  std::ifstream in(trace);
  std::vector<std::string> events;
  double last_t = 0;
  for (std::string line; std::getline(in, line);) {
    auto parsed = parse_json(line);
    ASSERT_TRUE(parsed.ok()) << line;
    const Json& j = parsed.value();
    ASSERT_TRUE(j.is_object()) << line;
    const double t = j.find("t")->as_double().value_or(-1);
    EXPECT_GE(t, last_t) << "trace times go backwards at " << line;
    last_t = t;
    EXPECT_EQ(*j.find("gpu")->as_string(), kGpu);
    events.push_back(*j.find("event")->as_string());
    if (events.back() == "release") {
      EXPECT_GE(j.find("ms")->as_double().value_or(-1), 0.0) << line;
    }
  }
  // The yield is asked only while a's turn has not ended yet: when b's request comes after a's
  // shortest turn (a loaded host), the scheduler revokes a at once and sends no yield.
  const auto yield = std::find(events.begin(), events.end(), "yield");
  if (yield != events.end()) {
    EXPECT_EQ(yield - events.begin(), 3) << "the yield comes between b's request and the revoke";
    events.erase(yield);
  }
  const std::vector<std::string> expected = {"request", "grant",   "request",
                                             "revoke",  "release", "grant"};
  ASSERT_GE(events.size(), expected.size());
  EXPECT_EQ(std::vector<std::string>(events.begin(), events.begin() + 6), expected);
}

// Exclusive mode with a long quantum and a long idle release: a holder that goes idle while another
// client waits hands the GPU over at once (the scheduler's yield), not after 60 s or 10 s.
TEST(LinkWithScheduler, IdleHolderYieldsToAWaiterAtOnce) {
  TempDir dir;
  SchedulerProcess scheduler(dir, {"--mode", "exclusive", "--quantum", "60", "--turn-slice", "60"});
  ASSERT_TRUE(scheduler.ready()) << scheduler.log();
  Client a(scheduler.socket(), 10s);
  Client b(scheduler.socket(), 10s);
  a.submit();
  ASSERT_TRUE(a.submitted_within(3s)) << scheduler.log();
  b.submit();
  EXPECT_FALSE(b.submitted_within(300ms)) << "a busy holder keeps its turn";
  a.agent().set_idle(1s);  // a's work is done
  ASSERT_TRUE(b.submitted_within(3s)) << "an idle holder did not yield: " << scheduler.log();
  EXPECT_EQ(a.state(), GrantState::kIdle);
  EXPECT_EQ(a.agent().drains.load(), 0) << "a yield is an idle release: nothing to drain";
}

TEST(LinkWithScheduler, UnwritableTraceFileLeavesTheLinkWorking) {
  TempDir dir;
  SchedulerProcess scheduler(dir, {"--mode", "exclusive"});
  ASSERT_TRUE(scheduler.ready()) << scheduler.log();
  Client a(scheduler.socket(), 0ms, dir.file("no/such/dir/trace.jsonl"));
  a.submit();
  ASSERT_TRUE(a.submitted_within(3s)) << scheduler.log();
  EXPECT_EQ(a.state(), GrantState::kHeld);
}

TEST(LinkWithScheduler, ClientsThatDoNotFitSwapAtTheHandOver) {
  TempDir dir;
  SchedulerProcess scheduler(dir, {"--capacity", "1Gi", "--quantum", "0.2"});
  ASSERT_TRUE(scheduler.ready()) << scheduler.log();
  Client a(scheduler.socket(), 0ms);
  Client b(scheduler.socket(), 0ms);
  // Announced, not only set: a usage the link was never told of reaches the scheduler only with the
  // welcome, which may come before it (a race the sanitizer build's timing exposed).
  a.set_usage({700ull << 20, 700ull << 20, 0});
  b.set_usage({700ull << 20, 700ull << 20, 0});
  a.agent().swap_bytes = 700ull << 20;
  b.agent().swap_bytes = 700ull << 20;
  a.submit();
  ASSERT_TRUE(a.submitted_within(3s)) << scheduler.log();
  b.submit();
  EXPECT_FALSE(b.submitted_within(100ms)) << "1.4Gi ran together on a 1Gi GPU";
  ASSERT_TRUE(b.submitted_within(5s)) << scheduler.log();
  EXPECT_EQ(a.agent().swap_outs.load(), 1);
  // a comes back after b's turn, swapping in before it runs again.
  a.submit();
  ASSERT_TRUE(a.submitted_within(5s)) << scheduler.log();
  EXPECT_EQ(a.agent().swap_ins.load(), 1);
  // b's memory left the device for each of a's turns: evicted while b idled before its first turn
  // (700Mi allocated and on the device), then revoked, or evicted once b idled in its turn.
  EXPECT_GE(b.agent().swap_outs.load(), 1);
  EXPECT_LE(b.agent().swap_outs.load(), 2);
}

TEST(LinkWithScheduler, SchedulerRestartIsSurvived) {
  TempDir dir;
  auto scheduler = std::make_unique<SchedulerProcess>(dir, std::vector<std::string>{});
  ASSERT_TRUE(scheduler->ready());
  Client a(scheduler->socket(), 0ms);
  a.submit();
  ASSERT_TRUE(a.submitted_within(3s));
  const std::string socket = scheduler->socket();
  scheduler.reset();  // SIGTERM: the scheduler goes away
  ASSERT_TRUE(wait_until([&] { return a.state() == GrantState::kOpen; }));
  a.submit();
  EXPECT_TRUE(a.submitted_within(1s)) << "fail-open";
  scheduler = std::make_unique<SchedulerProcess>(dir, std::vector<std::string>{});
  ASSERT_TRUE(scheduler->ready());
  // Registered again within the backoff (at most 2 s), closed until granted.
  ASSERT_TRUE(wait_until([&] { return a.state() == GrantState::kIdle; }, 5000ms))
      << to_string(a.state());
  a.submit();
  EXPECT_TRUE(a.submitted_within(3s)) << scheduler->log();
  EXPECT_EQ(a.state(), GrantState::kHeld);
}

}  // namespace
}  // namespace nvshare::client

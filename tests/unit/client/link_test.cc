// The link engine against a scripted scheduler: registration, the gate, revokes, swaps, idle
// release, limits, usage, liveness, fail-open and reconnection.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <future>
#include <map>
#include <set>

#include "client/link/link_engine.h"
#include "test_support.h"

namespace nvshare::client {
namespace {

using namespace std::chrono_literals;
using testing::FakeAgent;
using testing::ScriptedPeer;
using testing::ScriptedScheduler;
using testing::StderrCapture;
using testing::TempDir;
using testing::wait_until;

constexpr std::uint64_t kGpuMemory = 16ull << 30;

// A thread calling before_submit() once. If it is still blocked when the test ends (the test
// failed), the engine is stopped so that the gate opens and the test does not hang.
class Submitter {
 public:
  Submitter(DeviceLink& link, LinkEngine* engine)
      : engine_(engine), future_(std::async(std::launch::async, [&link] {
          link.before_submit();
          link.after_submit(true);
        })) {}
  ~Submitter() {
    if (future_.wait_for(3s) != std::future_status::ready && engine_ != nullptr) engine_->stop(1s);
  }
  bool done_within(std::chrono::milliseconds timeout) {
    return future_.wait_for(timeout) == std::future_status::ready;
  }

 private:
  LinkEngine* engine_;
  std::future<void> future_;
};

// Returns within `timeout` from before_submit on this thread.
bool passes_quickly(DeviceLink& link, std::chrono::milliseconds timeout = 200ms) {
  const auto start = std::chrono::steady_clock::now();
  link.before_submit();
  link.after_submit(true);
  return std::chrono::steady_clock::now() - start < timeout;
}

class LinkTest : public ::testing::Test {
 protected:
  LinkOptions options() {
    LinkOptions o;
    o.socket_path = dir_.file("s.sock");
    o.timing.reconnect_initial = 20ms;
    o.timing.reconnect_max = 100ms;
    o.process_name = "link-test";
    return o;
  }

  // Engine + device, session welcomed (the usage report that follows the welcome consumed).
  void start_session(LinkOptions o) {
    engine_ = std::make_unique<LinkEngine>(std::move(o));
    link_ = &engine_->device({"GPU-test", kGpuMemory}, agent_);
    peer_ = scheduler_.accept();
    ASSERT_NE(peer_, nullptr);
    ASSERT_TRUE(peer_->handshake());
    ASSERT_TRUE(wait_until([&] { return channel().state() == GrantState::kIdle; }));
  }
  void start_session() { start_session(options()); }

  // A submission requests, the grant arrives, the submission goes through.
  void acquire(std::uint64_t epoch) {
    Submitter submitter(*link_, engine_.get());
    ASSERT_TRUE(peer_->expect<protocol::Request>()) << peer_->last_unexpected();
    peer_->send(protocol::Grant{epoch});
    ASSERT_TRUE(submitter.done_within(3s));
    ASSERT_EQ(channel().state(), GrantState::kHeld);
  }

  DeviceChannel& channel() { return static_cast<DeviceChannel&>(*link_); }

  TempDir dir_;
  ScriptedScheduler scheduler_{dir_.file("s.sock")};
  FakeAgent agent_;
  FakeAgent other_;  // a second GPU's agent; both outlive the engine that calls them
  std::unique_ptr<LinkEngine> engine_;
  DeviceLink* link_ = nullptr;
  std::unique_ptr<ScriptedPeer> peer_;
};

TEST_F(LinkTest, HelloCarriesIdentityCapabilitiesAndDeclaredLimits) {
  LinkOptions o = options();
  o.declared = protocol::Limits{1ull << 30, 30};
  o.pod_uid = "pod-1234";
  o.process_name.clear();  // from /proc/self/comm
  engine_ = std::make_unique<LinkEngine>(o);
  engine_->device({"GPU-abc", kGpuMemory}, agent_);
  peer_ = scheduler_.accept();
  ASSERT_NE(peer_, nullptr);
  auto hello = peer_->expect<protocol::Hello>();
  ASSERT_TRUE(hello);
  EXPECT_EQ(hello->pid, static_cast<std::uint32_t>(::getpid()));
  EXPECT_EQ(hello->gpu_uuid, "GPU-abc");
  EXPECT_EQ(hello->gpu_memory_bytes, kGpuMemory);
  EXPECT_EQ(hello->capabilities, protocol::capability::kSwap | protocol::capability::kIdleRelease |
                                     protocol::capability::kUsageReports |
                                     protocol::capability::kYield);
  EXPECT_EQ(hello->declared, (protocol::Limits{1ull << 30, 30}));
  EXPECT_EQ(hello->pod_uid, "pod-1234");
  std::ifstream comm("/proc/self/comm");
  std::string name;
  std::getline(comm, name);
  EXPECT_EQ(hello->process_name, name);
  EXPECT_EQ(hello->min_version, protocol::kMinVersion);
  EXPECT_EQ(hello->max_version, protocol::kMaxVersion);
  // The declared limits reach the agent before anything else, scheduler or not.
  ASSERT_TRUE(wait_until([&] { return !agent_.limits().empty(); }));
  EXPECT_EQ(agent_.limits().front(), (protocol::Limits{1ull << 30, 30}));
}

TEST_F(LinkTest, CapabilitiesFollowTheOptions) {
  LinkOptions o = options();
  o.can_swap = false;
  o.timing.idle_release = 0ms;
  engine_ = std::make_unique<LinkEngine>(o);
  engine_->device({"GPU-abc", kGpuMemory}, agent_);
  peer_ = scheduler_.accept();
  ASSERT_NE(peer_, nullptr);
  auto hello = peer_->expect<protocol::Hello>();
  ASSERT_TRUE(hello);
  EXPECT_EQ(hello->capabilities,
            protocol::capability::kUsageReports | protocol::capability::kYield);
}

TEST_F(LinkTest, SameUuidSameLinkAndOneSessionPerGpu) {
  engine_ = std::make_unique<LinkEngine>(options());
  DeviceLink& a = engine_->device({"GPU-a", kGpuMemory}, agent_);
  DeviceLink& b = engine_->device({"GPU-b", kGpuMemory}, other_);
  EXPECT_EQ(&engine_->device({"GPU-a", kGpuMemory}, agent_), &a);
  EXPECT_NE(&a, &b);
  std::set<std::string> uuids;
  std::vector<std::unique_ptr<ScriptedPeer>> peers;
  for (int i = 0; i < 2; ++i) {
    peers.push_back(scheduler_.accept());
    ASSERT_NE(peers.back(), nullptr);
    auto hello = peers.back()->expect<protocol::Hello>();
    ASSERT_TRUE(hello);
    uuids.insert(hello->gpu_uuid);
  }
  EXPECT_EQ(uuids, (std::set<std::string>{"GPU-a", "GPU-b"}));
  EXPECT_EQ(scheduler_.accept(200ms), nullptr);
}

// Each GPU has its own link thread: while one GPU's agent is busy (a drain or swap that takes
// long), the other GPU's session still takes its grant and lets its submissions through.
TEST_F(LinkTest, ABusyGpuNeverDelaysAnotherGpusGrant) {
  engine_ = std::make_unique<LinkEngine>(options());
  DeviceLink& a = engine_->device({"GPU-a", kGpuMemory}, agent_);
  DeviceLink& b = engine_->device({"GPU-b", kGpuMemory}, other_);
  std::map<std::string, std::unique_ptr<ScriptedPeer>> peers;
  for (int i = 0; i < 2; ++i) {
    auto peer = scheduler_.accept();
    ASSERT_NE(peer, nullptr);
    auto hello = peer->handshake(10 + i);
    ASSERT_TRUE(hello);
    peers[hello->gpu_uuid] = std::move(peer);
  }
  {
    Submitter submitter(a, engine_.get());
    ASSERT_TRUE(peers["GPU-a"]->expect<protocol::Request>());
    peers["GPU-a"]->send(protocol::Grant{1});
    ASSERT_TRUE(submitter.done_within(3s));
  }
  // GPU-a's drain blocks its link thread until released.
  agent_.hold_drains();
  peers["GPU-a"]->send(protocol::Revoke{1, protocol::RevokeReason::kTurn, true});
  ASSERT_TRUE(wait_until([&] { return agent_.drain_started_ns.load() != 0; }));
  // Meanwhile GPU-b asks, is granted and runs.
  Submitter submitter(b, engine_.get());
  ASSERT_TRUE(peers["GPU-b"]->expect<protocol::Request>()) << peers["GPU-b"]->last_unexpected();
  peers["GPU-b"]->send(protocol::Grant{1});
  EXPECT_TRUE(submitter.done_within(3s));
  EXPECT_EQ(agent_.swap_outs.load(), 0);  // GPU-a is still draining
  agent_.release_drain();
  auto released = peers["GPU-a"]->expect<protocol::Released>();
  ASSERT_TRUE(released) << peers["GPU-a"]->last_unexpected();
  EXPECT_EQ(agent_.swap_outs.load(), 1);
}

TEST_F(LinkTest, FirstSubmissionRequestsAndWaitsForTheGrant) {
  start_session();
  EXPECT_TRUE(peer_->quiet_for(100ms))
      << "no request before a submission: " << peer_->last_unexpected();
  Submitter submitter(*link_, engine_.get());
  ASSERT_TRUE(peer_->expect<protocol::Request>()) << peer_->last_unexpected();
  EXPECT_FALSE(submitter.done_within(200ms)) << "a submission went through without a grant";
  EXPECT_EQ(channel().state(), GrantState::kRequested);
  peer_->send(protocol::Wait{protocol::WaitReason::kTurn});
  EXPECT_FALSE(submitter.done_within(100ms));
  peer_->send(protocol::Grant{3});
  EXPECT_TRUE(submitter.done_within(3s));
  EXPECT_EQ(channel().state(), GrantState::kHeld);
  EXPECT_EQ(channel().epoch(), 3u);
  // One request however many threads wait.
  EXPECT_TRUE(peer_->quiet_for(100ms)) << peer_->last_unexpected();
}

TEST_F(LinkTest, ManyWaitingThreadsSendOneRequest) {
  start_session();
  std::vector<std::unique_ptr<Submitter>> submitters;
  for (int i = 0; i < 8; ++i)
    submitters.push_back(std::make_unique<Submitter>(*link_, engine_.get()));
  ASSERT_TRUE(peer_->expect<protocol::Request>());
  EXPECT_TRUE(peer_->quiet_for(150ms)) << peer_->last_unexpected();
  peer_->send(protocol::Grant{1});
  for (auto& s : submitters) EXPECT_TRUE(s->done_within(3s));
}

TEST_F(LinkTest, FastPathTouchesNeitherSocketNorLinkThreadWhileHeld) {
  start_session();
  acquire(1);
  const LinkStats before = engine_->stats();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 1'000'000; ++i) {
    link_->before_submit();
    link_->after_submit(true);
  }
  const auto took = std::chrono::steady_clock::now() - start;
  const LinkStats after = engine_->stats();
  EXPECT_EQ(after.wakeups, before.wakeups);
  EXPECT_EQ(after.frames_sent, before.frames_sent);
  EXPECT_TRUE(peer_->quiet_for(100ms)) << peer_->last_unexpected();
  // A million passes are two uncontended atomic operations each: far below a second.
  EXPECT_LT(took, 1s);
}

TEST_F(LinkTest, RevokeDrainsSwapsOutReportsAndReleasesWithEpochAndDrainTime) {
  start_session();
  acquire(5);
  agent_.drain_delay_ns = std::chrono::nanoseconds(30ms).count();
  agent_.swap_delay_ns = std::chrono::nanoseconds(10ms).count();
  agent_.set_usage({3ull << 30, 3ull << 30, 0});
  peer_->send(protocol::Revoke{5, protocol::RevokeReason::kMemory, true});
  auto usage = peer_->next();
  ASSERT_TRUE(usage && std::holds_alternative<protocol::Usage>(*usage));
  // 1 GiB moved in about 10 ms: the link measured the bandwidth and reports it.
  EXPECT_GT(std::get<protocol::Usage>(*usage).swap_bytes_per_s, 0u);
  auto released = peer_->expect<protocol::Released>();
  ASSERT_TRUE(released) << peer_->last_unexpected();
  EXPECT_EQ(released->epoch, 5u);
  EXPECT_GE(released->drain_us, 30'000u);
  EXPECT_LT(released->drain_us, 2'000'000u);
  EXPECT_GE(released->held_us, released->drain_us);
  EXPECT_EQ(agent_.drains.load(), 1);
  EXPECT_EQ(agent_.swap_outs.load(), 1);
  EXPECT_EQ(agent_.swap_ins.load(), 0);
  EXPECT_EQ(channel().state(), GrantState::kRequested);

  // Revoked with work left: the scheduler queued us already, so a submission waits without asking.
  Submitter submitter(*link_, engine_.get());
  EXPECT_TRUE(peer_->quiet_for(150ms)) << "no request after a revoke: " << peer_->last_unexpected();
  EXPECT_FALSE(submitter.done_within(10ms));
  agent_.swap_delay_ns = std::chrono::nanoseconds(100ms).count();
  peer_->send(protocol::Grant{6});
  ASSERT_TRUE(submitter.done_within(3s));
  // The submission went through only after the memory was back.
  EXPECT_EQ(agent_.swap_ins.load(), 1);
  EXPECT_EQ(channel().epoch(), 6u);
  const std::vector<std::string> calls = agent_.calls();
  const auto swap_out = std::find(calls.begin(), calls.end(), "swap_out");
  const auto swap_in = std::find(calls.begin(), calls.end(), "swap_in");
  EXPECT_LT(swap_out, swap_in);
  EXPECT_TRUE(agent_.called_only_from_one_thread_other_than(std::this_thread::get_id()));
}

TEST_F(LinkTest, RevokeWithoutSwapOnlyDrains) {
  start_session();
  acquire(2);
  peer_->send(protocol::Revoke{2, protocol::RevokeReason::kTurn, false});
  auto released = peer_->expect<protocol::Released>();
  ASSERT_TRUE(released) << peer_->last_unexpected();
  EXPECT_EQ(released->epoch, 2u);
  EXPECT_EQ(agent_.drains.load(), 1);
  EXPECT_EQ(agent_.swap_outs.load(), 0);
  // Not swapped out: a grant does not swap in.
  Submitter submitter(*link_, engine_.get());
  peer_->send(protocol::Grant{3});
  ASSERT_TRUE(submitter.done_within(3s));
  EXPECT_EQ(agent_.swap_ins.load(), 0);
}

TEST_F(LinkTest, StaleRevokeIsIgnored) {
  start_session();
  acquire(5);
  peer_->send(protocol::Revoke{4, protocol::RevokeReason::kTurn, true});
  EXPECT_TRUE(peer_->quiet_for(200ms)) << peer_->last_unexpected();
  EXPECT_EQ(channel().state(), GrantState::kHeld);
  EXPECT_EQ(agent_.drains.load(), 0);
  EXPECT_TRUE(passes_quickly(*link_));
}

// The shell's wiring of the wait for threads inside a submission (its timing is pinned in
// grant_session_test.cc): the last thread out wakes the link thread, which drains only then.
TEST_F(LinkTest, RevokeWaitsForThreadsInsideASubmissionBeforeDraining) {
  start_session();
  acquire(1);
  std::atomic<bool> entered{false};
  std::atomic<std::int64_t> left_ns{0};
  std::promise<void> leave;
  std::thread inside([&, left = leave.get_future()] {
    link_->before_submit();
    entered = true;
    left.wait();  // a long launch call
    left_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                  std::chrono::steady_clock::now().time_since_epoch())
                  .count();
    link_->after_submit(true);
  });
  ASSERT_TRUE(wait_until([&] { return entered.load(); }));
  peer_->send(protocol::Revoke{1, protocol::RevokeReason::kTurn, false});
  ASSERT_TRUE(wait_until([&] { return channel().state() == GrantState::kRevoking; }));
  EXPECT_EQ(agent_.drains.load(), 0);
  leave.set_value();
  auto released = peer_->expect<protocol::Released>();
  inside.join();
  ASSERT_TRUE(released) << peer_->last_unexpected();
  EXPECT_GE(agent_.drain_started_ns.load(), left_ns.load());
}

TEST_F(LinkTest, GateIsClosedWhileDraining) {
  start_session();
  acquire(1);
  agent_.hold_drains();
  peer_->send(protocol::Revoke{1, protocol::RevokeReason::kTurn, false});
  ASSERT_TRUE(wait_until([&] { return agent_.drain_started_ns.load() != 0; }));
  EXPECT_EQ(channel().state(), GrantState::kRevoking);
  Submitter submitter(*link_, engine_.get());
  EXPECT_FALSE(submitter.done_within(150ms)) << "a submission went through during a revoke";
  agent_.release_drain();
  ASSERT_TRUE(peer_->expect<protocol::Released>());
  EXPECT_FALSE(submitter.done_within(100ms));
  peer_->send(protocol::Grant{2});
  EXPECT_TRUE(submitter.done_within(3s));
}

TEST_F(LinkTest, IdleHolderReleasesAndRequestsAgainOnNextSubmission) {
  LinkOptions o = options();
  o.timing.idle_release = 40ms;
  start_session(o);
  acquire(9);
  // Busy (idle_for zero): keeps the grant.
  EXPECT_TRUE(peer_->quiet_for(200ms)) << peer_->last_unexpected();
  EXPECT_GT(agent_.idle_queries.load(), 0);
  agent_.set_idle(50ms);
  auto released = peer_->expect<protocol::Released>(2000ms);
  ASSERT_TRUE(released) << peer_->last_unexpected();
  EXPECT_EQ(released->epoch, 9u);
  EXPECT_EQ(released->drain_us, 0u);
  EXPECT_GT(released->held_us, 0u);
  EXPECT_EQ(agent_.drains.load(), 0);
  EXPECT_EQ(channel().state(), GrantState::kIdle);
  agent_.set_idle(0ms);
  Submitter submitter(*link_, engine_.get());
  ASSERT_TRUE(peer_->expect<protocol::Request>()) << peer_->last_unexpected();
  EXPECT_FALSE(submitter.done_within(50ms));
  peer_->send(protocol::Grant{10});
  EXPECT_TRUE(submitter.done_within(3s));
}

TEST_F(LinkTest, GrantToAnIdleSwappedOutClientIsHandedBackWithoutSwappingIn) {
  LinkOptions o = options();
  o.timing.idle_release = 40ms;
  start_session(o);
  acquire(1);
  peer_->send(protocol::Revoke{1, protocol::RevokeReason::kMemory, true});
  ASSERT_TRUE(peer_->expect<protocol::Released>());
  agent_.set_idle(1s);  // nothing submitted since
  peer_->send(protocol::Grant{2});
  auto released = peer_->expect<protocol::Released>();
  ASSERT_TRUE(released) << peer_->last_unexpected();
  EXPECT_EQ(released->epoch, 2u);
  EXPECT_EQ(released->drain_us, 0u);
  EXPECT_EQ(agent_.swap_ins.load(), 0);
  EXPECT_EQ(channel().state(), GrantState::kIdle);
  // The next submission asks again and swaps in on its grant.
  agent_.set_idle(0ms);
  Submitter submitter(*link_, engine_.get());
  ASSERT_TRUE(peer_->expect<protocol::Request>());
  peer_->send(protocol::Grant{3});
  ASSERT_TRUE(submitter.done_within(3s));
  EXPECT_EQ(agent_.swap_ins.load(), 1);
}

TEST_F(LinkTest, LimitsReachTheAgent) {
  start_session();
  peer_->send(protocol::SetLimits{{4ull << 30, 30}});
  ASSERT_TRUE(wait_until([&] { return agent_.limits().size() >= 2; }));
  EXPECT_EQ(agent_.limits().back(), (protocol::Limits{4ull << 30, 30}));
}

// Coalescing is pinned in virtual time (grant_session_test.cc); here, a change reaches the
// scheduler and an unchanged figure does not go again.
TEST_F(LinkTest, UsageIsReportedWhenItChanges) {
  start_session();
  ASSERT_EQ(peer_->usage_seen().size(), 1u);  // right after the welcome
  agent_.set_usage({5ull << 20, 4ull << 20, 0});
  link_->usage_changed();
  EXPECT_TRUE(peer_->quiet_for(150ms)) << peer_->last_unexpected();  // collects usage reports
  ASSERT_EQ(peer_->usage_seen().size(), 2u);
  EXPECT_EQ(peer_->usage_seen().back().allocated_bytes, 5ull << 20);
  EXPECT_EQ(peer_->usage_seen().back().resident_bytes, 4ull << 20);
  const std::size_t count = peer_->usage_seen().size();
  link_->usage_changed();
  EXPECT_TRUE(peer_->quiet_for(150ms));
  EXPECT_EQ(peer_->usage_seen().size(), count);
}

TEST_F(LinkTest, PingIsAnswered) {
  start_session();
  peer_->send(protocol::Ping{42});
  auto pong = peer_->expect<protocol::Pong>();
  ASSERT_TRUE(pong) << peer_->last_unexpected();
  EXPECT_EQ(pong->nonce, 42u);
}

TEST_F(LinkTest, SilentSchedulerIsPingedThenTreatedAsGone) {
  LinkOptions o = options();
  o.timing.ping_after = 100ms;
  o.timing.dead_after = 150ms;
  start_session(o);
  Submitter submitter(*link_, engine_.get());
  ASSERT_TRUE(peer_->expect<protocol::Request>());
  auto ping = peer_->expect<protocol::Ping>(1000ms);
  ASSERT_TRUE(ping) << peer_->last_unexpected();
  // No answer: the session is dropped and the waiting thread goes on, unscheduled.
  EXPECT_TRUE(peer_->closed_within(2000ms));
  EXPECT_TRUE(submitter.done_within(2s));
  EXPECT_EQ(channel().state(), GrantState::kOpen);
}

TEST_F(LinkTest, AnsweredPingsKeepTheSession) {
  LinkOptions o = options();
  o.timing.ping_after = 50ms;
  o.timing.dead_after = 100ms;
  start_session(o);
  for (int i = 0; i < 4; ++i) {
    auto ping = peer_->expect<protocol::Ping>(1000ms);
    ASSERT_TRUE(ping) << peer_->last_unexpected();
    peer_->send(protocol::Pong{ping->nonce});
  }
  EXPECT_EQ(channel().state(), GrantState::kIdle);
  EXPECT_EQ(engine_->stats().sessions, 1u);
}

TEST_F(LinkTest, NoSchedulerMeansOpenAndIsLoggedOnce) {
  scheduler_.shut();
  StderrCapture capture;
  engine_ = std::make_unique<LinkEngine>(options());
  link_ = &engine_->device({"GPU-test", kGpuMemory}, agent_);
  for (int i = 0; i < 1000; ++i) ASSERT_TRUE(passes_quickly(*link_, 2s));
  // The backoff between attempts and the single log line over many of them are pinned in
  // grant_session_test.cc.
  EXPECT_EQ(channel().state(), GrantState::kOpen);
  // The gate opens just before the outage is logged, on the link thread: wait for the log.
  ASSERT_TRUE(wait_until([&] { return engine_->stats().outages >= 1; }));
  const std::string text = capture.text();
  EXPECT_EQ(testing::count_occurrences(text, "scheduler unreachable at " + dir_.file("s.sock")), 1)
      << text;
  EXPECT_EQ(engine_->stats().outages, 1u);
}

TEST_F(LinkTest, SchedulerRestartReconnectsAndRegistersAgain) {
  start_session();
  acquire(4);
  StderrCapture capture;
  peer_->close();
  scheduler_.shut();
  ASSERT_TRUE(wait_until([&] { return channel().state() == GrantState::kOpen; }));
  EXPECT_TRUE(passes_quickly(*link_));

  // A process that keeps submitting while the scheduler is away runs unscheduled.
  std::atomic<bool> stop{false};
  std::atomic<int> submitted{0};
  std::thread worker([&] {
    while (!stop) {
      link_->before_submit();
      link_->after_submit(true);
      ++submitted;
      std::this_thread::sleep_for(1ms);
    }
  });
  ASSERT_TRUE(wait_until([&] { return submitted.load() >= 20; }));
  ScriptedScheduler restarted(dir_.file("s.sock"));
  auto peer = restarted.accept(1000ms);  // backoff is at most 100 ms here
  ASSERT_NE(peer, nullptr);
  auto hello = peer->handshake(8);
  ASSERT_TRUE(hello);
  EXPECT_EQ(hello->gpu_uuid, "GPU-test");
  // Registered again: closed until granted; the running thread asks and waits.
  ASSERT_TRUE(peer->expect<protocol::Request>()) << peer->last_unexpected();
  peer->send(protocol::Grant{1});
  stop = true;
  worker.join();
  EXPECT_EQ(channel().state(), GrantState::kHeld);
  EXPECT_EQ(engine_->stats().sessions, 2u);
  const std::string text = capture.text();
  EXPECT_EQ(testing::count_occurrences(text, "scheduler unreachable"), 1) << text;
  EXPECT_EQ(testing::count_occurrences(text, "reachable again"), 1) << text;
}

TEST_F(LinkTest, WaitingThreadIsReleasedWhenTheConnectionDrops) {
  start_session();
  Submitter submitter(*link_, engine_.get());
  ASSERT_TRUE(peer_->expect<protocol::Request>());
  EXPECT_FALSE(submitter.done_within(100ms));
  peer_->close();
  EXPECT_TRUE(submitter.done_within(2s));
  EXPECT_EQ(channel().state(), GrantState::kOpen);
}

TEST_F(LinkTest, MissingWelcomeIsBoundedByTheHandshakeTimeout) {
  LinkOptions o = options();
  o.timing.handshake_timeout = 200ms;
  engine_ = std::make_unique<LinkEngine>(o);
  link_ = &engine_->device({"GPU-test", kGpuMemory}, agent_);
  peer_ = scheduler_.accept();
  ASSERT_NE(peer_, nullptr);
  ASSERT_TRUE(peer_->expect<protocol::Hello>());
  // The first submission waits for the registration's outcome, which never comes.
  Submitter submitter(*link_, engine_.get());
  EXPECT_FALSE(submitter.done_within(100ms));
  EXPECT_TRUE(submitter.done_within(2s));
  EXPECT_EQ(channel().state(), GrantState::kOpen);
}

TEST_F(LinkTest, MalformedInputDropsTheSessionAndRunsOpen) {
  start_session();
  Submitter submitter(*link_, engine_.get());
  ASSERT_TRUE(peer_->expect<protocol::Request>());
  const std::uint8_t garbage[16] = {0xde, 0xad, 0xbe, 0xef};
  ASSERT_TRUE(write_all(peer_->fd(), garbage).ok());
  EXPECT_TRUE(submitter.done_within(2s));
  EXPECT_TRUE(peer_->closed_within(1000ms));
  EXPECT_EQ(channel().state(), GrantState::kOpen);
}

// A thread calling await_registration() once; reports how long it took.
class RegistrationWaiter {
 public:
  explicit RegistrationWaiter(DeviceLink& link)
      : future_(std::async(std::launch::async, [&link] {
          const auto start = std::chrono::steady_clock::now();
          link.await_registration();
          return std::chrono::steady_clock::now() - start;
        })) {}
  bool done_within(std::chrono::milliseconds timeout) {
    return future_.wait_for(timeout) == std::future_status::ready;
  }
  std::chrono::steady_clock::duration took() { return future_.get(); }

 private:
  std::future<std::chrono::steady_clock::duration> future_;
};

// The first CUDA call on a GPU waits until the scheduler's limits are in force: the welcome alone
// is not enough, the limits frame that follows it is, and it has reached the agent by then.
TEST_F(LinkTest, RegistrationIsAwaitedUntilTheFirstLimitsAreApplied) {
  engine_ = std::make_unique<LinkEngine>(options());
  link_ = &engine_->device({"GPU-test", kGpuMemory}, agent_);
  RegistrationWaiter waiter(*link_);
  peer_ = scheduler_.accept();
  ASSERT_NE(peer_, nullptr);
  ASSERT_TRUE(peer_->handshake());
  EXPECT_FALSE(waiter.done_within(150ms)) << "returned after the welcome, before the limits";
  EXPECT_FALSE(channel().registration_settled());
  peer_->send(protocol::SetLimits{{256ull << 20, 100}});
  ASSERT_TRUE(waiter.done_within(2s));
  EXPECT_TRUE(channel().registration_settled());
  ASSERT_FALSE(agent_.limits().empty());
  EXPECT_EQ(agent_.limits().back(), (protocol::Limits{256ull << 20, 100}));
  // Settled: later calls return at once.
  RegistrationWaiter again(*link_);
  EXPECT_TRUE(again.done_within(50ms));
}

// Nothing at the socket: the connect error settles the registration, nobody waits.
TEST_F(LinkTest, RegistrationIsNotAwaitedWithoutAScheduler) {
  scheduler_.shut();
  engine_ = std::make_unique<LinkEngine>(options());
  link_ = &engine_->device({"GPU-test", kGpuMemory}, agent_);
  RegistrationWaiter waiter(*link_);
  ASSERT_TRUE(waiter.done_within(2s));
  EXPECT_LT(waiter.took(), 100ms);
  EXPECT_TRUE(channel().registration_settled());
}

// A scheduler that accepts but never welcomes holds the first call for register_wait only.
TEST_F(LinkTest, RegistrationWaitIsBounded) {
  LinkOptions o = options();
  o.register_wait = 200ms;
  engine_ = std::make_unique<LinkEngine>(o);
  link_ = &engine_->device({"GPU-test", kGpuMemory}, agent_);
  peer_ = scheduler_.accept();
  ASSERT_NE(peer_, nullptr);
  ASSERT_TRUE(peer_->expect<protocol::Hello>());
  RegistrationWaiter waiter(*link_);
  ASSERT_TRUE(waiter.done_within(2s)) << "not bounded";
  EXPECT_LT(waiter.took(), 1000ms);
  EXPECT_FALSE(channel().registration_settled());
  // The bound counts from the link's creation: a later caller does not wait again.
  RegistrationWaiter later(*link_);
  EXPECT_TRUE(later.done_within(50ms));
}

// A lost connection during the handshake settles the registration (the process runs open).
TEST_F(LinkTest, RegistrationIsSettledWhenTheConnectionDrops) {
  engine_ = std::make_unique<LinkEngine>(options());
  link_ = &engine_->device({"GPU-test", kGpuMemory}, agent_);
  peer_ = scheduler_.accept();
  ASSERT_NE(peer_, nullptr);
  ASSERT_TRUE(peer_->expect<protocol::Hello>());
  RegistrationWaiter waiter(*link_);
  EXPECT_FALSE(waiter.done_within(100ms));
  peer_->close();
  EXPECT_TRUE(waiter.done_within(500ms));
}

TEST_F(LinkTest, ZeroRegisterWaitNeverWaits) {
  LinkOptions o = options();
  o.register_wait = 0ms;
  engine_ = std::make_unique<LinkEngine>(o);
  link_ = &engine_->device({"GPU-test", kGpuMemory}, agent_);
  RegistrationWaiter waiter(*link_);
  EXPECT_TRUE(waiter.done_within(50ms));
}

TEST_F(LinkTest, DisabledEngineDoesNothing) {
  LinkOptions o = options();
  o.enabled = false;
  engine_ = std::make_unique<LinkEngine>(o);
  DeviceLink& link = engine_->device({"GPU-test", kGpuMemory}, agent_);
  for (int i = 0; i < 100; ++i) EXPECT_TRUE(passes_quickly(link));
  link.usage_changed();
  EXPECT_EQ(scheduler_.accept(200ms), nullptr);
  EXPECT_FALSE(engine_->stats().thread_running);
  EXPECT_TRUE(agent_.calls().empty());
}

TEST_F(LinkTest, StoppedEngineOpensEveryGate) {
  start_session();
  Submitter submitter(*link_, engine_.get());
  ASSERT_TRUE(peer_->expect<protocol::Request>());
  engine_->stop(1s);
  EXPECT_TRUE(submitter.done_within(2s));
  EXPECT_EQ(channel().state(), GrantState::kStopped);
  EXPECT_TRUE(passes_quickly(*link_));
}

// A scheduler unsure of this client's limits (restarted without its state) marks them provisional:
// the client keeps, field by field, the stricter of those and the last limits known to hold, until
// authoritative ones arrive.
TEST_F(LinkTest, ProvisionalLimitsNeverLoosenTheLastKnownOnes) {
  start_session();
  peer_->send(protocol::SetLimits{{4ull << 30, 30}});
  ASSERT_TRUE(wait_until([&] { return agent_.limits().size() >= 2; }));
  peer_->send(protocol::SetLimits{{0, 100}, protocol::SetLimits::kProvisional});  // "none"
  ASSERT_TRUE(wait_until([&] { return agent_.limits().size() >= 3; }));
  EXPECT_EQ(agent_.limits().back(), (protocol::Limits{4ull << 30, 30}));
  peer_->send(protocol::SetLimits{{1ull << 30, 50}, protocol::SetLimits::kProvisional});
  ASSERT_TRUE(wait_until([&] { return agent_.limits().size() >= 4; }));
  EXPECT_EQ(agent_.limits().back(), (protocol::Limits{1ull << 30, 30}));  // stricter memory only
  // Authoritative limits replace them, looser or not.
  peer_->send(protocol::SetLimits{{8ull << 30, 100}});
  ASSERT_TRUE(wait_until([&] { return agent_.limits().size() >= 5; }));
  EXPECT_EQ(agent_.limits().back(), (protocol::Limits{8ull << 30, 100}));
}

// A managed container whose settings file says the pod's memory limit is pending: allocations are
// held (limits_unknown) and the first CUDA call waits, until the file gives the limit, even with no
// scheduler at all.
TEST_F(LinkTest, PendingSettingsHoldAllocationsUntilTheFileGivesTheLimit) {
  scheduler_.shut();
  const std::string settings = dir_.file("client.conf");
  std::ofstream(settings) << "enforce=1\nmemory-limit=pending\n";
  LinkOptions o = options();
  o.limits_pending = true;
  o.settings_path = settings;
  o.register_wait = 5s;
  engine_ = std::make_unique<LinkEngine>(o);
  link_ = &engine_->device({"GPU-test", kGpuMemory}, agent_);
  RegistrationWaiter waiter(*link_);
  ASSERT_TRUE(wait_until([&] {
    const auto calls = agent_.calls();
    return std::find(calls.begin(), calls.end(), "limits_unknown") != calls.end();
  }));
  EXPECT_TRUE(agent_.limits().empty());
  EXPECT_FALSE(waiter.done_within(300ms)) << "no scheduler, but the limit is not known yet";
  // The plugin writes the limit (atomically, as it does).
  std::ofstream(settings + ".tmp") << "enforce=1\nmemory-limit=1073741824\n";
  ASSERT_EQ(::rename((settings + ".tmp").c_str(), settings.c_str()), 0);
  ASSERT_TRUE(waiter.done_within(2s));
  ASSERT_FALSE(agent_.limits().empty());
  EXPECT_EQ(agent_.limits().back().memory_bytes, 1ull << 30);
  // While the scheduler stays away, a later change in the file applies too.
  std::ofstream(settings + ".tmp") << "enforce=1\nmemory-limit=536870912\n";
  ASSERT_EQ(::rename((settings + ".tmp").c_str(), settings.c_str()), 0);
  ASSERT_TRUE(
      wait_until([&] { return agent_.limits().back().memory_bytes == 512ull << 20; }, 3000ms));
}

// Pending settings and a scheduler that is unsure (provisional) either: still held; an
// authoritative frame releases them.
TEST_F(LinkTest, PendingSettingsAreNotResolvedByProvisionalLimits) {
  const std::string settings = dir_.file("client.conf");
  std::ofstream(settings) << "enforce=1\nmemory-limit=pending\n";
  LinkOptions o = options();
  o.limits_pending = true;
  o.settings_path = settings;
  engine_ = std::make_unique<LinkEngine>(o);
  link_ = &engine_->device({"GPU-test", kGpuMemory}, agent_);
  RegistrationWaiter waiter(*link_);
  peer_ = scheduler_.accept();
  ASSERT_NE(peer_, nullptr);
  ASSERT_TRUE(peer_->handshake());
  peer_->send(protocol::SetLimits{{0, 100}, protocol::SetLimits::kProvisional});
  EXPECT_FALSE(waiter.done_within(300ms));
  EXPECT_TRUE(agent_.limits().empty());
  peer_->send(protocol::SetLimits{{2ull << 30, 100}});
  ASSERT_TRUE(waiter.done_within(2s));
  EXPECT_EQ(agent_.limits().back(), (protocol::Limits{2ull << 30, 100}));
}

}  // namespace
}  // namespace nvshare::client

// GrantSession in virtual time: the client's half of the protocol with no socket, thread or clock.
// Each test feeds events at chosen instants and reads the actions back, so times are exact.
#include "client/link/grant_session.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <optional>

namespace nvshare::client {
namespace {

using namespace std::chrono_literals;
using namespace session;

class Probe final : public SessionProbe {
 public:
  int waiters() override { return waiting; }
  MonoTime waiting_since() override { return since; }
  std::uint64_t inside() override { return inside_now; }
  Duration idle_for() override { return idle; }
  DeviceUsage usage() override { return use; }
  Duration queue_waited() override { return waited; }
  std::uint64_t at_bound() override { return at_bound_now; }

  int waiting = 0;
  MonoTime since{};
  std::uint64_t inside_now = 0;
  std::uint64_t at_bound_now = 0;
  Duration idle{0};
  DeviceUsage use{1ull << 30, 1ull << 30, 0};
  Duration waited{0};
};

template <typename T>
const T* find(const std::vector<Action>& actions) {
  for (const Action& a : actions) {
    if (const T* t = std::get_if<T>(&a)) return t;
  }
  return nullptr;
}

template <typename M>
const M* sent(const std::vector<Action>& actions) {
  for (const Action& a : actions) {
    if (const Send* s = std::get_if<Send>(&a)) {
      if (const M* m = std::get_if<M>(&s->message)) return m;
    }
  }
  return nullptr;
}

template <typename M>
int count_sent(const std::vector<Action>& actions) {
  int n = 0;
  for (const Action& a : actions) {
    if (const Send* s = std::get_if<Send>(&a)) n += std::holds_alternative<M>(s->message) ? 1 : 0;
  }
  return n;
}

class GrantSessionTest : public ::testing::Test {
 protected:
  SessionConfig config() {
    SessionConfig c;
    c.gpu_uuid = "GPU-test";
    c.gpu_memory_bytes = 16ull << 30;
    c.pid = 42;
    c.timing.reconnect_initial = 20ms;
    c.timing.reconnect_max = 100ms;
    return c;
  }

  // The actions of one event; kept for the test's life, so pointers into them stay valid.
  const std::vector<Action>& at(Duration t, const Event& event) {
    now_ = MonoTime{t};
    return results_.emplace_back(engine_->handle(event, now_));
  }
  // Starts the engine, connects and welcomes it; returns the actions of the welcome.
  const std::vector<Action>& welcome(SessionConfig c) {
    engine_ = std::make_unique<GrantSession>(std::move(c), probe_);
    const auto first = at(0ms, Tick{});
    EXPECT_NE(find<Connect>(first), nullptr);
    EXPECT_NE(sent<protocol::Hello>(at(0ms, Connected{})), nullptr);
    return at(1ms, FrameReceived{protocol::Welcome{protocol::kMaxVersion, 7, 0}});
  }
  void welcome() { welcome(config()); }
  // A thread waits (since `waited_from`, else `t`), the engine requests at `t`, the grant comes.
  void hold(std::uint64_t epoch, Duration t, std::optional<Duration> waited_from = std::nullopt) {
    probe_.waiting = 1;
    probe_.since = MonoTime{waited_from.value_or(t)};
    EXPECT_NE(sent<protocol::Request>(at(t, Tick{})), nullptr);
    const auto granted = at(t, FrameReceived{protocol::Grant{epoch}});
    const Publish* p = find<Publish>(granted);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(p->gate, GateChange::kOpen);
    probe_.waiting = 0;
    ASSERT_EQ(engine_->state(), GrantState::kHeld);
  }

  // Held, idle for `threshold` less 1 ms at `before`: no release; for `threshold` at `at`: the
  // release starts (the gate closes).
  void expect_idle_threshold(Duration threshold, Duration before, Duration at) {
    probe_.idle = threshold - 1ms;
    EXPECT_EQ(find<CloseGateToRelease>(this->at(before, Tick{})), nullptr)
        << "released before " << to_ms(threshold) << " ms idle";
    probe_.idle = threshold;
    EXPECT_NE(find<CloseGateToRelease>(this->at(at, Tick{})), nullptr)
        << "not released at " << to_ms(threshold) << " ms idle";
  }

  Probe probe_;
  std::unique_ptr<GrantSession> engine_;
  MonoTime now_{};
  std::deque<std::vector<Action>> results_;
};

TEST_F(GrantSessionTest, HelloCarriesIdentityAndWelcomeClosesTheGate) {
  SessionConfig c = config();
  c.declared = {2ull << 30, 50};
  c.pod_uid = "pod";
  c.process_name = "trainer";
  engine_ = std::make_unique<GrantSession>(c, probe_);
  const auto start = at(0ms, Tick{});
  // Declared limits hold before anything else.
  ASSERT_NE(find<ApplyLimits>(start), nullptr);
  EXPECT_EQ(find<ApplyLimits>(start)->limits, (protocol::Limits{2ull << 30, 50}));
  const auto hello = sent<protocol::Hello>(at(0ms, Connected{}));
  ASSERT_NE(hello, nullptr);
  EXPECT_EQ(hello->pid, 42u);
  EXPECT_EQ(hello->gpu_uuid, "GPU-test");
  EXPECT_EQ(hello->pod_uid, "pod");
  EXPECT_EQ(hello->declared, (protocol::Limits{2ull << 30, 50}));
  EXPECT_NE(hello->capabilities & protocol::capability::kSwap, 0u);
  const auto welcomed = at(1ms, FrameReceived{protocol::Welcome{protocol::kMaxVersion, 7, 0}});
  ASSERT_NE(find<Publish>(welcomed), nullptr);
  EXPECT_EQ(find<Publish>(welcomed)->state, GrantState::kIdle);
  EXPECT_EQ(find<Publish>(welcomed)->gate, GateChange::kClose);
  EXPECT_NE(sent<protocol::Usage>(welcomed), nullptr);  // usage follows the welcome
  EXPECT_NE(find<Registered>(welcomed), nullptr);
}

TEST_F(GrantSessionTest, RevokeDrainsSwapsOutReportsAndReleasesWithExactTimes) {
  welcome();
  hold(5, 10ms);
  // Revoked 20 ms after the grant; the drain takes 30 ms and the swap 10 ms.
  const auto revoked =
      at(30ms, FrameReceived{protocol::Revoke{5, protocol::RevokeReason::kMemory, true}});
  EXPECT_EQ(find<Publish>(revoked)->gate, GateChange::kClose);
  EXPECT_NE(find<Drain>(revoked), nullptr);
  EXPECT_TRUE(engine_->busy());
  const SwapOut* swap = find<SwapOut>(at(60ms, Drained{}));
  ASSERT_NE(swap, nullptr);
  EXPECT_EQ(swap->bytes, kSwapStep);  // all of it, a step at a time
  probe_.use = {128ull << 20, 0, 0};
  const auto done = at(70ms, SwappedOut{128ull << 20});  // less than the step: that was all
  const protocol::Usage* usage = sent<protocol::Usage>(done);
  ASSERT_NE(usage, nullptr);
  EXPECT_EQ(usage->resident_bytes, 0u);
  // 128 MiB in 10 ms, measured by the engine.
  EXPECT_EQ(usage->swap_bytes_per_s, (128ull << 20) * 100);
  const protocol::Released* released = sent<protocol::Released>(done);
  ASSERT_NE(released, nullptr);
  EXPECT_EQ(released->epoch, 5u);
  EXPECT_EQ(released->held_us, 60'000u);   // grant at 10 ms, release at 70 ms
  EXPECT_EQ(released->drain_us, 30'000u);  // revoke at 30 ms, drained at 60 ms
  EXPECT_EQ(engine_->state(), GrantState::kRequested);
  // Queued again by the scheduler: a waiting thread does not ask again.
  probe_.waiting = 1;
  EXPECT_EQ(sent<protocol::Request>(at(80ms, Tick{})), nullptr);
  // The next grant swaps in before the gate opens.
  const auto granted = at(90ms, FrameReceived{protocol::Grant{6}});
  EXPECT_NE(find<SwapIn>(granted), nullptr);
  EXPECT_EQ(find<Publish>(granted), nullptr);
  const auto in = at(100ms, SwappedIn{1ull << 30});
  ASSERT_NE(find<Publish>(in), nullptr);
  EXPECT_EQ(find<Publish>(in)->gate, GateChange::kOpen);
  EXPECT_EQ(engine_->held_epoch(), 6u);
}

TEST_F(GrantSessionTest, RevokeWaitsForThreadsInsideASubmissionUpToTheBound) {
  SessionConfig c = config();
  c.timing.inside_bound = 1s;
  welcome(c);
  hold(1, 10ms);
  probe_.inside_now = 1;  // a long launch call
  EXPECT_EQ(find<Drain>(
                at(20ms, FrameReceived{protocol::Revoke{1, protocol::RevokeReason::kTurn, false}})),
            nullptr);
  EXPECT_EQ(engine_->next_deadline(), MonoTime{1020ms});
  EXPECT_EQ(find<Drain>(at(170ms, Tick{})), nullptr);
  probe_.inside_now = 0;  // the last one out wakes the engine
  EXPECT_NE(find<Drain>(at(170ms, Tick{})), nullptr);
  const protocol::Released* released = sent<protocol::Released>(at(180ms, Drained{}));
  ASSERT_NE(released, nullptr);
  EXPECT_EQ(released->drain_us, 160'000u);

  // A thread that never leaves: drained anyway at the bound. (Queued again by the revoke, so the
  // grant comes without a request.)
  at(200ms, FrameReceived{protocol::Grant{2}});
  ASSERT_EQ(engine_->state(), GrantState::kHeld);
  probe_.inside_now = 1;
  at(210ms, FrameReceived{protocol::Revoke{2, protocol::RevokeReason::kTurn, false}});
  EXPECT_EQ(find<Drain>(at(1209ms, Tick{})), nullptr);
  EXPECT_NE(find<Drain>(at(1210ms, Tick{})), nullptr);
}

// A usage report falls due while a revoke waits for a thread inside a submission: it goes out,
// and the next deadline stays in the future (a report left due kept it in the past: the link
// thread spun until the thread left).
TEST_F(GrantSessionTest, UsageFallingDueWhileARevokeWaitsForThreadsInsideGoesOut) {
  SessionConfig c = config();
  c.timing.inside_bound = 1s;
  c.timing.usage_interval = 100ms;
  welcome(c);
  hold(1, 10ms);
  probe_.inside_now = 1;
  at(20ms, FrameReceived{protocol::Revoke{1, protocol::RevokeReason::kTurn, false}});
  probe_.use = {2ull << 30, 2ull << 30, 0};  // an allocation meanwhile
  at(30ms, UsageChanged{});
  const auto due = at(200ms, Tick{});
  ASSERT_NE(sent<protocol::Usage>(due), nullptr);
  EXPECT_EQ(sent<protocol::Usage>(due)->allocated_bytes, 2ull << 30);
  EXPECT_EQ(find<Drain>(due), nullptr);  // the thread is still inside
  ASSERT_TRUE(engine_->next_deadline());
  EXPECT_GT(*engine_->next_deadline(), MonoTime{200ms});
}

TEST_F(GrantSessionTest, StaleRevokeAndGrantWhileHoldingAreIgnored) {
  welcome();
  hold(5, 10ms);
  const auto stale =
      at(20ms, FrameReceived{protocol::Revoke{4, protocol::RevokeReason::kTurn, true}});
  EXPECT_EQ(find<Publish>(stale), nullptr);
  EXPECT_EQ(find<Drain>(stale), nullptr);
  EXPECT_EQ(find<Publish>(at(30ms, FrameReceived{protocol::Grant{9}})), nullptr);
  EXPECT_EQ(engine_->held_epoch(), 5u);
}

TEST_F(GrantSessionTest, FramesDuringASwapInAreHandledAfterItInOrder) {
  welcome();
  hold(1, 10ms);
  at(20ms, FrameReceived{protocol::Revoke{1, protocol::RevokeReason::kTurn, true}});
  at(20ms, Drained{});
  at(30ms, SwappedOut{128ull << 20});
  probe_.waiting = 1;
  EXPECT_NE(find<SwapIn>(at(40ms, FrameReceived{protocol::Grant{2}})), nullptr);
  // A quota revoke for the new grant and new limits arrive while the memory comes back.
  EXPECT_TRUE(
      at(45ms, FrameReceived{protocol::Revoke{2, protocol::RevokeReason::kQuota, false}}).empty());
  EXPECT_TRUE(at(46ms, FrameReceived{protocol::SetLimits{{3ull << 30, 30}}}).empty());
  EXPECT_TRUE(at(47ms, Tick{}).empty());
  EXPECT_EQ(engine_->next_deadline(), std::nullopt);  // the answer is what is due
  // The swap-in ends: held, then the revoke (closing the gate again), then the limits.
  const auto after = at(300ms, SwappedIn{1ull << 30});
  std::vector<GrantState> states;
  for (const Action& a : after) {
    if (const Publish* p = std::get_if<Publish>(&a)) states.push_back(p->state);
  }
  EXPECT_EQ(states, (std::vector<GrantState>{GrantState::kHeld, GrantState::kRevoking}));
  ASSERT_NE(find<ApplyLimits>(after), nullptr);
  EXPECT_EQ(find<ApplyLimits>(after)->limits, (protocol::Limits{3ull << 30, 30}));
  EXPECT_NE(find<Drain>(after), nullptr);
}

TEST_F(GrantSessionTest, IdleHolderReleasesAtTheIdleThreshold) {
  SessionConfig c = config();
  c.timing.idle_release = 100ms;
  welcome(c);
  hold(3, 10ms);
  probe_.idle = 99ms;
  EXPECT_EQ(find<CloseGateToRelease>(at(200ms, Tick{})), nullptr);
  probe_.idle = 100ms;
  EXPECT_NE(find<CloseGateToRelease>(at(260ms, Tick{})), nullptr);
  // A thread got inside before the gate closed: reopened, no release.
  const auto reopened = at(260ms, GateClosed{1});
  EXPECT_EQ(find<Publish>(reopened)->gate, GateChange::kOpen);
  EXPECT_EQ(sent<protocol::Released>(reopened), nullptr);
  EXPECT_NE(find<CloseGateToRelease>(at(320ms, Tick{})), nullptr);
  const auto released = at(320ms, GateClosed{0});
  ASSERT_NE(sent<protocol::Released>(released), nullptr);
  EXPECT_EQ(sent<protocol::Released>(released)->epoch, 3u);
  EXPECT_EQ(sent<protocol::Released>(released)->drain_us, 0u);
  EXPECT_EQ(engine_->state(), GrantState::kIdle);
}

TEST_F(GrantSessionTest, YieldReleasesAfterAShortIdle) {
  SessionConfig c = config();
  c.timing.idle_release = Duration{0};  // never releases by itself
  welcome(c);
  hold(3, 10ms);
  probe_.idle = 1s;
  EXPECT_EQ(find<CloseGateToRelease>(at(20ms, Tick{})), nullptr);
  probe_.idle = kYieldIdle - 1us;
  at(30ms, FrameReceived{protocol::Revoke{3, protocol::RevokeReason::kYield, false}});
  EXPECT_EQ(engine_->state(), GrantState::kHeld);
  probe_.idle = kYieldIdle;
  EXPECT_NE(find<CloseGateToRelease>(at(31ms, Tick{})), nullptr);
  EXPECT_NE(sent<protocol::Released>(at(31ms, GateClosed{0})), nullptr);
}

// A swap notice for the grant held asks the agent to ready the swap-out, and changes nothing else;
// one for another grant, or while not holding, is ignored.
TEST_F(GrantSessionTest, SwapNoticeForTheHeldGrantReadiesTheSwapOut) {
  welcome();
  hold(3, 10ms);
  EXPECT_TRUE(at(20ms, FrameReceived{protocol::SwapNotice{2}}).empty()) << "stale";
  const auto noticed = at(30ms, FrameReceived{protocol::SwapNotice{3, 5ull << 30}});
  ASSERT_NE(find<PrepareSwapOut>(noticed), nullptr);
  EXPECT_EQ(find<PrepareSwapOut>(noticed)->bytes, 5ull << 30) << "the announced target";
  EXPECT_EQ(find<Publish>(noticed), nullptr);
  EXPECT_EQ(engine_->state(), GrantState::kHeld);
  at(40ms, FrameReceived{protocol::Revoke{3, protocol::RevokeReason::kTurn, true}});
  at(40ms, Drained{});
  at(50ms, SwappedOut{1ull << 30});
  EXPECT_EQ(find<PrepareSwapOut>(at(60ms, FrameReceived{protocol::SwapNotice{3}})), nullptr)
      << "not holding";
}

// A swap notice says a waiting job needs this one's memory: the end of this one's work is handed
// over after kNoticedIdle, not the whole idle release.
TEST_F(GrantSessionTest, ANoticedHolderReleasesAfterAShortIdle) {
  SessionConfig c = config();
  c.timing.idle_release = 100ms;
  welcome(c);
  hold(3, 10ms);
  at(30ms, FrameReceived{protocol::SwapNotice{3}});
  const std::optional<MonoTime> next = engine_->next_deadline();
  ASSERT_TRUE(next.has_value());
  EXPECT_LE(*next, MonoTime{30ms} + kNoticedIdle / 2) << "checks at half the shorter idle";
  expect_idle_threshold(kNoticedIdle, 40ms, 50ms);
  EXPECT_NE(sent<protocol::Released>(at(50ms, GateClosed{0})), nullptr);
  // The next grant, without a notice, waits out the idle release again.
  hold(4, 500ms);
  probe_.idle = 99ms;
  EXPECT_EQ(find<CloseGateToRelease>(at(600ms, Tick{})), nullptr);
}

// Contended (a lower class held back waits for this holder) hands the next pause over after
// kContendedIdle, shorter than a swap notice's (nothing moves), with no swap-out readied; a stale
// one is ignored.
TEST_F(GrantSessionTest, AContendedHolderReleasesAtItsNextPauseAndReadiesNoSwap) {
  SessionConfig c = config();
  c.timing.idle_release = 100ms;
  welcome(c);
  hold(3, 10ms);
  EXPECT_TRUE(at(20ms, FrameReceived{protocol::Contended{2}}).empty()) << "stale";
  const auto told = at(30ms, FrameReceived{protocol::Contended{3}});
  EXPECT_EQ(find<PrepareSwapOut>(told), nullptr);
  EXPECT_EQ(find<Publish>(told), nullptr);
  EXPECT_EQ(engine_->state(), GrantState::kHeld);
  const std::optional<MonoTime> next = engine_->next_deadline();
  ASSERT_TRUE(next.has_value());
  EXPECT_LE(*next, MonoTime{30ms} + kContendedIdle / 2) << "checks at half the shorter idle";
  static_assert(kContendedIdle < kNoticedIdle);
  expect_idle_threshold(kContendedIdle, 40ms, 50ms);
  EXPECT_NE(sent<protocol::Released>(at(50ms, GateClosed{0})), nullptr);
}

// Contended and a swap notice for the same grant, in either order: the swap notice's longer floor
// holds, since a release then costs a swap each way.
TEST_F(GrantSessionTest, ASwapNoticeKeepsItsFloorBesideContended) {
  SessionConfig c = config();
  c.timing.idle_release = 100ms;
  for (const bool contended_first : {true, false}) {
    probe_.idle = 0ms;
    welcome(c);
    hold(3, 10ms);
    const protocol::Message first = contended_first ? protocol::Message{protocol::Contended{3}}
                                                    : protocol::Message{protocol::SwapNotice{3}};
    const protocol::Message second = contended_first ? protocol::Message{protocol::SwapNotice{3}}
                                                     : protocol::Message{protocol::Contended{3}};
    at(20ms, FrameReceived{first});
    at(25ms, FrameReceived{second});
    expect_idle_threshold(kNoticedIdle, 40ms, 50ms);
  }
}

// A pause is no end of work: once the process was seen to make a pause twice (idle, then busy
// again), a noticed holder waits out twice that pause; a pause that a release on a notice cut short
// counts too, up to when a thread began to wait again. A pause made once changes nothing.
TEST_F(GrantSessionTest, ANoticedHolderWaitsOutThePausesItMakesAgain) {
  SessionConfig c = config();
  c.timing.idle_release = 100ms;
  welcome(c);
  hold(3, 10ms);
  at(15ms, FrameReceived{protocol::SwapNotice{3}});
  // Idle checks inside two pauses (15 ms idle when seen, no thread submitting), each followed by
  // work: the second is traced with the threads seen during it.
  probe_.idle = 15ms;
  EXPECT_EQ(find<CloseGateToRelease>(at(30ms, Tick{})), nullptr);
  probe_.idle = 0ms;
  EXPECT_EQ(find<Record>(at(40ms, Tick{})), nullptr) << "made once";
  probe_.idle = 15ms;
  EXPECT_EQ(find<CloseGateToRelease>(at(50ms, Tick{})), nullptr);
  probe_.idle = 0ms;
  const Record* pause = find<Record>(at(60ms, Tick{}));
  ASSERT_NE(pause, nullptr);
  EXPECT_STREQ(pause->event, "pause");
  EXPECT_EQ(pause->ms, 15.0);
  EXPECT_EQ(pause->threads.inside, 0);
  EXPECT_EQ(pause->threads.waiting, 0);
  expect_idle_threshold(30ms, 100ms, 130ms);  // twice the pause
  at(130ms, GateClosed{0});
  ASSERT_EQ(engine_->state(), GrantState::kIdle);

  // That release came 30 ms into an idle stretch, and a thread began to wait for the GPU 60 ms
  // after the stretch began (its request went out later, after an eviction): a pause of 60 ms,
  // made once, so the next noticed grant still waits out 30 ms.
  probe_.idle = 0ms;
  hold(4, 400ms, 160ms);
  at(410ms, FrameReceived{protocol::SwapNotice{4}});
  expect_idle_threshold(30ms, 440ms, 460ms);
  at(460ms, GateClosed{0});
  ASSERT_EQ(engine_->state(), GrantState::kIdle);
  // The same again: 60 ms made twice, so the next noticed grant waits the whole idle release.
  probe_.idle = 0ms;
  hold(5, 600ms, 490ms);
  at(610ms, FrameReceived{protocol::SwapNotice{5}});
  expect_idle_threshold(100ms, 740ms, 800ms);
}

// The pauses kept are the last kPausesKept: a long pause made twice is forgotten once that many
// shorter ones came after it, and the holder waits out the short ones again.
TEST_F(GrantSessionTest, APauseIsForgottenOnceEnoughOthersCameAfterIt) {
  SessionConfig c = config();
  c.timing.idle_release = 100ms;
  welcome(c);
  hold(3, 10ms);
  Duration t = 60ms;  // idle checks every 50 ms (half the idle release) until a notice
  const auto pause = [&](Duration length) {  // an idle check inside it, then one after it
    probe_.idle = length;
    EXPECT_EQ(find<CloseGateToRelease>(at(t, Tick{})), nullptr);
    probe_.idle = 0ms;
    at(t + 50ms, Tick{});
    t += 100ms;
  };
  pause(4ms);
  pause(4ms);
  pause(40ms);
  pause(40ms);
  for (std::size_t i = 0; i + 2 < kPausesKept; ++i) pause(4ms);
  // Both long ones are still among the last kPausesKept: twice 40 ms.
  at(t, FrameReceived{protocol::Contended{3}});
  expect_idle_threshold(80ms, t + 40ms, t + 80ms);
  at(t + 80ms, GateClosed{0});
  ASSERT_EQ(engine_->state(), GrantState::kIdle);
  probe_.idle = 0ms;
  hold(4, t + 200ms);
  t += 250ms;
  pause(4ms);  // one more short one: the first long one is gone
  at(t, FrameReceived{protocol::Contended{4}});
  static_assert(2 * 4ms > kContendedIdle);
  expect_idle_threshold(8ms, t + 4ms, t + 10ms);
}

// An idle GPU while a thread is submitting is no pause of the process: inside a submission (the
// driver holds the call), or waiting for the drain bound outside the gate (the driver woke it late
// from a wait for work already done). A noticed holder does not release then, at an idle check or
// when the gate closes, and the stretch is traced as a stall, never learnt, so the floor stays
// kNoticedIdle.
TEST_F(GrantSessionTest, AThreadSubmittingIsNoPause) {
  SessionConfig c = config();
  c.timing.idle_release = 100ms;
  for (const bool at_bound : {false, true}) {
    SCOPED_TRACE(at_bound ? "at the drain bound" : "inside a submission");
    std::uint64_t& count = at_bound ? probe_.at_bound_now : probe_.inside_now;
    probe_.idle = 0ms;
    welcome(c);
    hold(3, 10ms);
    at(15ms, FrameReceived{protocol::SwapNotice{3}});
    probe_.idle = 90ms;
    count = 1;
    EXPECT_EQ(find<CloseGateToRelease>(at(30ms, Tick{})), nullptr) << "released while submitting";
    probe_.idle = 0ms;
    count = 0;
    const Record* stall = find<Record>(at(45ms, Tick{}));
    ASSERT_NE(stall, nullptr);
    EXPECT_STREQ(stall->event, "stall");
    EXPECT_EQ(stall->ms, 90.0);
    EXPECT_EQ(stall->threads.inside, at_bound ? 0 : 1);
    EXPECT_EQ(stall->threads.at_bound, at_bound ? 1 : 0);
    expect_idle_threshold(kNoticedIdle, 60ms, 70ms);
    // A thread began to submit between that idle check and the closing of the gate: the gate
    // opens again.
    count = 1;
    const auto closed = at(71ms, GateClosed{probe_.inside_now});
    count = 0;
    EXPECT_EQ(sent<protocol::Released>(closed), nullptr);
    ASSERT_NE(find<Publish>(closed), nullptr);
    EXPECT_EQ(find<Publish>(closed)->gate, GateChange::kOpen);
    EXPECT_EQ(engine_->state(), GrantState::kHeld);
  }
}

// A thread seen submitting at an idle check makes the process busy then, whatever the GPU's idle
// time says: the process's idle time starts again from that check (a thread the driver woke late
// from the drain bound goes on to its next submission, and an idle check may come in between).
TEST_F(GrantSessionTest, IdleTimeStartsAgainWhereAThreadWasSeenSubmitting) {
  SessionConfig c = config();
  c.timing.idle_release = 100ms;
  welcome(c);
  hold(3, 10ms);
  at(15ms, FrameReceived{protocol::SwapNotice{3}});
  probe_.idle = 40ms;
  probe_.at_bound_now = 1;
  EXPECT_EQ(find<CloseGateToRelease>(at(30ms, Tick{})), nullptr);
  probe_.at_bound_now = 0;
  probe_.idle = 50ms;  // nothing submitted since: the GPU is still idle
  EXPECT_EQ(find<CloseGateToRelease>(at(40ms, Tick{})), nullptr) << "idle 10 ms since the bound";
  probe_.idle = 60ms;
  EXPECT_NE(find<CloseGateToRelease>(at(50ms, Tick{})), nullptr) << "idle 20 ms since the bound";
  const auto released = at(50ms, GateClosed{0});
  ASSERT_NE(sent<protocol::Released>(released), nullptr);
  const Record* record = find<Record>(released);
  ASSERT_NE(record, nullptr);
  EXPECT_STREQ(record->event, "idle-release");
  EXPECT_EQ(record->ms, 20.0) << "the process's idle time, not the GPU's";
  EXPECT_EQ(record->threads.at_bound, 1) << "seen during the stretch";
}

// An eviction without a grant (protocol version 9): drain, swap out, report the usage at once; the
// next grant swaps the memory back in. Ignored while holding; already out, only the usage again.
TEST_F(GrantSessionTest, AnEvictionWithoutAGrantSwapsOutAndReports) {
  SessionConfig c = config();
  c.timing.idle_release = 100ms;
  welcome(c);
  hold(3, 10ms);
  EXPECT_EQ(find<Drain>(at(20ms, FrameReceived{protocol::Evict{}})), nullptr) << "holding";
  probe_.idle = 1s;
  at(200ms, Tick{});
  at(200ms, GateClosed{0});  // released while idle, its memory on the GPU
  ASSERT_EQ(engine_->state(), GrantState::kIdle);
  const auto evicted = at(300ms, FrameReceived{protocol::Evict{}});
  EXPECT_NE(find<Drain>(evicted), nullptr);
  EXPECT_NE(find<SwapOut>(at(301ms, Drained{})), nullptr);
  probe_.use = {1ull << 30, 0, 0};
  at(350ms, SwappedOut{kSwapStep});
  const auto out = at(360ms, SwappedOut{kSwapStep});
  EXPECT_NE(find<SwapOut>(out), nullptr) << "a step that moved what it was asked: one more";
  ASSERT_NE(sent<protocol::Usage>(out), nullptr) << "reported between the steps";
  const auto last = at(365ms, SwappedOut{0});
  ASSERT_NE(sent<protocol::Usage>(last), nullptr) << "the answer goes at once";
  EXPECT_EQ(sent<protocol::Usage>(last)->evictions_answered, 1u);
  EXPECT_EQ(sent<protocol::Released>(last), nullptr) << "nothing to release";
  EXPECT_EQ(engine_->state(), GrantState::kIdle);
  // Out already: the report again, nothing moved.
  const auto again = at(400ms, FrameReceived{protocol::Evict{}});
  EXPECT_EQ(find<Drain>(again), nullptr);
  EXPECT_NE(sent<protocol::Usage>(again), nullptr);
  // The next grant swaps the memory back in before the gate opens.
  probe_.idle = Duration{0};
  probe_.waiting = 1;
  at(500ms, Tick{});
  EXPECT_NE(find<SwapIn>(at(510ms, FrameReceived{protocol::Grant{4}})), nullptr);
}

// Byte targets (protocol version 10): a revoke's and an eviction's go to the agent's swap_out, and
// after a swap-out that moved part of the memory an eviction moves more.
TEST_F(GrantSessionTest, ByteTargetsReachTheSwapOut) {
  SessionConfig c = config();
  c.timing.idle_release = 100ms;
  welcome(c);
  hold(1, 10ms);
  at(20ms, FrameReceived{protocol::Revoke{1, protocol::RevokeReason::kTurn, true, 3ull << 30}});
  // In steps: each asks for a step, or what is left of the target if less.
  const SwapOut* swap = find<SwapOut>(at(21ms, Drained{}));
  ASSERT_NE(swap, nullptr);
  EXPECT_EQ(swap->bytes, kSwapStep);
  probe_.use = {8ull << 30, 6ull << 30, 0};
  const auto first = at(25ms, SwappedOut{2ull << 30});  // a whole 2 GiB piece
  EXPECT_EQ(sent<protocol::Released>(first), nullptr);
  ASSERT_NE(find<SwapOut>(first), nullptr);
  EXPECT_EQ(find<SwapOut>(first)->bytes, kSwapStep);
  EXPECT_EQ(sent<protocol::Usage>(first)->resident_bytes, 6ull << 30);
  probe_.use = {8ull << 30, 5ull << 30, 0};
  ASSERT_NE(sent<protocol::Released>(at(30ms, SwappedOut{1ull << 30})), nullptr);
  // Waiting, 5 GiB kept: an eviction asks for 256 MiB more, and gets a drain and a swap-out of it.
  EXPECT_NE(find<Drain>(at(40ms, FrameReceived{protocol::Evict{256ull << 20}})), nullptr);
  swap = find<SwapOut>(at(41ms, Drained{}));
  ASSERT_NE(swap, nullptr);
  EXPECT_EQ(swap->bytes, 256ull << 20);
  probe_.use = {8ull << 30, 4ull << 30, 0};
  EXPECT_NE(sent<protocol::Usage>(at(50ms, SwappedOut{1ull << 30})), nullptr);
  // One that asks for all of it moves the rest; after that there is nothing more to move.
  EXPECT_NE(find<Drain>(at(60ms, FrameReceived{protocol::Evict{}})), nullptr);
  swap = find<SwapOut>(at(61ms, Drained{}));
  ASSERT_NE(swap, nullptr);
  EXPECT_EQ(swap->bytes, kSwapStep);
  EXPECT_NE(find<SwapOut>(at(70ms, SwappedOut{4ull << 30})), nullptr);
  EXPECT_EQ(find<SwapOut>(at(71ms, SwappedOut{0})), nullptr);
  const auto again = at(80ms, FrameReceived{protocol::Evict{}});
  EXPECT_EQ(find<Drain>(again), nullptr);
  EXPECT_NE(sent<protocol::Usage>(again), nullptr);
}

// Room (protocol version 12): waiting with memory on the host, the client brings back what fits
// (the room less what is on the device), reports at once and keeps waiting, gate closed; the grant
// brings back the rest. Room while holding, or no larger than what is there, changes nothing.
TEST_F(GrantSessionTest, RoomBringsMemoryBackWhileWaiting) {
  welcome();
  hold(1, 10ms);
  EXPECT_TRUE(at(15ms, FrameReceived{protocol::Room{1ull << 30}}).empty()) << "holding";
  at(20ms, FrameReceived{protocol::Revoke{1, protocol::RevokeReason::kTurn, true, 3ull << 30}});
  at(21ms, Drained{});
  probe_.use = {4ull << 30, 1ull << 30, 0, 0, 256ull << 20};  // 768 MiB movable stay
  at(30ms, SwappedOut{3ull << 30});
  ASSERT_EQ(engine_->state(), GrantState::kRequested);
  probe_.waiting = 1;
  const auto room = at(40ms, FrameReceived{protocol::Room{2ull << 30}});
  ASSERT_NE(find<SwapIn>(room), nullptr);
  EXPECT_EQ(find<SwapIn>(room)->limit, (2ull << 30) - (768ull << 20));
  EXPECT_TRUE(at(45ms, FrameReceived{protocol::Room{3ull << 30}}).empty()) << "read after";
  probe_.use = {4ull << 30, 2ull << 30, 0, 0, 256ull << 20};
  const auto back = at(60ms, SwappedIn{1ull << 30});
  const protocol::Usage* usage = sent<protocol::Usage>(back);
  ASSERT_NE(usage, nullptr) << "reported at once";
  EXPECT_EQ(usage->resident_bytes, 2ull << 30);
  const Record* record = find<Record>(back);
  ASSERT_NE(record, nullptr);
  EXPECT_STREQ(record->event, "room");
  EXPECT_EQ(record->swap.bytes, 1ll << 30);
  // Still waiting, gate closed; the later room, read now, asks for what it adds.
  EXPECT_EQ(engine_->state(), GrantState::kRequested);
  ASSERT_NE(find<SwapIn>(back), nullptr);
  EXPECT_EQ(find<SwapIn>(back)->limit, (3ull << 30) - (1792ull << 20));
  for (const Action& a : back) {
    if (const Publish* p = std::get_if<Publish>(&a)) EXPECT_NE(p->gate, GateChange::kOpen);
  }
  probe_.use = {4ull << 30, 3ull << 30, 0, 0, 256ull << 20};
  at(70ms, SwappedIn{1ull << 30});
  EXPECT_TRUE(at(75ms, FrameReceived{protocol::Room{2ull << 30}}).empty()) << "no larger";
  // The grant brings back the rest, then opens the gate.
  const SwapIn* rest = find<SwapIn>(at(80ms, FrameReceived{protocol::Grant{2}}));
  ASSERT_NE(rest, nullptr);
  EXPECT_EQ(rest->limit, 0u);
  probe_.use = {4ull << 30, 4ull << 30, 0};
  const auto held = at(90ms, SwappedIn{1ull << 30});
  ASSERT_NE(find<Publish>(held), nullptr);
  EXPECT_EQ(find<Publish>(held)->gate, GateChange::kOpen);
  EXPECT_EQ(engine_->state(), GrantState::kHeld);
}

// A client that does not want the GPU any more (no thread waits, idle past the idle release) takes
// no room; one whose memory came back into room moves it out again when evicted.
TEST_F(GrantSessionTest, RoomIsLeftWhenIdleAndEvictedWhenTaken) {
  SessionConfig c = config();
  c.timing.idle_release = 100ms;
  welcome(c);
  hold(1, 10ms);
  at(20ms, FrameReceived{protocol::Revoke{1, protocol::RevokeReason::kTurn, true}});
  at(21ms, Drained{});
  probe_.use = {1ull << 30, 0, 0};
  at(30ms, SwappedOut{128ull << 20});
  probe_.idle = 1s;
  EXPECT_EQ(find<SwapIn>(at(40ms, FrameReceived{protocol::Room{1ull << 30}})), nullptr);
  probe_.idle = 0ms;
  probe_.waiting = 1;
  ASSERT_NE(find<SwapIn>(at(50ms, FrameReceived{protocol::Room{1ull << 30}})), nullptr);
  probe_.use = {1ull << 30, 1ull << 30, 0};
  at(60ms, SwappedIn{1ull << 30});
  // All of it had gone out; what came back into room goes out again for an eviction.
  EXPECT_NE(find<Drain>(at(70ms, FrameReceived{protocol::Evict{}})), nullptr);
}

TEST_F(GrantSessionTest, GrantToAnIdleSwappedOutClientIsHandedBack) {
  welcome();
  hold(1, 10ms);
  at(20ms, FrameReceived{protocol::Revoke{1, protocol::RevokeReason::kTurn, true}});
  at(20ms, Drained{});
  at(30ms, SwappedOut{128ull << 20});
  probe_.idle = 1s;
  const auto granted = at(2s, FrameReceived{protocol::Grant{2}});
  EXPECT_EQ(find<SwapIn>(granted), nullptr);
  ASSERT_NE(sent<protocol::Released>(granted), nullptr);
  EXPECT_EQ(sent<protocol::Released>(granted)->epoch, 2u);
  EXPECT_EQ(engine_->state(), GrantState::kIdle);
}

TEST_F(GrantSessionTest, UsageReportsAreCoalescedToOnePerInterval) {
  SessionConfig c = config();
  c.timing.usage_interval = 50ms;
  welcome(c);  // reported at 1 ms
  int reports = 0;
  for (int ms = 2; ms <= 300; ++ms) {
    probe_.use = {static_cast<std::uint64_t>(ms) << 20, 0, 0};
    reports += count_sent<protocol::Usage>(at(std::chrono::milliseconds(ms), UsageChanged{}));
    reports += count_sent<protocol::Usage>(at(std::chrono::milliseconds(ms), Tick{}));
  }
  // At 51, 101, 151, 201 and 251 ms (the welcome's at 1 ms): five in 300 ms; the latest figure
  // is due at 301 ms.
  EXPECT_EQ(reports, 5);
  EXPECT_EQ(engine_->next_deadline(), MonoTime{301ms});
  const auto last = at(301ms, Tick{});
  ASSERT_NE(sent<protocol::Usage>(last), nullptr);
  EXPECT_EQ(sent<protocol::Usage>(last)->allocated_bytes, 300ull << 20);
  // Unchanged usage is not sent again.
  at(400ms, UsageChanged{});
  EXPECT_EQ(sent<protocol::Usage>(at(400ms, Tick{})), nullptr);
}

// A request carries the allocations made before the wait that caused it, even when no
// UsageChanged was fed for them yet (the thread raised the flag after the link thread's pass took
// it): the scheduler judges fit on that usage, so it must precede the request.
TEST_F(GrantSessionTest, ARequestIsPrecededByTheUsageOfItsAllocationsWithoutAUsageEvent) {
  SessionConfig c = config();
  c.timing.usage_interval = 50ms;
  welcome(c);  // reported at 1 ms
  probe_.use = {256ull << 20, 256ull << 20, 0};
  probe_.waiting = 1;
  probe_.since = MonoTime{10ms};
  const auto asked = at(10ms, Tick{});
  ASSERT_NE(sent<protocol::Request>(asked), nullptr);
  ASSERT_NE(sent<protocol::Usage>(asked), nullptr) << "requested on the usage of 1 ms";
  EXPECT_EQ(sent<protocol::Usage>(asked)->allocated_bytes, 256ull << 20);
  std::size_t usage_at = 0;
  std::size_t request_at = 0;
  for (std::size_t i = 0; i < asked.size(); ++i) {
    const Send* s = std::get_if<Send>(&asked[i]);
    if (s == nullptr) continue;
    if (std::holds_alternative<protocol::Usage>(s->message)) usage_at = i;
    if (std::holds_alternative<protocol::Request>(s->message)) request_at = i;
  }
  EXPECT_LT(usage_at, request_at);
}

// Over each half second held, the share of time threads waited for the drain bound goes to the
// scheduler with the usage; time not held (waiting for a turn) is skipped.
TEST_F(GrantSessionTest, PaceIsReportedPerWindowOfHeldTime) {
  welcome();
  const protocol::Usage* first = nullptr;
  hold(1, 10ms);
  // 400 ms of the first 500 ms held were spent waiting for the bound.
  probe_.waited = 400ms;
  ASSERT_TRUE(engine_->next_deadline().has_value());
  EXPECT_LE(*engine_->next_deadline(), MonoTime{510ms});
  first = sent<protocol::Usage>(at(510ms, Tick{}));
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(first->deep_queue_permille, 800);
  // Revoked at 600 ms (90 ms more held, all of it waiting), given back, then granted again at
  // 2 s: the 1.4 s between is not held and counts for nothing.
  probe_.waited = 500ms;
  at(600ms, FrameReceived{protocol::Revoke{1, protocol::RevokeReason::kTurn, false}});
  at(601ms, Drained{});
  ASSERT_EQ(engine_->state(), GrantState::kRequested);
  probe_.waited = 900ms;  // waits while not held are not counted
  at(2000ms, FrameReceived{protocol::Grant{2}});
  ASSERT_EQ(engine_->state(), GrantState::kHeld);
  EXPECT_EQ(sent<protocol::Usage>(at(2409ms, Tick{})), nullptr);  // 499 ms held so far
  // 410 ms more held with no waiting: 90 of 500 ms, 18%, rounded to 20%.
  const protocol::Usage* second = sent<protocol::Usage>(at(2410ms, Tick{}));
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(second->deep_queue_permille, 200);
  // An unchanged figure is not sent again.
  probe_.waited = 1000ms;
  EXPECT_EQ(sent<protocol::Usage>(at(2900ms, Tick{})), nullptr);
}

TEST_F(GrantSessionTest, NoSchedulerOpensOnceAndBacksOff) {
  engine_ = std::make_unique<GrantSession>(config(), probe_);
  std::vector<MonoTime> attempts;
  int outages = 0;
  for (Duration t = 0ms; t <= 500ms; t += 1ms) {
    for (const Action& a : at(t, Tick{})) {
      if (std::holds_alternative<Connect>(a)) {
        attempts.push_back(now_);
        for (const Action& b : at(t, ConnectFailed{"connection refused"})) {
          outages += std::holds_alternative<OutageBegins>(b) ? 1 : 0;
        }
      }
    }
  }
  EXPECT_EQ(outages, 1);
  EXPECT_EQ(engine_->state(), GrantState::kOpen);
  // 20, 40, 80, then 100 ms apart (reconnect_max).
  ASSERT_GE(attempts.size(), 6u);
  EXPECT_EQ(attempts[1] - attempts[0], 20ms);
  EXPECT_EQ(attempts[2] - attempts[1], 40ms);
  EXPECT_EQ(attempts[3] - attempts[2], 80ms);
  EXPECT_EQ(attempts[4] - attempts[3], 100ms);
  EXPECT_EQ(attempts[5] - attempts[4], 100ms);
}

TEST_F(GrantSessionTest, SilentSchedulerIsPingedThenDroppedAndTheGateOpens) {
  SessionConfig c = config();
  c.timing.ping_after = 100ms;
  c.timing.dead_after = 150ms;
  welcome(c);  // last frame at 1 ms
  probe_.waiting = 1;
  at(1ms, Tick{});
  EXPECT_EQ(sent<protocol::Ping>(at(100ms, Tick{})), nullptr);
  EXPECT_NE(sent<protocol::Ping>(at(101ms, Tick{})), nullptr);
  EXPECT_EQ(find<Disconnect>(at(250ms, Tick{})), nullptr);
  const auto gone = at(251ms, Tick{});
  EXPECT_NE(find<Disconnect>(gone), nullptr);
  ASSERT_NE(find<Publish>(gone), nullptr);
  EXPECT_EQ(find<Publish>(gone)->gate, GateChange::kOpen);
  EXPECT_NE(find<OutageBegins>(gone), nullptr);
}

TEST_F(GrantSessionTest, MissingWelcomeIsBoundedByTheHandshakeTimeout) {
  SessionConfig c = config();
  c.timing.handshake_timeout = 300ms;
  engine_ = std::make_unique<GrantSession>(c, probe_);
  at(0ms, Tick{});
  at(0ms, Connected{});
  EXPECT_EQ(engine_->next_deadline(), MonoTime{300ms});
  EXPECT_EQ(find<Disconnect>(at(299ms, Tick{})), nullptr);
  const auto gone = at(300ms, Tick{});
  EXPECT_NE(find<Disconnect>(gone), nullptr);
  EXPECT_NE(find<SettleRegistration>(gone), nullptr);
  EXPECT_EQ(engine_->state(), GrantState::kOpen);
}

// A scheduler that closes the session before its welcome refuses the process (a GPU it does not
// know, an identity it will not admit): the outage says so; a missing welcome or a drop after it
// does not.
TEST_F(GrantSessionTest, AConnectionClosedBeforeTheWelcomeIsARefusal) {
  engine_ = std::make_unique<GrantSession>(config(), probe_);
  at(0ms, Tick{});
  at(0ms, Connected{});
  const auto refused = at(1ms, ConnectionLost{"end of stream"});
  ASSERT_NE(find<OutageBegins>(refused), nullptr);
  EXPECT_TRUE(find<OutageBegins>(refused)->refused);
  EXPECT_EQ(find<OutageBegins>(refused)->why, "end of stream");

  SessionConfig c = config();
  c.timing.handshake_timeout = 300ms;
  engine_ = std::make_unique<GrantSession>(c, probe_);
  at(0ms, Tick{});
  at(0ms, Connected{});
  const auto silent = at(300ms, Tick{});
  ASSERT_NE(find<OutageBegins>(silent), nullptr);
  EXPECT_FALSE(find<OutageBegins>(silent)->refused);

  welcome();
  const auto dropped = at(20ms, ConnectionLost{"reset"});
  ASSERT_NE(find<OutageBegins>(dropped), nullptr);
  EXPECT_FALSE(find<OutageBegins>(dropped)->refused);
}

TEST_F(GrantSessionTest, LostConnectionBringsSwappedOutMemoryBackBeforeOpening) {
  welcome();
  hold(1, 10ms);
  at(20ms, FrameReceived{protocol::Revoke{1, protocol::RevokeReason::kTurn, true}});
  at(20ms, Drained{});
  at(30ms, SwappedOut{128ull << 20});
  const auto lost = at(40ms, ConnectionLost{"reset"});
  EXPECT_NE(find<SwapIn>(lost), nullptr);
  EXPECT_EQ(find<Publish>(lost), nullptr);  // still closed while the memory comes back
  const auto back = at(60ms, SwappedIn{1ull << 30});
  EXPECT_EQ(find<Publish>(back)->gate, GateChange::kOpen);
  EXPECT_NE(find<OutageBegins>(back), nullptr);
}

TEST_F(GrantSessionTest, ProvisionalLimitsNeverLoosenTheLastKnownOnes) {
  SessionConfig c = config();
  c.declared = {4ull << 30, 100};
  welcome(c);
  const auto strict = at(
      2ms, FrameReceived{protocol::SetLimits{{8ull << 30, 50}, protocol::SetLimits::kProvisional}});
  EXPECT_EQ(find<ApplyLimits>(strict)->limits, (protocol::Limits{4ull << 30, 50}));
  const auto known = at(3ms, FrameReceived{protocol::SetLimits{{8ull << 30, 100}}});
  EXPECT_EQ(find<ApplyLimits>(known)->limits, (protocol::Limits{8ull << 30, 100}));
  const auto none =
      at(4ms, FrameReceived{protocol::SetLimits{{0, 100}, protocol::SetLimits::kProvisional}});
  EXPECT_EQ(find<ApplyLimits>(none)->limits, (protocol::Limits{8ull << 30, 100}));
}

TEST_F(GrantSessionTest, PendingSettingsHoldAllocationsUntilAFileOrAuthoritativeLimit) {
  SessionConfig c = config();
  c.limits_pending = true;
  c.has_settings_file = true;
  engine_ = std::make_unique<GrantSession>(c, probe_);
  const auto first = at(0ms, Tick{});
  EXPECT_NE(find<LimitsUnknown>(first), nullptr);
  EXPECT_EQ(find<ApplyLimits>(first), nullptr);
  EXPECT_NE(find<ReadSettings>(first), nullptr);
  at(0ms, SettingsRead{});  // still pending
  // No scheduler: the registration stays unsettled while the limits are unknown.
  at(0ms, Tick{});
  EXPECT_EQ(find<SettleRegistration>(at(0ms, ConnectFailed{"absent"})), nullptr);
  // The file is read again every 100 ms while pending; then it has the limit.
  EXPECT_NE(find<ReadSettings>(at(100ms, Tick{})), nullptr);
  const auto read = at(100ms, SettingsRead{512ull << 20});
  ASSERT_NE(find<ApplyLimits>(read), nullptr);
  EXPECT_EQ(find<ApplyLimits>(read)->limits.memory_bytes, 512ull << 20);
  EXPECT_NE(find<SettleRegistration>(read), nullptr);
  // A provisional frame does not resolve a pending limit (tested on a fresh engine).
  engine_ = std::make_unique<GrantSession>(c, probe_);
  at(0ms, Tick{});
  at(0ms, SettingsRead{});
  at(0ms, Connected{});
  at(1ms, FrameReceived{protocol::Welcome{protocol::kMaxVersion, 1, 0}});
  const auto provisional =
      at(2ms, FrameReceived{protocol::SetLimits{{0, 100}, protocol::SetLimits::kProvisional}});
  EXPECT_EQ(find<ApplyLimits>(provisional), nullptr);
  EXPECT_EQ(find<SettleRegistration>(provisional), nullptr);
  EXPECT_EQ(engine_->applied_limits(), std::nullopt);
}

TEST_F(GrantSessionTest, StopOpensTheGateForGoodAndEndsEverything) {
  welcome();
  hold(1, 10ms);
  at(20ms, FrameReceived{protocol::Revoke{1, protocol::RevokeReason::kTurn, true}});
  const auto stopped = at(30ms, Stop{});
  EXPECT_EQ(find<Publish>(stopped)->state, GrantState::kStopped);
  EXPECT_EQ(find<Publish>(stopped)->gate, GateChange::kOpen);
  EXPECT_TRUE(at(40ms, Drained{}).empty());
  EXPECT_TRUE(at(50ms, FrameReceived{protocol::Grant{2}}).empty());
  EXPECT_EQ(engine_->next_deadline(), std::nullopt);
}

TEST_F(GrantSessionTest, AForkedChildKeepsItsLimitsAndStartsOver) {
  SessionConfig c = config();
  c.declared = {4ull << 30, 100};
  welcome(c);
  at(2ms, FrameReceived{protocol::SetLimits{{2ull << 30, 100}}});
  hold(1, 10ms);
  SessionConfig child_config = config();
  child_config.pid = 43;
  GrantSession child(child_config, probe_, engine_->inherited());
  EXPECT_EQ(child.state(), GrantState::kStarting);
  EXPECT_EQ(child.applied_limits(), (protocol::Limits{2ull << 30, 100}));
  const auto first = child.handle(Tick{}, MonoTime{20ms});
  EXPECT_EQ(find<ApplyLimits>(first), nullptr);  // in force already
  EXPECT_NE(find<Connect>(first), nullptr);
  EXPECT_EQ(sent<protocol::Hello>(child.handle(Connected{}, MonoTime{20ms}))->pid, 43u);
}

}  // namespace
}  // namespace nvshare::client

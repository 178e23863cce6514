#include "client/link/grant_session.h"

#include <algorithm>
#include <type_traits>

namespace nvshare::client {
namespace {

std::uint64_t bytes_per_second(std::uint64_t bytes, Duration took) {
  if (bytes == 0 || took.count() <= 0) return 0;
  const long double rate =
      static_cast<long double>(bytes) * 1e9L / static_cast<long double>(took.count());
  return rate >= 1.8e19L ? UINT64_MAX : static_cast<std::uint64_t>(rate);
}

void earliest(std::optional<MonoTime>& next, MonoTime at) {
  if (!next || at < *next) next = at;
}

}  // namespace

const char* to_string(GrantState state) {
  switch (state) {
    case GrantState::kStarting:
      return "starting";
    case GrantState::kOpen:
      return "open";
    case GrantState::kIdle:
      return "idle";
    case GrantState::kRequested:
      return "requested";
    case GrantState::kHeld:
      return "held";
    case GrantState::kRevoking:
      return "revoking";
    case GrantState::kStopped:
      return "stopped";
  }
  return "?";
}

GrantSession::GrantSession(SessionConfig config, SessionProbe& probe)
    : config_(std::move(config)), probe_(probe) {
  config_.timing.reconnect_max =
      std::max(config_.timing.reconnect_max, config_.timing.reconnect_initial);
  backoff_ = config_.timing.reconnect_initial;
}

GrantSession::GrantSession(SessionConfig config, SessionProbe& probe, const Inherited& inherited)
    : GrantSession(std::move(config), probe) {
  stopped_ = inherited.stopped;
  if (stopped_) state_ = GrantState::kStopped;
  limits_started_ = inherited.limits_started;
  known_limits_ = inherited.known_limits;
  applied_ = inherited.applied;
  file_memory_ = inherited.file_memory;
}

GrantSession::Inherited GrantSession::inherited() const {
  return Inherited{stopped_, limits_started_, known_limits_, applied_, file_memory_};
}

std::uint64_t GrantSession::held_epoch() const {
  return state_ == GrantState::kHeld || state_ == GrantState::kRevoking ? epoch_ : 0;
}

// ---- events -------------------------------------------------------------------------------------

std::vector<session::Action> GrantSession::handle(const session::Event& event, MonoTime now) {
  now = std::max(now, last_now_);
  last_now_ = now;
  out_.clear();
  if (stopped_) return {};
  if (std::holds_alternative<session::Stop>(event)) {
    stop();
    return std::move(out_);
  }
  if (awaiting_ != Awaiting::kNothing && !answers_outstanding(event)) {
    // Read after the work in progress, as a shell doing that work on its thread would read it. A
    // tick is not kept: everything due is looked at once the answer comes.
    if (!std::holds_alternative<session::Tick>(event)) inbox_.push_back(event);
    return {};
  }
  dispatch(event, now);
  while (awaiting_ == Awaiting::kNothing && !inbox_.empty() && !stopped_) {
    const session::Event deferred = std::move(inbox_.front());
    inbox_.pop_front();
    dispatch(deferred, now);
  }
  observe_pace(now);
  if (awaiting_ == Awaiting::kNothing && !stopped_) service(now);
  return std::move(out_);
}

bool GrantSession::answers_outstanding(const session::Event& event) const {
  switch (awaiting_) {
    case Awaiting::kNothing:
      return false;
    case Awaiting::kConnect:
      return std::holds_alternative<session::Connected>(event) ||
             std::holds_alternative<session::ConnectFailed>(event);
    case Awaiting::kGateClosed:
      return std::holds_alternative<session::GateClosed>(event);
    case Awaiting::kDrained:
      return std::holds_alternative<session::Drained>(event);
    case Awaiting::kSwappedOut:
      return std::holds_alternative<session::SwappedOut>(event);
    case Awaiting::kSwappedIn:
      return std::holds_alternative<session::SwappedIn>(event);
    case Awaiting::kSettings:
      return std::holds_alternative<session::SettingsRead>(event);
  }
  return false;
}

void GrantSession::dispatch(const session::Event& event, MonoTime now) {
  if (answers_outstanding(event)) awaiting_ = Awaiting::kNothing;
  std::visit(
      [&](const auto& e) {
        using T = std::decay_t<decltype(e)>;
        if constexpr (std::is_same_v<T, session::UsageChanged>) {
          usage_dirty_ = true;
        } else if constexpr (std::is_same_v<T, session::Connected>) {
          on_connected(now);
        } else if constexpr (std::is_same_v<T, session::ConnectFailed>) {
          on_connect_failed(now, e.why);
        } else if constexpr (std::is_same_v<T, session::FrameReceived>) {
          on_frame(e.message, now);
        } else if constexpr (std::is_same_v<T, session::ConnectionLost>) {
          // Closed by the scheduler before its welcome: it refuses this process (or its GPU).
          if (conn_ == Conn::kHandshake || conn_ == Conn::kUp) {
            lose_connection(now, e.why, conn_ == Conn::kHandshake);
          }
        } else if constexpr (std::is_same_v<T, session::GateClosed>) {
          on_gate_closed(e.inside, now);
        } else if constexpr (std::is_same_v<T, session::Drained>) {
          on_drained(now);
        } else if constexpr (std::is_same_v<T, session::SwappedOut>) {
          on_swapped_out(e.bytes, now);
        } else if constexpr (std::is_same_v<T, session::SwappedIn>) {
          on_swapped_in(e.bytes, now);
        } else if constexpr (std::is_same_v<T, session::SettingsRead>) {
          on_settings(e.memory_bytes);
        }
        // Tick: service() below looks at everything due.
      },
      event);
}

// ---- what is due --------------------------------------------------------------------------------

void GrantSession::service(MonoTime now) {
  first_limits();
  if (watching_settings() && now >= next_settings_read_) {
    // Pending: soon, the plugin writes it within moments of the container starting. Unreachable:
    // now and then, for an annotation changed meanwhile.
    next_settings_read_ = now + (limits_pending() ? Duration(std::chrono::milliseconds(100))
                                                  : Duration(std::chrono::seconds(1)));
    await(Awaiting::kSettings, session::ReadSettings{});
    return;
  }
  service_connection(now);
  if (awaiting_ != Awaiting::kNothing || conn_ != Conn::kUp) return;
  service_grant(now);
}

void GrantSession::first_limits() {
  if (limits_started_) return;
  // Declared limits (or the settings file's) hold from the first allocation, with or without a
  // scheduler; a scheduler sends limits only when it wants others.
  limits_started_ = true;
  if (limits_pending()) {
    out_.emplace_back(session::LimitsUnknown{});
    return;
  }
  if (!known_limits_) known_limits_ = config_.declared;
  apply(*known_limits_);
}

bool GrantSession::limits_pending() const { return !known_limits_ && config_.limits_pending; }

bool GrantSession::watching_settings() const {
  return config_.has_settings_file && (limits_pending() || conn_ != Conn::kUp);
}

void GrantSession::service_connection(MonoTime now) {
  switch (conn_) {
    case Conn::kDown:
      if (now >= next_attempt_) {
        conn_ = Conn::kConnecting;
        await(Awaiting::kConnect, session::Connect{});
      }
      return;
    case Conn::kConnecting:
      return;
    case Conn::kHandshake:
      if (now >= handshake_deadline_) {
        lose_connection(now, "no welcome within " +
                                 std::to_string(to_ms(config_.timing.handshake_timeout)) + " ms");
      }
      return;
    case Conn::kUp:
      break;
  }
  // Liveness: a silent scheduler is pinged, and one that stays silent is treated as gone, so a
  // waiting thread is never held by a peer that stopped answering.
  const Duration silence = now - last_rx_;
  if (silence >= config_.timing.ping_after + config_.timing.dead_after) {
    lose_connection(now, "the scheduler stopped answering");
    return;
  }
  if (silence >= config_.timing.ping_after && !ping_outstanding_) {
    ping_outstanding_ = true;
    send(protocol::Ping{++ping_nonce_});
  }
}

void GrantSession::service_grant(MonoTime now) {
  // Demand: a thread waits while registered and not queued.
  if (state_ == GrantState::kIdle && probe_.waiters() > 0) {
    publish(GrantState::kRequested, session::GateChange::kKeep);
    // The scheduler judges fit on the last usage it saw: report allocations made since then
    // before asking, or it may grant beside a runner this client does not fit beside. Read afresh,
    // not on the dirty flag: a thread that allocated and then came to wait may have raised it
    // after this pass took it, and what it allocated is visible once its wait is.
    send_usage(now, false);
    out_.emplace_back(session::Record{"request", epoch_});
    send(protocol::Request{});
    observe_pause_before_request(now);
  }

  // Usage goes out on its own clock whatever else waits: a revoke waiting for threads still inside
  // a submission returns early below, and a report left due would keep next_deadline() in the past
  // (the link thread spinning until those threads leave).
  if (usage_dirty_ && (!usage_sent_ || now >= last_usage_at_ + config_.timing.usage_interval)) {
    send_usage(now, false);
  }

  if (revoke_pending_) {
    const std::uint64_t inside = probe_.inside();
    if (inside > 0 && now < inside_deadline_) return;
    revoke_pending_ = false;
    if (inside > 0 && config_.debug_notes) {
      debug(std::to_string(inside) + " threads still inside a submission after " +
            std::to_string(to_ms(now - revoke_at_)) + " ms; draining anyway");
    }
    await(Awaiting::kDrained, session::Drain{});
    return;
  }

  const Duration idle = idle_threshold();
  if (state_ == GrantState::kHeld && idle.count() > 0 && now >= next_idle_check_) {
    const Duration floor = yield_asked() ? kYieldCheckEvery : std::chrono::milliseconds(1);
    next_idle_check_ = now + std::max<Duration>(idle / 2, floor);
    const Duration gpu_idle = probe_.idle_for();
    observe_idle(gpu_idle);
    // A thread inside a submission is about to queue work, however long the call takes, and one
    // waiting for the drain bound is about to go on (the work it waits for is done when the GPU
    // is idle): the GPU is idle, the process is not, and its idle time starts again.
    const bool busy = submitting();
    if (busy) submitting_seen_ = now;
    if (process_idle(now, gpu_idle) >= idle && probe_.waiters() == 0 && !busy) {
      await(Awaiting::kGateClosed, session::CloseGateToRelease{});
      return;
    }
  }
}

std::optional<MonoTime> GrantSession::next_deadline() const {
  if (stopped_ || awaiting_ != Awaiting::kNothing) return std::nullopt;
  std::optional<MonoTime> next;
  if (watching_settings()) earliest(next, next_settings_read_);
  switch (conn_) {
    case Conn::kDown:
      earliest(next, next_attempt_);
      return next;
    case Conn::kConnecting:
      return next;
    case Conn::kHandshake:
      earliest(next, handshake_deadline_);
      return next;
    case Conn::kUp:
      break;
  }
  earliest(next,
           last_rx_ + (ping_outstanding_ ? config_.timing.ping_after + config_.timing.dead_after
                                         : config_.timing.ping_after));
  if (revoke_pending_) earliest(next, inside_deadline_);
  if (state_ == GrantState::kHeld && idle_threshold().count() > 0) {
    earliest(next, next_idle_check_);
  }
  if (usage_dirty_ && usage_sent_) earliest(next, last_usage_at_ + config_.timing.usage_interval);
  if (const std::optional<MonoTime> end = pace_.window_end()) earliest(next, *end);
  return next;
}

// The pace is measured over held time only; a window's figure that differs from the last one is
// reported with the usage.
void GrantSession::observe_pace(MonoTime now) {
  const std::optional<std::uint16_t> pace =
      pace_.observe(now, state_ == GrantState::kHeld, probe_.queue_waited());
  if (pace && *pace != pace_permille_) {
    pace_permille_ = *pace;
    usage_dirty_ = true;
  }
}

// ---- the connection -----------------------------------------------------------------------------

void GrantSession::on_connected(MonoTime now) {
  conn_ = Conn::kHandshake;
  version_ = protocol::kMaxVersion;
  handshake_deadline_ = now + config_.timing.handshake_timeout;
  last_rx_ = now;
  ping_outstanding_ = false;

  protocol::Hello hello;
  hello.pid = config_.pid;
  hello.gpu_uuid = config_.gpu_uuid.substr(0, protocol::kMaxUuidLength);
  hello.gpu_memory_bytes = config_.gpu_memory_bytes;
  hello.capabilities = protocol::capability::kUsageReports | protocol::capability::kYield;
  if (config_.can_swap) hello.capabilities |= protocol::capability::kSwap;
  if (config_.timing.idle_release.count() > 0)
    hello.capabilities |= protocol::capability::kIdleRelease;
  hello.declared = config_.declared;
  hello.pod_uid = config_.pod_uid.substr(0, protocol::kMaxUuidLength);
  hello.process_name = config_.process_name.substr(0, protocol::kMaxNameLength);
  send(std::move(hello));
}

void GrantSession::on_connect_failed(MonoTime now, const std::string& why) {
  conn_ = Conn::kDown;
  // Nothing accepts at the socket: the first CUDA call does not wait for a registration, unless
  // it still has no limits to keep.
  settle_if_limits_known();
  schedule_reconnect(now);
  // The first failure of an outage opens the gate and is logged; later attempts are silent.
  if (!in_outage_) {
    enter_outage(why);
  } else if (config_.debug_notes) {
    note(LogLevel::kTrace, config_.gpu_uuid + ": scheduler still unreachable: " + why);
  }
}

void GrantSession::lose_connection(MonoTime now, const std::string& why, bool refused) {
  const bool was_up = conn_ == Conn::kUp;
  if (was_up && sessions_lost_ < UINT32_MAX) ++sessions_lost_;
  out_.emplace_back(session::Disconnect{});
  conn_ = Conn::kDown;
  revoke_pending_ = false;
  ping_outstanding_ = false;
  // A session that stayed up a while earns a fresh backoff; one that keeps dropping right after
  // its welcome keeps backing off, so a scheduler rejecting us is not hammered.
  if (was_up && now - up_since_ >= config_.timing.reconnect_max)
    backoff_ = config_.timing.reconnect_initial;
  schedule_reconnect(now);
  if (config_.debug_notes) debug("session lost (" + why + ")");
  // Running unscheduled from now on: bring swapped-out memory back first, so the process runs at
  // full speed instead of faulting its pages in one by one.
  if (swapped_out_) {
    swapping_in_for_.reset();
    swap_in_started_ = now;
    outage_why_ = why;
    outage_refused_ = refused;
    await(Awaiting::kSwappedIn, session::SwapIn{});
    return;
  }
  enter_outage(why, refused);
}

void GrantSession::schedule_reconnect(MonoTime now) {
  next_attempt_ = now + backoff_;
  backoff_ = std::min(backoff_ * 2, config_.timing.reconnect_max);
}

void GrantSession::enter_outage(const std::string& why, bool refused) {
  publish(GrantState::kOpen, session::GateChange::kOpen);
  settle_if_limits_known();
  if (!in_outage_) {
    in_outage_ = true;
    out_.emplace_back(session::OutageBegins{why, refused});
  }
}

void GrantSession::on_frame(const protocol::Message& message, MonoTime now) {
  if (conn_ != Conn::kHandshake && conn_ != Conn::kUp) return;  // from a connection already dropped
  last_rx_ = now;
  ping_outstanding_ = false;
  if (conn_ == Conn::kHandshake) {
    if (const auto* welcome = std::get_if<protocol::Welcome>(&message)) {
      on_welcome(*welcome, now);
    } else {
      lose_connection(now, "expected welcome, got " +
                               std::string(protocol::to_string(protocol::type_of(message))));
    }
    return;
  }
  std::visit(
      [&](const auto& m) {
        using T = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<T, protocol::Grant>) {
          on_grant(m, now);
        } else if constexpr (std::is_same_v<T, protocol::Revoke>) {
          on_revoke(m, now);
        } else if constexpr (std::is_same_v<T, protocol::SwapNotice>) {
          on_swap_notice(m, now);
        } else if constexpr (std::is_same_v<T, protocol::Evict>) {
          on_evict(m, now);
        } else if constexpr (std::is_same_v<T, protocol::Room>) {
          on_room(m, now);
        } else if constexpr (std::is_same_v<T, protocol::Contended>) {
          on_contended(m, now);
        } else if constexpr (std::is_same_v<T, protocol::SetLimits>) {
          on_limits(m);
        } else if constexpr (std::is_same_v<T, protocol::Wait>) {
          if (config_.debug_notes) {
            debug("waiting (" + std::string(protocol::to_string(m.reason)) + ")");
          }
        } else if constexpr (std::is_same_v<T, protocol::Ping>) {
          send(protocol::Pong{m.nonce});
        } else if constexpr (std::is_same_v<T, protocol::Pong>) {
          // Any frame proves liveness; nothing else to do.
        } else {
          lose_connection(now, "the scheduler sent " +
                                   std::string(protocol::to_string(protocol::type_of(message))));
        }
      },
      message);
}

void GrantSession::on_welcome(const protocol::Welcome& welcome, MonoTime now) {
  if (welcome.version < protocol::kMinVersion || welcome.version > protocol::kMaxVersion) {
    lose_connection(now, "the scheduler chose protocol version " + std::to_string(welcome.version));
    return;
  }
  version_ = welcome.version;
  client_id_ = welcome.client_id;
  conn_ = Conn::kUp;
  up_since_ = now;
  next_idle_check_ = now;
  out_.emplace_back(session::Registered{client_id_});
  // Registered: closed until granted, like any new client. Threads already inside (running
  // fail-open) finish their submission; the next one waits for a grant.
  publish(GrantState::kIdle, session::GateChange::kClose);
  if (in_outage_) {
    in_outage_ = false;
    out_.emplace_back(session::OutageEnds{});
  }
  usage_sent_ = false;
  send_usage(now, true);
}

// ---- the grant ----------------------------------------------------------------------------------

void GrantSession::on_grant(const protocol::Grant& grant, MonoTime now) {
  if (state_ == GrantState::kHeld || state_ == GrantState::kRevoking) {
    if (config_.debug_notes) {
      debug("grant " + std::to_string(grant.epoch) + " while holding " + std::to_string(epoch_) +
            " ignored");
    }
    return;
  }
  if (!swapped_out_) {
    hold(grant.epoch, now, -1);
    return;
  }
  if (wants_no_gpu()) {
    // Queued again by the revoke but idle since: hand the grant straight back rather than swap
    // in only to swap out again. The next submission asks anew.
    out_.emplace_back(session::Record{"handback", grant.epoch});
    send(protocol::Released{grant.epoch, 0, 0});
    publish(GrantState::kIdle, session::GateChange::kKeep);
    return;
  }
  swapping_in_for_ = grant.epoch;
  swap_in_started_ = now;
  await(Awaiting::kSwappedIn, session::SwapIn{});
}

void GrantSession::on_swapped_in(std::uint64_t bytes, MonoTime now) {
  if (room_swapping_) {
    on_room_swapped_in(bytes, now);
    return;
  }
  swapped_out_ = false;
  room_in_bytes_ = 0;
  const double ms = to_ms(now - swap_in_started_);
  if (config_.debug_notes) {
    debug("swapped in " + std::to_string(bytes) + " bytes in " + std::to_string(ms) + " ms");
  }
  if (!swapping_in_for_) {
    enter_outage(outage_why_, outage_refused_);
    return;
  }
  const std::uint64_t epoch = *swapping_in_for_;
  swapping_in_for_.reset();
  send_usage(now, true);
  hold(epoch, now, ms, session::SwapRecord{static_cast<std::int64_t>(bytes), ms});
}

void GrantSession::hold(std::uint64_t epoch, MonoTime now, double swap_in_ms,
                        session::SwapRecord swap) {
  epoch_ = epoch;
  granted_at_ = now;
  idle_seen_ = Duration{0};
  idle_threads_ = {};
  submitting_seen_.reset();
  next_idle_check_ = now + config_.timing.idle_release / 2;
  out_.emplace_back(session::Record{"grant", epoch, swap_in_ms, swap});
  publish(GrantState::kHeld, session::GateChange::kOpen);
}

bool GrantSession::wants_no_gpu() {
  const Duration idle = config_.timing.idle_release;
  return probe_.waiters() == 0 && idle.count() > 0 && probe_.idle_for() >= idle;
}

bool GrantSession::submitting() { return probe_.inside() > 0 || probe_.at_bound() > 0; }

Duration GrantSession::process_idle(MonoTime now, Duration gpu_idle) const {
  if (!submitting_seen_) return gpu_idle;
  return std::min(gpu_idle, now - *submitting_seen_);
}

bool GrantSession::yield_asked() const { return yield_epoch_ != 0 && yield_epoch_ == epoch_; }

bool GrantSession::noticed() const { return notice_epoch_ != 0 && notice_epoch_ == epoch_; }

bool GrantSession::swap_noticed() const {
  return swap_notice_epoch_ != 0 && swap_notice_epoch_ == epoch_;
}

Duration GrantSession::noticed_idle() const {
  return pauses_waited_out(swap_noticed() ? kNoticedIdle : kContendedIdle);
}

Duration GrantSession::pauses_waited_out(Duration floor) const {
  return std::min(config_.timing.idle_release, std::max(floor, 2 * recurring_pause()));
}

Duration GrantSession::idle_threshold() const {
  const Duration idle = config_.timing.idle_release;
  if (yield_asked()) return idle.count() > 0 ? std::min(idle, kYieldIdle) : kYieldIdle;
  if (noticed() && idle.count() > 0) return noticed_idle();
  return idle;
}

void GrantSession::observe_idle(Duration idle) {
  // Less idle than at the last check: work came in between, so that idle stretch was a pause.
  if (idle < idle_seen_) {
    // A stretch during which a thread sat inside a submission or at the drain bound is the
    // driver's, not the application's: traced, never learnt as a pause.
    if (idle_threads_.submitting()) {
      note_stall(idle_seen_, idle_threads_);
    } else {
      learn_pause(idle_seen_, idle_threads_);
    }
    idle_threads_ = {};
  }
  if (idle.count() > 0) {
    idle_threads_.inside =
        std::max(idle_threads_.inside, static_cast<std::int64_t>(probe_.inside()));
    idle_threads_.waiting =
        std::max(idle_threads_.waiting, static_cast<std::int64_t>(probe_.waiters()));
    idle_threads_.at_bound =
        std::max(idle_threads_.at_bound, static_cast<std::int64_t>(probe_.at_bound()));
  }
  idle_seen_ = idle;
}

void GrantSession::learn_pause(Duration pause, session::ThreadsSeen threads) {
  // Traced where the time it would take a contended holder to release changes: below the floor
  // every pause is alike.
  const Duration before = pauses_waited_out(kContendedIdle);
  pauses_.add(pause);
  if (pauses_waited_out(kContendedIdle) != before) {
    out_.emplace_back(session::Record{"pause", epoch_, to_ms(recurring_pause()), {}, threads});
  }
}

Duration GrantSession::recurring_pause() const {
  Duration longest{0};
  Duration second{0};
  for (const Duration pause : pauses_.kept()) {
    if (pause > longest) {
      second = longest;
      longest = pause;
    } else if (pause > second) {
      second = pause;
    }
  }
  return second;
}

void GrantSession::note_stall(Duration stall, session::ThreadsSeen threads) {
  if (stall <= longest_stall_) return;
  longest_stall_ = stall;
  out_.emplace_back(session::Record{"stall", epoch_, to_ms(stall), {}, threads});
}

void GrantSession::observe_pause_before_request(MonoTime now) {
  if (!noticed_release_idle_since_) return;
  // The pause ended when a thread began to wait, which may be well before this request: the
  // engine may have been swapping the memory out for the job that waited.
  const MonoTime ended = std::clamp(probe_.waiting_since(), *noticed_release_idle_since_, now);
  const Duration pause = ended - *noticed_release_idle_since_;
  noticed_release_idle_since_.reset();
  // Work again within the idle release: the process paused, and the notice cut its turn short.
  if (pause < config_.timing.idle_release) learn_pause(pause);
}

void GrantSession::on_revoke(const protocol::Revoke& revoke, MonoTime now) {
  if (revoke.reason == protocol::RevokeReason::kYield) {
    // Not a revoke: keep running, but release as soon as idle (checked from now on).
    if (state_ == GrantState::kHeld && revoke.epoch == epoch_) {
      yield_epoch_ = revoke.epoch;
      next_idle_check_ = now;
      out_.emplace_back(session::Record{"yield", revoke.epoch});
    }
    return;
  }
  if (state_ != GrantState::kHeld || revoke.epoch != epoch_) {
    if (config_.debug_notes) {
      debug("stale revoke of grant " + std::to_string(revoke.epoch) + " ignored (state " +
            to_string(state_) + ", grant " + std::to_string(epoch_) + ")");
    }
    return;
  }
  publish(GrantState::kRevoking, session::GateChange::kClose);
  revoke_pending_ = true;
  revoke_ = revoke;
  revoke_at_ = now;
  inside_deadline_ = now + config_.timing.inside_bound;
  out_.emplace_back(session::Record{"revoke", revoke.epoch});
  // The drain starts from service() as soon as no thread is inside a submission.
}

void GrantSession::on_swap_notice(const protocol::SwapNotice& notice, MonoTime now) {
  if (!take_notice(notice.epoch, now, /*swap=*/true)) return;  // stale: nothing to ready
  out_.emplace_back(session::PrepareSwapOut{notice.bytes});
  out_.emplace_back(session::Record{"swap-notice", notice.epoch});
}

void GrantSession::on_contended(const protocol::Contended& contended, MonoTime now) {
  if (!take_notice(contended.epoch, now, /*swap=*/false)) return;
  out_.emplace_back(session::Record{"contended", contended.epoch});
}

bool GrantSession::take_notice(std::uint64_t epoch, MonoTime now, bool swap) {
  if (state_ != GrantState::kHeld || epoch != epoch_) return false;
  notice_epoch_ = epoch;
  if (swap) swap_notice_epoch_ = epoch;
  next_idle_check_ = std::min(next_idle_check_, now + noticed_idle() / 2);
  return true;
}

void GrantSession::on_evict(const protocol::Evict& evict, MonoTime now) {
  if (state_ != GrantState::kIdle && state_ != GrantState::kRequested) {
    if (config_.debug_notes)
      debug("eviction ignored (state " + std::string(to_string(state_)) + ")");
    return;
  }
  // After a swap-out that moved part of its memory (a byte target), an eviction moves more of what
  // stayed; after one that moved all of it, or where nothing can move, the report says so.
  if (!config_.can_swap || (swapped_out_ && swap_target_ == 0 && room_in_bytes_ == 0)) {
    ++evictions_answered_;
    send_usage(now, true);
    return;
  }
  if (evicting_) return;  // one at a time: the one under way answers
  evicting_ = true;
  evict_bytes_ = evict.bytes;
  evict_at_ = now;
  out_.emplace_back(session::Record{"evict", epoch_});
  await(Awaiting::kDrained, session::Drain{});
}

void GrantSession::on_room(const protocol::Room& room, MonoTime now) {
  if (state_ != GrantState::kRequested || !swapped_out_ || !config_.can_swap) return;
  if (wants_no_gpu()) return;
  const DeviceUsage usage = probe_.usage();
  const std::uint64_t on_device =
      usage.resident_bytes - std::min(usage.pinned_bytes, usage.resident_bytes);
  if (room.bytes <= on_device) return;
  room_swapping_ = true;
  swap_in_started_ = now;
  await(Awaiting::kSwappedIn, session::SwapIn{room.bytes - on_device});
}

void GrantSession::on_room_swapped_in(std::uint64_t bytes, MonoTime now) {
  room_swapping_ = false;
  if (bytes == 0) return;  // no whole piece fitted in the room
  room_in_bytes_ += bytes;
  const double ms = to_ms(now - swap_in_started_);
  if (config_.debug_notes) {
    debug("brought back " + std::to_string(bytes) + " bytes into room in " + std::to_string(ms) +
          " ms");
  }
  out_.emplace_back(session::Record{"room", epoch_, ms,
                                    session::SwapRecord{static_cast<std::int64_t>(bytes), ms}});
  send_usage(now, true);
}

void GrantSession::on_drained(MonoTime now) {
  drained_at_ = now;
  if (evicting_ || revoke_.swap_out) {
    swap_target_ = evicting_ ? evict_bytes_ : revoke_.swap_bytes;
    swap_moved_ = 0;
    swap_out_step();
    return;
  }
  finish_revoke(now);
}

void GrantSession::swap_out_step() {
  swap_step_ = swap_target_ == 0 ? kSwapStep : std::min(kSwapStep, swap_target_ - swap_moved_);
  await(Awaiting::kSwappedOut, session::SwapOut{swap_step_});
}

void GrantSession::on_swapped_out(std::uint64_t step, MonoTime now) {
  swap_moved_ += step;
  swapped_out_ = true;
  room_in_bytes_ = 0;
  // A step that moved what it was asked may have left more: the next one, after a report.
  const bool more =
      step > 0 && step >= swap_step_ && (swap_target_ == 0 || swap_moved_ < swap_target_);
  if (more) {
    send_usage(now, true);
    swap_out_step();
    return;
  }
  const std::uint64_t bytes = swap_moved_;
  const Duration took = now - drained_at_;
  if (const std::uint64_t rate = bytes_per_second(bytes, took); rate > 0) {
    swap_out_bytes_per_s_ = rate;
  }
  if (config_.debug_notes) {
    debug("swapped out " + std::to_string(bytes) + " bytes in " + std::to_string(to_ms(took)) +
          " ms");
  }
  const session::SwapRecord swap{static_cast<std::int64_t>(bytes), to_ms(took)};
  if (evicting_) {
    evicting_ = false;
    ++evictions_answered_;
    out_.emplace_back(session::Record{"evicted", epoch_, to_ms(now - evict_at_), swap});
    send_usage(now, true);
    return;
  }
  finish_revoke(now, swap);
}

void GrantSession::finish_revoke(MonoTime now, session::SwapRecord swap) {
  if (revoke_.swap_out) send_usage(now, true);
  out_.emplace_back(session::Record{"release", revoke_.epoch, to_ms(now - revoke_at_), swap});
  send(
      protocol::Released{revoke_.epoch, to_us(now - granted_at_), to_us(drained_at_ - revoke_at_)});
  // The scheduler queues a client that answered a revoke by itself: no request needed.
  publish(GrantState::kRequested, session::GateChange::kKeep);
}

void GrantSession::on_gate_closed(std::uint64_t inside, MonoTime now) {
  // With the gate closed nobody can start a submission; release only if nobody did in between
  // and no thread waits for the drain bound (its next submission would come at once).
  const Duration idle = process_idle(now, probe_.idle_for());
  if (state_ != GrantState::kHeld || inside > 0 || probe_.at_bound() > 0 ||
      idle < idle_threshold()) {
    publish(state_, session::GateChange::kOpen);
    return;
  }
  out_.emplace_back(session::Record{"idle-release", epoch_, to_ms(idle), {}, idle_threads_});
  if (noticed() && idle_threshold() < config_.timing.idle_release) {
    noticed_release_idle_since_ = now - idle;
  } else {
    noticed_release_idle_since_.reset();
  }
  send(protocol::Released{epoch_, to_us(now - granted_at_), 0});
  // A thread that arrived while the gate was closed waits; the next service() sees it and
  // requests.
  publish(GrantState::kIdle, session::GateChange::kKeep);
  if (config_.debug_notes) {
    note(LogLevel::kTrace, config_.gpu_uuid + ": idle, released grant " + std::to_string(epoch_));
  }
}

// ---- limits -------------------------------------------------------------------------------------

void GrantSession::on_limits(const protocol::SetLimits& frame) {
  if (config_.debug_notes) {
    debug("limits memory " + std::to_string(frame.limits.memory_bytes) + " bytes, core " +
          std::to_string(frame.limits.core_percent) + "%" +
          (frame.provisional() ? " (provisional)" : ""));
  }
  if (!frame.provisional()) {
    known_limits_ = frame.limits;
    apply(frame.limits);
  } else if (known_limits_) {
    // A scheduler unsure of this client's limits: keep the stricter, field by field.
    apply(protocol::stricter(*known_limits_, frame.limits));
  }
  // The first limits frame follows the welcome: the scheduler's limits are in force now.
  settle_if_limits_known();
}

void GrantSession::on_settings(const std::optional<std::uint64_t>& memory) {
  if (!memory) return;
  const bool first_read = !file_memory_.has_value();
  if (file_memory_ == memory && known_limits_) return;
  file_memory_ = memory;
  // Unreachable but with limits known: the file's value at the first look is what this process
  // started from, not news; only a change after that (an annotation changed meanwhile) is.
  if (first_read && known_limits_) return;
  protocol::Limits limits = known_limits_.value_or(protocol::Limits{});
  limits.memory_bytes = *memory;
  note(LogLevel::kInfo, config_.gpu_uuid + ": memory limit " + std::to_string(*memory) +
                            " bytes from the settings file");
  known_limits_ = limits;
  apply(limits);
  settle();
}

void GrantSession::settle_if_limits_known() {
  if (!limits_pending()) settle();
}

void GrantSession::settle() {
  if (settled_) return;
  settled_ = true;
  out_.emplace_back(session::SettleRegistration{});
}

void GrantSession::apply(const protocol::Limits& limits) {
  applied_ = limits;
  out_.emplace_back(session::ApplyLimits{limits});
}

// ---- output -------------------------------------------------------------------------------------

void GrantSession::send_usage(MonoTime now, bool force) {
  usage_dirty_ = false;
  const DeviceUsage usage = probe_.usage();
  const protocol::Usage message{
      usage.allocated_bytes,
      usage.resident_bytes,
      usage.swap_bytes_per_s != 0 ? usage.swap_bytes_per_s : swap_out_bytes_per_s_,
      pace_permille_,
      static_cast<std::uint32_t>(std::min<std::uint64_t>(usage.refused_allocations, UINT32_MAX)),
      sessions_lost_,
      usage.pinned_bytes,
      config_.declared.priority,
      evictions_answered_};
  if (!force && usage_sent_ && message == last_usage_) return;
  usage_sent_ = true;
  last_usage_ = message;
  last_usage_at_ = now;
  send(message);
}

void GrantSession::send(protocol::Message message) {
  if (conn_ != Conn::kHandshake && conn_ != Conn::kUp) return;
  out_.emplace_back(session::Send{std::move(message), version_});
}

void GrantSession::publish(GrantState state, session::GateChange gate) {
  state_ = state;
  out_.emplace_back(session::Publish{state, gate, held_epoch()});
}

void GrantSession::await(Awaiting what, session::Action action) {
  awaiting_ = what;
  out_.push_back(std::move(action));
}

void GrantSession::stop() {
  stopped_ = true;
  awaiting_ = Awaiting::kNothing;
  inbox_.clear();
  publish(GrantState::kStopped, session::GateChange::kOpen);
  settle();
}

void GrantSession::note(LogLevel level, std::string text) {
  out_.emplace_back(session::Note{level, std::move(text)});
}

void GrantSession::debug(std::string text) {
  note(LogLevel::kDebug, config_.gpu_uuid + ": " + text);
}

}  // namespace nvshare::client

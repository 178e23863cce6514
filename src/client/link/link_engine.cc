#include "client/link/link_engine.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <new>
#include <type_traits>

#include "client/settings_file.h"
#include "common/log.h"

namespace nvshare::client {
namespace {

// Output a scheduler may leave unread before the session is considered dead. Frames are tens of
// bytes, so reaching this means the scheduler stopped reading.
constexpr std::size_t kMaxPendingOutput = std::size_t{1} << 20;
constexpr std::size_t kReadChunk = 4096;
// The longest the thread sleeps with nothing due, so a stop request is never missed for long.
constexpr Duration kMaxSleep = std::chrono::seconds(1);
// Idle time after which a holder asked to yield releases: long enough not to hand over in the gap
// between two launches of a busy loop, short against the host work of an interactive job.
constexpr Duration kYieldIdle = std::chrono::microseconds(200);
// How often a holder asked to yield looks whether it is idle (otherwise every half idle release, at
// most once a millisecond).
constexpr Duration kYieldCheckEvery = std::chrono::microseconds(250);

MonoTime now_mono() { return SteadyClock::instance().now(); }

// Set on the engine's thread: a hooked CUDA call the agent makes there must never wait for a grant
// (the thread that would deliver it is the one waiting).
thread_local bool t_on_link_thread = false;

std::string read_process_name() {
  UniqueFd fd(::open("/proc/self/comm", O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return {};
  char buffer[64];
  const ssize_t n = ::read(fd.get(), buffer, sizeof buffer);
  if (n <= 0) return {};
  std::string name(buffer, static_cast<std::size_t>(n));
  while (!name.empty() && (name.back() == '\n' || name.back() == '\0')) name.pop_back();
  return name;
}

// Connects without blocking: a scheduler whose accept backlog is full (hung) makes connect fail
// with EAGAIN instead of stalling the thread.
Result<UniqueFd> connect_nonblocking(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof addr.sun_path) {
    return make_error("socket path \"" + path + "\" is empty or too long");
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return make_error(std::string("socket: ") + std::strerror(errno));
  int rc;
  do {
    rc = ::connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr);
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) return make_error(std::strerror(errno));
  return fd;
}

std::uint64_t bytes_per_second(std::uint64_t bytes, Duration took) {
  if (bytes == 0 || took.count() <= 0) return 0;
  const long double rate =
      static_cast<long double>(bytes) * 1e9L / static_cast<long double>(took.count());
  return rate >= 1.8e19L ? UINT64_MAX : static_cast<std::uint64_t>(rate);
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

LinkOptions LinkOptions::from_config(const ClientConfig& config) {
  LinkOptions options;
  options.enabled = config.enabled;
  options.socket_path = config.socket_path;
  options.idle_release = config.idle_release;
  options.reconnect_max = std::max(config.reconnect_max, options.reconnect_initial);
  options.can_swap = config.managed;
  options.declared = config.declared_limits;
  options.pod_uid = config.pod_uid;
  options.register_wait = config.register_wait;
  options.trace_file = config.trace_file;
  options.limits_pending = config.memory_limit_pending;
  options.settings_path = config.settings_path;
  return options;
}

// ---- the fork registry --------------------------------------------------------------------------

// Every live engine, so pthread_atfork can quiesce them in the parent and reset them in the child.
struct ForkRegistry {
  static std::mutex& mutex() {
    static std::mutex m;
    return m;
  }
  static LinkEngine*& head() {
    static LinkEngine* first = nullptr;
    return first;
  }
  static void prepare() {
    mutex().lock();
    for (LinkEngine* e = head(); e != nullptr; e = e->next_engine_) e->fork_prepare();
  }
  static void parent() {
    for (LinkEngine* e = head(); e != nullptr; e = e->next_engine_) e->fork_parent();
    mutex().unlock();
  }
  static void child() {
    for (LinkEngine* e = head(); e != nullptr; e = e->next_engine_) e->fork_child();
    mutex().unlock();
  }
  static void add(LinkEngine* engine) {
    static std::once_flag registered;
    std::call_once(registered, [] { ::pthread_atfork(&prepare, &parent, &child); });
    std::lock_guard lock(mutex());
    engine->next_engine_ = head();
    head() = engine;
  }
  static void remove(LinkEngine* engine) {
    std::lock_guard lock(mutex());
    for (LinkEngine** p = &head(); *p != nullptr; p = &(*p)->next_engine_) {
      if (*p == engine) {
        *p = engine->next_engine_;
        return;
      }
    }
  }
};

// ---- DeviceChannel: application threads ---------------------------------------------------------

DeviceChannel::DeviceChannel(LinkEngine& engine, DeviceIdentity identity, DeviceAgent& agent)
    : engine_(engine), identity_(std::move(identity)), agent_(agent) {
  session_.backoff = engine_.options_.reconnect_initial;
  register_deadline_ = std::chrono::steady_clock::now() + engine_.options_.register_wait;
  if (engine_.options_.register_wait <= Duration::zero()) settled_.store(true);
}

DeviceChannel::~DeviceChannel() = default;

void DeviceChannel::before_submit() noexcept {
  switch (gate_.try_enter()) {
    case GrantGate::Entry::kEntered:
      return;
    case GrantGate::Entry::kClosedLastOut:
      engine_.wake();
      [[fallthrough]];
    case GrantGate::Entry::kClosed:
      slow_enter();
      return;
  }
}

void DeviceChannel::after_submit() noexcept {
  if (gate_.leave_and_check_last()) engine_.wake();
}

void DeviceChannel::usage_changed() noexcept {
  if (!usage_dirty_.exchange(true, std::memory_order_acq_rel)) engine_.wake();
}

void DeviceChannel::await_registration() noexcept {
  if (settled_.load(std::memory_order_acquire)) return;
  // The link thread settles registration; waiting there would only ever time out.
  if (t_on_link_thread) return;
  try {
    std::unique_lock lock(mu_);
    cv_.wait_until(lock, register_deadline_,
                   [&] { return settled_.load(std::memory_order_acquire); });
  } catch (...) {
    // A failing mutex or condition variable: go on without the scheduler's limits.
  }
}

void DeviceChannel::slow_enter() {
  if (t_on_link_thread) {
    // Entered on our own thread: counted as inside, so leave_and_check_last() stays balanced.
    gate_.enter_unconditionally();
    return;
  }
  try {
    engine_.ensure_started();
    std::unique_lock lock(mu_);
    // The first waiter tells the engine's thread there is demand (it requests when registered).
    if (waiters_++ == 0) engine_.wake();
    for (;;) {
      if (gate_.is_open()) {
        const GrantGate::Entry entry = gate_.try_enter();
        if (entry == GrantGate::Entry::kEntered) break;
        if (entry == GrantGate::Entry::kClosedLastOut) engine_.wake();
        continue;  // closed again in between: look at the state anew
      }
      cv_.wait(lock);
    }
    --waiters_;
  } catch (...) {
    // Only a failing mutex or condition variable gets here; a submission never fails because of
    // the scheduler, so it goes on unscheduled.
  }
}

GrantState DeviceChannel::state() const { return state_.load(std::memory_order_acquire); }

std::uint64_t DeviceChannel::epoch() const {
  std::lock_guard lock(mu_);
  const GrantState state = state_.load(std::memory_order_relaxed);
  return state == GrantState::kHeld || state == GrantState::kRevoking ? held_epoch_ : 0;
}

// ---- DeviceChannel: the engine's thread ---------------------------------------------------------

bool DeviceChannel::agent_allowed() const {
  return !engine_.stopping_.load(std::memory_order_acquire);
}

void DeviceChannel::set_state(GrantState state, bool open_gate) {
  std::lock_guard lock(mu_);
  state_ = state;
  if (open_gate) {
    gate_.open();
    cv_.notify_all();
  }
}

void DeviceChannel::settle_registration() {
  if (settled_.load(std::memory_order_acquire)) return;
  std::lock_guard lock(mu_);
  settled_.store(true, std::memory_order_release);
  cv_.notify_all();
}

void DeviceChannel::stop() {
  std::lock_guard lock(mu_);
  state_ = GrantState::kStopped;
  settled_.store(true, std::memory_order_release);
  gate_.open();
  cv_.notify_all();
}

void DeviceChannel::service(MonoTime now, MonoTime& next) {
  service_timers(now, next);
  flush();
  check_broken(now);
}

void DeviceChannel::service_timers(MonoTime now, MonoTime& next) {
  Session& s = session_;
  if (!s.limits_applied && agent_allowed()) {
    // Declared limits (or the settings file's) hold from the first allocation, with or without a
    // scheduler; a scheduler sends limits only when it wants others.
    s.limits_applied = true;
    if (engine_.options_.limits_pending && !known_limits_) {
      agent_.limits_unknown();
    } else {
      if (!known_limits_) known_limits_ = engine_.options_.declared;
      agent_.apply_limits(*known_limits_);
    }
  }
  read_settings(now, next);
  switch (s.conn) {
    case Conn::kDown:
      if (now >= s.next_attempt) {
        try_connect(now);
      } else {
        next = std::min(next, s.next_attempt);
      }
      return;
    case Conn::kHandshake:
      if (now >= s.handshake_deadline) {
        lose_connection(now, "no welcome within " +
                                 std::to_string(to_ms(engine_.options_.handshake_timeout)) + " ms");
      } else {
        next = std::min(next, s.handshake_deadline);
      }
      return;
    case Conn::kUp:
      break;
  }

  // Liveness: a silent scheduler is pinged, and one that stays silent is treated as gone, so a
  // waiting thread is never held by a peer that stopped answering.
  const Duration silence = now - s.last_rx;
  const Duration ping_after = engine_.options_.ping_after;
  if (silence >= ping_after + engine_.options_.dead_after) {
    lose_connection(now, "the scheduler stopped answering");
    return;
  }
  if (silence >= ping_after && !s.ping_outstanding) {
    s.ping_outstanding = true;
    send(protocol::Ping{++s.ping_nonce});
  }
  next = std::min(next, s.last_rx + (s.ping_outstanding ? ping_after + engine_.options_.dead_after
                                                        : ping_after));

  // Demand: a thread waits while registered and not queued.
  if (state_ == GrantState::kIdle) {
    bool demand;
    {
      std::lock_guard lock(mu_);
      demand = waiters_ > 0;
      if (demand) state_ = GrantState::kRequested;
    }
    if (demand) {
      // The scheduler judges fit on the last usage it saw: report allocations made since then
      // before asking, or it may grant beside a runner this client does not fit beside.
      if (usage_dirty_.load(std::memory_order_acquire)) send_usage(now, false);
      send(protocol::Request{});
      engine_.trace_.record("request", identity_.gpu_uuid, s.epoch);
    }
  }

  if (s.revoke_pending) {
    if (gate_.inside() == 0 || now >= s.inside_deadline) {
      finish_revoke(now);
      if (s.conn != Conn::kUp) return;
    } else {
      next = std::min(next, s.inside_deadline);
    }
  }

  const Duration idle = idle_threshold();
  if (state_ == GrantState::kHeld && idle.count() > 0) {
    if (now >= s.next_idle_check) {
      try_idle_release(now);
      if (s.conn != Conn::kUp) return;
      const Duration floor = yield_asked() ? kYieldCheckEvery : std::chrono::milliseconds(1);
      s.next_idle_check = now + std::max<Duration>(idle / 2, floor);
    }
    if (state_ == GrantState::kHeld) next = std::min(next, s.next_idle_check);
  }

  if (usage_dirty_.load(std::memory_order_acquire)) {
    const MonoTime due = s.last_usage_at + engine_.options_.usage_interval;
    if (!s.usage_sent || now >= due) {
      send_usage(now, false);
    } else {
      next = std::min(next, due);
    }
  }
}

void DeviceChannel::try_connect(MonoTime now) {
  Session& s = session_;
  const LinkOptions& options = engine_.options_;
  auto fd = connect_nonblocking(options.socket_path);
  if (!fd) {
    // Nothing accepts at the socket: the first CUDA call does not wait for a registration, unless
    // it still has no limits to keep.
    settle_if_limits_known();
    s.next_attempt = now + s.backoff;
    s.backoff = std::min(s.backoff * 2, options.reconnect_max);
    // The first failure of an outage opens the gate and is logged; later attempts are silent.
    if (!s.in_outage) {
      s.in_outage = true;
      set_state(GrantState::kOpen, true);
      engine_.outage_begins(fd.error().message);
    } else {
      NVSHARE_TRACE("%s: scheduler still unreachable: %s", identity_.gpu_uuid.c_str(),
                    fd.error().message.c_str());
    }
    return;
  }
  s.fd = std::move(fd.value());
  s.conn = Conn::kHandshake;
  s.decoder = protocol::FrameDecoder{};
  s.out.clear();
  s.out_sent = 0;
  s.version = protocol::kMaxVersion;
  s.handshake_deadline = now + options.handshake_timeout;
  s.last_rx = now;
  s.ping_outstanding = false;

  protocol::Hello hello;
  hello.pid = static_cast<std::uint32_t>(::getpid());
  hello.gpu_uuid = identity_.gpu_uuid.substr(0, protocol::kMaxUuidLength);
  hello.gpu_memory_bytes = identity_.gpu_memory_bytes;
  hello.capabilities = protocol::capability::kUsageReports | protocol::capability::kYield;
  if (options.can_swap) hello.capabilities |= protocol::capability::kSwap;
  if (options.idle_release.count() > 0) hello.capabilities |= protocol::capability::kIdleRelease;
  hello.declared = options.declared;
  hello.pod_uid = options.pod_uid.substr(0, protocol::kMaxUuidLength);
  hello.process_name = options.process_name.substr(0, protocol::kMaxNameLength);
  send(hello);
  flush();
}

void DeviceChannel::lose_connection(MonoTime now, const std::string& why) {
  Session& s = session_;
  const bool was_up = s.conn == Conn::kUp;
  s.fd.reset();
  s.broken.clear();
  s.conn = Conn::kDown;
  s.decoder = protocol::FrameDecoder{};
  s.out.clear();
  s.out_sent = 0;
  s.revoke_pending = false;
  s.ping_outstanding = false;
  // A session that stayed up a while earns a fresh backoff; one that keeps dropping right after
  // its welcome keeps backing off, so a scheduler rejecting us is not hammered.
  if (was_up && now - s.up_since >= engine_.options_.reconnect_max) {
    s.backoff = engine_.options_.reconnect_initial;
  }
  s.next_attempt = now + s.backoff;
  s.backoff = std::min(s.backoff * 2, engine_.options_.reconnect_max);

  // Running unscheduled from now on: bring swapped-out memory back so the process runs at full
  // speed instead of faulting its pages in one by one.
  if (s.swapped_out && agent_allowed()) {
    agent_.swap_in();
    s.swapped_out = false;
  }
  set_state(GrantState::kOpen, true);
  settle_if_limits_known();
  if (!s.in_outage) {
    s.in_outage = true;
    engine_.outage_begins(why);
  }
  NVSHARE_DEBUG("%s: session lost (%s)", identity_.gpu_uuid.c_str(), why.c_str());
}

void DeviceChannel::on_readable(MonoTime now) {
  Session& s = session_;
  std::array<std::uint8_t, kReadChunk> buffer;
  for (int round = 0; round < 16 && s.conn != Conn::kDown; ++round) {
    auto n = read_some(s.fd.get(), buffer);
    if (!n) {
      if (would_block(n.error())) return;
      lose_connection(now, n.error().message);
      return;
    }
    if (n.value() == 0) {
      lose_connection(now, "the scheduler closed the connection");
      return;
    }
    s.last_rx = now;
    s.ping_outstanding = false;
    s.decoder.feed(std::span<const std::uint8_t>(buffer.data(), n.value()));
    for (;;) {
      auto frame = s.decoder.next();
      if (!frame) {
        NVSHARE_WARN("%s: malformed frame from the scheduler: %s", identity_.gpu_uuid.c_str(),
                     frame.error().message.c_str());
        lose_connection(now, "malformed frame");
        return;
      }
      if (!frame.value()) break;
      engine_.frames_received_.fetch_add(1, std::memory_order_relaxed);
      handle(frame.value()->message, now);
      check_broken(now);
      if (s.conn == Conn::kDown) return;
    }
    if (n.value() < buffer.size()) break;
  }
  flush();
  check_broken(now);
}

void DeviceChannel::on_writable(MonoTime now) {
  flush();
  check_broken(now);
}

void DeviceChannel::check_broken(MonoTime now) {
  if (session_.broken.empty()) return;
  const std::string why = std::move(session_.broken);
  session_.broken.clear();
  lose_connection(now, why);
}

void DeviceChannel::handle(const protocol::Message& message, MonoTime now) {
  Session& s = session_;
  if (s.conn == Conn::kHandshake) {
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
        } else if constexpr (std::is_same_v<T, protocol::SetLimits>) {
          on_limits(m);
        } else if constexpr (std::is_same_v<T, protocol::Wait>) {
          NVSHARE_DEBUG("%s: waiting (%s)", identity_.gpu_uuid.c_str(),
                        std::string(protocol::to_string(m.reason)).c_str());
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

void DeviceChannel::on_welcome(const protocol::Welcome& welcome, MonoTime now) {
  Session& s = session_;
  if (welcome.version < protocol::kMinVersion || welcome.version > protocol::kMaxVersion) {
    lose_connection(now, "the scheduler chose protocol version " + std::to_string(welcome.version));
    return;
  }
  s.version = welcome.version;
  s.client_id = welcome.client_id;
  s.conn = Conn::kUp;
  s.up_since = now;
  s.next_idle_check = now;
  engine_.sessions_.fetch_add(1, std::memory_order_relaxed);
  // Registered: closed until granted, like any new client. Threads already inside (running
  // fail-open) finish their submission; the next one waits for a grant.
  {
    std::lock_guard lock(mu_);
    state_ = GrantState::kIdle;
    gate_.close();
  }
  NVSHARE_DEBUG("%s: registered as client %llu", identity_.gpu_uuid.c_str(),
                static_cast<unsigned long long>(s.client_id));
  if (s.in_outage) {
    s.in_outage = false;
    engine_.outage_ends();
  }
  s.usage_sent = false;
  send_usage(now, true);
}

void DeviceChannel::on_grant(const protocol::Grant& grant, MonoTime now) {
  Session& s = session_;
  if (state_ == GrantState::kHeld || state_ == GrantState::kRevoking) {
    NVSHARE_DEBUG("%s: grant %llu while holding %llu ignored", identity_.gpu_uuid.c_str(),
                  static_cast<unsigned long long>(grant.epoch),
                  static_cast<unsigned long long>(s.epoch));
    return;
  }
  double swap_in_ms = -1;
  if (s.swapped_out && agent_allowed()) {
    bool nobody_waits;
    {
      std::lock_guard lock(mu_);
      nobody_waits = waiters_ == 0;
    }
    const Duration idle = engine_.options_.idle_release;
    if (nobody_waits && idle.count() > 0 && agent_.idle_for() >= idle) {
      // Queued again by the revoke but idle since: hand the grant straight back rather than
      // swap in only to swap out again. The next submission asks anew.
      send(protocol::Released{grant.epoch, 0, 0});
      set_state(GrantState::kIdle, false);
      engine_.trace_.record("handback", identity_.gpu_uuid, grant.epoch);
      return;
    }
    const MonoTime started = now_mono();
    const std::uint64_t bytes = agent_.swap_in();
    const Duration took = now_mono() - started;
    s.swapped_out = false;
    swap_in_ms = to_ms(took);
    NVSHARE_DEBUG("%s: swapped in %llu bytes in %.1f ms", identity_.gpu_uuid.c_str(),
                  static_cast<unsigned long long>(bytes), swap_in_ms);
    now = now_mono();
    send_usage(now, true);
  }
  s.epoch = grant.epoch;
  s.granted_at = now;
  s.next_idle_check = now + engine_.options_.idle_release / 2;
  {
    std::lock_guard lock(mu_);
    held_epoch_ = grant.epoch;
    state_ = GrantState::kHeld;
    gate_.open();
    cv_.notify_all();
  }
  engine_.trace_.record("grant", identity_.gpu_uuid, grant.epoch, swap_in_ms);
}

namespace {

protocol::Limits stricter(const protocol::Limits& a, const protocol::Limits& b) {
  protocol::Limits out;
  out.memory_bytes = a.memory_bytes == 0   ? b.memory_bytes
                     : b.memory_bytes == 0 ? a.memory_bytes
                                           : std::min(a.memory_bytes, b.memory_bytes);
  out.core_percent = std::min(a.core_percent, b.core_percent);
  return out;
}

}  // namespace

void DeviceChannel::on_limits(const protocol::SetLimits& frame) {
  NVSHARE_DEBUG("%s: limits memory %llu bytes, core %u%%%s", identity_.gpu_uuid.c_str(),
                static_cast<unsigned long long>(frame.limits.memory_bytes),
                frame.limits.core_percent, frame.provisional() ? " (provisional)" : "");
  if (!frame.provisional()) {
    known_limits_ = frame.limits;
    if (agent_allowed()) agent_.apply_limits(frame.limits);
  } else if (known_limits_) {
    // A scheduler unsure of this client's limits: keep the stricter, field by field.
    if (agent_allowed()) agent_.apply_limits(stricter(*known_limits_, frame.limits));
  }
  // The first limits frame follows the welcome: the scheduler's limits are in force now.
  settle_if_limits_known();
}

void DeviceChannel::settle_if_limits_known() {
  if (known_limits_ || !engine_.options_.limits_pending) settle_registration();
}

void DeviceChannel::read_settings(MonoTime now, MonoTime& next) {
  const std::string& path = engine_.options_.settings_path;
  const bool pending = !known_limits_ && engine_.options_.limits_pending;
  const bool unreachable = session_.conn != Conn::kUp;
  if (path.empty() || (!pending && !unreachable) || !agent_allowed()) return;
  if (now < next_settings_read_) {
    next = std::min(next, next_settings_read_);
    return;
  }
  // Pending: soon, the plugin writes it within moments of the container starting. Unreachable:
  // now and then, for an annotation changed meanwhile.
  next_settings_read_ = now + (pending ? std::chrono::milliseconds(100) : std::chrono::seconds(1));
  next = std::min(next, next_settings_read_);
  const SettingsRead read = read_client_settings(path);
  if (!read.settings || read.settings->memory_pending || !read.settings->memory_bytes) return;
  const std::uint64_t memory = *read.settings->memory_bytes;
  const bool first_read = !file_memory_.has_value();
  if (file_memory_ == memory && known_limits_) return;
  file_memory_ = memory;
  // Unreachable but with limits known: the file's value at the first look is what this process
  // started from, not news; only a change after that (an annotation changed meanwhile) is.
  if (first_read && known_limits_) return;
  protocol::Limits limits = known_limits_.value_or(protocol::Limits{});
  limits.memory_bytes = memory;
  NVSHARE_INFO("%s: memory limit %llu bytes from %s", identity_.gpu_uuid.c_str(),
               static_cast<unsigned long long>(memory), path.c_str());
  known_limits_ = limits;
  agent_.apply_limits(limits);
  settle_registration();
}

bool DeviceChannel::yield_asked() const {
  return session_.yield_epoch != 0 && session_.yield_epoch == session_.epoch;
}

Duration DeviceChannel::idle_threshold() const {
  const Duration idle = engine_.options_.idle_release;
  if (yield_asked()) {
    return idle.count() > 0 ? std::min(idle, kYieldIdle) : kYieldIdle;
  }
  return idle;
}

void DeviceChannel::on_revoke(const protocol::Revoke& revoke, MonoTime now) {
  Session& s = session_;
  if (revoke.reason == protocol::RevokeReason::kYield) {
    // Not a revoke: keep running, but release as soon as idle (checked from the next pass on).
    if (state_ == GrantState::kHeld && revoke.epoch == s.epoch) {
      s.yield_epoch = revoke.epoch;
      s.next_idle_check = now;
      engine_.trace_.record("yield", identity_.gpu_uuid, revoke.epoch);
    }
    return;
  }
  if (state_ != GrantState::kHeld || revoke.epoch != s.epoch) {
    NVSHARE_DEBUG("%s: stale revoke of grant %llu ignored (state %s, grant %llu)",
                  identity_.gpu_uuid.c_str(), static_cast<unsigned long long>(revoke.epoch),
                  to_string(state_.load()), static_cast<unsigned long long>(s.epoch));
    return;
  }
  {
    std::lock_guard lock(mu_);
    state_ = GrantState::kRevoking;
    gate_.close();
  }
  s.revoke_pending = true;
  s.revoke = revoke;
  s.revoke_at = now;
  s.inside_deadline = now + engine_.options_.inside_bound;
  engine_.trace_.record("revoke", identity_.gpu_uuid, revoke.epoch);
  // finish_revoke runs from service() as soon as no thread is inside a submission.
}

void DeviceChannel::finish_revoke(MonoTime now) {
  Session& s = session_;
  s.revoke_pending = false;
  if (const std::uint64_t inside = gate_.inside(); inside > 0) {
    NVSHARE_DEBUG("%s: %llu threads still inside a submission after %.0f ms; draining anyway",
                  identity_.gpu_uuid.c_str(), static_cast<unsigned long long>(inside),
                  to_ms(now - s.revoke_at));
  }
  MonoTime drained_at = now;
  if (agent_allowed()) {
    agent_.drain();
    drained_at = now_mono();
    if (s.revoke.swap_out) {
      const std::uint64_t bytes = agent_.swap_out();
      const Duration took = now_mono() - drained_at;
      s.swapped_out = true;
      if (const std::uint64_t rate = bytes_per_second(bytes, took); rate > 0) {
        s.swap_out_bytes_per_s = rate;
      }
      NVSHARE_DEBUG("%s: swapped out %llu bytes in %.1f ms", identity_.gpu_uuid.c_str(),
                    static_cast<unsigned long long>(bytes), to_ms(took));
    }
  }
  const MonoTime done = now_mono();
  if (s.revoke.swap_out) send_usage(done, true);
  // Recorded just before the frame is queued, so a follower's grant always reads later.
  engine_.trace_.record("release", identity_.gpu_uuid, s.revoke.epoch, to_ms(done - s.revoke_at));
  send(protocol::Released{s.revoke.epoch, to_us(done - s.granted_at),
                          to_us(drained_at - s.revoke_at)});
  // The scheduler queues a client that answered a revoke by itself: no request needed.
  set_state(GrantState::kRequested, false);
  flush();
}

void DeviceChannel::try_idle_release(MonoTime now) {
  Session& s = session_;
  if (s.revoke_pending || !agent_allowed()) return;
  const Duration idle = idle_threshold();
  if (agent_.idle_for() < idle) return;
  std::uint64_t inside;
  {
    std::lock_guard lock(mu_);
    if (waiters_ > 0 || state_ != GrantState::kHeld) return;
    inside = gate_.close();
  }
  // With the gate closed nobody can start a submission; release only if nobody did in between.
  if (inside > 0 || agent_.idle_for() < idle) {
    std::lock_guard lock(mu_);
    gate_.open();
    cv_.notify_all();
    return;
  }
  engine_.trace_.record("idle-release", identity_.gpu_uuid, s.epoch);
  send(protocol::Released{s.epoch, to_us(now - s.granted_at), 0});
  // A thread that arrived while the gate was closed has woken the thread; the next pass of
  // service() sees it waiting and requests.
  set_state(GrantState::kIdle, false);
  NVSHARE_TRACE("%s: idle, released grant %llu", identity_.gpu_uuid.c_str(),
                static_cast<unsigned long long>(s.epoch));
  flush();
}

void DeviceChannel::send_usage(MonoTime now, bool force) {
  Session& s = session_;
  usage_dirty_.store(false, std::memory_order_release);
  if (!agent_allowed()) return;
  const DeviceUsage usage = agent_.usage();
  protocol::Usage message{
      usage.allocated_bytes, usage.resident_bytes,
      usage.swap_bytes_per_s != 0 ? usage.swap_bytes_per_s : s.swap_out_bytes_per_s};
  if (!force && s.usage_sent && message == s.last_usage) return;
  s.usage_sent = true;
  s.last_usage = message;
  s.last_usage_at = now;
  send(message);
}

void DeviceChannel::send(const protocol::Message& message) {
  Session& s = session_;
  if (!s.fd.valid()) return;
  if (Status encoded = protocol::encode_to(message, s.out, s.version); !encoded) {
    NVSHARE_WARN("%s: cannot encode %s: %s", identity_.gpu_uuid.c_str(),
                 std::string(protocol::to_string(protocol::type_of(message))).c_str(),
                 encoded.error().message.c_str());
    return;
  }
  engine_.frames_sent_.fetch_add(1, std::memory_order_relaxed);
  if (s.out.size() - s.out_sent > kMaxPendingOutput && s.broken.empty()) {
    s.broken = "the scheduler stopped reading";
  }
}

void DeviceChannel::flush() {
  Session& s = session_;
  while (s.fd.valid() && s.out_sent < s.out.size()) {
    const ssize_t n =
        ::send(s.fd.get(), s.out.data() + s.out_sent, s.out.size() - s.out_sent, MSG_NOSIGNAL);
    if (n > 0) {
      s.out_sent += static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;  // poll for POLLOUT
    if (s.broken.empty()) s.broken = std::string("send: ") + std::strerror(errno);
    return;
  }
  if (s.out_sent == s.out.size()) {
    s.out.clear();
    s.out_sent = 0;
  }
}

void DeviceChannel::after_fork_child() {
  // The parent's engine thread may have been changing the session at the instant of fork, so the
  // old one is abandoned (a few bytes leak) rather than destroyed; its descriptor is the parent's
  // session and only our copy of it is closed.
  const int fd = session_.fd.get();
  if (fd >= 0) ::close(fd);
  const bool limits_applied = session_.limits_applied;
  new (&session_) Session();
  session_.limits_applied = limits_applied;
  session_.backoff = engine_.options_.reconnect_initial;
  // Threads that waited in the parent do not exist here; the condition variable may still count
  // them, so it starts over. mu_ was locked by fork_prepare in the forking thread.
  new (&cv_) std::condition_variable();
  waiters_ = 0;
  usage_dirty_.store(true, std::memory_order_relaxed);
  // The child registers as a new client: its first CUDA call waits for that registration anew.
  settled_.store(
      state_ == GrantState::kStopped || engine_.options_.register_wait <= Duration::zero(),
      std::memory_order_relaxed);
  register_deadline_ = std::chrono::steady_clock::now() + engine_.options_.register_wait;
  if (state_ == GrantState::kStopped) {
    gate_.reset_closed();
    gate_.open();
  } else {
    state_ = GrantState::kStarting;
    gate_.reset_closed();
  }
  mu_.unlock();
}

// ---- LinkEngine ---------------------------------------------------------------------------------

LinkEngine::LinkEngine(LinkOptions options)
    : options_([&] {
        if (options.process_name.empty()) options.process_name = read_process_name();
        if (options.reconnect_max < options.reconnect_initial) {
          options.reconnect_max = options.reconnect_initial;
        }
        return std::move(options);
      }()),
      trace_(options_.trace_file) {
  ForkRegistry::add(this);
}

LinkEngine::~LinkEngine() {
  stop(Duration::max());
  ForkRegistry::remove(this);
  const int fd = wake_fd_.exchange(-1, std::memory_order_acq_rel);
  if (fd >= 0) ::close(fd);
}

DeviceLink& LinkEngine::device(const DeviceIdentity& identity, DeviceAgent& agent) {
  static PassThroughLink pass_through;
  if (!options_.enabled || stopping_.load(std::memory_order_acquire)) return pass_through;
  DeviceChannel* channel = nullptr;
  {
    std::lock_guard lock(mu_);
    for (const auto& d : devices_) {
      if (d->identity().gpu_uuid == identity.gpu_uuid) return *d;
    }
    devices_.push_back(std::make_unique<DeviceChannel>(*this, identity, agent));
    channel = devices_.back().get();
  }
  NVSHARE_DEBUG("%s: linked (%llu bytes)", identity.gpu_uuid.c_str(),
                static_cast<unsigned long long>(identity.gpu_memory_bytes));
  ensure_started();
  wake();
  return *channel;
}

void LinkEngine::ensure_started() {
  std::unique_lock lock(mu_);
  if (started_ || stopping_.load(std::memory_order_acquire)) return;
  if (wake_fd_.load(std::memory_order_acquire) < 0) {
    wake_fd_.store(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC), std::memory_order_release);
  }
  // The thread takes no signals: the application's handlers must run on its own threads.
  sigset_t all;
  sigset_t previous;
  sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &previous);
  const int rc = wake_fd_.load(std::memory_order_acquire) >= 0
                     ? ::pthread_create(&thread_, nullptr, &thread_main, this)
                     : errno;
  ::pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  if (rc != 0) {
    // Without the thread nothing can be scheduled: every GPU runs unscheduled.
    NVSHARE_WARN("cannot start the scheduler link thread (%s); running unscheduled",
                 std::strerror(rc));
    for (const auto& d : devices_) d->stop();
    return;
  }
  started_ = true;
  exited_ = false;
}

void LinkEngine::wake() {
  wakeups_.fetch_add(1, std::memory_order_relaxed);
  const int fd = wake_fd_.load(std::memory_order_acquire);
  if (fd < 0) return;
  const std::uint64_t one = 1;
  [[maybe_unused]] const ssize_t n = ::write(fd, &one, sizeof one);
}

void* LinkEngine::thread_main(void* self) {
  ::pthread_setname_np(::pthread_self(), "nvshare-link");
  t_on_link_thread = true;
  static_cast<LinkEngine*>(self)->run();
  return nullptr;
}

std::vector<DeviceChannel*> LinkEngine::snapshot() {
  std::lock_guard lock(mu_);
  std::vector<DeviceChannel*> out;
  out.reserve(devices_.size());
  for (const auto& d : devices_) out.push_back(d.get());
  return out;
}

void LinkEngine::run() {
  try {
    std::vector<pollfd> fds;
    std::vector<DeviceChannel*> polled;
    while (!stopping_.load(std::memory_order_acquire)) {
      const std::vector<DeviceChannel*> devices = snapshot();
      MonoTime now = now_mono();
      MonoTime next = now + kMaxSleep;
      for (DeviceChannel* d : devices) d->service(now, next);
      if (stopping_.load(std::memory_order_acquire)) break;

      fds.clear();
      polled.clear();
      const int wake_fd = wake_fd_.load(std::memory_order_acquire);
      fds.push_back(pollfd{wake_fd, POLLIN, 0});
      for (DeviceChannel* d : devices) {
        if (d->poll_fd() < 0) continue;
        fds.push_back(
            pollfd{d->poll_fd(), static_cast<short>(POLLIN | (d->wants_write() ? POLLOUT : 0)), 0});
        polled.push_back(d);
      }
      now = now_mono();
      const Duration wait = std::max(Duration::zero(), next - now);
      timespec timeout{static_cast<time_t>(wait.count() / 1'000'000'000),
                       static_cast<long>(wait.count() % 1'000'000'000)};
      const int ready = ::ppoll(fds.data(), fds.size(), &timeout, nullptr);
      if (ready < 0 && errno != EINTR) {
        NVSHARE_WARN("scheduler link: poll failed: %s", std::strerror(errno));
        break;
      }
      if (ready <= 0) continue;
      if (fds[0].revents != 0) {
        std::uint64_t count;
        [[maybe_unused]] const ssize_t n = ::read(wake_fd, &count, sizeof count);
      }
      now = now_mono();
      for (std::size_t i = 0; i < polled.size(); ++i) {
        const short revents = fds[i + 1].revents;
        if (revents == 0) continue;
        if ((revents & POLLOUT) != 0) polled[i]->on_writable(now);
        if ((revents & (POLLIN | POLLHUP | POLLERR)) != 0) polled[i]->on_readable(now);
      }
    }
  } catch (...) {
    NVSHARE_ERROR("scheduler link thread failed; running unscheduled");
  }
  for (DeviceChannel* d : snapshot()) d->stop();
  std::lock_guard lock(mu_);
  exited_ = true;
  exited_cv_.notify_all();
}

void LinkEngine::stop(Duration wait) {
  stopping_.store(true, std::memory_order_release);
  wake();
  bool joinable = false;
  {
    std::unique_lock lock(mu_);
    if (started_) {
      if (wait == Duration::max()) {
        exited_cv_.wait(lock, [&] { return exited_; });
      } else {
        exited_cv_.wait_for(lock, wait, [&] { return exited_; });
      }
      joinable = exited_;
      if (joinable) started_ = false;
    }
  }
  if (joinable) ::pthread_join(thread_, nullptr);
  // Whatever the thread was doing, no submission may wait on it from now on.
  for (DeviceChannel* d : snapshot()) d->stop();
}

LinkStats LinkEngine::stats() const {
  LinkStats out;
  out.wakeups = wakeups_.load(std::memory_order_relaxed);
  out.frames_sent = frames_sent_.load(std::memory_order_relaxed);
  out.frames_received = frames_received_.load(std::memory_order_relaxed);
  out.sessions = sessions_.load(std::memory_order_relaxed);
  out.outages = outages_.load(std::memory_order_relaxed);
  std::lock_guard lock(mu_);
  out.thread_running = started_ && !exited_;
  return out;
}

void LinkEngine::outage_begins(const std::string& why) {
  if (outage_devices_++ > 0) return;
  outages_.fetch_add(1, std::memory_order_relaxed);
  NVSHARE_WARN("scheduler unreachable at %s (%s); running unscheduled",
               options_.socket_path.c_str(), why.c_str());
}

void LinkEngine::outage_ends() {
  if (outage_devices_ == 0 || --outage_devices_ > 0) return;
  NVSHARE_INFO("scheduler at %s reachable again; GPU work is scheduled",
               options_.socket_path.c_str());
}

void LinkEngine::fork_prepare() {
  // Holding every lock across fork() leaves the child a consistent device list and grant states.
  // None of these locks is held across a blocking call, so this waits only for short sections.
  mu_.lock();
  for (const auto& d : devices_) d->mu_.lock();
}

void LinkEngine::fork_parent() {
  for (const auto& d : devices_) d->mu_.unlock();
  mu_.unlock();
}

void LinkEngine::fork_child() {
  // The thread did not survive the fork; a new one starts on first use.
  started_ = false;
  exited_ = true;
  new (&exited_cv_) std::condition_variable();
  // The parent's wake-up descriptor: reading it here would steal the parent's wake-ups.
  const int fd = wake_fd_.exchange(-1, std::memory_order_acq_rel);
  if (fd >= 0) ::close(fd);
  outage_devices_ = 0;
  for (const auto& d : devices_) d->after_fork_child();
  mu_.unlock();
}

}  // namespace nvshare::client

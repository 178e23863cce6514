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

#include "client/process_events.h"
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

}  // namespace

LinkOptions LinkOptions::from_config(const ClientConfig& config) {
  LinkOptions options;
  options.enabled = config.enabled;
  options.socket_path = config.socket_path;
  options.timing.idle_release = config.idle_release;
  options.timing.reconnect_max = config.reconnect_max;  // the session keeps it >= the initial
  options.can_swap = config.memory_mode != MemoryMode::kPlain;  // unset: whatever is given
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
    std::call_once(registered, [] {
      on_fork(ProcessStage::kLink, ForkHandlers{&prepare, &parent, &child});
    });
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
    : engine_(engine),
      identity_(std::move(identity)),
      agent_(agent),
      session_(new GrantSession(engine_.session_config(identity_), *this)),
      wire_(new Wire) {
  register_deadline_ = std::chrono::steady_clock::now() + engine_.options_.register_wait;
  if (engine_.options_.register_wait <= Duration::zero()) settled_.store(true);
}

DeviceChannel::~DeviceChannel() {
  const int fd = wake_fd_.exchange(-1, std::memory_order_acq_rel);
  if (fd >= 0) ::close(fd);
  delete session_;
  delete wire_;
}

void DeviceChannel::before_submit() noexcept {
  switch (gate_.try_enter()) {
    case GrantGate::Entry::kEntered:
      return;
    case GrantGate::Entry::kClosedLastOut:
      wake();
      [[fallthrough]];
    case GrantGate::Entry::kClosed:
      slow_enter();
      return;
  }
}

std::uint64_t DeviceChannel::after_submit(bool queued) noexcept {
  if (!queued) {
    if (gate_.leave_and_check_last()) wake();
    return 0;
  }
  const GrantGate::Left left = gate_.leave_queued();
  if (left.last_out) wake();
  return left.count;
}

void DeviceChannel::usage_changed() noexcept {
  if (!usage_dirty_.exchange(true, std::memory_order_acq_rel)) wake();
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
    // Entered on a link thread: counted as inside, so leave_and_check_last() stays balanced.
    gate_.enter_unconditionally();
    return;
  }
  try {
    // Every GPU's thread, not only this one's: a forked child registers all of them again.
    engine_.ensure_started();
    std::unique_lock lock(mu_);
    // The first waiter tells the GPU's thread there is demand (it requests when registered).
    if (waiters_.fetch_add(1, std::memory_order_acq_rel) == 0) {
      waiting_since_ns_.store(now_mono().since_origin.count(), std::memory_order_release);
      wake();
    }
    for (;;) {
      if (gate_.is_open()) {
        const GrantGate::Entry entry = gate_.try_enter();
        if (entry == GrantGate::Entry::kEntered) break;
        if (entry == GrantGate::Entry::kClosedLastOut) wake();
        continue;  // closed again in between: look at the state anew
      }
      cv_.wait(lock);
    }
    waiters_.fetch_sub(1, std::memory_order_acq_rel);
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

// ---- DeviceChannel: the GPU's thread ------------------------------------------------------------

void DeviceChannel::ensure_started() {
  std::lock_guard lock(thread_mu_);
  if (started_ || engine_.stopping_.load(std::memory_order_acquire)) return;
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
    // Without the thread nothing can be scheduled: this GPU runs unscheduled.
    NVSHARE_WARN("%s: cannot start the scheduler link thread (%s); running unscheduled",
                 identity_.gpu_uuid.c_str(), std::strerror(rc));
    stop_now();
    return;
  }
  started_ = true;
  exited_ = false;
}

void DeviceChannel::wake() {
  engine_.wakeups_.fetch_add(1, std::memory_order_relaxed);
  const int fd = wake_fd_.load(std::memory_order_acquire);
  if (fd < 0) return;
  const std::uint64_t one = 1;
  [[maybe_unused]] const ssize_t n = ::write(fd, &one, sizeof one);
}

void* DeviceChannel::thread_main(void* self) {
  ::pthread_setname_np(::pthread_self(), "nvshare-link");
  t_on_link_thread = true;
  static_cast<DeviceChannel*>(self)->run();
  return nullptr;
}

bool DeviceChannel::agent_allowed() const {
  return !engine_.stopping_.load(std::memory_order_acquire);
}

Duration DeviceChannel::idle_for() { return agent_allowed() ? agent_.idle_for() : Duration{0}; }

DeviceUsage DeviceChannel::usage() { return agent_allowed() ? agent_.usage() : DeviceUsage{}; }

Duration DeviceChannel::queue_waited() {
  return agent_allowed() ? agent_.queue_waited() : Duration{0};
}

std::uint64_t DeviceChannel::at_bound() { return agent_allowed() ? agent_.threads_at_bound() : 0; }

void DeviceChannel::run() {
  try {
    while (!engine_.stopping_.load(std::memory_order_acquire)) {
      if (usage_dirty_.exchange(false, std::memory_order_acq_rel)) feed(session::UsageChanged{});
      feed(session::Tick{});
      if (engine_.stopping_.load(std::memory_order_acquire)) break;

      const int wake_fd = wake_fd_.load(std::memory_order_acquire);
      const int fd = wire_->fd.get();
      std::array<pollfd, 2> fds{pollfd{wake_fd, POLLIN, 0}, pollfd{fd, 0, 0}};
      if (fd >= 0) {
        fds[1].events =
            static_cast<short>(POLLIN | (wire_->out_sent < wire_->out.size() ? POLLOUT : 0));
      }
      const MonoTime now = now_mono();
      const MonoTime due =
          std::min(session_->next_deadline().value_or(now + kMaxSleep), now + kMaxSleep);
      const Duration wait = std::max(Duration::zero(), due - now);
      timespec timeout{static_cast<time_t>(wait.count() / 1'000'000'000),
                       static_cast<long>(wait.count() % 1'000'000'000)};
      const int ready = ::ppoll(fds.data(), fd >= 0 ? 2 : 1, &timeout, nullptr);
      if (ready < 0 && errno != EINTR) {
        NVSHARE_WARN("%s: scheduler link: poll failed: %s", identity_.gpu_uuid.c_str(),
                     std::strerror(errno));
        break;
      }
      if (ready <= 0) continue;
      if (fds[0].revents != 0) {
        std::uint64_t count;
        [[maybe_unused]] const ssize_t n = ::read(wake_fd, &count, sizeof count);
      }
      if (fd >= 0 && fds[1].revents != 0) {
        if ((fds[1].revents & POLLOUT) != 0) flush();
        if ((fds[1].revents & (POLLIN | POLLHUP | POLLERR)) != 0) read_frames();
        feed_if_broken();
      }
    }
  } catch (...) {
    NVSHARE_ERROR("%s: scheduler link thread failed; running unscheduled",
                  identity_.gpu_uuid.c_str());
  }
  stop_now();
  std::lock_guard lock(thread_mu_);
  exited_ = true;
  exited_cv_.notify_all();
}

void DeviceChannel::feed(const session::Event& event) {
  std::vector<session::Action> actions = session_->handle(event, now_mono());
  for (std::size_t i = 0; i < actions.size(); ++i) {
    const session::Action action = std::move(actions[i]);
    if (std::optional<session::Event> answer = perform(action)) {
      std::vector<session::Action> more = session_->handle(*answer, now_mono());
      for (session::Action& a : more) actions.push_back(std::move(a));
    }
  }
  flush();
  feed_if_broken();
}

std::optional<session::Event> DeviceChannel::perform(const session::Action& action) {
  using namespace session;
  Wire& w = *wire_;
  if (const auto* send = std::get_if<Send>(&action)) {
    if (!w.fd.valid()) return std::nullopt;
    if (Status encoded = protocol::encode_to(send->message, w.out, send->version); !encoded) {
      NVSHARE_WARN("%s: cannot encode %s: %s", identity_.gpu_uuid.c_str(),
                   std::string(protocol::to_string(protocol::type_of(send->message))).c_str(),
                   encoded.error().message.c_str());
      return std::nullopt;
    }
    engine_.frames_sent_.fetch_add(1, std::memory_order_relaxed);
    if (w.out.size() - w.out_sent > kMaxPendingOutput && w.broken.empty()) {
      w.broken = "the scheduler stopped reading";
    }
    return std::nullopt;
  }
  if (const auto* p = std::get_if<Publish>(&action)) {
    publish(*p);
    return std::nullopt;
  }
  if (std::holds_alternative<Connect>(action)) {
    auto fd = connect_nonblocking(engine_.options_.socket_path);
    if (!fd) return ConnectFailed{fd.error().message};
    w.reset();
    w.fd = std::move(fd.value());
    return Connected{};
  }
  if (std::holds_alternative<Disconnect>(action)) {
    w.reset();
    return std::nullopt;
  }
  if (std::holds_alternative<CloseGateToRelease>(action)) {
    std::lock_guard lock(mu_);
    return GateClosed{gate_.close()};
  }
  if (std::holds_alternative<SettleRegistration>(action)) {
    settle_registration();
    return std::nullopt;
  }
  if (std::holds_alternative<ReadSettings>(action)) {
    const client::SettingsRead read = read_client_settings(engine_.options_.settings_path);
    if (!read.settings || read.settings->memory_pending) return session::SettingsRead{};
    return session::SettingsRead{read.settings->memory_bytes};
  }
  if (const auto* r = std::get_if<Record>(&action)) {
    engine_.trace_.record(r->event, identity_.gpu_uuid, r->epoch, r->ms, r->swap.bytes, r->swap.ms,
                          r->threads.inside, r->threads.waiting, r->threads.at_bound);
    return std::nullopt;
  }
  if (const auto* r = std::get_if<Registered>(&action)) {
    engine_.sessions_.fetch_add(1, std::memory_order_relaxed);
    NVSHARE_DEBUG("%s: registered as client %llu", identity_.gpu_uuid.c_str(),
                  static_cast<unsigned long long>(r->client_id));
    return std::nullopt;
  }
  if (const auto* o = std::get_if<OutageBegins>(&action)) {
    engine_.outage_begins(o->why, o->refused);
    return std::nullopt;
  }
  if (std::holds_alternative<OutageEnds>(action)) {
    engine_.outage_ends();
    return std::nullopt;
  }
  if (const auto* n = std::get_if<Note>(&action)) {
    NVSHARE_LOG_AT(n->level, "%s", n->text.c_str());
    return std::nullopt;
  }
  return perform_agent(action);
}

std::optional<session::Event> DeviceChannel::perform_agent(const session::Action& action) {
  using namespace session;
  // Once the engine stops, no agent call starts: answers come at once, with nothing done.
  const bool allowed = agent_allowed();
  // What the session said before a call that blocks goes out first: a usage report between the
  // steps of a swap-out is what lets the scheduler give the room it makes to the next job.
  if (std::holds_alternative<Drain>(action) || std::holds_alternative<SwapOut>(action) ||
      std::holds_alternative<SwapIn>(action)) {
    flush();
  }
  if (std::holds_alternative<Drain>(action)) {
    if (allowed) agent_.drain();
    return Drained{};
  }
  if (const auto* swap = std::get_if<SwapOut>(&action)) {
    return SwappedOut{allowed ? agent_.swap_out(swap->bytes) : 0};
  }
  if (const auto* swap = std::get_if<SwapIn>(&action)) {
    return SwappedIn{allowed ? agent_.swap_in(swap->limit) : 0};
  }
  if (const auto* prepare = std::get_if<PrepareSwapOut>(&action)) {
    if (allowed) agent_.prepare_swap_out(prepare->bytes);
    return std::nullopt;
  }
  if (const auto* l = std::get_if<ApplyLimits>(&action)) {
    if (allowed) agent_.apply_limits(l->limits);
    return std::nullopt;
  }
  if (std::holds_alternative<LimitsUnknown>(action)) {
    if (allowed) agent_.limits_unknown();
  }
  return std::nullopt;
}

void DeviceChannel::publish(const session::Publish& p) {
  std::lock_guard lock(mu_);
  // Stopped is final, even against a thread that was still busy when stop() gave up on it.
  if (state_.load(std::memory_order_relaxed) == GrantState::kStopped) return;
  state_ = p.state;
  held_epoch_ = p.epoch;
  if (p.gate == session::GateChange::kClose) gate_.close();
  if (p.gate == session::GateChange::kOpen) {
    gate_.open();
    cv_.notify_all();
  }
}

void DeviceChannel::read_frames() {
  std::array<std::uint8_t, kReadChunk> buffer;
  for (int round = 0; round < 16 && wire_->fd.valid(); ++round) {
    auto n = read_some(wire_->fd.get(), buffer);
    if (!n) {
      if (would_block(n.error())) return;
      feed(session::ConnectionLost{n.error().message});
      return;
    }
    if (n.value() == 0) {
      feed(session::ConnectionLost{"the scheduler closed the connection"});
      return;
    }
    wire_->decoder.feed(std::span<const std::uint8_t>(buffer.data(), n.value()));
    for (;;) {
      auto frame = wire_->decoder.next();
      if (!frame) {
        NVSHARE_WARN("%s: malformed frame from the scheduler: %s", identity_.gpu_uuid.c_str(),
                     frame.error().message.c_str());
        feed(session::ConnectionLost{"malformed frame"});
        return;
      }
      if (!frame.value()) break;
      engine_.frames_received_.fetch_add(1, std::memory_order_relaxed);
      feed(session::FrameReceived{frame.value()->message});
      if (!wire_->fd.valid()) return;
    }
    if (n.value() < buffer.size()) break;
  }
}

void DeviceChannel::flush() {
  Wire& w = *wire_;
  while (w.fd.valid() && w.out_sent < w.out.size()) {
    const ssize_t n =
        ::send(w.fd.get(), w.out.data() + w.out_sent, w.out.size() - w.out_sent, MSG_NOSIGNAL);
    if (n > 0) {
      w.out_sent += static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;  // poll for POLLOUT
    if (w.broken.empty()) w.broken = std::string("send: ") + std::strerror(errno);
    return;
  }
  if (w.out_sent == w.out.size()) {
    w.out.clear();
    w.out_sent = 0;
  }
}

void DeviceChannel::feed_if_broken() {
  if (wire_->broken.empty()) return;
  std::string why = std::move(wire_->broken);
  wire_->broken.clear();
  feed(session::ConnectionLost{std::move(why)});
}

void DeviceChannel::settle_registration() {
  if (settled_.load(std::memory_order_acquire)) return;
  std::lock_guard lock(mu_);
  settled_.store(true, std::memory_order_release);
  cv_.notify_all();
}

void DeviceChannel::stop_now() {
  std::lock_guard lock(mu_);
  state_ = GrantState::kStopped;
  settled_.store(true, std::memory_order_release);
  gate_.open();
  cv_.notify_all();
}

bool DeviceChannel::join_until(std::chrono::steady_clock::time_point until) {
  bool joinable = false;
  {
    std::unique_lock lock(thread_mu_);
    if (!started_) return true;
    exited_cv_.wait_until(lock, until, [&] { return exited_; });
    joinable = exited_;
    if (joinable) started_ = false;
  }
  if (joinable) ::pthread_join(thread_, nullptr);
  return joinable;
}

void DeviceChannel::fork_prepare() {
  thread_mu_.lock();
  mu_.lock();
}

void DeviceChannel::fork_parent() {
  mu_.unlock();
  thread_mu_.unlock();
}

void DeviceChannel::fork_child() {
  // The thread did not survive the fork; a new one starts on first use. The parent's wake-up
  // descriptor is not read here: that would steal the parent's wake-ups.
  started_ = false;
  exited_ = true;
  new (&exited_cv_) std::condition_variable();
  const int wake = wake_fd_.exchange(-1, std::memory_order_acq_rel);
  if (wake >= 0) ::close(wake);
  // The parent's thread may have been changing the session or the wire at the instant of fork, so
  // both are abandoned (a few bytes leak) rather than destroyed; the descriptor is the parent's
  // session and only our copy of it is closed.
  const int fd = wire_->fd.get();
  if (fd >= 0) ::close(fd);
  const GrantSession::Inherited inherited = session_->inherited();
  session_ = new GrantSession(engine_.session_config(identity_), *this, inherited);
  wire_ = new Wire;
  // Threads that waited in the parent do not exist here; the condition variable may still count
  // them, so it starts over.
  new (&cv_) std::condition_variable();
  waiters_.store(0, std::memory_order_relaxed);
  usage_dirty_.store(true, std::memory_order_relaxed);
  // The child registers as a new client: its first CUDA call waits for that registration anew.
  const bool stopped = state_ == GrantState::kStopped;
  settled_.store(stopped || engine_.options_.register_wait <= Duration::zero(),
                 std::memory_order_relaxed);
  register_deadline_ = std::chrono::steady_clock::now() + engine_.options_.register_wait;
  gate_.reset_closed();
  if (stopped) {
    gate_.open();
  } else {
    state_ = GrantState::kStarting;
  }
  mu_.unlock();
  thread_mu_.unlock();
}

// ---- LinkEngine ---------------------------------------------------------------------------------

LinkEngine::LinkEngine(LinkOptions options)
    : options_([&] {
        if (options.process_name.empty()) options.process_name = read_process_name();
        return std::move(options);
      }()),
      trace_(options_.trace_file) {
  ForkRegistry::add(this);
}

LinkEngine::~LinkEngine() {
  stop(Duration::max());
  ForkRegistry::remove(this);
}

SessionConfig LinkEngine::session_config(const DeviceIdentity& identity) const {
  SessionConfig c;
  c.gpu_uuid = identity.gpu_uuid;
  c.gpu_memory_bytes = identity.gpu_memory_bytes;
  c.pid = static_cast<std::uint32_t>(::getpid());
  c.pod_uid = options_.pod_uid;
  c.process_name = options_.process_name;
  c.can_swap = options_.can_swap;
  c.declared = options_.declared;
  c.limits_pending = options_.limits_pending;
  c.has_settings_file = !options_.settings_path.empty();
  c.timing = options_.timing;
  c.debug_notes = log_enabled(LogLevel::kDebug);
  return c;
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
  channel->ensure_started();
  channel->wake();
  return *channel;
}

void LinkEngine::ensure_started() {
  for (DeviceChannel* d : snapshot()) d->ensure_started();
}

std::vector<DeviceChannel*> LinkEngine::snapshot() {
  std::lock_guard lock(mu_);
  std::vector<DeviceChannel*> out;
  out.reserve(devices_.size());
  for (const auto& d : devices_) out.push_back(d.get());
  return out;
}

void LinkEngine::stop(Duration wait) {
  stopping_.store(true, std::memory_order_release);
  const std::vector<DeviceChannel*> devices = snapshot();
  for (DeviceChannel* d : devices) d->wake();
  const auto until =
      wait == Duration::max()
          ? std::chrono::steady_clock::time_point::max()
          : std::chrono::steady_clock::now() +
                std::chrono::duration_cast<std::chrono::steady_clock::duration>(wait);
  for (DeviceChannel* d : devices) d->join_until(until);
  // Whatever a thread was doing, no submission may wait on it from now on.
  for (DeviceChannel* d : devices) d->stop_now();
}

LinkStats LinkEngine::stats() const {
  LinkStats out;
  out.wakeups = wakeups_.load(std::memory_order_relaxed);
  out.frames_sent = frames_sent_.load(std::memory_order_relaxed);
  out.frames_received = frames_received_.load(std::memory_order_relaxed);
  out.sessions = sessions_.load(std::memory_order_relaxed);
  out.outages = outages_.load(std::memory_order_relaxed);
  std::lock_guard lock(mu_);
  for (const auto& d : devices_) {
    std::lock_guard thread_lock(d->thread_mu_);
    out.thread_running = out.thread_running || (d->started_ && !d->exited_);
  }
  return out;
}

void LinkEngine::outage_begins(const std::string& why, bool refused) {
  std::lock_guard lock(outage_mu_);
  if (outage_devices_++ > 0) return;
  if (refused) {
    NVSHARE_WARN(
        "the scheduler at %s closed the session before welcoming it (%s): it refuses this process "
        "or does not know its GPU (`nvsharectl status` lists the GPUs it knows, its log says why); "
        "running unscheduled",
        options_.socket_path.c_str(), why.c_str());
  } else {
    NVSHARE_WARN("scheduler unreachable at %s (%s); running unscheduled",
                 options_.socket_path.c_str(), why.c_str());
  }
  outages_.fetch_add(1, std::memory_order_relaxed);  // after the line: a count seen is logged
}

void LinkEngine::outage_ends() {
  std::lock_guard lock(outage_mu_);
  if (outage_devices_ == 0 || --outage_devices_ > 0) return;
  NVSHARE_INFO("scheduler at %s reachable again; GPU work is scheduled",
               options_.socket_path.c_str());
}

void LinkEngine::fork_prepare() {
  // Holding every lock across fork() leaves the child a consistent device list and grant states.
  // None of these locks is held across a blocking call, so this waits only for short sections.
  mu_.lock();
  outage_mu_.lock();
  for (const auto& d : devices_) d->fork_prepare();
}

void LinkEngine::fork_parent() {
  for (const auto& d : devices_) d->fork_parent();
  outage_mu_.unlock();
  mu_.unlock();
}

void LinkEngine::fork_child() {
  outage_devices_ = 0;
  for (const auto& d : devices_) d->fork_child();
  outage_mu_.unlock();
  mu_.unlock();
}

}  // namespace nvshare::client

// LinkEngine: the scheduler-facing half of libnvshare.so: one background thread speaking the wire
// protocol (docs/protocol.md) on one session per GPU, and the grant state application threads read.
//
// link_device() (device_link.h) uses one process-wide engine built from client_config(); tests
// build their own engines from LinkOptions, each with its own thread.
//
// Per GPU, the grant state (GrantState) moves like this; the gate is open in kOpen, kHeld and
// kStopped, closed otherwise:
//
//   kStarting --welcome--> kIdle --a thread waits: request--> kRequested --grant--> kHeld
//       |                   ^ ^                                ^                     | |
//       |                   | |                                +-- kRevoking <-revoke-+ |
//       |                   | |                                    (drain, swap out if  |
//       |                   | |                                     asked, released)    |
//       |                   | +------------ idle: released (drain 0) -------------------+
//       |                   +-------------- grant while swapped out and idle: released at once
//       +--connect fails--> kOpen --reconnected, welcome--> kIdle
//   any state but kStopped --connection lost--> kOpen;   any state --stop()--> kStopped
//
//  - kStarting: the first connection is being made; threads wait for its outcome (registering
//    first is what makes the first submission scheduled).
//  - kOpen: the scheduler is unreachable (absent, refused, dropped, no welcome in time, silent
//    past the liveness bound): every submission passes (fail-open), swapped-out memory is brought
//    back, and the engine reconnects with exponential backoff. Once a new session is welcomed the
//    GPU is closed until granted again, like a new client.
//  - kRevoking: the gate is closed; the engine waits (bounded) for threads inside a submission to
//    leave it, drains, swaps out when asked, reports usage, then sends released. The scheduler
//    re-queues a client that answered a revoke, so the state becomes kRequested without a request.
//  - A revoke for another epoch than the held grant's is ignored, and so is a grant while holding.
//  - Registration is settled (await_registration() returns) at the first limits frame of a
//    session, at a failed connect, a lost connection or stop(), and in any case register_wait
//    after the channel was created (or after fork() in the child).
//
// Contract
//  - Agent calls happen only on the engine's thread, never under a lock application threads take.
//  - Nothing waits on the scheduler without a bound set by the connection: a lost connection, a
//    missing welcome (handshake timeout) or a silent peer (ping unanswered) opens the gate.
//  - fork(): the child drops every session and the thread (pthread_atfork); a new thread starts
//    on first use and registers the child as a new client. Nothing locked in the parent stays
//    locked in the child.
//  - No exception leaves the engine; it never calls exit() or abort().
#pragma once

#include <pthread.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "client/config.h"
#include "client/device_link.h"
#include "client/link/grant_gate.h"
#include "client/link/handoff_trace.h"
#include "common/clock.h"
#include "common/protocol.h"
#include "common/unix_socket.h"

namespace nvshare::client {

struct LinkOptions {
  bool enabled = true;
  std::string socket_path;
  Duration idle_release = std::chrono::milliseconds(100);  // zero: never release when idle
  Duration reconnect_initial = std::chrono::milliseconds(50);
  Duration reconnect_max = std::chrono::milliseconds(2000);
  // Usage reports are coalesced to at most one per interval (swaps and new sessions report at
  // once).
  Duration usage_interval = std::chrono::milliseconds(50);
  // A scheduler that accepted the connection but does not welcome within this is treated as absent.
  Duration handshake_timeout = std::chrono::seconds(2);
  // After this much silence the engine pings; after dead_after more the session is dropped.
  Duration ping_after = std::chrono::seconds(5);
  Duration dead_after = std::chrono::seconds(5);
  // How long a revoke waits for threads still inside a submission before it drains anyway (a thread
  // can be inside one GPU's submission while it waits for another GPU's grant).
  Duration inside_bound = std::chrono::seconds(1);
  // The longest await_registration() waits for the welcome and the first limits frame, counted
  // from the channel's creation (device_link.h; NVSHARE_REGISTER_WAIT_MS). Zero: never waits.
  Duration register_wait = kDefaultRegisterWait;
  bool can_swap = true;  // announced in hello (NVSHARE_MANAGED)
  protocol::Limits declared;
  // The settings file says the pod's memory limit is pending: allocations wait for it.
  bool limits_pending = false;
  // The settings file (settings_file.h) re-read while the limit is pending or the scheduler is
  // unreachable; empty: none.
  std::string settings_path;
  std::string pod_uid;
  std::string process_name;  // empty: /proc/self/comm
  std::string trace_file;    // NVSHARE_TRACE_FILE; empty: no trace

  static LinkOptions from_config(const ClientConfig& config);
};

enum class GrantState : std::uint8_t {
  kStarting,
  kOpen,
  kIdle,
  kRequested,
  kHeld,
  kRevoking,
  kStopped,
};
const char* to_string(GrantState state);

// Counters for tests and debug logging.
struct LinkStats {
  std::uint64_t wakeups = 0;  // times an application thread woke the engine's thread
  std::uint64_t frames_sent = 0;
  std::uint64_t frames_received = 0;
  std::uint64_t sessions = 0;  // sessions welcomed
  std::uint64_t outages = 0;   // times the scheduler became unreachable (logged once each)
  bool thread_running = false;
};

class LinkEngine;

// The DeviceLink of one GPU. Its address is stable for the engine's life (the hooks keep it).
class DeviceChannel final : public DeviceLink {
 public:
  DeviceChannel(LinkEngine& engine, DeviceIdentity identity, DeviceAgent& agent);
  DeviceChannel(const DeviceChannel&) = delete;
  DeviceChannel& operator=(const DeviceChannel&) = delete;
  ~DeviceChannel() override;

  void before_submit() noexcept override;
  void after_submit() noexcept override;
  void usage_changed() noexcept override;
  void await_registration() noexcept override;

  const DeviceIdentity& identity() const { return identity_; }
  // Whether the registration's outcome is known (await_registration() returns at once).
  bool registration_settled() const { return settled_.load(std::memory_order_acquire); }
  GrantState state() const;
  std::uint64_t epoch() const;

 private:
  friend class LinkEngine;

  enum class Conn : std::uint8_t { kDown, kHandshake, kUp };

  // Everything only the engine's thread touches (no lock). Replaced wholesale in a forked child.
  struct Session {
    UniqueFd fd;
    Conn conn = Conn::kDown;
    protocol::FrameDecoder decoder;
    std::vector<std::uint8_t> out;
    std::size_t out_sent = 0;
    std::uint16_t version = protocol::kMaxVersion;
    std::uint64_t client_id = 0;
    MonoTime next_attempt{};
    Duration backoff{};
    MonoTime up_since{};
    MonoTime handshake_deadline{};
    MonoTime last_rx{};
    bool ping_outstanding = false;
    std::uint64_t ping_nonce = 0;
    std::uint64_t epoch = 0;
    MonoTime granted_at{};
    bool revoke_pending = false;
    protocol::Revoke revoke;
    MonoTime revoke_at{};
    MonoTime inside_deadline{};
    bool swapped_out = false;
    std::uint64_t swap_out_bytes_per_s = 0;
    MonoTime next_idle_check{};
    std::uint64_t yield_epoch = 0;  // a soft revoke (yield) asks to release this grant once idle
    bool usage_sent = false;
    protocol::Usage last_usage;
    MonoTime last_usage_at{};
    bool limits_applied = false;
    bool in_outage = false;
    std::string broken;  // why the connection failed inside send/flush; acted on at a safe point
  };

  void slow_enter();
  // Engine thread.
  void service(MonoTime now, MonoTime& next);
  void service_timers(MonoTime now, MonoTime& next);
  void on_readable(MonoTime now);
  void on_writable(MonoTime now);
  void check_broken(MonoTime now);
  int poll_fd() const { return session_.fd.get(); }
  bool wants_write() const { return session_.out_sent < session_.out.size(); }
  void try_connect(MonoTime now);
  void lose_connection(MonoTime now, const std::string& why);
  void handle(const protocol::Message& message, MonoTime now);
  void on_welcome(const protocol::Welcome& welcome, MonoTime now);
  void on_grant(const protocol::Grant& grant, MonoTime now);
  void on_revoke(const protocol::Revoke& revoke, MonoTime now);
  // Whether the scheduler asked to yield the grant now held (someone waits and fits beside it).
  bool yield_asked() const;
  // How long the holder must be idle before it releases by itself: the idle release, or the much
  // shorter yield threshold while someone waits for this grant.
  Duration idle_threshold() const;
  void finish_revoke(MonoTime now);
  // A limits frame: authoritative limits replace the known ones; provisional ones apply only
  // where stricter.
  void on_limits(const protocol::SetLimits& frame);
  // Reads the settings file when it is due: while the limit is pending, or the scheduler is
  // unreachable and the file may carry a newer one.
  void read_settings(MonoTime now, MonoTime& next);
  // Settles the registration unless the limits are still unknown (the wait then runs to its
  // deadline, or until the file or the scheduler gives them).
  void settle_if_limits_known();
  void try_idle_release(MonoTime now);
  void send_usage(MonoTime now, bool force);
  void send(const protocol::Message& message);
  void flush();
  void set_state(GrantState state, bool open_gate);  // takes mu_
  void settle_registration();                        // takes mu_
  void stop();                                       // gate open for good
  void after_fork_child();
  bool agent_allowed() const;

  LinkEngine& engine_;
  const DeviceIdentity identity_;
  DeviceAgent& agent_;
  alignas(64) GrantGate gate_;
  std::atomic<bool> usage_dirty_{true};
  alignas(64) mutable std::mutex mu_;
  std::condition_variable cv_;
  // Written under mu_ (so waiters see changes with the gate), by the engine's thread only (or by
  // whoever stops the engine); read anywhere.
  std::atomic<GrantState> state_{GrantState::kStarting};
  int waiters_ = 0;               // under mu_
  std::uint64_t held_epoch_ = 0;  // under mu_; for epoch()
  // Registration (device_link.h): set under mu_ (waiters wait on cv_), read anywhere.
  std::atomic<bool> settled_{false};
  // Engine thread only; kept across sessions (and into a forked child). The last limits known to
  // hold for this process: declared or the settings file's at first, then the scheduler's
  // authoritative ones. nullopt while the settings file says pending and nobody has said.
  std::optional<protocol::Limits> known_limits_;
  std::optional<std::uint64_t> file_memory_;  // the settings file's memory limit, last read
  MonoTime next_settings_read_{};
  std::chrono::steady_clock::time_point register_deadline_;  // under mu_
  Session session_;
};

class LinkEngine {
 public:
  explicit LinkEngine(LinkOptions options);
  LinkEngine(const LinkEngine&) = delete;
  LinkEngine& operator=(const LinkEngine&) = delete;
  // Stops the thread (waiting for it) and closes every session; DeviceLinks from it die with it.
  ~LinkEngine();

  // The DeviceLink of a GPU: created (and its session started) on first call for its UUID, the
  // same object afterwards. With options.enabled false, a link that does nothing and no thread.
  DeviceLink& device(const DeviceIdentity& identity, DeviceAgent& agent);

  // Stops the thread: every gate opens for good and no agent call starts afterwards. Waits at most
  // `wait` for the thread to finish what it is doing (process exit uses a short bound).
  void stop(Duration wait);

  LinkStats stats() const;
  const LinkOptions& options() const { return options_; }

 private:
  friend class DeviceChannel;
  friend struct ForkRegistry;

  void ensure_started();
  void wake();
  void run();
  static void* thread_main(void* self);
  std::vector<DeviceChannel*> snapshot();
  void outage_begins(const std::string& why);
  void outage_ends();
  void fork_prepare();
  void fork_parent();
  void fork_child();

  const LinkOptions options_;
  const HandoffTrace trace_;
  mutable std::mutex mu_;  // devices_, thread state; taken before any device's mu_
  std::vector<std::unique_ptr<DeviceChannel>> devices_;
  bool started_ = false;
  bool exited_ = true;
  std::condition_variable exited_cv_;
  pthread_t thread_{};
  std::atomic<int> wake_fd_{-1};  // eventfd; read by application threads without the lock
  std::atomic<bool> stopping_{false};
  int outage_devices_ = 0;             // engine thread only
  LinkEngine* next_engine_ = nullptr;  // ForkRegistry's list

  std::atomic<std::uint64_t> wakeups_{0};
  std::atomic<std::uint64_t> frames_sent_{0};
  std::atomic<std::uint64_t> frames_received_{0};
  std::atomic<std::uint64_t> sessions_{0};
  std::atomic<std::uint64_t> outages_{0};
};

// The link for NVSHARE_ENABLE=0: every call returns at once.
class PassThroughLink final : public DeviceLink {
 public:
  void before_submit() noexcept override {}
  void after_submit() noexcept override {}
  void usage_changed() noexcept override {}
  void await_registration() noexcept override {}
};

}  // namespace nvshare::client

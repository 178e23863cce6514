// LinkEngine: the scheduler-facing half of libnvshare.so: the shell around one GrantSession
// (grant_session.h, the protocol's client half as a pure state machine) per GPU. Each GPU has its
// own thread: it polls the GPU's socket and a wake-up descriptor, turns what it sees into
// events for the GPU's session, and carries out the actions it gets back (frames, the gate, drain
// and swap through the DeviceAgent, limits, the registration wait). One GPU's swap therefore never
// delays another GPU's grant.
//
// link_device() (device_link.h) uses one process-wide engine built from client_config(); tests
// build their own engines from LinkOptions.
//
// Contract
//  - Agent calls happen only on the GPU's link thread, never under a lock application threads
//    take.
//  - Nothing waits on the scheduler without a bound set by the connection (grant_session.h): a
//    lost connection, a missing welcome or a silent peer opens the gate.
//  - fork(): the child drops every session and thread (pthread_atfork); a GPU's thread starts again
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
#include "client/link/grant_session.h"
#include "client/link/handoff_trace.h"
#include "common/clock.h"
#include "common/protocol.h"
#include "common/unix_socket.h"

namespace nvshare::client {

struct LinkOptions {
  bool enabled = true;
  std::string socket_path;
  SessionTiming timing;
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

// Counters for tests and debug logging.
struct LinkStats {
  std::uint64_t wakeups = 0;  // times an application thread woke the engine's thread
  std::uint64_t frames_sent = 0;
  std::uint64_t frames_received = 0;
  std::uint64_t sessions = 0;   // sessions welcomed
  std::uint64_t outages = 0;    // times the scheduler became unreachable (logged once each)
  bool thread_running = false;  // some GPU's thread runs
};

class LinkEngine;

// The DeviceLink of one GPU and the shell of its GrantSession. Its address is stable for the
// engine's life (the hooks keep it).
class DeviceChannel final : public DeviceLink, private SessionProbe {
 public:
  DeviceChannel(LinkEngine& engine, DeviceIdentity identity, DeviceAgent& agent);
  DeviceChannel(const DeviceChannel&) = delete;
  DeviceChannel& operator=(const DeviceChannel&) = delete;
  ~DeviceChannel() override;

  void before_submit() noexcept override;
  std::uint64_t after_submit(bool queued) noexcept override;
  void usage_changed() noexcept override;
  void await_registration() noexcept override;

  const DeviceIdentity& identity() const { return identity_; }
  // Whether the registration's outcome is known (await_registration() returns at once).
  bool registration_settled() const { return settled_.load(std::memory_order_acquire); }
  GrantState state() const;
  std::uint64_t epoch() const;

 private:
  friend class LinkEngine;

  // The connection's bytes; only the GPU's thread touches them. Abandoned in a forked child.
  struct Wire {
    UniqueFd fd;
    protocol::FrameDecoder decoder;
    std::vector<std::uint8_t> out;
    std::size_t out_sent = 0;
    std::string broken;  // why the connection failed while sending; fed to the session after

    // No connection, nothing buffered either way.
    void reset() {
      fd.reset();
      decoder = protocol::FrameDecoder{};
      out.clear();
      out_sent = 0;
      broken.clear();
    }
  };

  // SessionProbe.
  int waiters() override { return waiters_.load(std::memory_order_acquire); }
  MonoTime waiting_since() override {
    return MonoTime{Duration{waiting_since_ns_.load(std::memory_order_acquire)}};
  }
  std::uint64_t inside() override { return gate_.inside(); }
  Duration idle_for() override;
  DeviceUsage usage() override;
  Duration queue_waited() override;
  std::uint64_t at_bound() override;

  void slow_enter();
  void ensure_started();
  void wake();
  static void* thread_main(void* self);
  void run();
  // Feeds one event and carries out the actions, feeding the answers of those that have one.
  void feed(const session::Event& event);
  std::optional<session::Event> perform(const session::Action& action);
  std::optional<session::Event> perform_agent(const session::Action& action);
  void publish(const session::Publish& publish);
  void read_frames();
  void flush();
  void feed_if_broken();
  void settle_registration();
  // Gate open for good, whatever the thread is doing (stop(), a thread that cannot start).
  void stop_now();
  // Waits up to `until` for the thread to exit; true when it did (and was joined).
  bool join_until(std::chrono::steady_clock::time_point until);
  bool agent_allowed() const;
  void fork_prepare();
  void fork_parent();
  void fork_child();

  LinkEngine& engine_;
  const DeviceIdentity identity_;
  DeviceAgent& agent_;
  alignas(64) GrantGate gate_;
  std::atomic<bool> usage_dirty_{true};
  alignas(64) mutable std::mutex mu_;
  std::condition_variable cv_;
  // Written under mu_ (so waiters see changes with the gate) by the GPU's thread, or by whoever
  // stops the engine; read anywhere.
  std::atomic<GrantState> state_{GrantState::kStarting};
  std::atomic<int> waiters_{0};                    // changed under mu_
  std::atomic<std::int64_t> waiting_since_ns_{0};  // set by the first waiter, under mu_
  std::uint64_t held_epoch_ = 0;                   // under mu_; for epoch()
  // Registration (device_link.h): set under mu_ (waiters wait on cv_), read anywhere.
  std::atomic<bool> settled_{false};
  std::chrono::steady_clock::time_point register_deadline_;  // under mu_

  // The GPU's thread: started on first use.
  std::mutex thread_mu_;
  bool started_ = false;  // under thread_mu_
  bool exited_ = true;    // under thread_mu_
  std::condition_variable exited_cv_;
  pthread_t thread_{};
  std::atomic<int> wake_fd_{-1};  // eventfd; written by application threads without the lock

  // The GPU's thread only. A forked child replaces both (the parent's may be mid-change).
  GrantSession* session_;
  Wire* wire_;
};

class LinkEngine {
 public:
  explicit LinkEngine(LinkOptions options);
  LinkEngine(const LinkEngine&) = delete;
  LinkEngine& operator=(const LinkEngine&) = delete;
  // Stops the threads (waiting for them) and closes every session; DeviceLinks from it die with it.
  ~LinkEngine();

  // The DeviceLink of a GPU: created (and its session and thread started) on first call for its
  // UUID, the same object afterwards. With options.enabled false, a link that does nothing and no
  // thread.
  DeviceLink& device(const DeviceIdentity& identity, DeviceAgent& agent);

  // Stops the threads: every gate opens for good and no agent call starts afterwards. Waits at
  // most `wait` in all for the threads to finish what they are doing (process exit uses a short
  // bound).
  void stop(Duration wait);

  LinkStats stats() const;
  const LinkOptions& options() const { return options_; }

 private:
  friend class DeviceChannel;
  friend struct ForkRegistry;

  SessionConfig session_config(const DeviceIdentity& identity) const;
  // Starts every GPU's thread that is not running (after fork(), the child's).
  void ensure_started();
  std::vector<DeviceChannel*> snapshot();
  void outage_begins(const std::string& why, bool refused);
  void outage_ends();
  void fork_prepare();
  void fork_parent();
  void fork_child();

  const LinkOptions options_;
  const HandoffTrace trace_;
  mutable std::mutex mu_;  // devices_; taken before any device's locks
  std::vector<std::unique_ptr<DeviceChannel>> devices_;
  std::atomic<bool> stopping_{false};
  std::mutex outage_mu_;
  int outage_devices_ = 0;             // under outage_mu_: GPUs whose scheduler is unreachable
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
  std::uint64_t after_submit(bool queued) noexcept override {
    return queued ? queued_.fetch_add(1, std::memory_order_relaxed) + 1 : 0;
  }
  void usage_changed() noexcept override {}
  void await_registration() noexcept override {}

 private:
  std::atomic<std::uint64_t> queued_{0};
};

}  // namespace nvshare::client

// Test doubles and helpers for the client link tests:
//  - FakeAgent: a DeviceAgent that records what the link asks of it (and from which thread);
//  - ScriptedScheduler / ScriptedPeer: the scheduler's side of the wire protocol on a
//    temporary unix socket, driven step by step by the test (accept, expect a frame, send one);
//  - TempDir, StderrCapture, wait_until, and child processes (run_process, SchedulerProcess).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "client/device_link.h"
#include "common/protocol.h"
#include "common/unix_socket.h"

namespace nvshare::client::testing {

using namespace std::chrono_literals;

// Polls `condition` until it holds or `timeout` passes; returns whether it held.
bool wait_until(const std::function<bool()>& condition, std::chrono::milliseconds timeout = 3000ms);

class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

class FakeAgent final : public DeviceAgent {
 public:
  Duration drain() override;
  std::uint64_t swap_out(std::uint64_t target = 0) override;
  std::atomic<std::uint64_t> last_swap_target{0};  // the target of the last swap_out()
  std::uint64_t swap_in(std::uint64_t limit = 0) override;
  Duration idle_for() override;
  DeviceUsage usage() override;
  Duration queue_waited() override { return Duration{0}; }
  std::uint64_t threads_at_bound() override { return 0; }
  void apply_limits(const protocol::Limits& limits) override;
  void limits_unknown() override;

  void set_idle(Duration idle) { idle_ns_.store(idle.count()); }
  void set_usage(DeviceUsage usage);
  // drain() blocks until release_drain() when armed.
  void hold_drains() { hold_drain_.store(true); }
  void release_drain();

  std::atomic<int> drains{0};
  std::atomic<int> swap_outs{0};      // swap-outs begun with all the memory on the device
  std::atomic<int> swap_ins{0};       // for a grant (or an outage): no limit
  std::atomic<int> room_swap_ins{0};  // into room while waiting: with a limit
  std::atomic<int> idle_queries{0};
  std::atomic<Duration::rep> drain_delay_ns{0};
  std::atomic<Duration::rep> swap_delay_ns{0};
  // The memory it swaps: what a swap-out moves in all (in steps of at least their target, as the
  // library's whole pieces), and a swap-in brings back (at most its limit).
  std::atomic<std::uint64_t> swap_bytes{128ull << 20};
  std::atomic<std::int64_t> drain_started_ns{0};  // steady clock, when the last drain began

  std::vector<protocol::Limits> limits() const;
  std::vector<std::string> calls() const;
  // Every agent call came from one thread, and not from `forbidden`.
  bool called_only_from_one_thread_other_than(std::thread::id forbidden) const;

 private:
  void record(const char* call);

  std::atomic<Duration::rep> idle_ns_{0};
  std::atomic<bool> hold_drain_{false};
  std::atomic<bool> swapped_{false};         // swapped out since the last swap_in
  std::atomic<std::uint64_t> out_bytes_{0};  // of swap_bytes, what is on the host
  std::atomic<std::uint64_t> room_back_{0};  // brought back into room since the last swap-out
  mutable std::mutex mu_;
  std::condition_variable drain_cv_;
  bool drain_released_ = false;
  DeviceUsage usage_;
  std::vector<protocol::Limits> limits_;
  std::vector<std::string> calls_;
  std::vector<std::thread::id> threads_;
};

// One accepted connection, seen from the scheduler's side.
class ScriptedPeer {
 public:
  explicit ScriptedPeer(UniqueFd fd);

  // The next frame within `timeout`, nullopt on timeout or when the client closed.
  std::optional<protocol::Message> next(std::chrono::milliseconds timeout = 3000ms);
  // The next frame that is not a usage report (those are collected in usage_seen()).
  std::optional<protocol::Message> next_skipping_usage(std::chrono::milliseconds timeout = 3000ms);
  template <typename T>
  std::optional<T> expect(std::chrono::milliseconds timeout = 3000ms) {
    auto message = next_skipping_usage(timeout);
    if (!message) return std::nullopt;
    if (const T* typed = std::get_if<T>(&*message)) return *typed;
    last_unexpected_ = std::string(protocol::to_string(protocol::type_of(*message)));
    return std::nullopt;
  }
  // True when no frame other than usage arrives within `period`.
  bool quiet_for(std::chrono::milliseconds period);
  // True when the client closes the connection within `timeout` (frames before that are dropped).
  bool closed_within(std::chrono::milliseconds timeout);

  void send(const protocol::Message& message);
  void close() { fd_.reset(); }
  // hello -> welcome (client id 7), then the usage report every new session sends.
  std::optional<protocol::Hello> handshake(std::uint64_t client_id = 7);

  const std::vector<protocol::Usage>& usage_seen() const { return usage_; }
  const std::string& last_unexpected() const { return last_unexpected_; }
  int fd() const { return fd_.get(); }

 private:
  UniqueFd fd_;
  protocol::FrameDecoder decoder_;
  std::vector<protocol::Usage> usage_;
  std::string last_unexpected_;
  bool eof_ = false;
};

class ScriptedScheduler {
 public:
  explicit ScriptedScheduler(std::string path);
  ~ScriptedScheduler();
  bool listening() const { return listener_.valid(); }
  std::unique_ptr<ScriptedPeer> accept(std::chrono::milliseconds timeout = 3000ms);
  // Stops listening and removes the socket file (the scheduler "dies").
  void shut();

 private:
  std::string path_;
  UniqueFd listener_;
};

// Redirects this process's stderr (fd 2) to a file while alive; text() reads what was written.
class StderrCapture {
 public:
  StderrCapture();
  ~StderrCapture();
  std::string text() const;

 private:
  std::string path_;
  int saved_ = -1;
};

int count_occurrences(const std::string& text, const std::string& needle);

struct ProcessResult {
  int exit_code = -1;  // 128+N when killed by signal N; -1 when it had to be killed on timeout
  std::string out;
  std::string err;
};

// Environment changes for a child: a value sets the variable, nullopt removes it.
using EnvChanges = std::map<std::string, std::optional<std::string>>;

// Runs argv to completion (killed after `timeout`), capturing stdout and stderr.
ProcessResult run_process(const std::vector<std::string>& argv, const EnvChanges& env = {},
                          std::chrono::milliseconds timeout = 20000ms);
// Starts argv with stdout/stderr sent to `log` (may be empty: /dev/null); returns the pid.
pid_t start_process(const std::vector<std::string>& argv, const EnvChanges& env,
                    const std::string& log);
// Waits for a child started with start_process; exit code as above, -1 on timeout.
int wait_process(pid_t pid, std::chrono::milliseconds timeout);

// The pid of whatever accepts on a unix socket (SO_PEERCRED), 0 when nothing does.
pid_t listener_pid(const std::string& socket);

// The real nvshare-scheduler on temporary sockets.
class SchedulerProcess {
 public:
  SchedulerProcess(const TempDir& dir, const std::vector<std::string>& extra_args);
  ~SchedulerProcess();
  bool ready() const { return ready_; }
  const std::string& socket() const { return socket_; }
  std::string log() const;

 private:
  std::string socket_;
  std::string log_;
  pid_t pid_ = -1;
  bool ready_ = false;
};

}  // namespace nvshare::client::testing

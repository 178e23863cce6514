// Daemon: nvshare-scheduler assembled. One Reactor owns the client socket, the control socket, the
// timer, the signals, every session and the Scheduler; this unit wires them together.
//
// One loop iteration: handle the ready sockets; a session's input is decoded into Scheduler calls
// whose frames are queued on the sessions they address and written as soon as that input is handled
// (so a grant never waits for the rest of the batch), and sessions that asked to be closed are
// closed (their Disconnected may queue more frames: repeat). Before sleeping: feed due deadlines,
// write whatever is still queued (control commands, deadlines), and arm the timer at the earliest
// policy deadline.
//
// Contract
//  - create() restores the state file (state_file.h) and learns the GPUs, then listens on both
//    sockets (client 0666, control 0600), or fails with the reason. State changes are written by
//    a thread of their own after the batch that made them; the destructor waits for the last.
//  - run() returns after SIGTERM or SIGINT (or stop()); the destructor closes every connection and
//    removes both socket files.
//  - A session whose pending output exceeds config.client_buffer_limit is dropped; a slow client
//    never blocks the loop. A malformed frame closes only its own session.
//  - Admission: a connection is identified when accepted (peer_identity.h) and counted against
//    its pod or uid (session_limits.h); one that cannot be identified (unless clients are
//    trusted) or is over a limit is closed at once. The total is kept below the descriptor limit
//    with room to spare, so the control socket and host root always get in; should descriptors run
//    out anyway, a spare one lets the loop accept and close rather than stall. A session that has
//    not said hello within config.hello_timeout is closed.
//  - CUDA IPC (ipc_broker.h): exports are accepted only from a process with a welcomed session and
//    dropped when its last session closes; their descriptors come out of the sessions' budget.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "common/result.h"
#include "common/unix_socket.h"
#include "scheduler/client_session.h"
#include "scheduler/control_server.h"
#include "scheduler/daemon_stats.h"
#include "scheduler/ipc_broker.h"
#include "scheduler/knobs.h"
#include "scheduler/metrics_server.h"
#include "scheduler/reactor.h"
#include "scheduler/scheduler.h"
#include "scheduler/session_limits.h"

namespace nvshare::scheduler {

class Daemon final : public ClientChannel, public SessionHost {
 public:
  struct Options {
    bool handle_signals = true;       // SIGTERM/SIGINT stop run(); off for in-process use
    std::string proc_root = "/proc";  // where pids' cgroup files are read
  };

  static Result<std::unique_ptr<Daemon>> create(DaemonConfig config, Options options);
  ~Daemon() override;

  Status run();
  void stop() { reactor_->stop(); }

  // ClientChannel
  void send(ClientId client, const protocol::Message& message) override;
  // SessionHost
  void bind(ClientId client, ClientSession& session) override;
  void output_queued(ClientSession& session) override;
  void decision_started(std::optional<MonoTime> at) override { decision_started_ = at; }
  IpcReply ipc(const ClientIdentity& peer, const protocol::Message& request,
               UniqueFd passed) override;

 private:
  struct FileId {
    dev_t dev = 0;
    ino_t ino = 0;
  };
  static FileId file_id(const std::string& path);
  static void remove_socket_file(const std::string& path, FileId created);

  Daemon(DaemonConfig config, Options options);

  // The node's GPUs, from the gpus knob or NVML (docs/configuration.md, `gpus`).
  void load_gpus();
  // What a previous run left in the state file, before any client is accepted.
  void load_state();
  // Hands the persistent state to the writer thread when it changed.
  void save_state();
  void accept_clients();
  // Identifies and admits one accepted connection; false when it is refused (and closed).
  bool admit(UniqueFd& fd, ClientIdentity& identity);
  // Accepts and closes one pending connection using the spare descriptor (EMFILE/ENFILE).
  void shed_one_connection();
  void note_refusal(const std::string& why);
  void expire_hellos(MonoTime now);
  std::optional<MonoTime> next_timer() const;
  void on_session_event(int fd, std::uint32_t events);
  void before_sleep();
  MetricsSnapshot metrics_snapshot() const;
  void flush_sessions(MonoTime now);
  void close_pending(MonoTime now);
  void close_session(int fd, MonoTime now);
  // Whether a welcomed session of that process (pid and start time) is open (one closing counts
  // until close_session() ends it). One map lookup: welcomed_ counts them by process.
  bool has_session(const ClientIdentity& process) const;
  // Who a CUDA IPC request comes from: the peer, in the pod its welcomed sessions count in where
  // its cgroup names none (a pod it declared to a scheduler that trusts client limits), so that
  // memory is shared within the pods the scheduler counts it in.
  ClientIdentity ipc_identity(const ClientIdentity& peer) const;
  using ProcessKey = std::pair<pid_t, std::uint64_t>;  // pid, start time
  static ProcessKey process_key(const ClientIdentity& peer) { return {peer.pid, peer.start_time}; }

  DaemonConfig config_;
  Options options_;
  const Clock& clock_;
  MonoTime started_;
  std::unique_ptr<Reactor> reactor_;
  DaemonStats stats_;
  SessionLimits limits_;
  IpcBroker ipc_;
  Scheduler scheduler_;
  UniqueFd listener_;
  UniqueFd spare_fd_;  // given up to accept-and-close when descriptors run out
  std::uint64_t next_serial_ = 1;
  struct HelloDeadline {
    MonoTime at;
    int fd;
    std::uint64_t serial;
  };
  std::deque<HelloDeadline> hello_deadlines_;  // in accept order, so in deadline order
  // Refusals are logged at most once a second, with how many there were.
  std::uint64_t refusals_unlogged_ = 0;
  MonoTime refusal_logged_at_{};
  std::unique_ptr<ControlServer> control_;
  std::unique_ptr<MetricsServer> metrics_;  // when metrics-address is set
  double start_time_s_ = 0;                 // wall clock at start, for metrics
  std::unique_ptr<StateWriter> state_writer_;
  std::unordered_map<int, std::unique_ptr<ClientSession>> sessions_;  // by fd
  std::unordered_map<ClientId, ClientSession*> by_client_;
  std::map<ProcessKey, std::size_t> welcomed_;  // welcomed sessions open per process
  std::vector<int> flush_list_;                 // sessions with queued output
  std::vector<int> close_list_;                 // sessions that asked to be closed
  std::optional<MonoTime> decision_started_;
  FileId socket_file_;  // the socket files as created, so shutdown removes only those
  FileId control_file_;
};

}  // namespace nvshare::scheduler

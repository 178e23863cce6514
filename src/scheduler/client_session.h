// ClientSession: one connection of the client library (one process on one GPU).
//
// Lifecycle: accepted -> hello -> (versions overlap) welcome with a client id -> frames until
// either side closes. The session decodes frames with protocol::FrameDecoder and turns each into a
// Scheduler call; the Scheduler's answers come back through the daemon's ClientChannel and land in
// queue().
//
// Contract
//  - Malformed input (the decoder fails), a frame out of place (anything before hello, a second
//  hello,
//    a scheduler->client message type) or a hello without a common version makes the session ask to
//    be closed: closing() turns true with a reason, and no further frame of it is handled. Other
//    sessions are unaffected. The owner closes it and reports the disconnect to the Scheduler.
//  - Identity is the peer's, taken by the daemon when it accepted the connection (peer_identity.h),
//    never re-read at hello: the connecting process may be gone by then.
//  - A connection whose first frame is a CUDA IPC request (ipc-export, ipc-import, ipc-withdraw) is
//    not a client session: the request goes to the owner (SessionHost::ipc), the answer is written
//    at once (with the descriptor an import gets) and the connection closes. Descriptors sent with
//    anything but an export close the connection.
//  - Output is only queued here (never written): the owner flushes it without blocking and drops
//    the session when the pending output exceeds its limit. A message whose type the session's
//    version lacks (protocol::introduced_in) is not queued.
#pragma once

#include <cstdint>
#include <deque>
#include <string>

#include "common/clock.h"
#include "common/protocol.h"
#include "common/unix_socket.h"
#include "scheduler/daemon_stats.h"
#include "scheduler/outbox.h"
#include "scheduler/scheduler.h"

namespace nvshare::scheduler {

class ClientSession;

// What a session needs from its owner.
class SessionHost {
 public:
  virtual ~SessionHost() = default;
  // From now on, frames for `client` go to `session` (called before the Scheduler learns the
  // client).
  virtual void bind(ClientId client, ClientSession& session) = 0;
  // The session queued output.
  virtual void output_queued(ClientSession& session) = 0;
  // A request or release read at `at` is being handled (nullopt: done); grants it causes are timed.
  virtual void decision_started(std::optional<MonoTime> at) = 0;
  // A CUDA IPC request (the only frame of its connection) from `peer`; `passed` is the descriptor
  // that came with an export (invalid otherwise). The answer, and for an import the descriptor to
  // pass back (invalid: none).
  struct IpcReply {
    protocol::IpcAnswer answer;
    UniqueFd fd;
  };
  virtual IpcReply ipc(const ClientIdentity& peer, const protocol::Message& request,
                       UniqueFd passed) = 0;
};

// The close reason of a connection whose CUDA IPC request was answered (not an error).
inline constexpr const char* kIpcAnswered = "ipc request answered";

class ClientSession {
 public:
  ClientSession(UniqueFd fd, ClientIdentity peer, Scheduler& scheduler, SessionHost& host,
                DaemonStats& stats, std::uint64_t serial);
  ClientSession(const ClientSession&) = delete;
  ClientSession& operator=(const ClientSession&) = delete;

  int fd() const { return fd_.get(); }
  ClientId client() const { return client_; }
  const ClientIdentity& peer() const { return peer_; }
  // Unique per accepted connection (descriptors are reused, serials are not).
  std::uint64_t serial() const { return serial_; }

  // Reads what the socket has (bounded per call, the loop is level-triggered) and handles every
  // complete frame. End of stream or a read error also ends the session.
  void on_readable(MonoTime now);

  // Encodes a frame into the output buffer in the session's protocol version.
  void queue(const protocol::Message& message);
  Outbox& outbox() { return outbox_; }

  bool closing() const { return closing_; }
  const std::string& close_reason() const { return close_reason_; }
  void close_with(std::string reason);

  // Latency bookkeeping: a grant caused by a decision that started at `started` was just queued.
  void mark_decision(MonoTime started);
  // Records, for every marked grant now written to the socket, its latency up to `now`.
  void collect_written(LatencyHistogram& histogram, BucketHistogram& buckets, MonoTime now);

  // Owner's bookkeeping for its flush list and EPOLLOUT interest.
  bool in_flush_list = false;
  bool wants_writable = false;

 private:
  void handle(const protocol::Frame& frame, MonoTime now);
  void handle_hello(const protocol::Hello& hello, MonoTime now);
  // Answers the IPC request `message` (the connection's first frame) and closes the connection.
  void handle_ipc(const protocol::Message& message);

  UniqueFd fd_;
  ClientIdentity peer_;
  Scheduler& scheduler_;
  SessionHost& host_;
  DaemonStats& stats_;
  std::uint64_t serial_;
  protocol::FrameDecoder decoder_;
  std::vector<UniqueFd> passed_;  // descriptors received (SCM_RIGHTS), for an IPC export
  Outbox outbox_;
  ClientId client_ = 0;
  std::uint16_t version_ = protocol::kMaxVersion;
  bool closing_ = false;
  std::string close_reason_;
  struct Mark {
    std::uint64_t end;  // absolute output offset just past the grant frame
    MonoTime started;
  };
  std::deque<Mark> marks_;
};

}  // namespace nvshare::scheduler

// ControlServer: the control socket's connections (nvsharectl, the device plugin).
//
// The socket file is created mode 0600, and each accepted peer is checked again with SO_PEERCRED:
// only the scheduler's own uid and root are served (a socket file's mode can be loosened by anyone
// who owns it; the credential check cannot). A refused peer gets one error line and is closed.
// The socket's directory is created mode 0700 when it is missing (its missing parents 0755); an
// existing directory is left as it is, since it may also hold the client socket (nvshare-run puts
// both side by side in a private directory). The default directory is the control socket's own
// (default_paths.h), never the one mounted into GPU containers.
//
// Framing: one JSON request per line, one JSON response line per request, in order. A request that
// is not valid JSON gets an error response and the connection stays open; a line longer than
// kMaxControlLine gets an error response and the connection is closed (the rest of the line cannot
// be told from the next request). Output is buffered and written without blocking, like client
// output, and bounded: while more than kMaxPendingOutput is unread the connection's requests wait
// (nothing more is read or handled), so a peer that pipelines requests and reads slowly costs at
// most that plus one response.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>

#include "common/json.h"
#include "common/unix_socket.h"
#include "scheduler/daemon_stats.h"
#include "scheduler/outbox.h"
#include "scheduler/reactor.h"

namespace nvshare::scheduler {

class ControlServer {
 public:
  using LineHandler = std::function<Json(std::string_view line)>;
  static constexpr std::size_t kMaxConnections = 64;
  static constexpr std::size_t kMaxPendingOutput = std::size_t{1} << 20;
  static constexpr unsigned kControlDirectoryMode = 0700;

  ControlServer(Reactor& reactor, DaemonStats& stats, LineHandler handler);
  ControlServer(const ControlServer&) = delete;
  ControlServer& operator=(const ControlServer&) = delete;
  ~ControlServer();

  // Creates the socket at `path` (mode 0600; its directory 0700 when missing) and starts accepting.
  Status listen(const std::string& path);

 private:
  struct Connection {
    UniqueFd fd;
    std::string input;
    Outbox output;
    bool close_when_flushed = false;
    std::uint32_t events = EPOLLIN;  // what the reactor watches for it
  };

  static bool backlogged(const Connection& c) { return c.output.pending() > kMaxPendingOutput; }
  // Handles the complete request lines in the input while the output is within its bound.
  void handle_lines(Connection& connection);

  void accept_all();
  void on_event(int fd, std::uint32_t events);
  void respond(Connection& connection, const Json& response);
  // Writes what it can; closes the connection when it is done or broken. Returns false if closed.
  bool flush(int fd);
  void close(int fd);

  Reactor& reactor_;
  DaemonStats& stats_;
  LineHandler handler_;
  UniqueFd listener_;
  std::unordered_map<int, std::unique_ptr<Connection>> connections_;
};

}  // namespace nvshare::scheduler

#include "scheduler/control_server.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>

#include "common/log.h"
#include "scheduler/control_api.h"

namespace nvshare::scheduler {
namespace {

std::string parent_directory(const std::string& path) {
  const std::size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return "";
  return slash == 0 ? "/" : path.substr(0, slash);
}

// Creates `dir` with `mode` when it is missing, and its missing parents 0755 (as listen_unix makes
// a socket's parents). Returns whether `dir` itself was created.
Result<bool> make_directory(const std::string& dir, mode_t mode) {
  if (dir.empty() || dir == "/") return false;
  struct stat st {};
  if (::stat(dir.c_str(), &st) == 0) {
    if (!S_ISDIR(st.st_mode)) return make_error(dir + " exists and is not a directory");
    return false;
  }
  if (errno != ENOENT) return make_error("cannot stat " + dir + ": " + std::strerror(errno));
  if (auto parent = make_directory(parent_directory(dir), 0755); !parent) return parent.error();
  if (::mkdir(dir.c_str(), mode) != 0) {
    if (errno == EEXIST) return false;
    return make_error("cannot create directory " + dir + ": " + std::strerror(errno));
  }
  return true;
}

}  // namespace

ControlServer::ControlServer(Reactor& reactor, DaemonStats& stats, LineHandler handler)
    : reactor_(reactor), stats_(stats), handler_(std::move(handler)) {}

ControlServer::~ControlServer() {
  for (auto& [fd, connection] : connections_) reactor_.remove(fd);
  if (listener_.valid()) reactor_.remove(listener_.get());
}

Status ControlServer::listen(const std::string& path) {
  const std::string dir = parent_directory(path);
  auto created = make_directory(dir, kControlDirectoryMode);
  if (!created) return created.error();
  if (created.value()) NVSHARE_INFO("created %s (mode 0700) for the control socket", dir.c_str());
  auto listener = listen_unix(path, 0600);
  if (!listener) return listener.error();
  listener_ = std::move(listener).value();
  if (Status s = set_nonblocking(listener_.get()); !s) return s;
  return reactor_.add(listener_.get(), EPOLLIN, [this](std::uint32_t) { accept_all(); });
}

void ControlServer::accept_all() {
  for (int i = 0; i < 16; ++i) {
    UniqueFd fd(::accept4(listener_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (!fd.valid()) {
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        NVSHARE_WARN("control socket: accept: %s", std::strerror(errno));
      }
      return;
    }
    auto peer = peer_credentials(fd.get());
    const uid_t self = ::geteuid();
    std::string refusal;
    if (!peer) {
      refusal = "cannot identify the peer: " + peer.error().message;
    } else if (peer.value().uid != self && peer.value().uid != 0) {
      refusal = "permission denied: uid " + std::to_string(peer.value().uid) +
                " may not use the control socket (only uid " + std::to_string(self) + " and root)";
    } else if (connections_.size() >= kMaxConnections) {
      refusal = "too many control connections (" + std::to_string(kMaxConnections) + ")";
    }
    if (!refusal.empty()) {
      ++stats_.control_refused;
      NVSHARE_WARN("control socket: refused pid %d: %s",
                   peer ? static_cast<int>(peer.value().pid) : -1, refusal.c_str());
      std::string line = error_response(refusal).dump() + "\n";
      // Best effort: a fresh socket's buffer takes one short line; the peer learns why either way.
      (void)::send(fd.get(), line.data(), line.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      continue;  // fd closes here
    }
    const int raw = fd.get();
    auto connection = std::make_unique<Connection>();
    connection->fd = std::move(fd);
    if (Status s = reactor_.add(raw, EPOLLIN,
                                [this, raw](std::uint32_t events) { on_event(raw, events); });
        !s) {
      NVSHARE_WARN("control socket: %s", s.error().message.c_str());
      continue;
    }
    connections_.emplace(raw, std::move(connection));
  }
}

void ControlServer::on_event(int fd, std::uint32_t events) {
  auto it = connections_.find(fd);
  if (it == connections_.end()) return;
  Connection& connection = *it->second;
  if (events & EPOLLOUT) {
    if (!flush(fd)) return;
  }
  const bool readable = (events & (EPOLLIN | EPOLLHUP | EPOLLERR)) != 0;
  if (readable && !connection.close_when_flushed && !backlogged(connection)) {
    std::array<char, 16384> buffer;
    const ssize_t n = ::recv(fd, buffer.data(), buffer.size(), 0);
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      close(fd);
      return;
    }
    if (n == 0) {
      close(fd);
      return;
    }
    if (n > 0) connection.input.append(buffer.data(), static_cast<std::size_t>(n));
  }
  handle_lines(connection);
  flush(fd);
}

void ControlServer::handle_lines(Connection& connection) {
  std::size_t start = 0;
  // A peer that pipelines requests and reads slowly gets its answers at its own pace: no request is
  // handled while its unread output is over the bound, so that output never grows past it by more
  // than one response.
  while (!backlogged(connection) && !connection.close_when_flushed) {
    const std::size_t newline = connection.input.find('\n', start);
    if (newline == std::string::npos) break;
    const std::string_view line(connection.input.data() + start, newline - start);
    start = newline + 1;
    if (line.empty() || line == "\r") continue;
    respond(connection, handler_(line));
  }
  connection.input.erase(0, start);
  if (connection.input.find('\n') == std::string::npos &&
      connection.input.size() > kMaxControlLine) {
    respond(connection, error_response("request line longer than " +
                                       std::to_string(kMaxControlLine) + " bytes"));
    connection.input.clear();
    connection.close_when_flushed = true;
  }
}

void ControlServer::respond(Connection& connection, const Json& response) {
  std::string line;
  response.dump_to(line);
  line += '\n';
  connection.output.append(line);
}

bool ControlServer::flush(int fd) {
  auto it = connections_.find(fd);
  if (it == connections_.end()) return false;
  Connection& connection = *it->second;
  auto done = connection.output.flush(fd);
  if (!done) {
    close(fd);
    return false;
  }
  if (done.value() && connection.close_when_flushed) {
    close(fd);
    return false;
  }
  // Requests read but held back while the output was over the bound are handled now.
  if (!backlogged(connection) && connection.input.find('\n') != std::string::npos) {
    handle_lines(connection);
    done = connection.output.flush(fd);
    if (!done) {
      close(fd);
      return false;
    }
  }
  const std::uint32_t events =
      (backlogged(connection) || connection.close_when_flushed ? 0u : std::uint32_t{EPOLLIN}) |
      (connection.output.empty() ? 0u : std::uint32_t{EPOLLOUT});
  if (events != connection.events) {
    connection.events = events;
    (void)reactor_.set_events(fd, events);
  }
  return true;
}

void ControlServer::close(int fd) {
  reactor_.remove(fd);
  connections_.erase(fd);
}

}  // namespace nvshare::scheduler

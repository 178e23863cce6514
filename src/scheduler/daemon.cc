#include "scheduler/daemon.h"

#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/log.h"
#include "scheduler/control_api.h"

namespace nvshare::scheduler {
namespace {

// Accepts per readable event before giving other connections a turn.
constexpr int kAcceptsPerEvent = 64;

// Refuses to take over a socket path another live scheduler is serving (listen_unix would unlink
// it).
Status check_not_served(const std::string& path) {
  auto probe = connect_unix(path);
  if (probe.ok()) return make_error("another process is already listening on " + path);
  return Status::Ok();
}

}  // namespace

Daemon::FileId Daemon::file_id(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return {};
  return FileId{st.st_dev, st.st_ino};
}

// Removes a socket file this daemon created, unless something else has replaced it since.
void Daemon::remove_socket_file(const std::string& path, FileId created) {
  const FileId now = file_id(path);
  if (created.ino != 0 && now.dev == created.dev && now.ino == created.ino) ::unlink(path.c_str());
}

Daemon::Daemon(DaemonConfig config, Options options)
    : config_(config),
      options_(std::move(options)),
      clock_(SteadyClock::instance()),
      started_(clock_.now()),
      scheduler_(std::move(config), *this) {}

Result<std::unique_ptr<Daemon>> Daemon::create(DaemonConfig config, Options options) {
  std::unique_ptr<Daemon> daemon(new Daemon(std::move(config), std::move(options)));
  Daemon& d = *daemon;
  auto reactor = Reactor::create();
  if (!reactor) return reactor.error();
  d.reactor_ = std::move(reactor).value();

  if (Status s = check_not_served(d.config_.socket_path); !s) return s.error();
  if (Status s = check_not_served(d.config_.control_socket_path); !s) return s.error();

  auto listener = listen_unix(d.config_.socket_path, 0666, 1024);
  if (!listener) return listener.error();
  d.listener_ = std::move(listener).value();
  d.socket_file_ = file_id(d.config_.socket_path);
  if (Status s = set_nonblocking(d.listener_.get()); !s) return s.error();
  if (Status s =
          d.reactor_->add(d.listener_.get(), EPOLLIN, [&d](std::uint32_t) { d.accept_clients(); });
      !s) {
    return s.error();
  }

  d.control_ = std::make_unique<ControlServer>(*d.reactor_, d.stats_, [&d](std::string_view line) {
    ControlContext context{d.scheduler_, d.stats_, d.started_, d.clock_.now(), d.sessions_.size()};
    return handle_control_line(line, context);
  });
  if (Status s = d.control_->listen(d.config_.control_socket_path); !s) return s.error();
  d.control_file_ = file_id(d.config_.control_socket_path);

  if (d.options_.handle_signals) {
    Status s = d.reactor_->watch_signals({SIGTERM, SIGINT}, [&d](int sig) {
      NVSHARE_INFO("received %s, shutting down", sig == SIGTERM ? "SIGTERM" : "SIGINT");
      d.reactor_->stop();
    });
    if (!s) return s.error();
  }
  d.reactor_->on_timer([&d] { d.scheduler_.run_due(d.clock_.now()); });
  d.reactor_->before_sleep([&d] { d.before_sleep(); });
  NVSHARE_INFO("listening: clients on %s, control on %s", d.config_.socket_path.c_str(),
               d.config_.control_socket_path.c_str());
  return daemon;
}

Daemon::~Daemon() {
  if (reactor_) {
    for (auto& [fd, session] : sessions_) reactor_->remove(fd);
    if (listener_.valid()) reactor_->remove(listener_.get());
  }
  by_client_.clear();
  sessions_.clear();
  control_.reset();
  listener_.reset();
  remove_socket_file(config_.socket_path, socket_file_);
  remove_socket_file(config_.control_socket_path, control_file_);
}

Status Daemon::run() { return reactor_->run(); }

void Daemon::accept_clients() {
  for (int i = 0; i < kAcceptsPerEvent; ++i) {
    UniqueFd fd(::accept4(listener_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (!fd.valid()) {
      if (errno == EMFILE || errno == ENFILE) {
        // Out of descriptors: stop listening until a session closes, or the loop would spin.
        NVSHARE_WARN("accept: %s; not accepting until a connection closes", std::strerror(errno));
        (void)reactor_->set_events(listener_.get(), 0);
        listener_paused_ = true;
      } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR &&
                 errno != ECONNABORTED) {
        NVSHARE_WARN("accept: %s", std::strerror(errno));
      }
      return;
    }
    auto peer = peer_credentials(fd.get());
    if (!peer) {
      NVSHARE_WARN("client refused: %s", peer.error().message.c_str());
      continue;
    }
    const int raw = fd.get();
    auto session = std::make_unique<ClientSession>(std::move(fd), peer.value(), scheduler_, *this,
                                                   stats_, options_.proc_root);
    if (Status s = reactor_->add(
            raw, EPOLLIN, [this, raw](std::uint32_t events) { on_session_event(raw, events); });
        !s) {
      NVSHARE_WARN("client refused: %s", s.error().message.c_str());
      continue;
    }
    ++stats_.sessions_opened;
    NVSHARE_DEBUG("connection from pid %d uid %u", static_cast<int>(peer.value().pid),
                  static_cast<unsigned>(peer.value().uid));
    sessions_.emplace(raw, std::move(session));
  }
}

void Daemon::on_session_event(int fd, std::uint32_t events) {
  auto it = sessions_.find(fd);
  if (it == sessions_.end()) return;
  ClientSession& session = *it->second;
  if ((events & EPOLLOUT) && !session.in_flush_list) {
    session.in_flush_list = true;
    flush_list_.push_back(fd);
  }
  if (events & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
    const MonoTime now = clock_.now();
    const bool was_closing = session.closing();
    session.on_readable(now);
    if (session.closing() && !was_closing) close_list_.push_back(fd);
    // Write what this input caused now rather than at the end of the batch: a grant must not wait
    // for the other hundred sessions that became readable at the same time. Frames for one peer
    // produced by one read still go out in one send.
    while (!flush_list_.empty() || !close_list_.empty()) {
      flush_sessions(now);
      close_pending(now);
    }
  }
}

void Daemon::send(ClientId client, const protocol::Message& message) {
  auto it = by_client_.find(client);
  if (it == by_client_.end()) return;  // gone: its disconnect is already being handled
  ClientSession& session = *it->second;
  if (session.closing()) return;
  session.queue(message);
  if (decision_started_ && std::holds_alternative<protocol::Grant>(message)) {
    session.mark_decision(*decision_started_);
  }
}

void Daemon::bind(ClientId client, ClientSession& session) { by_client_[client] = &session; }

void Daemon::output_queued(ClientSession& session) {
  if (session.closing()) return;
  if (session.outbox().pending() > config_.client_buffer_limit) {
    ++stats_.closed_slow;
    session.close_with("client does not read: " + std::to_string(session.outbox().pending()) +
                       " bytes of output pending (limit " +
                       std::to_string(config_.client_buffer_limit) + ")");
    close_list_.push_back(session.fd());
    return;
  }
  if (!session.in_flush_list) {
    session.in_flush_list = true;
    flush_list_.push_back(session.fd());
  }
}

void Daemon::flush_sessions(MonoTime) {
  std::vector<int> fds;
  fds.swap(flush_list_);
  for (int fd : fds) {
    auto it = sessions_.find(fd);
    if (it == sessions_.end()) continue;
    ClientSession& session = *it->second;
    session.in_flush_list = false;
    if (session.closing()) continue;
    const std::uint64_t before = session.outbox().sent_total();
    auto done = session.outbox().flush(fd);
    stats_.bytes_out += session.outbox().sent_total() - before;
    if (!done) {
      session.close_with(done.error().message);
      close_list_.push_back(fd);
      continue;
    }
    session.collect_written(stats_.decision_latency, clock_.now());
    const bool wants = !done.value();
    if (wants != session.wants_writable) {
      session.wants_writable = wants;
      (void)reactor_->set_events(fd, wants ? (EPOLLIN | EPOLLOUT) : EPOLLIN);
    }
  }
}

void Daemon::close_pending(MonoTime now) {
  while (!close_list_.empty()) {
    const int fd = close_list_.back();
    close_list_.pop_back();
    close_session(fd, now);
  }
}

void Daemon::close_session(int fd, MonoTime now) {
  auto it = sessions_.find(fd);
  if (it == sessions_.end()) return;
  ClientSession& session = *it->second;
  const ClientId client = session.client();
  const std::string& reason = session.close_reason();
  if (reason == "end of stream") {
    NVSHARE_DEBUG("session of client %llu (pid %d) ended", static_cast<unsigned long long>(client),
                  static_cast<int>(session.peer().pid));
  } else {
    NVSHARE_WARN("closing session of client %llu (pid %d): %s",
                 static_cast<unsigned long long>(client), static_cast<int>(session.peer().pid),
                 reason.c_str());
  }
  reactor_->remove(fd);
  if (client != 0) by_client_.erase(client);
  sessions_.erase(it);  // closes the socket
  ++stats_.sessions_closed;
  if (client != 0) scheduler_.disconnect(client, now);
  if (listener_paused_) {
    listener_paused_ = false;
    (void)reactor_->set_events(listener_.get(), EPOLLIN);
  }
}

void Daemon::before_sleep() {
  scheduler_.run_due(clock_.now());
  // Closing a session frees its grant, which may queue frames for others; flushing may find more
  // broken peers. Both lists only shrink overall (each close removes a session), so this ends.
  while (!flush_list_.empty() || !close_list_.empty()) {
    flush_sessions(clock_.now());
    close_pending(clock_.now());
  }
  if (Status s = reactor_->set_timer(scheduler_.next_deadline()); !s) {
    NVSHARE_ERROR("%s", s.error().message.c_str());
  }
}

}  // namespace nvshare::scheduler

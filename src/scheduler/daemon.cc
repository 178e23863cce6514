#include "scheduler/daemon.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <type_traits>

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

namespace {

// Descriptors kept out of the client sessions' budget: the control socket's connections (64), the
// listeners, epoll, timer and signal descriptors, the state writer, NVML and the logs.
constexpr std::size_t kReservedDescriptors = 256;

std::size_t descriptor_limit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return 1024;
  if (limit.rlim_cur == RLIM_INFINITY) return std::size_t{1} << 20;
  return static_cast<std::size_t>(limit.rlim_cur);
}

// Descriptors CUDA IPC exports may keep: an eighth of the limit, at least 16, at most 4096 (one
// process may keep a quarter of them).
std::size_t ipc_export_budget() {
  return std::clamp<std::size_t>(descriptor_limit() / 8, 16, 4096);
}

SessionQuota session_quota(const DaemonConfig& config) {
  SessionQuota quota;
  quota.per_uid = config.max_sessions_per_uid;
  quota.per_pod = config.max_sessions_per_pod;
  const std::size_t descriptors = descriptor_limit();
  const std::size_t reserved = kReservedDescriptors + ipc_export_budget();
  quota.root_extra = kReservedDescriptors / 2;
  quota.total = descriptors > reserved ? descriptors - reserved : 1;
  return quota;
}

}  // namespace

Daemon::Daemon(DaemonConfig config, Options options)
    : config_(config),
      options_(std::move(options)),
      clock_(SteadyClock::instance()),
      started_(clock_.now()),
      limits_(session_quota(config)),
      ipc_(std::max<std::size_t>(1, ipc_export_budget() / 4), ipc_export_budget()),
      scheduler_(std::move(config), *this) {}

Result<std::unique_ptr<Daemon>> Daemon::create(DaemonConfig config, Options options) {
  std::unique_ptr<Daemon> daemon(new Daemon(std::move(config), std::move(options)));
  Daemon& d = *daemon;
  auto reactor = Reactor::create();
  if (!reactor) return reactor.error();
  d.reactor_ = std::move(reactor).value();
  // Signals are taken before either socket listens: whoever sees a socket may already signal, and a
  // signal that arrived in between would end the process with its default action.
  if (d.options_.handle_signals) {
    Status s = d.reactor_->watch_signals({SIGTERM, SIGINT}, [&d](int sig) {
      NVSHARE_INFO("received %s, shutting down", sig == SIGTERM ? "SIGTERM" : "SIGINT");
      d.reactor_->stop();
    });
    if (!s) return s.error();
  }

  d.load_state();
  d.load_gpus();
  if (Status s = check_not_served(d.config_.socket_path); !s) return s.error();
  if (Status s = check_not_served(d.config_.control_socket_path); !s) return s.error();

  d.spare_fd_ = UniqueFd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  NVSHARE_INFO("client sessions: at most %zu in all, %zu per uid, %zu per pod",
               d.limits_.quota().total, d.limits_.quota().per_uid, d.limits_.quota().per_pod);
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

  if (!d.config_.metrics_address.empty()) {
    d.start_time_s_ = static_cast<double>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                              std::chrono::system_clock::now().time_since_epoch())
                                              .count()) /
                      1e3;
    auto metrics = MetricsServer::start(d.config_.metrics_address, *d.reactor_,
                                        [&d] { return d.metrics_snapshot(); });
    if (!metrics) return metrics.error();
    d.metrics_ = std::move(metrics).value();
    NVSHARE_INFO("metrics on http://%s/metrics", d.metrics_->address().c_str());
  }

  d.reactor_->on_timer([&d] {
    d.scheduler_.run_due(d.clock_.now());
    d.expire_hellos(d.clock_.now());
  });
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
  metrics_.reset();
  by_client_.clear();
  sessions_.clear();
  control_.reset();
  if (state_writer_) {
    save_state();
    state_writer_.reset();  // writes what is pending
  }
  listener_.reset();
  remove_socket_file(config_.socket_path, socket_file_);
  remove_socket_file(config_.control_socket_path, control_file_);
}

Status Daemon::run() { return reactor_->run(); }

MetricsSnapshot Daemon::metrics_snapshot() const {
  MetricsSnapshot s;
  s.status = scheduler_.snapshot(clock_.now());
  s.stats = stats_;
  s.sessions = sessions_.size();
  s.start_time_s = start_time_s_;
  s.version = NVSHARE_VERSION;
  return s;
}

void Daemon::load_state() {
  if (config_.state_file.empty()) {
    NVSHARE_WARN(
        "no state file: after a restart, limits stay provisional until the control plane has "
        "pushed them again");
    return;
  }
  state_writer_ = std::make_unique<StateWriter>(config_.state_file);
  auto text = read_state_file(config_.state_file);
  if (!text) {
    NVSHARE_ERROR("state file: %s; limits are provisional until the control plane pushes them",
                  text.error().message.c_str());
    return;
  }
  if (!text.value()) {
    NVSHARE_INFO(
        "state file %s does not exist yet: limits are provisional until the control "
        "plane pushes them",
        config_.state_file.c_str());
    return;
  }
  auto state = parse_state(*text.value());
  if (!state) {
    // Kept for a person to look at; a fresh one is written at the next change.
    const std::string aside = config_.state_file + ".unreadable";
    (void)::rename(config_.state_file.c_str(), aside.c_str());
    NVSHARE_ERROR(
        "state file %s: %s (moved to %s); limits are provisional until the control "
        "plane pushes them",
        config_.state_file.c_str(), state.error().message.c_str(), aside.c_str());
    return;
  }
  scheduler_.restore(state.value(), !config_.gpus.has_value(), clock_.now());
}

void Daemon::save_state() {
  if (!scheduler_.take_state_dirty() || !state_writer_) return;
  state_writer_->submit(render_state(scheduler_.persistent_state()));
}

void Daemon::load_gpus() {
  const MonoTime now = clock_.now();
  if (config_.gpus) {
    if (Status s = scheduler_.set_gpus(*config_.gpus, "gpus knob", now); !s) {
      NVSHARE_ERROR("gpus knob: %s", s.error().message.c_str());
    }
    return;
  }
  auto nvml = open_nvml_inventory();
  auto listed = nvml ? nvml.value()->list() : Result<std::vector<GpuInfo>>(nvml.error());
  if (!listed) {
    NVSHARE_WARN(
        "no GPUs from NVML (%s): clients are refused until the device plugin reports the "
        "node's GPUs (set-gpus) or --gpus names them",
        listed.error().message.c_str());
    return;
  }
  if (Status s = scheduler_.set_gpus(listed.value(), "nvml", now); !s) {
    NVSHARE_ERROR("NVML inventory: %s", s.error().message.c_str());
  }
  if (listed.value().empty()) NVSHARE_WARN("NVML lists no GPU: every client is refused");
}

void Daemon::accept_clients() {
  for (int i = 0; i < kAcceptsPerEvent; ++i) {
    UniqueFd fd(::accept4(listener_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (!fd.valid()) {
      if (errno == EMFILE || errno == ENFILE) {
        shed_one_connection();
      } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR &&
                 errno != ECONNABORTED) {
        NVSHARE_WARN("accept: %s", std::strerror(errno));
      }
      return;
    }
    ClientIdentity identity;
    if (!admit(fd, identity)) continue;  // closed
    const int raw = fd.get();
    const std::uint64_t serial = next_serial_++;
    auto session =
        std::make_unique<ClientSession>(std::move(fd), identity, scheduler_, *this, stats_, serial);
    if (Status s = reactor_->add(
            raw, EPOLLIN, [this, raw](std::uint32_t events) { on_session_event(raw, events); });
        !s) {
      NVSHARE_WARN("client refused: %s", s.error().message.c_str());
      limits_.release(identity);
      continue;
    }
    ++stats_.sessions_opened;
    NVSHARE_DEBUG("connection from pid %d uid %u pod %s", static_cast<int>(identity.pid),
                  static_cast<unsigned>(identity.uid),
                  identity.pod_uid ? identity.pod_uid->c_str() : "-");
    sessions_.emplace(raw, std::move(session));
    hello_deadlines_.push_back(HelloDeadline{clock_.now() + config_.hello_timeout, raw, serial});
  }
}

bool Daemon::admit(UniqueFd& fd, ClientIdentity& identity) {
  auto identified = identify_peer(fd.get(), options_.proc_root);
  if (identified) {
    identity = std::move(identified).value();
  } else if (config_.trust_client_limits) {
    // Local mode: a session without a pod is still scheduled; only its credentials are needed.
    auto peer = peer_credentials(fd.get());
    if (!peer) {
      ++stats_.refused_identity;
      note_refusal("cannot identify the peer: " + peer.error().message);
      fd.reset();
      return false;
    }
    identity.pid = peer.value().pid;
    identity.uid = peer.value().uid;
    identity.gid = peer.value().gid;
  } else {
    // Without a readable identity the session could escape its pod's limits.
    ++stats_.refused_identity;
    note_refusal("cannot identify the peer: " + identified.error().message);
    fd.reset();
    return false;
  }
  if (Status s = limits_.admit(identity); !s) {
    ++stats_.refused_limit;
    note_refusal("pid " + std::to_string(identity.pid) + ": " + s.error().message);
    fd.reset();
    return false;
  }
  return true;
}

void Daemon::shed_one_connection() {
  ++stats_.refused_descriptors;
  spare_fd_.reset();
  UniqueFd doomed(::accept4(listener_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
  doomed.reset();
  spare_fd_ = UniqueFd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  note_refusal(std::string("out of descriptors (") + std::strerror(EMFILE) + ")");
}

void Daemon::note_refusal(const std::string& why) {
  ++refusals_unlogged_;
  const MonoTime now = clock_.now();
  if (now - refusal_logged_at_ < std::chrono::seconds(1)) return;
  NVSHARE_WARN("client connection refused: %s (%llu refused since the last report)", why.c_str(),
               static_cast<unsigned long long>(refusals_unlogged_));
  refusals_unlogged_ = 0;
  refusal_logged_at_ = now;
}

void Daemon::expire_hellos(MonoTime now) {
  while (!hello_deadlines_.empty() && hello_deadlines_.front().at <= now) {
    const HelloDeadline due = hello_deadlines_.front();
    hello_deadlines_.pop_front();
    auto it = sessions_.find(due.fd);
    if (it == sessions_.end()) continue;
    ClientSession& session = *it->second;
    if (session.serial() != due.serial || session.client() != 0 || session.closing()) continue;
    ++stats_.closed_no_hello;
    session.close_with("no hello within " + std::to_string(to_ms(config_.hello_timeout)) + " ms");
    close_list_.push_back(due.fd);
  }
}

std::optional<MonoTime> Daemon::next_timer() const {
  std::optional<MonoTime> next = scheduler_.next_deadline();
  if (!hello_deadlines_.empty() && (!next || hello_deadlines_.front().at < *next)) {
    next = hello_deadlines_.front().at;
  }
  return next;
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

void Daemon::bind(ClientId client, ClientSession& session) {
  by_client_[client] = &session;
  ++welcomed_[process_key(session.peer())];
}

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
    session.collect_written(stats_.decision_latency, stats_.decision_buckets, clock_.now());
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
  if (reason == "end of stream" || reason == kIpcAnswered) {
    NVSHARE_DEBUG("session of client %llu (pid %d) ended", static_cast<unsigned long long>(client),
                  static_cast<int>(session.peer().pid));
  } else if (client == 0) {
    // Never welcomed (a hello refused, garbage, silence): as many as a peer can open, so said at
    // most once a second with the count, like refusals at accept.
    note_refusal("pid " + std::to_string(session.peer().pid) + ": " + reason);
  } else {
    NVSHARE_WARN("closing session of client %llu (pid %d): %s",
                 static_cast<unsigned long long>(client), static_cast<int>(session.peer().pid),
                 reason.c_str());
  }
  reactor_->remove(fd);
  if (client != 0) {
    by_client_.erase(client);
    auto process = welcomed_.find(process_key(session.peer()));
    if (process != welcomed_.end() && --process->second == 0) welcomed_.erase(process);
  }
  limits_.release(session.peer());
  const ClientIdentity peer = session.peer();
  sessions_.erase(it);  // closes the socket
  ++stats_.sessions_closed;
  if (client != 0) scheduler_.disconnect(client, now);
  if (client != 0 && ipc_.size() > 0 && !has_session(peer)) {
    const std::size_t dropped = ipc_.drop_process(peer.pid, peer.start_time);
    if (dropped > 0) {
      NVSHARE_DEBUG("pid %d has no session left: %zu CUDA IPC exports closed",
                    static_cast<int>(peer.pid), dropped);
    }
  }
}

bool Daemon::has_session(const ClientIdentity& process) const {
  return welcomed_.count(process_key(process)) != 0;
}

ClientIdentity Daemon::ipc_identity(const ClientIdentity& peer) const {
  if (peer.pod_uid || !has_session(peer)) return peer;
  for (const auto& [fd, session] : sessions_) {
    if (session->client() == 0 || process_key(session->peer()) != process_key(peer)) continue;
    if (std::optional<std::string> pod = scheduler_.pod_of(session->client())) {
      ClientIdentity who = peer;
      who.pod_uid = std::move(pod);
      return who;
    }
  }
  return peer;
}

SessionHost::IpcReply Daemon::ipc(const ClientIdentity& sender, const protocol::Message& request,
                                  UniqueFd passed) {
  const ClientIdentity peer = ipc_identity(sender);
  IpcReply reply;
  std::visit(
      [&](const auto& m) {
        using T = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<T, protocol::IpcExport>) {
          if (!has_session(peer)) {
            reply.answer.error = "the exporting process has no session with this scheduler";
            return;
          }
          auto token = ipc_.offer(peer, std::move(passed), m.bytes);
          if (!token) {
            reply.answer.error = token.error().message;
            return;
          }
          reply.answer.token = token.value();
          reply.answer.bytes = m.bytes;
          ++stats_.ipc_exports;
        } else if constexpr (std::is_same_v<T, protocol::IpcImport>) {
          auto claimed = ipc_.claim(peer, m.token);
          if (!claimed) {
            ++stats_.ipc_refused;
            reply.answer.error = claimed.error().message;
            return;
          }
          reply.answer.token = m.token;
          reply.answer.bytes = claimed.value().bytes;
          reply.fd = std::move(claimed.value().fd);
          ++stats_.ipc_imports;
        } else if constexpr (std::is_same_v<T, protocol::IpcWithdraw>) {
          reply.answer.token = m.token;
          if (!ipc_.withdraw(peer, m.token)) reply.answer.error = "no such export of this process";
        } else {
          reply.answer.error = "not an ipc request";
        }
      },
      request);
  if (!reply.answer.error.empty()) {
    NVSHARE_DEBUG("CUDA IPC request of pid %d refused: %s", static_cast<int>(peer.pid),
                  reply.answer.error.c_str());
  }
  return reply;
}

void Daemon::before_sleep() {
  scheduler_.run_due(clock_.now());
  expire_hellos(clock_.now());
  // Closing a session frees its grant, which may queue frames for others; flushing may find more
  // broken peers. Both lists only shrink overall (each close removes a session), so this ends.
  while (!flush_list_.empty() || !close_list_.empty()) {
    flush_sessions(clock_.now());
    close_pending(clock_.now());
  }
  save_state();
  if (Status s = reactor_->set_timer(next_timer()); !s) {
    NVSHARE_ERROR("%s", s.error().message.c_str());
  }
}

}  // namespace nvshare::scheduler

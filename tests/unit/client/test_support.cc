#include "test_support.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

extern char** environ;

namespace nvshare::client::testing {
namespace {

std::int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::vector<std::string> build_environment(const EnvChanges& changes) {
  std::vector<std::string> out;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    const std::string name = entry.substr(0, entry.find('='));
    if (changes.count(name) == 0) out.push_back(entry);
  }
  for (const auto& [name, value] : changes) {
    if (value) out.push_back(name + "=" + *value);
  }
  return out;
}

[[noreturn]] void exec_child(const std::vector<std::string>& argv,
                             const std::vector<std::string>& env) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::vector<char*> envp;
  for (const std::string& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  ::execve(args[0], args.data(), envp.data());
  std::fprintf(stderr, "exec %s: %s\n", args[0], std::strerror(errno));
  ::_exit(126);
}

int decode_status(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

}  // namespace

bool wait_until(const std::function<bool()>& condition, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (condition()) return true;
    std::this_thread::sleep_for(2ms);
  }
  return condition();
}

// ---- TempDir ------------------------------------------------------------------------------------

TempDir::TempDir() {
  // Short: unix socket paths are limited to 107 bytes.
  char pattern[] = "/tmp/nvl-XXXXXX";
  const char* made = ::mkdtemp(pattern);
  path_ = made != nullptr ? made : "/tmp";
}

TempDir::~TempDir() {
  std::error_code ignored;
  if (path_ != "/tmp") std::filesystem::remove_all(path_, ignored);
}

// ---- FakeAgent ----------------------------------------------------------------------------------

void FakeAgent::record(const char* call) {
  std::lock_guard lock(mu_);
  calls_.emplace_back(call);
  threads_.push_back(std::this_thread::get_id());
}

Duration FakeAgent::drain() {
  drain_started_ns.store(steady_ns());
  record("drain");
  if (hold_drain_.load()) {
    std::unique_lock lock(mu_);
    drain_cv_.wait_for(lock, 10s, [&] { return drain_released_; });
    drain_released_ = false;
  }
  const Duration delay(drain_delay_ns.load());
  if (delay.count() > 0) std::this_thread::sleep_for(delay);
  ++drains;
  return delay;
}

void FakeAgent::release_drain() {
  std::lock_guard lock(mu_);
  drain_released_ = true;
  hold_drain_.store(false);
  drain_cv_.notify_all();
}

std::uint64_t FakeAgent::swap_out(std::uint64_t target) {
  record("swap_out");
  last_swap_target.store(target);
  const Duration delay(swap_delay_ns.load());
  if (delay.count() > 0) std::this_thread::sleep_for(delay);
  if (!swapped_.load()) ++swap_outs;  // the first step of a swap-out
  swapped_.store(true);
  const std::uint64_t total = swap_bytes.load();
  const std::uint64_t left = total - std::min(total, out_bytes_.load());
  const std::uint64_t moved = target == 0 ? left : std::min(left, target);
  out_bytes_ += moved;
  room_back_ = 0;
  return moved;
}

std::uint64_t FakeAgent::swap_in(std::uint64_t limit) {
  record("swap_in");
  const Duration delay(swap_delay_ns.load());
  if (delay.count() > 0) std::this_thread::sleep_for(delay);
  ++(limit == 0 ? swap_ins : room_swap_ins);
  const std::uint64_t out = out_bytes_.load();
  const std::uint64_t moved = limit == 0 ? out : std::min(out, limit);
  out_bytes_ -= moved;
  if (limit == 0) swapped_.store(false);
  room_back_ = limit == 0 ? 0 : room_back_.load() + moved;
  return moved;
}

Duration FakeAgent::idle_for() {
  record("idle_for");
  ++idle_queries;
  return Duration(idle_ns_.load());
}

DeviceUsage FakeAgent::usage() {
  record("usage");
  std::lock_guard lock(mu_);
  DeviceUsage usage = usage_;
  // As the library reports it: swapped out, on the host, but for what came back into room.
  if (swapped_.load()) usage.resident_bytes = std::min(usage.allocated_bytes, room_back_.load());
  return usage;
}

void FakeAgent::set_usage(DeviceUsage usage) {
  std::lock_guard lock(mu_);
  usage_ = usage;
}

void FakeAgent::limits_unknown() { record("limits_unknown"); }

void FakeAgent::apply_limits(const protocol::Limits& limits) {
  record("apply_limits");
  std::lock_guard lock(mu_);
  limits_.push_back(limits);
}

std::vector<protocol::Limits> FakeAgent::limits() const {
  std::lock_guard lock(mu_);
  return limits_;
}

std::vector<std::string> FakeAgent::calls() const {
  std::lock_guard lock(mu_);
  return calls_;
}

bool FakeAgent::called_only_from_one_thread_other_than(std::thread::id forbidden) const {
  std::lock_guard lock(mu_);
  if (threads_.empty()) return true;
  for (const std::thread::id& id : threads_) {
    if (id != threads_.front() || id == forbidden) return false;
  }
  return true;
}

// ---- ScriptedPeer -------------------------------------------------------------------------------

ScriptedPeer::ScriptedPeer(UniqueFd fd) : fd_(std::move(fd)) {}

std::optional<protocol::Message> ScriptedPeer::next(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    auto frame = decoder_.next();
    if (!frame) return std::nullopt;  // malformed: the test sees nothing
    if (frame.value()) return std::move(frame.value()->message);
    if (eof_ || !fd_.valid()) return std::nullopt;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return std::nullopt;
    pollfd p{fd_.get(), POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(left.count()));
    if (ready <= 0) continue;
    std::array<std::uint8_t, 4096> buffer;
    const ssize_t n = ::recv(fd_.get(), buffer.data(), buffer.size(), 0);
    if (n <= 0) {
      eof_ = true;
      continue;
    }
    decoder_.feed(std::span<const std::uint8_t>(buffer.data(), static_cast<std::size_t>(n)));
  }
}

std::optional<protocol::Message> ScriptedPeer::next_skipping_usage(
    std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    auto message = next(std::max(left, 0ms));
    if (!message) return std::nullopt;
    if (const auto* usage = std::get_if<protocol::Usage>(&*message)) {
      usage_.push_back(*usage);
      continue;
    }
    return message;
  }
}

bool ScriptedPeer::quiet_for(std::chrono::milliseconds period) {
  auto message = next_skipping_usage(period);
  if (message) last_unexpected_ = std::string(protocol::to_string(protocol::type_of(*message)));
  return !message.has_value();
}

bool ScriptedPeer::closed_within(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!eof_ && std::chrono::steady_clock::now() < deadline) {
    (void)next(std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now()));
  }
  return eof_;
}

void ScriptedPeer::send(const protocol::Message& message) {
  auto bytes = protocol::encode(message);
  if (!bytes || !fd_.valid()) return;
  (void)write_all(fd_.get(), bytes.value(), 2000);
}

std::optional<protocol::Hello> ScriptedPeer::handshake(std::uint64_t client_id) {
  auto hello = expect<protocol::Hello>();
  if (!hello) return std::nullopt;
  send(protocol::Welcome{protocol::kMaxVersion, client_id, 0});
  // Every new session reports its usage right after the welcome.
  auto usage = next(3000ms);
  if (!usage || !std::holds_alternative<protocol::Usage>(*usage)) return std::nullopt;
  usage_.push_back(std::get<protocol::Usage>(*usage));
  return hello;
}

// ---- ScriptedScheduler --------------------------------------------------------------------------

ScriptedScheduler::ScriptedScheduler(std::string path) : path_(std::move(path)) {
  auto fd = listen_unix(path_, 0600);
  if (fd) listener_ = std::move(fd.value());
}

ScriptedScheduler::~ScriptedScheduler() { shut(); }

std::unique_ptr<ScriptedPeer> ScriptedScheduler::accept(std::chrono::milliseconds timeout) {
  if (!listener_.valid()) return nullptr;
  pollfd p{listener_.get(), POLLIN, 0};
  if (::poll(&p, 1, static_cast<int>(timeout.count())) <= 0) return nullptr;
  UniqueFd fd(::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
  if (!fd.valid()) return nullptr;
  return std::make_unique<ScriptedPeer>(std::move(fd));
}

void ScriptedScheduler::shut() {
  if (!listener_.valid()) return;
  listener_.reset();
  ::unlink(path_.c_str());
}

// ---- StderrCapture ------------------------------------------------------------------------------

StderrCapture::StderrCapture() {
  char pattern[] = "/tmp/nvl-stderr-XXXXXX";
  const int fd = ::mkstemp(pattern);
  path_ = pattern;
  std::fflush(stderr);
  saved_ = ::dup(STDERR_FILENO);
  ::dup2(fd, STDERR_FILENO);
  ::close(fd);
}

StderrCapture::~StderrCapture() {
  std::fflush(stderr);
  ::dup2(saved_, STDERR_FILENO);
  ::close(saved_);
  ::unlink(path_.c_str());
}

std::string StderrCapture::text() const {
  std::ifstream in(path_);
  std::stringstream out;
  out << in.rdbuf();
  return out.str();
}

int count_occurrences(const std::string& text, const std::string& needle) {
  int count = 0;
  for (std::size_t at = text.find(needle); at != std::string::npos;
       at = text.find(needle, at + needle.size())) {
    ++count;
  }
  return count;
}

// ---- processes ----------------------------------------------------------------------------------

ProcessResult run_process(const std::vector<std::string>& argv, const EnvChanges& env,
                          std::chrono::milliseconds timeout) {
  ProcessResult result;
  int out_pipe[2];
  int err_pipe[2];
  if (::pipe2(out_pipe, O_CLOEXEC) != 0 || ::pipe2(err_pipe, O_CLOEXEC) != 0) return result;
  const std::vector<std::string> environment = build_environment(env);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(out_pipe[1], STDOUT_FILENO);
    ::dup2(err_pipe[1], STDERR_FILENO);
    exec_child(argv, environment);
  }
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  // Read both pipes until both close. A detached grandchild (a scheduler) gets its own output
  // descriptors, so the pipes close when the direct child exits.
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  std::string* sinks[2] = {&result.out, &result.err};
  int open_count = 2;
  bool timed_out = false;
  while (open_count > 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    if (::poll(fds, 2, static_cast<int>(left.count())) <= 0) continue;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      char buffer[4096];
      const ssize_t n = ::read(fds[i].fd, buffer, sizeof buffer);
      if (n <= 0) {
        ::close(fds[i].fd);
        fds[i].fd = -1;
        --open_count;
      } else {
        sinks[i]->append(buffer, static_cast<std::size_t>(n));
      }
    }
  }
  for (pollfd& p : fds) {
    if (p.fd >= 0) ::close(p.fd);
  }
  if (timed_out) ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
  result.exit_code = timed_out ? -1 : decode_status(status);
  return result;
}

pid_t start_process(const std::vector<std::string>& argv, const EnvChanges& env,
                    const std::string& log) {
  const std::vector<std::string> environment = build_environment(env);
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int fd = log.empty() ? ::open("/dev/null", O_WRONLY)
                               : ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
    if (fd >= 0) {
      ::dup2(fd, STDOUT_FILENO);
      ::dup2(fd, STDERR_FILENO);
    }
    exec_child(argv, environment);
  }
  return pid;
}

int wait_process(pid_t pid, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    int status = 0;
    const pid_t done = ::waitpid(pid, &status, WNOHANG);
    if (done == pid) return decode_status(status);
    if (done < 0) return -1;
    if (std::chrono::steady_clock::now() >= deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(5ms);
  }
}

pid_t listener_pid(const std::string& socket) {
  auto fd = connect_unix(socket);
  if (!fd) return 0;
  auto peer = peer_credentials(fd.value().get());
  return peer ? peer.value().pid : 0;
}

SchedulerProcess::SchedulerProcess(const TempDir& dir, const std::vector<std::string>& extra_args)
    : socket_(dir.file("sched.sock")), log_(dir.file("sched.log")) {
  // The GPU the link tests name, with the 1Gi they give it; state beside the sockets, so a
  // restarted scheduler in the same directory finds it. Later flags win.
  std::vector<std::string> argv = {NVSHARE_SCHEDULER_BIN,
                                   "--socket",
                                   socket_,
                                   "--control-socket",
                                   dir.file("control.sock"),
                                   "--state-file",
                                   dir.file("state.json"),
                                   "--gpus",
                                   "GPU-00000000-1111-2222-3333-444444444444=1Gi"};
  argv.insert(argv.end(), extra_args.begin(), extra_args.end());
  pid_ = start_process(argv, {}, log_);
  ready_ = wait_until([&] { return connect_unix(socket_).ok(); }, 5000ms);
}

SchedulerProcess::~SchedulerProcess() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGTERM);
  if (wait_process(pid_, 5000ms) < 0) ::kill(pid_, SIGKILL);
}

std::string SchedulerProcess::log() const {
  std::ifstream in(log_);
  std::stringstream out;
  out << in.rdbuf();
  return out.str();
}

}  // namespace nvshare::client::testing

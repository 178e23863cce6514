#include "chaos_support.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "harness.h"

namespace nvshare::chaos {
namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

bool writable_hierarchy(const std::string& root) {
  struct stat st {};
  return ::stat((root + "/cgroup.procs").c_str(), &st) == 0 && ::access(root.c_str(), W_OK) == 0;
}

}  // namespace

Result<std::unique_ptr<FakePod>> FakePod::create(const std::string& uid, const std::string& under) {
  // The unified hierarchy first (what current nodes run), then a v1 controller any kernel has.
  for (const char* root : {"/sys/fs/cgroup", "/sys/fs/cgroup/unified", "/sys/fs/cgroup/pids",
                           "/sys/fs/cgroup/memory", "/sys/fs/cgroup/cpu"}) {
    if (!writable_hierarchy(root)) continue;
    const std::string dir = std::string(root) + "/" + under + "/pod" + uid;
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) continue;
    return std::unique_ptr<FakePod>(new FakePod(uid, root, dir, under));
  }
  return make_error(
      "no writable cgroup hierarchy (the chaos tests run as root on a node-like "
      "machine)");
}

FakePod::~FakePod() {
  // A cgroup goes once its processes have: give the last ones a moment.
  for (int i = 0; i < 100 && ::rmdir(dir_.c_str()) != 0 && errno == EBUSY; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // Then the directories above it that this made (those still in use stay).
  for (std::filesystem::path up = under_; !up.empty(); up = up.parent_path()) {
    ::rmdir((root_ + "/" + up.string()).c_str());
  }
}

Status FakePod::add(pid_t pid) const {
  std::ofstream out(procs());
  out << pid << "\n";
  out.flush();
  if (!out) return make_error("cannot move pid " + std::to_string(pid) + " into " + procs());
  return Status::Ok();
}

Status write_settings(const std::string& dir, const std::string& text) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  ::chmod(dir.c_str(), 0755);
  const std::string temporary = dir + "/client.conf.tmp";
  {
    std::ofstream out(temporary, std::ios::trunc);
    out << text;
    if (!out) return make_error("cannot write " + temporary);
  }
  ::chmod(temporary.c_str(), 0644);
  if (::rename(temporary.c_str(), (dir + "/client.conf").c_str()) != 0) {
    return make_error(std::string("rename: ") + std::strerror(errno));
  }
  return Status::Ok();
}

SettingsMountPoint::SettingsMountPoint() {
  struct stat st {};
  if (::stat("/etc/nvshare", &st) == 0) {
    ok_ = S_ISDIR(st.st_mode);
    return;
  }
  made_ = ok_ = ::mkdir("/etc/nvshare", 0755) == 0;
}

SettingsMountPoint::~SettingsMountPoint() {
  if (made_) ::rmdir("/etc/nvshare");
}

void raise_descriptor_limit(std::size_t n) {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return;
  if (limit.rlim_cur >= n) return;
  rlimit wanted = limit;
  wanted.rlim_cur = n;
  if (wanted.rlim_max < n) wanted.rlim_max = n;  // root only
  if (::setrlimit(RLIMIT_NOFILE, &wanted) != 0) {
    limit.rlim_cur = limit.rlim_max;
    (void)::setrlimit(RLIMIT_NOFILE, &limit);
  }
}

Result<std::unique_ptr<Attacker>> Attacker::start(uid_t uid, std::size_t max_files,
                                                  std::function<int(int report_fd)> body) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return make_error(std::string("pipe: ") + std::strerror(errno));
  const pid_t pid = e2e::fork_tied_to_test();
  if (pid < 0) return make_error(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    ::close(fds[0]);
    raise_descriptor_limit(max_files);
    if (::setgid(uid) != 0 || ::setuid(uid) != 0) ::_exit(125);
    ::_exit(body(fds[1]));
  }
  ::close(fds[1]);
  std::unique_ptr<Attacker> attacker(new Attacker());
  attacker->pid_ = pid;
  attacker->report_fd_ = fds[0];
  return attacker;
}

Attacker::~Attacker() {
  kill();
  if (report_fd_ >= 0) ::close(report_fd_);
}

void Attacker::kill() {
  if (pid_ > 0 && !exit_code_) {
    ::kill(pid_, SIGKILL);
    (void)wait(5);
  }
}

Result<std::string> Attacker::report(double timeout_s) {
  const double deadline = now_s() + timeout_s;
  for (;;) {
    const std::size_t newline = buffered_.find('\n');
    if (newline != std::string::npos) {
      std::string line = buffered_.substr(0, newline);
      buffered_.erase(0, newline + 1);
      return line;
    }
    const double left = deadline - now_s();
    if (left <= 0) return make_error("no report within " + std::to_string(timeout_s) + " s");
    pollfd p{report_fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left * 1000) + 1) <= 0) continue;
    char buffer[512];
    const ssize_t n = ::read(report_fd_, buffer, sizeof buffer);
    if (n <= 0) return make_error("the attacker ended without a report");
    buffered_.append(buffer, static_cast<std::size_t>(n));
  }
}

Result<int> Attacker::wait(double timeout_s) {
  if (exit_code_) return *exit_code_;
  const double deadline = now_s() + timeout_s;
  while (now_s() < deadline) {
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      return *exit_code_;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return make_error("the attacker is still running");
}

void report_line(int fd, const std::string& line) {
  const std::string text = line + "\n";
  (void)!::write(fd, text.data(), text.size());
}

Footprint footprint(pid_t pid) {
  Footprint out;
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    ++out.fds;
  }
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) out.rss_bytes = std::stoull(line.substr(6)) * 1024;
  }
  return out;
}

}  // namespace nvshare::chaos

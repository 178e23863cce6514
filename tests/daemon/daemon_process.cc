#include "daemon_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "common/unix_socket.h"

namespace nvshare::testing {
namespace {

int decode_status(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

std::vector<char*> c_argv(const std::vector<std::string>& args) {
  std::vector<char*> out;
  for (const std::string& a : args) out.push_back(const_cast<char*>(a.c_str()));
  out.push_back(nullptr);
  return out;
}

}  // namespace

Result<std::unique_ptr<DaemonProcess>> DaemonProcess::start(const std::vector<std::string>& flags,
                                                            const std::string& binary,
                                                            Readiness readiness) {
  std::unique_ptr<DaemonProcess> daemon(new DaemonProcess());
  char tmpl[] = "/tmp/nvshare-daemon-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr)
    return make_error(std::string("mkdtemp: ") + std::strerror(errno));
  daemon->dir_ = tmpl;
  daemon->socket_ = daemon->dir_ + "/scheduler.sock";
  daemon->control_socket_ = daemon->dir_ + "/control.sock";

  // The state file in the test's directory, and the GPU the tests name (flags may say otherwise:
  // the last of a flag wins).
  std::vector<std::string> args = {binary,
                                   "--socket",
                                   daemon->socket_,
                                   "--control-socket",
                                   daemon->control_socket_,
                                   "--state-file",
                                   daemon->dir_ + "/state.json",
                                   "--gpus",
                                   std::string(kTestGpu) + "=80Gi"};
  args.insert(args.end(), flags.begin(), flags.end());
  // A --control-socket among the flags wins (the last flag does), and is the one waited for.
  for (std::size_t i = 0; i + 1 < flags.size(); ++i) {
    if (flags[i] == "--control-socket") daemon->control_socket_ = flags[i + 1];
  }
  const std::string log_path = daemon->dir_ + "/scheduler.log";
  const pid_t pid = ::fork();
  if (pid < 0) return make_error(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    // The daemon dies with the test process, whatever happens to the test.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    const int log = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (log >= 0) {
      ::dup2(log, STDOUT_FILENO);
      ::dup2(log, STDERR_FILENO);
    }
    ::setenv("NVSHARE_LOG_LEVEL", "debug", 0);
    auto argv = c_argv(args);
    ::execv(binary.c_str(), argv.data());
    ::_exit(127);
  }
  daemon->pid_ = pid;

  // Ready when both sockets accept (or gone, when the daemon exited).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) {
      daemon->pid_ = -1;
      return make_error("nvshare-scheduler exited with status " +
                        std::to_string(decode_status(status)) + ":\n" + daemon->log());
    }
    if (readiness == Readiness::kClientSocketExists) {
      struct stat st {};
      if (::stat(daemon->socket_.c_str(), &st) == 0) return daemon;
      continue;
    }
    if (connect_unix(daemon->socket_).ok() && connect_unix(daemon->control_socket_).ok()) {
      return daemon;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return make_error("nvshare-scheduler did not start listening within 10 s:\n" + daemon->log());
}

DaemonProcess::~DaemonProcess() {
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    int status;
    ::waitpid(pid_, &status, 0);
  }
  if (!dir_.empty() && std::getenv("NVSHARE_KEEP_TEST_DIRS") == nullptr) {
    std::string command = "rm -rf '" + dir_ + "'";
    (void)std::system(command.c_str());
  }
}

std::string DaemonProcess::log() const {
  std::ifstream in(dir_ + "/scheduler.log");
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

Result<int> DaemonProcess::stop(int signal, std::chrono::milliseconds timeout) {
  if (pid_ <= 0) return make_error("the daemon is not running");
  ::kill(pid_, signal);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    int status = 0;
    const pid_t done = ::waitpid(pid_, &status, WNOHANG);
    if (done == pid_) {
      pid_ = -1;
      return decode_status(status);
    }
    if (std::chrono::steady_clock::now() > deadline) {
      return make_error("the daemon did not exit within " + std::to_string(timeout.count()) +
                        " ms");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

Result<CommandResult> run_command(const std::vector<std::string>& argv,
                                  std::chrono::milliseconds timeout) {
  int out_pipe[2];
  int err_pipe[2];
  if (::pipe2(out_pipe, O_CLOEXEC) != 0 || ::pipe2(err_pipe, O_CLOEXEC) != 0) {
    return make_error(std::string("pipe: ") + std::strerror(errno));
  }
  const pid_t pid = ::fork();
  if (pid < 0) return make_error(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    ::dup2(out_pipe[1], STDOUT_FILENO);
    ::dup2(err_pipe[1], STDERR_FILENO);
    auto args = c_argv(argv);
    ::execv(argv[0].c_str(), args.data());
    ::_exit(127);
  }
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  CommandResult result;
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  std::string* sinks[2] = {&result.out, &result.err};
  int open_count = 2;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (open_count > 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    if (::poll(fds, 2, static_cast<int>(left.count())) <= 0) continue;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP))) continue;
      char buffer[8192];
      const ssize_t n = ::read(fds[i].fd, buffer, sizeof buffer);
      if (n > 0) {
        sinks[i]->append(buffer, static_cast<std::size_t>(n));
      } else {
        ::close(fds[i].fd);
        fds[i].fd = -1;
        --open_count;
      }
    }
  }
  for (auto& p : fds) {
    if (p.fd >= 0) ::close(p.fd);
  }
  int status = 0;
  if (open_count > 0) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
    return make_error(argv[0] + " did not finish within " + std::to_string(timeout.count()) +
                      " ms");
  }
  ::waitpid(pid, &status, 0);
  result.exit_code = decode_status(status);
  return result;
}

}  // namespace nvshare::testing

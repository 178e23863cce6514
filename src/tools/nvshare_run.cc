// nvshare-run: runs a command under libnvshare.so on a workstation or notebook host, starting a
// local scheduler when none is running.
//
//   nvshare-run [--gpu UUID|INDEX] [--memory-limit Q] [--core-limit P] [--memory-mode M]
//               [--priority C] [--socket PATH] -- CMD...
//   nvshare-run [--socket PATH] --stop-scheduler
//
// What it does, in order:
//  1. finds libnvshare.so: $NVSHARE_LIBRARY, else next to this executable (../lib, its own
//     directory), else the build tree (../client relative to src/tools);
//  2. picks the scheduler socket: --socket, else $NVSHARE_SOCKET, else the system socket as
//     root and a per-user one otherwise ($XDG_RUNTIME_DIR/nvshare/scheduler.sock or
//     /tmp/nvshare-$UID/scheduler.sock, in a private directory);
//  3. when nothing accepts on that socket, starts nvshare-scheduler ($NVSHARE_SCHEDULER_BIN,
//     else next to this executable, else the build tree, else $PATH) detached from this
//     process, in local mode (--trust-client-limits: the limits a process declares are
//     honoured), with its log file next to the socket and its control socket there too (the
//     system socket gets the system control socket, default_paths.h), and waits (at most
//     5 s) until it accepts; a lock file next to the socket keeps two nvshare-runs from
//     starting two schedulers;
//  4. asks the scheduler (its control socket) which GPUs it knows: one that knows none refuses
//     every client, which would then run unscheduled. A local scheduler of ours that knows none is
//     stopped and started again (the GPUs may have appeared since, or its environment lacked the
//     driver); if it still knows none, nvshare-run fails when a limit only the scheduler enforces
//     was asked for (--core-limit, --priority) and otherwise says the command runs unscheduled.
//     --gpu is checked against the GPUs it knows;
//  5. runs the command with LD_PRELOAD (the library first), NVSHARE_SOCKET, and the declared limits
//     (NVSHARE_MEMORY_LIMIT, NVSHARE_CORE_LIMIT), the memory mode (NVSHARE_MEMORY_MODE), the
//     priority class (NVSHARE_PRIORITY) and
//     CUDA_VISIBLE_DEVICES when asked; SIGINT,
//     SIGTERM, SIGHUP and SIGQUIT sent to nvshare-run are passed on to the command.
//
// Exit status: the command's; 128+N when it was killed by signal N; 127 when the command is not
// found; 126 when it cannot be executed; 125 when nvshare-run itself failed (no library, the
// scheduler would not start); 2 for a usage error.
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "common/default_paths.h"
#include "common/knob_parse.h"
#include "common/memory_mode.h"
#include "common/priority.h"
#include "common/quantity.h"
#include "common/result.h"
#include "common/shared_knobs.h"
#include "common/unix_socket.h"
#include "control/client.h"

#ifndef NVSHARE_VERSION
#define NVSHARE_VERSION "0.0.0"
#endif

namespace {

using nvshare::Error;
using nvshare::make_error;
using nvshare::Result;
using nvshare::Status;

constexpr int kExitUsage = 2;
constexpr int kExitFailed = 125;
constexpr int kExitCannotExecute = 126;
constexpr int kExitNotFound = 127;
constexpr auto kSchedulerStartTimeout = std::chrono::seconds(5);

constexpr const char* kUsage =
    R"(Usage: nvshare-run [OPTIONS] [--] COMMAND [ARGS...]

Runs COMMAND under libnvshare.so, so that its GPU work is scheduled by nvshare-scheduler; starts a
local scheduler first when none is running on the socket.

Options:
  --gpu UUID|INDEX       the GPU the command sees (sets CUDA_VISIBLE_DEVICES)
  --memory-limit Q       memory limit per GPU, a quantity such as 4Gi or 512Mi
                         (NVSHARE_MEMORY_LIMIT)
  --core-limit P         share of GPU time in percent, 1..100 (NVSHARE_CORE_LIMIT)
  --memory-mode M        how device allocations are backed: device (the default: swapped by
                         copies), unified (managed memory: one job larger than its GPU) or plain
                         (never swapped) (NVSHARE_MEMORY_MODE)
  --priority C           priority class: high, normal or low (NVSHARE_PRIORITY; the local
                         scheduler honours it, docs/scheduling.md)
  --socket PATH          the scheduler's client socket (default: $NVSHARE_SOCKET; else
                         /var/run/nvshare/scheduler.sock as root, otherwise
                         $XDG_RUNTIME_DIR/nvshare/scheduler.sock or
                         /tmp/nvshare-$UID/scheduler.sock)
  --stop-scheduler       stop the local scheduler on the socket (one nvshare-run started) and exit
  --help                 this text
  --version              the version

A scheduler started here runs detached in local mode (--trust-client-limits), with its log and its
state next to the client socket and its control socket there too (scheduler.sock: control.sock,
scheduler.log and scheduler.state.json), except that the system socket
/var/run/nvshare/scheduler.sock gets the system control socket /var/run/nvshare-control/control.sock
and the system state file /var/lib/nvshare/scheduler/state.json. It learns the GPUs from NVML. It
keeps running after the command ends, for the next one.

Environment: NVSHARE_LIBRARY (the library to preload), NVSHARE_SCHEDULER_BIN (the scheduler to
start); every other NVSHARE_* variable reaches the command's library and the scheduler as is (see
docs/configuration.md).

Exit status: the command's, 128+N if it was killed by signal N, 127 command not found, 126 command
not executable, 125 nvshare-run failed, 2 usage error.
)";

struct Options {
  std::optional<std::string> gpu;
  std::optional<std::string> memory_limit;
  std::optional<std::string> core_limit;
  std::optional<std::string> memory_mode;
  std::optional<std::string> priority;
  std::optional<std::string> socket;
  std::vector<std::string> command;
  bool help = false;
  bool version = false;
  bool stop_scheduler = false;
};

// Where the scheduler's files go for one client socket.
struct SchedulerPaths {
  std::string socket;
  std::string control_socket;
  std::string log;
  std::string lock;
  std::string state;
};

int usage_error(const std::string& message) {
  std::fprintf(stderr, "nvshare-run: %s\nRun 'nvshare-run --help' for usage.\n", message.c_str());
  return kExitUsage;
}

int failure(const std::string& message) {
  std::fprintf(stderr, "nvshare-run: %s\n", message.c_str());
  return kExitFailed;
}

Result<Options> parse_arguments(int argc, char** argv) {
  Options options;
  int i = 1;
  for (; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg.empty() || arg[0] != '-') break;  // the command starts here
    if (arg == "--help" || arg == "-h") {
      options.help = true;
      return options;
    }
    if (arg == "--version") {
      options.version = true;
      return options;
    }
    if (arg == "--stop-scheduler") {
      options.stop_scheduler = true;
      continue;
    }
    std::string_view name = arg;
    std::optional<std::string> value;
    if (const auto eq = arg.find('='); eq != std::string_view::npos) {
      name = arg.substr(0, eq);
      value = std::string(arg.substr(eq + 1));
    }
    std::optional<std::string>* slot = nullptr;
    if (name == "--gpu") {
      slot = &options.gpu;
    } else if (name == "--memory-limit") {
      slot = &options.memory_limit;
    } else if (name == "--core-limit") {
      slot = &options.core_limit;
    } else if (name == "--memory-mode") {
      slot = &options.memory_mode;
    } else if (name == "--priority") {
      slot = &options.priority;
    } else if (name == "--socket") {
      slot = &options.socket;
    } else {
      return make_error("unknown option " + std::string(name));
    }
    if (!value) {
      if (i + 1 >= argc) return make_error("option " + std::string(name) + " needs a value");
      value = argv[++i];
    }
    if (value->empty()) return make_error("option " + std::string(name) + " has an empty value");
    *slot = *value;
  }
  for (; i < argc; ++i) options.command.emplace_back(argv[i]);
  if (options.memory_limit) {
    auto parsed = nvshare::parse_memory_quantity(*options.memory_limit);
    if (!parsed) return make_error("--memory-limit: " + parsed.error().message);
    if (parsed.value() == 0) {
      return make_error("--memory-limit: 0 is not a limit (leave the option out for none)");
    }
  }
  if (options.core_limit) {
    if (auto parsed = nvshare::parse_percent(*options.core_limit); !parsed) {
      return make_error("--core-limit: " + parsed.error().message);
    }
  }
  if (options.memory_mode && !nvshare::parse_memory_mode(*options.memory_mode)) {
    return make_error("--memory-mode: " + *options.memory_mode + " is not one of " +
                      std::string(nvshare::kMemoryModeWords));
  }
  if (options.priority && !nvshare::parse_priority(*options.priority)) {
    return make_error("--priority: " + *options.priority + " is not one of " +
                      std::string(nvshare::kPriorityWords));
  }
  return options;
}

std::string errno_text(int err = errno) { return std::strerror(err); }

bool is_executable_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

bool is_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string absolute(const std::string& path) {
  char resolved[PATH_MAX];
  return ::realpath(path.c_str(), resolved) != nullptr ? std::string(resolved) : path;
}

std::string own_directory() {
  char buffer[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", buffer, sizeof buffer - 1);
  if (n <= 0) return ".";
  std::string path(buffer, static_cast<std::size_t>(n));
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash == 0 ? 1 : slash);
}

std::string directory_of(const std::string& path) {
  const auto slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

// NVSHARE_LIBRARY and NVSHARE_SCHEDULER_BIN are not knobs of the library or of a daemon: they
// tell nvshare-run where its own pieces are (--help lists them), and are checked here.
Result<std::string> find_library() {
  if (const char* env = std::getenv("NVSHARE_LIBRARY"); env != nullptr && *env != '\0') {
    if (!is_file(env)) return make_error("NVSHARE_LIBRARY=" + std::string(env) + " is not a file");
    return absolute(env);
  }
  const std::string dir = own_directory();
  const std::vector<std::string> candidates = {
      dir + "/../lib/libnvshare.so", dir + "/libnvshare.so", dir + "/../client/libnvshare.so"};
  std::string looked;
  for (const std::string& candidate : candidates) {
    if (is_file(candidate)) return absolute(candidate);
    looked += (looked.empty() ? "" : ", ") + candidate;
  }
  return make_error("cannot find libnvshare.so (looked at " + looked +
                    "); set NVSHARE_LIBRARY to its path");
}

Result<std::string> find_scheduler() {
  if (const char* env = std::getenv("NVSHARE_SCHEDULER_BIN"); env != nullptr && *env != '\0') {
    if (!is_executable_file(env)) {
      return make_error("NVSHARE_SCHEDULER_BIN=" + std::string(env) + " is not an executable file");
    }
    return absolute(env);
  }
  const std::string dir = own_directory();
  for (const std::string& candidate :
       {dir + "/nvshare-scheduler", dir + "/../scheduler/nvshare-scheduler"}) {
    if (is_executable_file(candidate)) return absolute(candidate);
  }
  // Not a knob: the command's own search path.
  if (const char* path = std::getenv("PATH"); path != nullptr) {
    std::string_view rest = path;
    while (!rest.empty()) {
      const auto colon = rest.find(':');
      std::string entry(rest.substr(0, colon));
      rest = colon == std::string_view::npos ? std::string_view() : rest.substr(colon + 1);
      if (entry.empty()) entry = ".";
      if (const std::string candidate = entry + "/nvshare-scheduler";
          is_executable_file(candidate)) {
        return absolute(candidate);
      }
    }
  }
  return make_error(
      "cannot find nvshare-scheduler (next to nvshare-run or on PATH); set NVSHARE_SCHEDULER_BIN "
      "to its path");
}

// Creates `dir` (and missing parents) with `mode`. A per-user directory in a shared place must be
// ours and private, or another user could plant a socket there; it must not be a symbolic link
// either. Other directories may be links (/var/run is one to /run on most distributions).
Status make_directory(const std::string& dir, mode_t mode, bool must_be_private) {
  if (dir.empty() || dir == "/" || dir == ".") return Status::Ok();
  const auto status_of = [must_be_private](const std::string& path, struct stat* st) {
    return must_be_private ? ::lstat(path.c_str(), st) : ::stat(path.c_str(), st);
  };
  struct stat st {};
  if (status_of(dir, &st) != 0) {
    if (Status parent = make_directory(directory_of(dir), 0755, false); !parent) return parent;
    if (::mkdir(dir.c_str(), mode) != 0 && errno != EEXIST) {
      return make_error("cannot create directory " + dir + ": " + errno_text());
    }
    if (status_of(dir, &st) != 0) return make_error("cannot stat " + dir + ": " + errno_text());
  }
  if (!S_ISDIR(st.st_mode)) return make_error(dir + " exists and is not a directory");
  if (must_be_private && (st.st_uid != ::getuid() || (st.st_mode & 0077) != 0)) {
    return make_error(dir + " must be a directory owned by uid " + std::to_string(::getuid()) +
                      " and not accessible to others");
  }
  return Status::Ok();
}

// The library's and the scheduler's socket knob, by its environment variable (NVSHARE_SOCKET).
const std::string kSocketVariable =
    "NVSHARE_" + nvshare::knobparse::upper_snake(nvshare::knobtable::kSocket.name);

Result<SchedulerPaths> scheduler_paths(const Options& options) {
  SchedulerPaths paths;
  bool per_user = false;
  if (options.socket) {
    paths.socket = *options.socket;
  } else if (const char* env = std::getenv(kSocketVariable.c_str());
             env != nullptr && *env != '\0') {
    paths.socket = env;
  } else if (::geteuid() == 0) {
    paths.socket = nvshare::kDefaultSocketPath;
  } else {
    // Not a knob: the user's runtime directory, as the session sets it.
    const char* runtime = std::getenv("XDG_RUNTIME_DIR");
    struct stat st {};
    const std::string dir =
        runtime != nullptr && *runtime == '/' && ::stat(runtime, &st) == 0 && S_ISDIR(st.st_mode)
            ? std::string(runtime) + "/nvshare"
            : "/tmp/nvshare-" + std::to_string(::getuid());
    paths.socket = dir + "/scheduler.sock";
    per_user = true;
  }
  if (paths.socket[0] != '/') {
    char cwd[PATH_MAX];
    if (::getcwd(cwd, sizeof cwd) == nullptr) return make_error("getcwd: " + errno_text());
    paths.socket = std::string(cwd) + "/" + paths.socket;
  }
  // The same check as the scheduler's and the library's socket knob (common/shared_knobs.h).
  if (auto checked = nvshare::knobparse::parse_socket_path(paths.socket); !checked) {
    return make_error("the scheduler's socket: " + checked.error().message);
  }
  const std::string dir = directory_of(paths.socket);
  if (Status made = make_directory(dir, per_user ? 0700 : 0755, per_user); !made) {
    return made.error();
  }
  const std::string base = paths.socket.substr(dir.size() + (dir == "/" ? 0 : 1));
  std::string stem = paths.socket;
  if (stem.size() > 5 && stem.compare(stem.size() - 5, 5, ".sock") == 0) {
    stem.resize(stem.size() - 5);
  }
  // The system socket gets the system control socket (in its own directory, which the scheduler
  // creates), so that nvsharectl finds it without flags. Elsewhere the control socket lies next to
  // the client socket, named like the system pair when the socket is called scheduler.sock.
  if (paths.socket == nvshare::kDefaultSocketPath) {
    paths.control_socket = nvshare::kDefaultControlSocketPath;
  } else {
    paths.control_socket = base == "scheduler.sock" ? (dir == "/" ? "" : dir) + "/control.sock"
                                                    : stem + ".control.sock";
  }
  paths.log = stem + ".log";
  paths.lock = stem + ".lock";
  paths.state = paths.socket == nvshare::kDefaultSocketPath ? nvshare::kDefaultStateFile
                                                            : stem + ".state.json";
  return paths;
}

bool scheduler_accepts(const std::string& socket) { return nvshare::connect_unix(socket).ok(); }

std::string log_tail(const std::string& path) {
  nvshare::UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return {};
  const off_t size = ::lseek(fd.get(), 0, SEEK_END);
  const off_t from = size > 2048 ? size - 2048 : 0;
  std::string text(static_cast<std::size_t>(size - from), '\0');
  if (::pread(fd.get(), text.data(), text.size(), from) <= 0) return {};
  return text;
}

// Starts the scheduler in its own session, reparented to init (double fork), its output in the log
// file. A close-on-exec pipe reports an exec failure back.
Status spawn_scheduler(const std::string& binary, const SchedulerPaths& paths) {
  nvshare::UniqueFd log(::open(paths.log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600));
  if (!log.valid())
    return make_error("cannot open the scheduler log " + paths.log + ": " + errno_text());
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) return make_error("pipe: " + errno_text());
  nvshare::UniqueFd report_read(pipe_fds[0]);
  nvshare::UniqueFd report_write(pipe_fds[1]);
  std::vector<std::string> args = {
      binary,         "--socket",  paths.socket,           "--control-socket", paths.control_socket,
      "--state-file", paths.state, "--trust-client-limits"};
  std::vector<char*> argv;
  argv.reserve(args.size() + 1);
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);

  const pid_t first = ::fork();
  if (first < 0) return make_error("fork: " + errno_text());
  if (first == 0) {
    ::setsid();
    const pid_t second = ::fork();
    if (second != 0) ::_exit(second < 0 ? 1 : 0);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE}) ::signal(sig, SIG_DFL);
    const int null_fd = ::open("/dev/null", O_RDONLY);
    if (null_fd >= 0) ::dup2(null_fd, STDIN_FILENO);
    ::dup2(log.get(), STDOUT_FILENO);
    ::dup2(log.get(), STDERR_FILENO);
    if (::chdir("/") != 0) {
      // Staying in the current directory only keeps it busy; not worth failing for.
    }
    ::execv(binary.c_str(), argv.data());
    const int err = errno;
    [[maybe_unused]] const ssize_t n = ::write(report_write.get(), &err, sizeof err);
    ::_exit(127);
  }
  report_write.reset();
  int status = 0;
  while (::waitpid(first, &status, 0) < 0 && errno == EINTR) {
  }
  int err = 0;
  ssize_t n;
  do {
    n = ::read(report_read.get(), &err, sizeof err);
  } while (n < 0 && errno == EINTR);
  if (n == static_cast<ssize_t>(sizeof err)) {
    return make_error("cannot run " + binary + ": " + errno_text(err));
  }
  return Status::Ok();
}

// Makes sure a scheduler accepts on the socket, starting one when none does.
Status ensure_scheduler(const SchedulerPaths& paths) {
  if (scheduler_accepts(paths.socket)) return Status::Ok();
  // Two nvshare-runs starting at once: the second waits here and then finds the first's scheduler.
  nvshare::UniqueFd lock(::open(paths.lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  if (lock.valid()) {
    while (::flock(lock.get(), LOCK_EX) != 0 && errno == EINTR) {
    }
  }
  if (scheduler_accepts(paths.socket)) return Status::Ok();
  auto binary = find_scheduler();
  if (!binary) return binary.error();
  if (Status spawned = spawn_scheduler(binary.value(), paths); !spawned) return spawned;
  const auto deadline = std::chrono::steady_clock::now() + kSchedulerStartTimeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (scheduler_accepts(paths.socket)) {
      std::fprintf(stderr, "nvshare-run: started nvshare-scheduler on %s (log %s)\n",
                   paths.socket.c_str(), paths.log.c_str());
      return Status::Ok();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::string message = "the scheduler (" + binary.value() + ") did not accept connections on " +
                        paths.socket + " within 5 s; its log is " + paths.log;
  if (const std::string tail = log_tail(paths.log); !tail.empty()) {
    message += ", ending with:\n" + tail;
  }
  return make_error(message);
}

// What the scheduler says of itself on its control socket.
struct SchedulerFacts {
  pid_t pid = 0;
  std::vector<std::string> gpus;  // the GPUs it knows: it refuses clients of any other
};

Result<SchedulerFacts> ask_scheduler(const SchedulerPaths& paths) {
  auto reply = nvshare::control::ask(paths.control_socket, nvshare::control::StatusRequest{}, 2000);
  if (!reply) return reply.error();
  if (reply.value().refused()) return make_error(reply.value().refusal());
  const nvshare::control::SchedulerInfo& info = reply.value().answer().scheduler;
  return SchedulerFacts{static_cast<pid_t>(info.pid), info.gpus};
}

// The arguments of process `pid`, empty when they cannot be read.
std::vector<std::string> command_line(pid_t pid) {
  nvshare::UniqueFd fd(
      ::open(("/proc/" + std::to_string(pid) + "/cmdline").c_str(), O_RDONLY | O_CLOEXEC));
  std::vector<std::string> args;
  if (!fd.valid()) return args;
  std::string text(8192, '\0');
  const ssize_t n = ::read(fd.get(), text.data(), text.size());
  if (n <= 0) return args;
  text.resize(static_cast<std::size_t>(n));
  for (std::size_t at = 0; at < text.size();) {
    const std::size_t end = std::min(text.find('\0', at), text.size());
    args.push_back(text.substr(at, end - at));
    at = end + 1;
  }
  return args;
}

// A scheduler nvshare-run may stop and start again: one it would have started itself (local mode,
// on this socket), run by this user.
bool ours_to_restart(pid_t pid, const SchedulerPaths& paths) {
  struct stat st {};
  if (pid <= 0 || ::stat(("/proc/" + std::to_string(pid)).c_str(), &st) != 0 ||
      st.st_uid != ::geteuid()) {
    return false;
  }
  const std::vector<std::string> args = command_line(pid);
  const auto has = [&](const std::string& word) {
    return std::find(args.begin(), args.end(), word) != args.end();
  };
  return has("--trust-client-limits") && has(paths.socket);
}

Status stop_scheduler(pid_t pid, const SchedulerPaths& paths) {
  if (::kill(pid, SIGTERM) != 0 && errno != ESRCH) {
    return make_error("cannot stop the scheduler (pid " + std::to_string(pid) +
                      "): " + errno_text());
  }
  const auto deadline = std::chrono::steady_clock::now() + kSchedulerStartTimeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (::kill(pid, 0) != 0 && errno == ESRCH && !scheduler_accepts(paths.socket)) {
      return Status::Ok();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return make_error("the scheduler (pid " + std::to_string(pid) + ") did not stop within 5 s");
}

// The last line of the scheduler's log about its GPUs, when the log is ours to read.
std::string gpu_log_line(const SchedulerPaths& paths) {
  const std::string tail = log_tail(paths.log);
  std::string found;
  std::size_t at = 0;
  while (at < tail.size()) {
    const std::size_t end = std::min(tail.find('\n', at), tail.size());
    const std::string line = tail.substr(at, end - at);
    if (line.find("NVML") != std::string::npos || line.find("GPU") != std::string::npos) {
      found = line;
    }
    at = end + 1;
  }
  return found;
}

// CUDA_VISIBLE_DEVICES items that can be checked: indices against the count, GPU UUIDs (or a
// unique prefix, as CUDA takes them) against the list. MIG names are left to CUDA.
Status check_gpu_option(const std::string& value, const std::vector<std::string>& gpus) {
  std::string_view rest = value;
  while (!rest.empty()) {
    const auto comma = rest.find(',');
    const std::string item(rest.substr(0, comma));
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    const bool index = !item.empty() && std::all_of(item.begin(), item.end(),
                                                    [](char ch) { return ch >= '0' && ch <= '9'; });
    if (index && (item.size() > 4 || std::stoul(item) >= gpus.size())) {
      return make_error("--gpu " + item + ": this machine's scheduler knows " +
                        std::to_string(gpus.size()) + " GPU" + (gpus.size() == 1 ? "" : "s") +
                        " (indices 0.." + std::to_string(gpus.size() - 1) + ")");
    }
    if (item.rfind("GPU-", 0) == 0 &&
        std::none_of(gpus.begin(), gpus.end(),
                     [&](const std::string& uuid) { return uuid.rfind(item, 0) == 0; })) {
      std::string known;
      for (const std::string& uuid : gpus) known += (known.empty() ? "" : ", ") + uuid;
      return make_error("--gpu " + item + " is not one of this machine's GPUs (" + known + ")");
    }
  }
  return Status::Ok();
}

// Makes sure the scheduler knows a GPU before the command runs: a client of a scheduler that knows
// none is refused and runs unscheduled. Fails when a limit only the scheduler enforces was asked
// for and cannot be.
Status check_scheduler(const Options& options, const SchedulerPaths& paths) {
  auto facts = ask_scheduler(paths);
  if (!facts) {
    std::fprintf(stderr, "nvshare-run: cannot ask the scheduler which GPUs it knows (%s)\n",
                 facts.error().message.c_str());
    return Status::Ok();
  }
  if (facts.value().gpus.empty() && ours_to_restart(facts.value().pid, paths)) {
    std::fprintf(stderr, "nvshare-run: the scheduler on %s knows no GPU; starting it again\n",
                 paths.socket.c_str());
    if (Status stopped = stop_scheduler(facts.value().pid, paths); !stopped) return stopped;
    if (Status started = ensure_scheduler(paths); !started) return started;
    facts = ask_scheduler(paths);
    if (!facts) return make_error("the restarted scheduler: " + facts.error().message);
  }
  if (!facts.value().gpus.empty()) {
    return options.gpu ? check_gpu_option(*options.gpu, facts.value().gpus) : Status::Ok();
  }
  std::string why = "the scheduler on " + paths.socket + " knows no GPU and refuses every client";
  if (const std::string line = gpu_log_line(paths); !line.empty())
    why += " (its log: " + line + ")";
  if (options.core_limit || options.priority) {
    return make_error(why + "; " + (options.core_limit ? "--core-limit" : "--priority") +
                      " cannot be enforced, so the command was not run");
  }
  std::fprintf(stderr, "nvshare-run: %s; the command runs unscheduled%s\n", why.c_str(),
               options.memory_limit ? " (its --memory-limit still holds)" : "");
  return Status::Ok();
}

// --stop-scheduler: stops the scheduler on the socket when nvshare-run would have started it (this
// user's, in local mode); a scheduler started otherwise is left to whoever started it.
int stop_local_scheduler(const Options& options) {
  auto paths = scheduler_paths(options);
  if (!paths) return failure(paths.error().message);
  if (!scheduler_accepts(paths.value().socket)) {
    std::fprintf(stderr, "nvshare-run: no scheduler runs on %s\n", paths.value().socket.c_str());
    return 0;
  }
  auto facts = ask_scheduler(paths.value());
  if (!facts)
    return failure("cannot ask the scheduler on " + paths.value().socket +
                   " for its pid: " + facts.error().message);
  const pid_t pid = facts.value().pid;
  if (!ours_to_restart(pid, paths.value())) {
    return failure("the scheduler on " + paths.value().socket + " (pid " + std::to_string(pid) +
                   ") was not started by nvshare-run for this user; stop it as it was started");
  }
  if (Status stopped = stop_scheduler(pid, paths.value()); !stopped) {
    return failure(stopped.error().message);
  }
  std::fprintf(stderr, "nvshare-run: stopped nvshare-scheduler (pid %d) on %s\n",
               static_cast<int>(pid), paths.value().socket.c_str());
  return 0;
}

void set_env(const char* name, const std::string& value) { ::setenv(name, value.c_str(), 1); }

// LD_PRELOAD with the library first, keeping what was there (without a second copy of it).
std::string preload_value(const std::string& library) {
  std::string out = library;
  // Not a knob: the command's own preloads, kept after ours.
  const char* existing = std::getenv("LD_PRELOAD");
  if (existing == nullptr) return out;
  std::string_view rest = existing;
  while (!rest.empty()) {
    const auto sep = rest.find_first_of(": ");
    const std::string_view entry = rest.substr(0, sep);
    rest = sep == std::string_view::npos ? std::string_view() : rest.substr(sep + 1);
    if (entry.empty() || entry == library) continue;
    out += ":";
    out += entry;
  }
  return out;
}

// Runs the command and waits for it. The signals to pass on are blocked and taken synchronously
// (sigwaitinfo, with SIGCHLD for the child's end), so none is lost between the fork and the wait
// and no handler runs in signal context. One the terminal sent (SI_KERNEL) is not passed on: the
// command, in the same foreground process group, got it already, and a second copy could count as a
// second Ctrl-C.
int run_command(const std::vector<std::string>& command) {
  constexpr int kForwarded[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};
  sigset_t waited;
  sigset_t previous;
  sigemptyset(&waited);
  for (int sig : kForwarded) sigaddset(&waited, sig);
  sigaddset(&waited, SIGCHLD);
  ::sigprocmask(SIG_BLOCK, &waited, &previous);

  std::vector<std::string> args = command;
  std::vector<char*> argv;
  argv.reserve(args.size() + 1);
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);

  const pid_t child = ::fork();
  if (child < 0) {
    ::sigprocmask(SIG_SETMASK, &previous, nullptr);
    return failure("fork: " + errno_text());
  }
  if (child == 0) {
    ::sigprocmask(SIG_SETMASK, &previous, nullptr);
    ::execvp(argv[0], argv.data());
    const int err = errno;
    if (err == ENOENT) {
      std::fprintf(stderr, "nvshare-run: %s: command not found\n", argv[0]);
      ::_exit(kExitNotFound);
    }
    std::fprintf(stderr, "nvshare-run: %s: %s\n", argv[0], errno_text(err).c_str());
    ::_exit(kExitCannotExecute);
  }

  int status = 0;
  for (;;) {
    const pid_t done = ::waitpid(child, &status, WNOHANG);
    if (done == child) break;
    if (done < 0 && errno != EINTR) return failure("waitpid: " + errno_text());
    siginfo_t info{};
    const int sig = ::sigwaitinfo(&waited, &info);
    if (sig < 0 || sig == SIGCHLD) continue;
    if (info.si_code != SI_KERNEL) ::kill(child, sig);
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return kExitFailed;
}

}  // namespace

int main(int argc, char** argv) {
  auto parsed = parse_arguments(argc, argv);
  if (!parsed) return usage_error(parsed.error().message);
  const Options& options = parsed.value();
  if (options.help) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (options.version) {
    std::printf("nvshare-run %s\n", NVSHARE_VERSION);
    return 0;
  }
  if (options.stop_scheduler) {
    if (!options.command.empty()) return usage_error("--stop-scheduler takes no command");
    return stop_local_scheduler(options);
  }
  if (options.command.empty()) return usage_error("no command given");

  auto library = find_library();
  if (!library) return failure(library.error().message);
  auto paths = scheduler_paths(options);
  if (!paths) return failure(paths.error().message);
  if (Status scheduler = ensure_scheduler(paths.value()); !scheduler) {
    return failure(scheduler.error().message);
  }
  if (Status checked = check_scheduler(options, paths.value()); !checked) {
    return failure(checked.error().message);
  }

  set_env("LD_PRELOAD", preload_value(library.value()));
  set_env(kSocketVariable.c_str(), paths.value().socket);
  if (options.memory_limit) set_env("NVSHARE_MEMORY_LIMIT", *options.memory_limit);
  if (options.core_limit) set_env("NVSHARE_CORE_LIMIT", *options.core_limit);
  if (options.memory_mode) set_env("NVSHARE_MEMORY_MODE", *options.memory_mode);
  if (options.priority) set_env("NVSHARE_PRIORITY", *options.priority);
  if (options.gpu) set_env("CUDA_VISIBLE_DEVICES", *options.gpu);
  return run_command(options.command);
}

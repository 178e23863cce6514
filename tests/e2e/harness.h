// The end-to-end harness: real processes (nvshare-scheduler, nvsharectl, nvshare-trainer under
// libnvshare.so on the simulated GPU), each test in its own temporary directory with its own
// sockets and its own simulated-GPU state file, so tests never see each other.
//
// Contract
//  - Every child is started with a clean NVSHARE_* environment (nothing leaks from the shell that
//    runs ctest) plus the variables the test names, dies with the test process (PDEATHSIG) and is
//    killed and reaped by its owner's destructor.
//  - Timestamps are CLOCK_MONOTONIC seconds, the clock the trainer prints, so a test can subtract
//    its own events (a kill, a set-limits call) from the trainer's.
//  - A failing test prints what it needs to be understood: the trainers' JSON and stderr, the
//    scheduler's log and the simulated GPU's state (E2eTest::TearDown).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/json.h"
#include "common/result.h"

namespace nvshare::e2e {

// Where the programs under test are (compile definitions from tests/e2e/CMakeLists.txt).
struct Programs {
  std::string scheduler;
  std::string ctl;
  std::string library;  // libnvshare.so
  std::string trainer;
  std::string stat;          // nvshare-fakecuda-stat
  std::string fakecuda_dir;  // holds the simulated libcuda.so.1
};
const Programs& programs();

double monotonic_s();
// Prints "[ MEASURE ] <test>: <what> = <value> <unit>" and records it as a test property.
void measure(const std::string& what, double value, const std::string& unit);
void sleep_s(double seconds);

// Environment overrides: a value sets the variable, nullopt removes it.
using Env = std::map<std::string, std::optional<std::string>>;

class TempDir {
 public:
  TempDir();
  ~TempDir();  // removes the directory unless NVSHARE_KEEP_TEST_DIRS is set
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// fork(2) for a child that must not outlive the test: in the child (0 returned) a parent that dies
// takes it along (PR_SET_PDEATHSIG), and one already gone ends it at once; -1 with errno when fork
// fails. The child may call only async-signal-safe functions before exec or _exit.
pid_t fork_tied_to_test();

std::string read_file(const std::string& path);
// The last `lines` lines of `text`.
std::string tail(const std::string& text, std::size_t lines);

// How a child starts besides its environment: as a node would run a pod's process.
struct SpawnOptions {
  // A cgroup.procs file the child moves itself into first (a fake pod: see tests/chaos).
  std::string cgroup_procs;
  // A directory bind-mounted read-only at /etc/nvshare in a mount namespace of the child's own, as
  // the device plugin's Allocate mounts a container's settings (the mount point must exist).
  std::string settings_dir;
  // Drop to this uid and gid (from root) before exec.
  std::optional<uid_t> uid;
  // Another userland: the child chroots into this directory (an older distribution's root, see
  // tests/compat) in a mount namespace of its own, where /proc, /dev and each of `root_binds` are
  // bind-mounted at their own paths, so the programs and files under test keep their paths.
  std::string root;
  std::vector<std::string> root_binds;
};

// A child process with stdout and stderr redirected to files.
class Process {
 public:
  static Result<std::unique_ptr<Process>> spawn(const std::vector<std::string>& argv,
                                                const Env& env, const std::string& stdout_path,
                                                const std::string& stderr_path, bool append = false,
                                                const SpawnOptions& options = {});
  ~Process();  // SIGKILL and reap when still running

  pid_t pid() const { return pid_; }
  // Reaps the child if it has exited; true while it runs.
  bool running();
  // Waits up to `timeout_s`. The exit code, 128 + signal when killed, or an error on timeout.
  Result<int> wait(double timeout_s);
  void kill(int signal);
  std::optional<int> exit_code() const { return exit_code_; }

 private:
  Process() = default;
  pid_t pid_ = -1;
  std::optional<int> exit_code_;
};

struct CommandResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};
// Runs a program to completion (stdout/stderr through files in `dir`).
Result<CommandResult> run_command(const std::vector<std::string>& argv, const std::string& dir,
                                  double timeout_s = 10);

// A private nvshare-scheduler: sockets and state file in `dir`, log in <dir>/scheduler.log
// (appended across restarts so a failure shows every life of the daemon). `env` is its environment
// (the simulated GPU's, so that its NVML sees the GPUs the trainers see).
class Scheduler {
 public:
  Scheduler(std::string dir, std::vector<std::string> flags, Env env = {});
  ~Scheduler();

  // Starts the daemon and returns once both sockets accept connections.
  Status start();
  // SIGKILL, as a crash or an OOM kill would end it: no cleanup of its sockets.
  void kill_hard();
  // SIGTERM and wait.
  void stop();
  bool running();

  const std::string& socket() const { return socket_; }
  const std::string& control_socket() const { return control_socket_; }
  pid_t pid() const { return process_ ? process_->pid() : -1; }
  std::string log() const;

  // The control API's status response (docs/control-api.md).
  Result<Json> status() const;
  // nvsharectl --control-socket ... ARGS
  Result<CommandResult> ctl(const std::vector<std::string>& args) const;

 private:
  std::string dir_;
  std::vector<std::string> flags_;
  Env env_;
  std::string socket_;
  std::string control_socket_;
  std::unique_ptr<Process> process_;
  int lives_ = 0;
};

// The client object of `status` whose pid is `pid` (on any GPU), or nullptr.
const Json* find_client(const Json& status, pid_t pid);
// Member `key` of `object` as a number/string, or a fallback.
double json_number(const Json* object, std::string_view key, double fallback = -1);
std::string json_string(const Json* object, std::string_view key);

// The events of process `pid` in a hand-off trace (NVSHARE_TRACE_FILE), in the order written; lines
// that do not parse (one being written) are skipped. An error when the trace cannot be read.
Result<std::vector<Json>> trace_events(const std::string& trace, pid_t pid);
// The share (%) of [begin, end] (CLOCK_MONOTONIC seconds) during which process `pid` held a grant,
// from the hand-off trace it wrote (NVSHARE_TRACE_FILE): grant to release, a revoke's drain
// included; a grant not yet released counts until `end`. What a compute cap governs, observed from
// the client's side. -1 when the trace cannot be read or the window is empty.
double held_share(const std::string& trace, pid_t pid, double begin, double end);
// The bytes process `pid` moved in the trace's `event`s ("release", "evicted", "grant"): the sum of
// their swap_bytes; -1 when the trace cannot be read.
double swapped_bytes(const std::string& trace, pid_t pid, std::string_view event);
// The times (CLOCK_MONOTONIC seconds) of the first and the last grant in that trace; {-1, -1} when
// it has none.
std::pair<double, double> grant_span(const std::string& trace, pid_t pid);

// A span of CLOCK_MONOTONIC seconds: a kernel's, a grant's.
struct Interval {
  double begin = 0;
  double end = 0;
  int owner = 0;
};
// Kernel intervals [launch_s, done_s] from a trainer's --progress lines.
std::vector<Interval> intervals(const std::vector<Json>& progress, int owner);
// The grants process `pid` held, grant to release (a revoke's drain included), from its hand-off
// trace; a grant not released when the trace ends lasts until `end`. Empty when it cannot be read.
std::vector<Interval> held_intervals(const std::string& trace, pid_t pid, double end);
// Seconds during which intervals of both lists (each in time order) were open at once.
double overlap_s(const std::vector<Interval>& a, const std::vector<Interval>& b);
// Seconds of [begin, end] during which at least one of `spans` (in any order) was open.
double covered_s(std::vector<Interval> spans, double begin, double end);

// One nvshare-trainer run.
struct TrainerOptions {
  TrainerOptions(std::string name_, std::vector<std::string> args_, Env env_ = {},
                 bool preload_ = true, SpawnOptions spawn_ = {})
      : name(std::move(name_)),
        args(std::move(args_)),
        env(std::move(env_)),
        preload(preload_),
        spawn(std::move(spawn_)) {}

  std::string name;               // for messages: "A", "holder", ...
  std::vector<std::string> args;  // nvshare-trainer flags
  Env env;                        // on top of the test's trainer environment
  bool preload = true;            // LD_PRELOAD=libnvshare.so
  SpawnOptions spawn;             // a pod's cgroup, its settings, a uid
  // A command that starts the trainer (a container runtime's `run ...`): argv is launcher, then
  // the trainer and its flags. Empty: the trainer is started directly.
  std::vector<std::string> launcher;
};

class Trainer {
 public:
  Trainer(TrainerOptions options, std::string dir);
  Status start(const Env& base_env);
  Result<int> wait(double timeout_s);
  bool running() { return process_ && process_->running(); }
  void kill(int signal) { process_->kill(signal); }
  pid_t pid() const { return process_ ? process_->pid() : -1; }
  const std::string& name() const { return options_.name; }

  std::string stdout_text() const;
  std::string stderr_text() const;
  // The final JSON object (the first stdout line that parses), or an error naming what was there.
  Result<Json> report() const;
  // The --progress lines seen so far, in order.
  std::vector<Json> progress() const;
  std::string describe() const;  // name, command line, exit code, stdout, the end of stderr

 private:
  TrainerOptions options_;
  std::string dir_;
  std::string stdout_path_;
  std::string stderr_path_;
  std::unique_ptr<Process> process_;
};

// A cap as a capped trainer lived it, from its own side: its hand-off trace (NVSHARE_TRACE_FILE)
// and its --progress lines. A cap governs the time a client holds a grant, and the gate keeps its
// kernels inside its grants. Its kernel time can fall short of the time it held by the host's own
// cost between kernels (launch, synchronize, a simulated kernel that completes late): more under
// the sanitizers or on a busy host, so K x D / wall time is a ceiling there, not a measure of the
// cap.
struct CapUse {
  double held_percent = -1;  // of its first grant to its last, the time it held one
  double ran_in_grants = 0;  // of its kernel time, the fraction inside its grants
  double grants_used = 0;    // of the time it held grants, the fraction its kernels ran
};
CapUse cap_use(const std::string& trace, const Trainer& t);
// Reports `use` (measure) and expects it of a `cap_percent` cap: held within 2 points, kernels
// inside the grants (99% of their time), and the grants used (85% of their time: the gate opened
// when they came).
void expect_cap_held(const CapUse& use, double cap_percent, const std::string& what);

// The program `name` as found on PATH (children are started with execve), or `name` itself.
std::string on_path(const std::string& name);
// `promtool check metrics` on an exposition (written to <dir>/scrape.txt): its exit code and what
// it said.
Result<CommandResult> promtool_check(const std::string& dir, const std::string& exposition);

// A port that was free a moment ago on 127.0.0.1 (0 when none could be had).
int free_port();

struct HttpReply {
  int status = 0;
  std::string body;
};

// GET http://127.0.0.1:port/path, HTTP/1.0, the whole reply (a 10 s read timeout).
Result<HttpReply> http_get(int port, const std::string& path);

}  // namespace nvshare::e2e

#include "harness.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "common/unix_socket.h"
#include "control/client.h"
#include "gtest/gtest.h"

extern char** environ;

namespace nvshare::e2e {
namespace {

int decode_status(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

// The child's environment: ours without anything that would steer nvshare or the fake from the
// shell that runs the tests (a developer's NVSHARE_SOCKET, an LD_PRELOAD), then the overrides.
std::vector<std::string> child_environment(const Env& env) {
  std::map<std::string, std::string> vars;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string_view entry(*e);
    const auto eq = entry.find('=');
    if (eq == std::string_view::npos) continue;
    std::string name(entry.substr(0, eq));
    if (name.rfind("NVSHARE_", 0) == 0 || name == "LD_PRELOAD") continue;
    vars[name] = std::string(entry.substr(eq + 1));
  }
  for (const auto& [name, value] : env) {
    if (value) {
      vars[name] = *value;
    } else {
      vars.erase(name);
    }
  }
  std::vector<std::string> out;
  for (const auto& [name, value] : vars) out.push_back(name + "=" + value);
  return out;
}

std::vector<char*> c_strings(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (std::string& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

}  // namespace

const Programs& programs() {
  static const Programs p{NVSHARE_E2E_SCHEDULER, NVSHARE_E2E_CTL,  NVSHARE_E2E_LIBRARY,
                          NVSHARE_E2E_TRAINER,   NVSHARE_E2E_STAT, NVSHARE_E2E_FAKECUDA_DIR};
  return p;
}

double monotonic_s() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

void measure(const std::string& what, double value, const std::string& unit) {
  std::printf("[ MEASURE ] %s: %s = %.4g %s\n",
              ::testing::UnitTest::GetInstance()->current_test_info()->name(), what.c_str(), value,
              unit.c_str());
  std::fflush(stdout);
  ::testing::Test::RecordProperty(what, std::to_string(value) + " " + unit);
}

void sleep_s(double seconds) {
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
}

TempDir::TempDir() {
  char tmpl[] = "/tmp/nvshare-e2e-XXXXXX";
  if (::mkdtemp(tmpl) != nullptr) path_ = tmpl;
}

TempDir::~TempDir() {
  if (path_.empty() || std::getenv("NVSHARE_KEEP_TEST_DIRS") != nullptr) return;
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

pid_t fork_tied_to_test() {
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(126);
  }
  return pid;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string tail(const std::string& text, std::size_t lines) {
  std::size_t pos = text.size();
  if (pos > 0 && text[pos - 1] == '\n') --pos;
  for (std::size_t seen = 0; pos > 0; --pos) {
    if (text[pos - 1] == '\n' && ++seen == lines) break;
  }
  return (pos > 0 ? "[...]\n" : "") + text.substr(pos);
}

namespace {

// (source, target) for each directory SpawnOptions::root_binds names, and /proc and /dev; the
// targets are created inside the root first.
Result<std::vector<std::pair<std::string, std::string>>> root_bind_points(
    const SpawnOptions& options) {
  std::vector<std::string> sources = {"/proc", "/dev"};
  sources.insert(sources.end(), options.root_binds.begin(), options.root_binds.end());
  std::vector<std::pair<std::string, std::string>> points;
  for (const std::string& source : sources) {
    const std::string target = options.root + source;
    std::error_code error;
    std::filesystem::create_directories(target, error);
    if (error) return make_error("create " + target + ": " + error.message());
    points.emplace_back(source, target);
  }
  return points;
}

}  // namespace

Result<std::unique_ptr<Process>> Process::spawn(const std::vector<std::string>& argv,
                                                const Env& env, const std::string& stdout_path,
                                                const std::string& stderr_path, bool append,
                                                const SpawnOptions& options) {
  // Everything the child needs is built before fork: only async-signal-safe calls after it.
  std::vector<std::string> args = argv;
  std::vector<std::string> envs = child_environment(env);
  std::vector<char*> c_args = c_strings(args);
  std::vector<char*> c_envs = c_strings(envs);
  const int flags = O_WRONLY | O_CREAT | O_CLOEXEC | (append ? O_APPEND : O_TRUNC);
  const int out = ::open(stdout_path.c_str(), flags, 0644);
  const int err = stderr_path == stdout_path ? out : ::open(stderr_path.c_str(), flags, 0644);
  if (out < 0 || err < 0) return make_error("open " + stdout_path + ": " + std::strerror(errno));
  std::vector<std::string> root_sources;
  std::vector<std::string> root_targets;
  if (!options.root.empty()) {
    auto binds = root_bind_points(options);
    if (!binds.ok()) return binds.error();
    for (auto& [source, target] : binds.value()) {
      root_sources.push_back(source);
      root_targets.push_back(target);
    }
  }
  const pid_t pid = fork_tied_to_test();
  if (pid < 0) return make_error(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    ::dup2(out, STDOUT_FILENO);
    ::dup2(err, STDERR_FILENO);
    if (!options.cgroup_procs.empty()) {
      const int procs = ::open(options.cgroup_procs.c_str(), O_WRONLY | O_CLOEXEC);
      if (procs < 0 || ::write(procs, "0\n", 2) != 2) ::_exit(125);
      ::close(procs);
    }
    if (!options.settings_dir.empty() || !options.root.empty()) {
      if (::unshare(CLONE_NEWNS) != 0 ||
          ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
        ::_exit(124);
      }
    }
    if (!options.settings_dir.empty() &&
        (::mount(options.settings_dir.c_str(), "/etc/nvshare", nullptr, MS_BIND, nullptr) != 0 ||
         ::mount(nullptr, "/etc/nvshare", nullptr, MS_REMOUNT | MS_BIND | MS_RDONLY, nullptr) !=
             0)) {
      ::_exit(124);
    }
    if (!options.root.empty()) {
      for (std::size_t i = 0; i < root_sources.size(); ++i) {
        if (::mount(root_sources[i].c_str(), root_targets[i].c_str(), nullptr, MS_BIND | MS_REC,
                    nullptr) != 0) {
          ::_exit(122);
        }
      }
      if (::chroot(options.root.c_str()) != 0 || ::chdir("/") != 0) ::_exit(121);
    }
    if (options.uid && (::setgid(*options.uid) != 0 || ::setuid(*options.uid) != 0)) ::_exit(123);
    ::execve(c_args[0], c_args.data(), c_envs.data());
    ::_exit(127);
  }
  ::close(out);
  if (err != out) ::close(err);
  std::unique_ptr<Process> process(new Process());
  process->pid_ = pid;
  return process;
}

Process::~Process() {
  if (running()) {
    ::kill(pid_, SIGKILL);
    (void)wait(5);
  }
}

bool Process::running() {
  if (exit_code_) return false;
  int status = 0;
  const pid_t done = ::waitpid(pid_, &status, WNOHANG);
  if (done == pid_) {
    exit_code_ = decode_status(status);
    return false;
  }
  return done == 0;
}

Result<int> Process::wait(double timeout_s) {
  const double deadline = monotonic_s() + timeout_s;
  while (running()) {
    if (monotonic_s() > deadline) {
      return make_error("pid " + std::to_string(pid_) + " still running after " +
                        std::to_string(timeout_s) + " s");
    }
    sleep_s(0.002);
  }
  if (!exit_code_) return make_error("pid " + std::to_string(pid_) + " could not be reaped");
  return *exit_code_;
}

void Process::kill(int signal) {
  if (!exit_code_) ::kill(pid_, signal);
}

Result<CommandResult> run_command(const std::vector<std::string>& argv, const std::string& dir,
                                  double timeout_s) {
  static int counter = 0;
  const std::string base = dir + "/cmd" + std::to_string(++counter);
  auto process = Process::spawn(argv, {}, base + ".out", base + ".err");
  if (!process.ok()) return process.error();
  auto code = process.value()->wait(timeout_s);
  if (!code.ok()) return code.error();
  CommandResult result;
  result.exit_code = code.value();
  result.out = read_file(base + ".out");
  result.err = read_file(base + ".err");
  std::error_code ignored;
  std::filesystem::remove(base + ".out", ignored);
  std::filesystem::remove(base + ".err", ignored);
  return result;
}

Scheduler::Scheduler(std::string dir, std::vector<std::string> flags, Env env)
    : dir_(std::move(dir)),
      flags_(std::move(flags)),
      env_(std::move(env)),
      socket_(dir_ + "/scheduler.sock"),
      control_socket_(dir_ + "/control.sock") {}

Scheduler::~Scheduler() = default;

Status Scheduler::start() {
  std::vector<std::string> argv = {programs().scheduler, "--socket",      socket_,
                                   "--control-socket",   control_socket_, "--state-file",
                                   dir_ + "/state.json"};
  argv.insert(argv.end(), flags_.begin(), flags_.end());
  const std::string log_path = dir_ + "/scheduler.log";
  {
    std::ofstream log(log_path, std::ios::app);
    log << "=== e2e: scheduler start #" << ++lives_ << " at t=" << monotonic_s() << " ===\n";
  }
  Env env = env_;
  env["NVSHARE_LOG_LEVEL"] = "debug";
  auto process = Process::spawn(argv, env, log_path, log_path, true);
  if (!process.ok()) return process.error();
  process_ = std::move(process).value();
  const double deadline = monotonic_s() + 10;
  while (monotonic_s() < deadline) {
    if (!process_->running()) {
      return make_error("nvshare-scheduler exited with status " +
                        std::to_string(process_->exit_code().value_or(-1)));
    }
    if (connect_unix(socket_).ok() && connect_unix(control_socket_).ok()) return Status::Ok();
    sleep_s(0.005);
  }
  return make_error("nvshare-scheduler did not listen within 10 s");
}

void Scheduler::kill_hard() {
  if (!process_) return;
  process_->kill(SIGKILL);
  (void)process_->wait(5);
  std::ofstream log(dir_ + "/scheduler.log", std::ios::app);
  log << "=== e2e: scheduler killed (SIGKILL) at t=" << monotonic_s() << " ===\n";
}

void Scheduler::stop() {
  if (!process_) return;
  process_->kill(SIGTERM);
  (void)process_->wait(5);
}

bool Scheduler::running() { return process_ && process_->running(); }

std::string Scheduler::log() const { return read_file(dir_ + "/scheduler.log"); }

Result<Json> Scheduler::status() const {
  auto response =
      control::control_call(control_socket_, Json(Json::Object{{"cmd", "status"}}), 2000);
  if (!response.ok()) return response.error();
  const Json* ok = response.value().find("ok");
  if (ok == nullptr || ok->as_bool() != true) {
    return make_error("status refused: " + response.value().dump());
  }
  return response;
}

Result<CommandResult> Scheduler::ctl(const std::vector<std::string>& args) const {
  std::vector<std::string> argv = {programs().ctl, "--control-socket", control_socket_};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_command(argv, dir_);
}

const Json* find_client(const Json& status, pid_t pid) {
  const Json* gpus = status.find("gpus");
  if (gpus == nullptr || gpus->as_array() == nullptr) return nullptr;
  for (const Json& gpu : *gpus->as_array()) {
    const Json* clients = gpu.find("clients");
    if (clients == nullptr || clients->as_array() == nullptr) continue;
    for (const Json& client : *clients->as_array()) {
      const Json* p = client.find("pid");
      if (p != nullptr && p->as_int64() == pid) return &client;
    }
  }
  return nullptr;
}

double json_number(const Json* object, std::string_view key, double fallback) {
  if (object == nullptr) return fallback;
  const Json* member = object->find(key);
  if (member == nullptr) return fallback;
  return member->as_double().value_or(fallback);
}

std::string json_string(const Json* object, std::string_view key) {
  if (object == nullptr) return "";
  const Json* member = object->find(key);
  if (member == nullptr || member->as_string() == nullptr) return "";
  return *member->as_string();
}

Result<std::vector<Json>> trace_events(const std::string& trace, pid_t pid) {
  std::ifstream lines(trace);
  if (!lines) return make_error("cannot read the hand-off trace " + trace);
  std::vector<Json> events;
  for (std::string line; std::getline(lines, line);) {
    auto event = parse_json(line);
    if (event.ok() && json_number(&event.value(), "pid") == pid) {
      events.push_back(std::move(event.value()));
    }
  }
  return events;
}

double swapped_bytes(const std::string& trace, pid_t pid, std::string_view event) {
  const Result<std::vector<Json>> events = trace_events(trace, pid);
  if (!events.ok()) return -1;
  double bytes = 0;
  for (const Json& e : events.value()) {
    if (json_string(&e, "event") == event) bytes += json_number(&e, "swap_bytes", 0);
  }
  return bytes;
}

std::pair<double, double> grant_span(const std::string& trace, pid_t pid) {
  std::pair<double, double> span{-1, -1};
  const Result<std::vector<Json>> events = trace_events(trace, pid);
  if (!events.ok()) return span;
  for (const Json& e : events.value()) {
    if (json_string(&e, "event") != "grant") continue;
    const double t = json_number(&e, "t");
    if (span.first < 0) span.first = t;
    span.second = t;
  }
  return span;
}

double held_share(const std::string& trace, pid_t pid, double begin, double end) {
  if (end <= begin) return -1;
  if (!trace_events(trace, pid).ok()) return -1;
  double held = 0;
  for (const Interval& g : held_intervals(trace, pid, end)) {
    held += std::max(0.0, std::min(g.end, end) - std::max(g.begin, begin));
  }
  return 100.0 * held / (end - begin);
}

std::vector<Interval> intervals(const std::vector<Json>& progress, int owner) {
  std::vector<Interval> out;
  for (const Json& p : progress) {
    out.push_back({json_number(&p, "launch_s"), json_number(&p, "done_s"), owner});
  }
  return out;
}

std::vector<Interval> held_intervals(const std::string& trace, pid_t pid, double end) {
  std::vector<Interval> out;
  const Result<std::vector<Json>> events = trace_events(trace, pid);
  if (!events.ok()) return out;
  std::optional<double> since;
  for (const Json& e : events.value()) {
    const std::string what = json_string(&e, "event");
    if (what == "grant") {
      since = json_number(&e, "t");
    } else if ((what == "release" || what == "idle-release") && since) {
      out.push_back({*since, json_number(&e, "t"), 1});
      since.reset();
    }
  }
  if (since) out.push_back({*since, std::max(*since, end), 1});
  return out;
}

double overlap_s(const std::vector<Interval>& a, const std::vector<Interval>& b) {
  double total = 0;
  std::size_t j = 0;
  for (const Interval& x : a) {
    while (j < b.size() && b[j].end <= x.begin) ++j;
    for (std::size_t k = j; k < b.size() && b[k].begin < x.end; ++k) {
      total += std::max(0.0, std::min(x.end, b[k].end) - std::max(x.begin, b[k].begin));
    }
  }
  return total;
}

double covered_s(std::vector<Interval> spans, double begin, double end) {
  std::sort(spans.begin(), spans.end(),
            [](const Interval& a, const Interval& b) { return a.begin < b.begin; });
  double covered = 0;
  double reached = begin;
  for (const Interval& s : spans) {
    const double from = std::max(s.begin, reached);
    const double to = std::min(s.end, end);
    if (to > from) covered += to - from;
    reached = std::max(reached, std::min(s.end, end));
  }
  return covered;
}

CapUse cap_use(const std::string& trace, const Trainer& t) {
  CapUse use;
  const std::vector<Interval> ran = intervals(t.progress(), 0);
  if (ran.empty()) return use;
  const auto [first, last] = grant_span(trace, t.pid());
  use.held_percent = held_share(trace, t.pid(), first, last);
  const std::vector<Interval> grants = held_intervals(trace, t.pid(), ran.back().end);
  double held_s = 0;
  for (const Interval& g : grants) held_s += g.end - g.begin;
  double ran_s = 0;
  for (const Interval& k : ran) ran_s += k.end - k.begin;
  const double inside_s = overlap_s(ran, grants);
  use.ran_in_grants = ran_s > 0 ? inside_s / ran_s : 0;
  use.grants_used = held_s > 0 ? inside_s / held_s : 0;
  return use;
}

void expect_cap_held(const CapUse& use, double cap_percent, const std::string& what) {
  measure(what + ": held, first grant to last (client trace)", use.held_percent, "%");
  measure(what + ": kernel time inside grants", 100 * use.ran_in_grants, "%");
  measure(what + ": time held that kernels ran", 100 * use.grants_used, "%");
  EXPECT_NEAR(use.held_percent, cap_percent, 2.0) << what << ": the time held";
  EXPECT_GE(use.ran_in_grants, 0.99) << what << ": kernels ran without a grant";
  EXPECT_GE(use.grants_used, 0.85) << what << ": the grants went unused";
}

Trainer::Trainer(TrainerOptions options, std::string dir)
    : options_(std::move(options)),
      dir_(std::move(dir)),
      stdout_path_(dir_ + "/trainer-" + options_.name + ".json"),
      stderr_path_(dir_ + "/trainer-" + options_.name + ".stderr") {}

Status Trainer::start(const Env& base_env) {
  Env env = base_env;
  if (options_.preload) env["LD_PRELOAD"] = programs().library;
  for (const auto& [name, value] : options_.env) env[name] = value;
  std::vector<std::string> argv = options_.launcher;
  argv.push_back(programs().trainer);
  argv.insert(argv.end(), options_.args.begin(), options_.args.end());
  auto process = Process::spawn(argv, env, stdout_path_, stderr_path_, false, options_.spawn);
  if (!process.ok()) return process.error();
  process_ = std::move(process).value();
  return Status::Ok();
}

Result<int> Trainer::wait(double timeout_s) {
  if (!process_) return make_error("trainer " + options_.name + " was not started");
  return process_->wait(timeout_s);
}

std::string Trainer::stdout_text() const { return read_file(stdout_path_); }
std::string Trainer::stderr_text() const { return read_file(stderr_path_); }

Result<Json> Trainer::report() const {
  const std::string text = stdout_text();
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.empty() || line[0] != '{') continue;
    auto json = parse_json(line);
    if (json.ok()) return json;
  }
  return make_error("trainer " + options_.name + " printed no JSON report; stdout: \"" + text +
                    "\"");
}

std::vector<Json> Trainer::progress() const {
  std::vector<Json> out;
  std::istringstream lines(stderr_text());
  for (std::string line; std::getline(lines, line);) {
    // The library's own log lines share stderr; only the trainer's progress objects count.
    if (line.rfind("{\"progress\":", 0) != 0) continue;
    auto json = parse_json(line);
    if (json.ok()) out.push_back(std::move(json).value());
  }
  return out;
}

std::string Trainer::describe() const {
  std::string out = "--- trainer " + options_.name;
  if (process_) out += " (pid " + std::to_string(process_->pid()) + ")";
  out += ":";
  for (const auto& [name, value] : options_.env) {
    out += " " + name + "=" + value.value_or("(unset)");
  }
  out += options_.preload ? " LD_PRELOAD=libnvshare.so" : "";
  out += " nvshare-trainer";
  for (const std::string& a : options_.args) out += " " + a;
  out += "\n    exit: ";
  auto code = process_ ? process_->exit_code() : std::nullopt;
  out += code ? std::to_string(*code) : std::string("(running or not started)");
  out += "\n    stdout: " + stdout_text();
  std::string err = stderr_text();
  // Progress lines make stderr long; the library's messages are what a reader needs.
  std::string filtered;
  std::size_t progress_lines = 0;
  std::istringstream lines(err);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("{\"progress\":", 0) == 0) {
      ++progress_lines;
      continue;
    }
    filtered += line + "\n";
  }
  out += "\n    stderr (" + std::to_string(progress_lines) + " progress lines omitted):\n" +
         tail(filtered, 60);
  return out;
}

std::string on_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::istringstream dirs(path != nullptr ? path : "/usr/bin:/bin");
  for (std::string dir; std::getline(dirs, dir, ':');) {
    const std::string candidate = dir + "/" + name;
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return name;
}

Result<CommandResult> promtool_check(const std::string& dir, const std::string& exposition) {
  const std::string file = dir + "/scrape.txt";
  std::ofstream(file) << exposition;
  return run_command({"/bin/sh", "-c", on_path("promtool") + " check metrics < " + file}, dir, 30);
}

int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  int port = 0;
  if (fd >= 0 && bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  if (fd >= 0) close(fd);
  return port;
}

Result<HttpReply> http_get(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return make_error("socket failed");
  timeval tv{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    close(fd);
    return make_error("connect to port " + std::to_string(port) + " failed");
  }
  const std::string request = "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  if (write(fd, request.data(), request.size()) != static_cast<ssize_t>(request.size())) {
    close(fd);
    return make_error("write failed");
  }
  std::string in;
  char buffer[65536];
  ssize_t n = 0;
  while ((n = read(fd, buffer, sizeof buffer)) > 0) in.append(buffer, static_cast<std::size_t>(n));
  close(fd);
  const std::size_t head_end = in.find("\r\n\r\n");
  if (in.rfind("HTTP/1.", 0) != 0 || head_end == std::string::npos) {
    return make_error("not an HTTP reply: " + in.substr(0, 200));
  }
  HttpReply reply;
  reply.status = std::atoi(in.c_str() + 9);
  reply.body = in.substr(head_end + 4);
  return reply;
}

}  // namespace nvshare::e2e

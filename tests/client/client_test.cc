// libnvshare.so as real processes use it: nvshare-client-probe and nvshare-trainer run with
// LD_PRELOAD=libnvshare.so against the simulated driver (each case on its own state file, with no
// scheduler listening, so the link fails open), and the shared object's exports, dependencies and
// symbol versions are read with nm and readelf.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <pthread.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "common/json.h"
#include "shared_state.h"

namespace {

constexpr std::uint64_t kMiB = 1 << 20;

struct ProcessOutput {
  int status = -1;
  std::string output;
};

// Starts `command` with `env` added (through env(1)); its stdout and stderr come through the pipe.
FILE* start(const std::map<std::string, std::string>& env, const std::string& command) {
  std::string line = "env";
  for (const auto& [name, value] : env) line += " '" + name + "=" + value + "'";
  line += " " + command + " 2>&1";
  return popen(line.c_str(), "r");
}

// Reads the rest of a started command's output and waits for it.
ProcessOutput finish(FILE* pipe, std::string output = {}) {
  ProcessOutput result;
  result.output = std::move(output);
  if (pipe == nullptr) return result;
  char buffer[4096];
  std::size_t n = 0;
  while ((n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) result.output.append(buffer, n);
  const int status = pclose(pipe);
  result.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

// Runs `command` with `env` added (through env(1)), capturing stdout and stderr.
ProcessOutput run(const std::map<std::string, std::string>& env, const std::string& command) {
  return finish(start(env, command));
}

// Reads a started command's output up to the first line that begins with `prefix` and returns
// that line (empty when the output ended first); everything read is appended to `seen`.
std::string read_line_starting(FILE* pipe, const std::string& prefix, std::string& seen) {
  char buffer[4096];
  while (pipe != nullptr && std::fgets(buffer, sizeof buffer, pipe) != nullptr) {
    seen += buffer;
    if (std::strncmp(buffer, prefix.c_str(), prefix.size()) == 0) return buffer;
  }
  return {};
}

long long realtime_ns() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<long long>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  std::string line;
  while (std::getline(ss, line)) out.push_back(line);
  return out;
}

// A fresh simulated GPU per test: its own state file, 1 GiB, no scheduler.
class ProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    state_ = (std::filesystem::temp_directory_path() /
              ("client_test." + std::to_string(getpid()) + "." + info->name() + ".state"))
                 .string();
    std::filesystem::remove(state_);
  }
  void TearDown() override {
    std::filesystem::remove(state_);
    // The context-footprint lock files the library made next to this test's socket.
    const std::string prefix =
        std::filesystem::path(state_).filename().string() + ".no-scheduler.sock";
    std::error_code ec;
    for (const auto& entry :
         std::filesystem::directory_iterator(std::filesystem::path(state_).parent_path(), ec)) {
      if (entry.path().filename().string().rfind(prefix, 0) == 0) {
        std::filesystem::remove(entry.path(), ec);
      }
    }
  }

  std::string socket() const { return state_ + ".no-scheduler.sock"; }

  std::map<std::string, std::string> env(bool preload) const {
    std::map<std::string, std::string> e = {
        {"LD_LIBRARY_PATH", NVSHARE_FAKECUDA_LIB_DIR},
        {"NVSHARE_FAKECUDA_STATE", state_},
        {"NVSHARE_FAKECUDA_MEMORY", "1Gi"},
        {"NVSHARE_SOCKET", socket()},
        {"NVSHARE_LOG_LEVEL", "warn"},
    };
    if (preload) e["LD_PRELOAD"] = NVSHARE_CLIENT_LIBRARY;
    return e;
  }

  // The simulated GPU's counters (all zero before a process registered it).
  fakecuda::DeviceSnapshot snapshot() const {
    auto state = fakecuda::SharedState::open(state_, /*create=*/true);
    EXPECT_TRUE(state.ok());
    if (!state.ok() || state.value()->devices().empty()) return {};
    return fakecuda::SimDevice(state.value()->devices()[0]).snapshot();
  }

  std::string state_;
};

// ---- The shared object ----

std::set<std::string> defined_exports() {
  std::set<std::string> names;
  for (const std::string& line :
       lines(run({}, "nm -D --defined-only '" NVSHARE_CLIENT_LIBRARY "'").output)) {
    std::stringstream ss(line);
    std::string address, type, name;
    if (ss >> address >> type >> name) names.insert(name.substr(0, name.find('@')));
  }
  return names;
}

TEST(Exports, AreExactlyTheHookListAndDlsym) {
  const ProcessOutput list = run({}, NVSHARE_GEN_EXPORTS_PATH " --list");
  ASSERT_EQ(list.status, 0);
  std::set<std::string> wanted;
  for (const std::string& name : lines(list.output)) wanted.insert(name);
  EXPECT_GT(wanted.size(), 110u);
  EXPECT_TRUE(wanted.count("dlsym"));
  EXPECT_TRUE(wanted.count("nvmlDeviceGetMemoryInfo_v2"));
  const std::set<std::string> exported = defined_exports();
  if (exported.empty()) GTEST_SKIP() << "nm is not available";
  for (const std::string& name : wanted) EXPECT_TRUE(exported.count(name)) << name << " missing";
  for (const std::string& name : exported) EXPECT_TRUE(wanted.count(name)) << name << " leaks";
}

TEST(Exports, NeedNothingFromTheCudaToolkit) {
  const ProcessOutput dynamic = run({}, "readelf -d '" NVSHARE_CLIENT_LIBRARY "'");
  if (dynamic.status != 0) GTEST_SKIP() << "readelf is not available";
  int needed = 0;
  for (const std::string& line : lines(dynamic.output)) {
    if (line.find("(NEEDED)") == std::string::npos) continue;
    ++needed;
    for (const char* forbidden :
         {"libcuda", "libcudart", "libnvidia-ml", "libstdc++", "libgcc_s"}) {
      EXPECT_EQ(line.find(forbidden), std::string::npos) << line;
    }
  }
  EXPECT_GT(needed, 0);
}

// Static libstdc++/libgcc: no GLIBCXX, CXXABI or GCC symbol versions, so the library loads beside
// any C++ runtime. The newest GLIBC version it needs is reported, and checked against
// NVSHARE_CLIENT_GLIBC_MAX when the build sets one (release builds on an old-glibc image).
TEST(Exports, NeedOnlyGlibcSymbolVersions) {
  const ProcessOutput undefined = run({}, "nm -D --undefined-only '" NVSHARE_CLIENT_LIBRARY "'");
  if (undefined.status != 0) GTEST_SKIP() << "nm is not available";
  int newest_minor = 0;
  std::string newest;
  for (const std::string& line : lines(undefined.output)) {
    for (const char* forbidden : {"@GLIBCXX_", "@CXXABI_", "@GCC_"}) {
      EXPECT_EQ(line.find(forbidden), std::string::npos) << line;
    }
    const std::size_t at = line.find("@GLIBC_2.");
    if (at == std::string::npos) continue;
    const int minor = std::atoi(line.c_str() + at + 9);
    if (minor > newest_minor) {
      newest_minor = minor;
      newest = line;
    }
  }
  std::printf("newest GLIBC version needed: 2.%d (%s)\n", newest_minor, newest.c_str());
  const std::string cap = NVSHARE_CLIENT_GLIBC_MAX;
  if (!cap.empty()) {
    EXPECT_LE(newest_minor, std::atoi(cap.c_str() + cap.find('.') + 1)) << newest;
  }
}

// ---- Dispatch and memory, from inside a process ----

TEST_F(ProcessTest, EveryHookIsReachedThroughEveryPath) {
  auto e = env(true);
  e["NVSHARE_MEMORY_LIMIT"] = "256Mi";
  const ProcessOutput probe = run(e, NVSHARE_PROBE_PATH " dispatch");
  EXPECT_EQ(probe.status, 0) << probe.output;
  EXPECT_NE(probe.output.find("\"failures\":0"), std::string::npos) << probe.output;
}

TEST_F(ProcessTest, TheLimitIsExactAndDeviceAllocationsAreDeviceBacked) {
  auto e = env(true);
  e["NVSHARE_MEMORY_LIMIT"] = "256Mi";
  e["NVSHARE_FAKECUDA_CONTEXT_MEMORY"] = "64Mi";
  const ProcessOutput probe = run(e, NVSHARE_PROBE_PATH " memory");
  EXPECT_EQ(probe.status, 0) << probe.output;
  EXPECT_NE(probe.output.find("\"failures\":0"), std::string::npos) << probe.output;
}

TEST_F(ProcessTest, TheLimitIsExactAndDeviceAllocationsBecomeManagedInTheUnifiedMode) {
  auto e = env(true);
  e["NVSHARE_MEMORY_LIMIT"] = "256Mi";
  e["NVSHARE_FAKECUDA_CONTEXT_MEMORY"] = "64Mi";
  e["NVSHARE_MEMORY_MODE"] = "unified";
  const ProcessOutput probe = run(e, NVSHARE_PROBE_PATH " memory");
  EXPECT_EQ(probe.status, 0) << probe.output;
  EXPECT_NE(probe.output.find("\"failures\":0"), std::string::npos) << probe.output;
}

TEST_F(ProcessTest, PeerAccessReachesDeviceBackedMemory) {
  auto e = env(true);
  e["NVSHARE_FAKECUDA_DEVICES"] = "2";
  const ProcessOutput probe = run(e, NVSHARE_PROBE_PATH " peer");
  EXPECT_EQ(probe.status, 0) << probe.output;
  EXPECT_NE(probe.output.find("\"failures\":0"), std::string::npos) << probe.output;
}

// ---- The context's footprint and the first CUDA call on a GPU ----

struct ContextReport {
  int status = -1;
  double first_call_ms = -1;
  std::vector<std::int64_t> charged;  // per device: total - free right after the context
  std::string output;
};

ContextReport parse_context_report(const std::string& line, ContextReport report) {
  auto parsed = nvshare::parse_json(line);
  if (!parsed.ok()) return report;
  const nvshare::Json* ms = parsed.value().find("first_call_ms");
  if (ms != nullptr && ms->as_double()) report.first_call_ms = *ms->as_double();
  const nvshare::Json* charged = parsed.value().find("charged");
  if (charged != nullptr && charged->as_array() != nullptr) {
    for (const nvshare::Json& c : *charged->as_array())
      report.charged.push_back(c.as_int64().value_or(-1));
  }
  return report;
}

class ContextTest : public ProcessTest {
 protected:
  // The probe's `context` scenario on `devices` simulated GPUs whose contexts take `context`.
  std::map<std::string, std::string> context_env(int devices, const std::string& context) const {
    auto e = env(true);
    e["NVSHARE_FAKECUDA_DEVICES"] = std::to_string(devices);
    e["NVSHARE_FAKECUDA_MEMORY"] = "16Gi";
    e["NVSHARE_FAKECUDA_CONTEXT_MEMORY"] = context;
    e["NVSHARE_MEMORY_LIMIT"] = "1Gi";
    return e;
  }

  ContextReport context_probe(const std::map<std::string, std::string>& e) {
    const ProcessOutput out = run(e, NVSHARE_PROBE_PATH " context");
    ContextReport report;
    report.status = out.status;
    report.output = out.output;
    for (const std::string& line : lines(out.output)) {
      if (line.rfind("{\"first_call_ms\"", 0) == 0) return parse_context_report(line, report);
    }
    return report;
  }

  // The lock file the library uses for the first simulated GPU: the first choice, next to the
  // socket (context_footprint.h).
  std::string lock_file() const {
    return socket() + ".context-GPU-00000000-0000-4000-8000-000000000000.lock";
  }
};

// Processes that create their first context on the same GPUs at the same moment are each charged
// their own context, not the others' too: the footprint is measured under a per-GPU lock shared by
// the processes (the first one measures it alone; the others are charged that). Each process
// retains a context on several GPUs, all starting at the same instant. To make them reach each
// GPU's measurement together, the test holds the simulated GPUs' state (the mutex every NVML memory
// query and context creation of the fake takes) from before that instant and lets the GPUs go one
// by one, 100 ms apart: every process waits at each GPU for the others. The processes stay alive
// until all have measured, so no exit frees memory under a measurement.
TEST_F(ContextTest, ConcurrentProcessesAreEachChargedOneContext) {
  constexpr int kProcesses = 6;
  constexpr int kDevices = 6;
  const auto e = context_env(kDevices, "64Mi");
  const std::string release = state_ + ".release";
  const long long start_ns = realtime_ns() + 2'000'000'000LL;  // time for every process to load
  std::vector<FILE*> pipes;
  for (int i = 0; i < kProcesses; ++i) {
    pipes.push_back(start(e, std::string(NVSHARE_PROBE_PATH " context ") +
                                 std::to_string(start_ns) + " '" + release + "'"));
    ASSERT_NE(pipes.back(), nullptr);
  }
  {
    // The simulated GPUs exist once a process has run cuInit.
    auto state = fakecuda::SharedState::open(state_, /*create=*/true);
    ASSERT_TRUE(state.ok());
    std::vector<fakecuda::DeviceRecord*> devices;
    while (realtime_ns() < start_ns - 200'000'000LL) {
      devices = state.value()->devices();
      if (devices.size() == static_cast<std::size_t>(kDevices)) break;
      usleep(10'000);
    }
    std::vector<fakecuda::DeviceRecord*> held;
    for (fakecuda::DeviceRecord* d : devices) {
      const int rc = pthread_mutex_lock(&d->mutex);
      if (rc == EOWNERDEAD) pthread_mutex_consistent(&d->mutex);
      if (rc == 0 || rc == EOWNERDEAD) held.push_back(d);
    }
    for (std::size_t d = 0; d < held.size(); ++d) {
      const long long until_ns =
          start_ns + 300'000'000LL + static_cast<long long>(d) * 100'000'000LL;
      timespec at{static_cast<time_t>(until_ns / 1'000'000'000),
                  static_cast<long>(until_ns % 1'000'000'000)};
      while (clock_nanosleep(CLOCK_REALTIME, TIMER_ABSTIME, &at, nullptr) != 0) {
      }
      pthread_mutex_unlock(&held[d]->mutex);
    }
  }
  std::vector<ContextReport> reports(kProcesses);
  std::vector<std::string> seen(kProcesses);
  for (int i = 0; i < kProcesses; ++i) {
    const std::string line = read_line_starting(pipes[i], "{\"first_call_ms\"", seen[i]);
    reports[i] = parse_context_report(line, reports[i]);
  }
  {
    FILE* f = std::fopen(release.c_str(), "w");
    if (f != nullptr) std::fclose(f);
  }
  for (int i = 0; i < kProcesses; ++i) {
    const ProcessOutput out = finish(pipes[i], seen[i]);
    reports[i].status = out.status;
    reports[i].output = out.output;
  }
  std::filesystem::remove(release);
  for (int i = 0; i < kProcesses; ++i) {
    const ContextReport& r = reports[i];
    EXPECT_EQ(r.status, 0) << "process " << i << ": " << r.output;
    ASSERT_EQ(r.charged.size(), static_cast<std::size_t>(kDevices)) << r.output;
    for (int d = 0; d < kDevices; ++d) {
      EXPECT_EQ(r.charged[d], static_cast<std::int64_t>(64 * kMiB))
          << "process " << i << " device " << d << " was charged " << r.charged[d] / kMiB
          << " MiB for one 64 MiB context";
    }
  }
}

// A process that cannot take the GPU's measurement lock (another one holds it) waits for it at
// most 2 s, does not measure, and charges the footprint last measured on that GPU.
TEST_F(ContextTest, AHeldLockIsWaitedForBoundedAndTheLastMeasurementIsCharged) {
  const ContextReport first = context_probe(context_env(1, "64Mi"));
  ASSERT_EQ(first.status, 0) << first.output;
  ASSERT_EQ(first.charged, std::vector<std::int64_t>{static_cast<std::int64_t>(64 * kMiB)});
  ASSERT_TRUE(std::filesystem::exists(lock_file())) << lock_file();

  const int fd = ::open(lock_file().c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX), 0);
  const auto t0 = std::chrono::steady_clock::now();
  // The simulated context is larger now: the charge shows whether it was measured.
  const ContextReport locked = context_probe(context_env(1, "96Mi"));
  const double took_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ::flock(fd, LOCK_UN);
  ::close(fd);
  EXPECT_EQ(locked.status, 0) << locked.output;
  EXPECT_EQ(locked.charged, std::vector<std::int64_t>{static_cast<std::int64_t>(64 * kMiB)})
      << "measured although another process held the lock: " << locked.output;
  EXPECT_GE(locked.first_call_ms, 1900) << "the lock was not waited for";
  EXPECT_LT(took_s, 10) << "the lock was waited for without a bound";

  const ContextReport again = context_probe(context_env(1, "96Mi"));
  EXPECT_EQ(again.status, 0) << again.output;
  EXPECT_EQ(again.charged, std::vector<std::int64_t>{static_cast<std::int64_t>(96 * kMiB)});
  EXPECT_LT(again.first_call_ms, 1000);
}

// Only a context measured on an otherwise idle GPU is measured alone (on an H200 a context made
// beside another one takes 88 MiB at first, the rest of its 523.5 MiB later). A process that finds
// the GPU in use is charged the footprint measured alone there, whatever it measures itself, or
// the default (512 MiB) when none was measured.
TEST_F(ContextTest, ABusyGpuIsChargedTheFootprintMeasuredAlone) {
  const std::string release = state_ + ".release";
  std::string seen;
  FILE* holder =
      start(context_env(1, "64Mi"), std::string(NVSHARE_PROBE_PATH " context 0 '") + release + "'");
  ASSERT_NE(holder, nullptr);
  const ContextReport alone =
      parse_context_report(read_line_starting(holder, "{\"first_call_ms\"", seen), {});
  EXPECT_EQ(alone.charged, std::vector<std::int64_t>{static_cast<std::int64_t>(64 * kMiB)}) << seen;

  // Beside the holder's context: the simulated context is larger now, the charge is the one
  // measured alone.
  const ContextReport beside = context_probe(context_env(1, "96Mi"));
  EXPECT_EQ(beside.status, 0) << beside.output;
  EXPECT_EQ(beside.charged, std::vector<std::int64_t>{static_cast<std::int64_t>(64 * kMiB)})
      << beside.output;

  // Nothing measured alone on record: the default.
  std::filesystem::remove(lock_file());
  const ContextReport unknown = context_probe(context_env(1, "96Mi"));
  EXPECT_EQ(unknown.status, 0) << unknown.output;
  EXPECT_EQ(unknown.charged, std::vector<std::int64_t>{static_cast<std::int64_t>(512 * kMiB)})
      << unknown.output;

  {
    FILE* f = std::fopen(release.c_str(), "w");
    if (f != nullptr) std::fclose(f);
  }
  const ProcessOutput out = finish(holder, seen);
  std::filesystem::remove(release);
  EXPECT_EQ(out.status, 0) << out.output;
}

// With no scheduler the first CUDA call on a GPU does not wait for a registration: nothing at the
// socket path, or a socket file nobody listens on (connection refused). The register wait is set
// to 5 s, so a call that waited for it is told apart from one that did not by seconds, whatever
// the machine's load.
TEST_F(ContextTest, WithoutASchedulerTheFirstCallDoesNotWait) {
  auto e = context_env(1, "64Mi");
  e["NVSHARE_REGISTER_WAIT_MS"] = "5000";
  const ContextReport absent = context_probe(e);
  EXPECT_EQ(absent.status, 0) << absent.output;
  EXPECT_GE(absent.first_call_ms, 0) << absent.output;
  EXPECT_LT(absent.first_call_ms, 2500) << absent.output;

  // A stale socket: bound, then closed (what a crashed scheduler leaves).
  {
    const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, socket().c_str(), sizeof addr.sun_path - 1);
    ASSERT_EQ(::bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr), 0);
    ::close(fd);
  }
  const ContextReport refused = context_probe(e);
  std::filesystem::remove(socket());
  EXPECT_EQ(refused.status, 0) << refused.output;
  EXPECT_GE(refused.first_call_ms, 0) << refused.output;
  EXPECT_LT(refused.first_call_ms, 2500) << refused.output;
}

// A scheduler that accepts connections (its listen backlog does) but never answers delays the
// first CUDA call on a GPU by NVSHARE_REGISTER_WAIT_MS, not longer.
TEST_F(ContextTest, ASilentSchedulerDelaysTheFirstCallByTheRegisterWaitOnly) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, socket().c_str(), sizeof addr.sun_path - 1);
  ASSERT_EQ(::bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(fd, 16), 0);
  auto e = context_env(1, "64Mi");
  e["NVSHARE_REGISTER_WAIT_MS"] = "300";
  const ContextReport silent = context_probe(e);
  ::close(fd);
  std::filesystem::remove(socket());
  EXPECT_EQ(silent.status, 0) << silent.output;
  EXPECT_GE(silent.first_call_ms, 290) << "the first call did not wait for the registration";
  EXPECT_LT(silent.first_call_ms, 1500) << "the wait is not bounded by NVSHARE_REGISTER_WAIT_MS";
}

TEST_F(ProcessTest, DisabledTheLibraryPassesEverythingThrough) {
  auto e = env(true);
  e["NVSHARE_ENABLE"] = "0";
  e["NVSHARE_MEMORY_LIMIT"] = "64Mi";  // ignored
  const ProcessOutput probe = run(e, NVSHARE_PROBE_PATH " passthrough");
  EXPECT_EQ(probe.status, 0) << probe.output;
  EXPECT_NE(probe.output.find("\"failures\":0"), std::string::npos) << probe.output;
}

// ---- nvshare-trainer under the library ----

struct TrainerRun {
  int status = -1;
  nvshare::Json report;
  fakecuda::DeviceSnapshot before, after;
  std::string output;
};

class TrainerTest : public ProcessTest {
 protected:
  TrainerRun trainer(const std::map<std::string, std::string>& e, const std::string& args) {
    TrainerRun r;
    r.before = snapshot();
    const ProcessOutput run_result = run(e, std::string(NVSHARE_TRAINER_PATH) + " " + args);
    r.after = snapshot();
    r.status = run_result.status;
    r.output = run_result.output;
    for (const std::string& line : lines(run_result.output)) {
      if (line.empty() || line[0] != '{') continue;
      auto parsed = nvshare::parse_json(line);
      if (parsed.ok() && parsed.value().find("result") != nullptr) r.report = parsed.value();
    }
    return r;
  }
  static std::string text(const nvshare::Json& report, const char* key) {
    const nvshare::Json* value = report.find(key);
    return value != nullptr ? value->dump() : "(missing)";
  }
};

constexpr const char kTrainerArgs[] = "--bytes 64Mi --kernels 5 --kernel-us 1000 --report-meminfo";

TEST_F(TrainerTest, DisabledTheTrainerRunsAsWithoutTheLibrary) {
  auto first = trainer(env(false), kTrainerArgs);
  auto e = env(true);
  e["NVSHARE_ENABLE"] = "0";
  auto second = trainer(e, kTrainerArgs);
  ASSERT_EQ(first.status, 0) << first.output;
  ASSERT_EQ(second.status, 0) << second.output;
  for (const char* key :
       {"result", "uuid", "bytes", "managed", "iterations", "mem_free", "mem_total"}) {
    EXPECT_EQ(text(first.report, key), text(second.report, key)) << key;
  }
  EXPECT_EQ(second.after.migrated_to_device - second.before.migrated_to_device, 0u);
  EXPECT_EQ(first.after.kernels - first.before.kernels,
            second.after.kernels - second.before.kernels);
  EXPECT_EQ(second.after.faulted_in, second.before.faulted_in);
}

TEST_F(TrainerTest, EnabledTheTrainersMemoryIsDeviceMemory) {
  auto plain = trainer(env(false), kTrainerArgs);
  auto shared = trainer(env(true), kTrainerArgs);
  ASSERT_EQ(shared.status, 0) << shared.output;
  EXPECT_EQ(text(shared.report, "result"), "\"ok\"");
  // Device-backed: nothing migrates, nothing faults, the GPU sees the same memory in use.
  EXPECT_EQ(shared.after.migrated_to_device, shared.before.migrated_to_device);
  EXPECT_EQ(shared.after.faulted_in, shared.before.faulted_in);
  EXPECT_EQ(text(shared.report, "mem_total"), text(plain.report, "mem_total"));
  EXPECT_EQ(text(shared.report, "mem_free"), text(plain.report, "mem_free"));
}

TEST_F(TrainerTest, EnabledInTheUnifiedModeTheTrainersMemoryBecomesManagedOnTheDevice) {
  auto plain = trainer(env(false), kTrainerArgs);
  auto e = env(true);
  e["NVSHARE_MEMORY_MODE"] = "unified";
  auto shared = trainer(e, kTrainerArgs);
  ASSERT_EQ(shared.status, 0) << shared.output;
  EXPECT_EQ(text(shared.report, "result"), "\"ok\"");
  // Placed on the device by prefetch at allocation: moved once, never demand-faulted.
  EXPECT_EQ(shared.after.migrated_to_device - shared.before.migrated_to_device, 64 * kMiB);
  EXPECT_EQ(shared.after.faulted_in, shared.before.faulted_in);
  // No limit: the trainer sees the GPU as it is.
  EXPECT_EQ(text(shared.report, "mem_total"), text(plain.report, "mem_total"));
  EXPECT_EQ(text(shared.report, "mem_free"), text(plain.report, "mem_free"));
}

TEST_F(TrainerTest, OverTheLimitTheTrainerGetsOutOfMemory) {
  auto e = env(true);
  e["NVSHARE_MEMORY_LIMIT"] = "48Mi";
  auto r = trainer(e, kTrainerArgs);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_EQ(text(r.report, "error"), "\"CUDA_ERROR_OUT_OF_MEMORY: cuMemAlloc\"") << r.output;
}

}  // namespace

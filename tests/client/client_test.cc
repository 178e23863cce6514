// libnvshare.so as real processes use it: nvshare-client-probe and nvshare-trainer run with
// LD_PRELOAD=libnvshare.so against the simulated driver (each case on its own state file, with no
// scheduler listening, so the link fails open), and the shared object's exports, dependencies and
// symbol versions are read with nm and readelf.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
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

// Runs `command` with `env` added (through env(1)), capturing stdout and stderr.
ProcessOutput run(const std::map<std::string, std::string>& env, const std::string& command) {
  std::string line = "env";
  for (const auto& [name, value] : env) line += " '" + name + "=" + value + "'";
  line += " " + command + " 2>&1";
  ProcessOutput result;
  FILE* pipe = popen(line.c_str(), "r");
  if (pipe == nullptr) return result;
  char buffer[4096];
  std::size_t n = 0;
  while ((n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) result.output.append(buffer, n);
  const int status = pclose(pipe);
  result.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
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
  void TearDown() override { std::filesystem::remove(state_); }

  std::map<std::string, std::string> env(bool preload) const {
    std::map<std::string, std::string> e = {
        {"LD_LIBRARY_PATH", NVSHARE_FAKECUDA_LIB_DIR},
        {"NVSHARE_FAKECUDA_STATE", state_},
        {"NVSHARE_FAKECUDA_MEMORY", "1Gi"},
        {"NVSHARE_SOCKET", state_ + ".no-scheduler.sock"},
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

TEST_F(ProcessTest, TheLimitIsExactAndDeviceAllocationsBecomeManaged) {
  auto e = env(true);
  e["NVSHARE_MEMORY_LIMIT"] = "256Mi";
  e["NVSHARE_FAKECUDA_CONTEXT_MEMORY"] = "64Mi";
  const ProcessOutput probe = run(e, NVSHARE_PROBE_PATH " memory");
  EXPECT_EQ(probe.status, 0) << probe.output;
  EXPECT_NE(probe.output.find("\"failures\":0"), std::string::npos) << probe.output;
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

TEST_F(TrainerTest, EnabledTheTrainersMemoryBecomesManagedOnTheDevice) {
  auto plain = trainer(env(false), kTrainerArgs);
  auto shared = trainer(env(true), kTrainerArgs);
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

// The library in an older userland: a Debian 11 root (bullseye, glibc 2.31; tests/compat/
// make_root.sh) where nvshare-trainer runs under libnvshare.so (LD_PRELOAD) on the simulated GPU,
// against a scheduler on the host, as a container of an old image does on a node. The memory limit
// and the core cap must hold there as they do on the host. Built against the host's glibc (2.34 or
// newer) without the glibc floor (src/compat), neither the library nor the trainer loads there.
//
// The root is given by NVSHARE_COMPAT_ROOT (tests/compat/CMakeLists.txt).
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "harness.h"

namespace nvshare::e2e {
namespace {

constexpr double kMi = 1024.0 * 1024.0;
constexpr double kGi = 1024.0 * kMi;

std::string compat_root() {
  const char* root = std::getenv("NVSHARE_COMPAT_ROOT");
  return root != nullptr ? root : "";
}

class OlderUserlandTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = compat_root();
    ASSERT_FALSE(root_.empty()) << "NVSHARE_COMPAT_ROOT names no root (run through ctest)";
    ASSERT_TRUE(std::filesystem::exists(root_ + "/.nvshare-root-complete"))
        << root_ << " is not a finished root (tests/compat/make_root.sh makes it)";
    state_ = dir_.path() + "/fakecuda.state";
    scheduler_ = std::make_unique<Scheduler>(
        dir_.path(), std::vector<std::string>{"--trust-client-limits"}, gpu_env());
    Status started = scheduler_->start();
    ASSERT_TRUE(started.ok()) << started.error().message;
  }

  void TearDown() override {
    if (!HasFailure()) return;
    for (const auto& t : trainers_) std::fprintf(stderr, "%s\n", t->describe().c_str());
    std::fprintf(stderr, "--- scheduler log:\n%s\n", tail(scheduler_->log(), 80).c_str());
  }

  Env gpu_env() const {
    return {{"LD_LIBRARY_PATH", programs().fakecuda_dir},
            {"NVSHARE_FAKECUDA_STATE", state_},
            {"NVSHARE_FAKECUDA_DEVICES", "1"},
            {"NVSHARE_FAKECUDA_MEMORY", "16Gi"}};
  }

  // Inside the root: the test's directory, the library's and the trainer's, at their own paths.
  SpawnOptions in_root() const {
    SpawnOptions options;
    options.root = root_;
    options.root_binds = {dir_.path(), programs().fakecuda_dir,
                          std::filesystem::path(programs().library).parent_path().string(),
                          std::filesystem::path(programs().trainer).parent_path().string()};
    return options;
  }

  // The glibc the root's own getconf reports, e.g. "glibc 2.31".
  std::string root_glibc() {
    const std::string out = dir_.path() + "/getconf.out";
    auto process =
        Process::spawn({"/usr/bin/getconf", "GNU_LIBC_VERSION"}, {}, out, out, false, in_root());
    if (!process.ok()) return "";
    auto code = process.value()->wait(10);
    if (!code.ok() || code.value() != 0) return "";
    std::string text = read_file(out);
    while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
    return text;
  }

  Json run(const std::string& name, std::vector<std::string> args, Env env, double timeout_s) {
    trainers_.push_back(std::make_unique<Trainer>(
        TrainerOptions(name, std::move(args), std::move(env), true, in_root()), dir_.path()));
    Trainer& t = *trainers_.back();
    Env base = gpu_env();
    base["NVSHARE_SOCKET"] = scheduler_->socket();
    Status started = t.start(base);
    EXPECT_TRUE(started.ok()) << (started.ok() ? "" : started.error().message);
    if (!started.ok()) return Json();
    auto code = t.wait(timeout_s);
    EXPECT_TRUE(code.ok()) << name << ": " << (code.ok() ? "" : code.error().message);
    if (code.ok()) EXPECT_EQ(code.value(), 0) << t.describe();
    auto report = t.report();
    EXPECT_TRUE(report.ok()) << t.describe();
    if (!report.ok()) return Json();
    EXPECT_EQ(json_string(&report.value(), "result"), "ok") << t.describe();
    return report.value();
  }

  TempDir dir_;
  std::string root_;
  std::string state_;
  std::unique_ptr<Scheduler> scheduler_;
  std::vector<std::unique_ptr<Trainer>> trainers_;
};

TEST_F(OlderUserlandTest, GlibcIsOlderThanTheBuildHost) {
  const std::string glibc = root_glibc();
  std::printf("[ MEASURE ] the root's glibc: %s\n", glibc.c_str());
  int major = 0;
  int minor = 0;
  ASSERT_EQ(std::sscanf(glibc.c_str(), "glibc %d.%d", &major, &minor), 2) << "getconf: " << glibc;
  EXPECT_EQ(major, 2);
  EXPECT_LT(minor, 34) << "the root is not older than the symbol versions the floor replaces";
}

// 1Gi declared: cuMemGetInfo says 1Gi, the library refuses one byte past what it calls free.
TEST_F(OlderUserlandTest, MemoryLimitHolds) {
  Json report =
      run("limited", {"--bytes", "256Mi", "--report-meminfo", "--probe-free", "--kernels", "2"},
          {{"NVSHARE_MEMORY_LIMIT", "1Gi"}}, 30);
  ASSERT_FALSE(HasFailure());
  const Json* probe = report.find("probe");
  ASSERT_NE(probe, nullptr) << report.dump();
  EXPECT_EQ(json_number(probe, "total"), 1 * kGi) << report.dump();
  EXPECT_EQ(json_string(probe, "over_by_one"), "CUDA_ERROR_OUT_OF_MEMORY");
  EXPECT_EQ(json_string(probe, "exact"), "CUDA_SUCCESS");
  EXPECT_EQ(json_string(probe, "one_more"), "CUDA_ERROR_OUT_OF_MEMORY");
}

// A 30% core cap: 300 kernels of 10 ms take 3 s of GPU time in about 10 s. Checked as in the e2e
// suite (harness.h, CapUse): the time held from the trainer's own trace, its kernels inside its
// grants, and K x D / wall time as a ceiling.
TEST_F(OlderUserlandTest, CoreCapHolds) {
  const long kernels = 300;
  const double kernel_s = 0.010;
  const std::string trace = dir_.path() + "/handoff.jsonl";
  Json report =
      run("capped", {"--kernels", std::to_string(kernels), "--kernel-us", "10000", "--progress"},
          {{"NVSHARE_CORE_LIMIT", "30"}, {"NVSHARE_TRACE_FILE", trace}}, 60);
  ASSERT_FALSE(HasFailure());
  const double wall = json_number(&report, "wall_s");
  const double share = 100.0 * static_cast<double>(kernels) * kernel_s / wall;
  measure("GPU share under a 30% cap, in the older root (K x D / wall_s)", share, "%");
  expect_cap_held(cap_use(trace, *trainers_.back()), 30, "a 30% cap in the older root");
  EXPECT_LE(share, 32.0) << report.dump();
}

}  // namespace
}  // namespace nvshare::e2e

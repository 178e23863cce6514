// The attacks of a local process on a GPU node, short: each tries to starve the other clients, to
// lift a pod's limit, or to outlast the limits, against the real scheduler and real trainers under
// the real library on the simulated GPU. What runs unprivileged on a node runs here as an
// unprivileged uid (nobody), forked from the test (which runs as root, as CI does). Pods are real
// cgroups named as the kubelet names them (FakePod), so the scheduler finds them from the kernel,
// as it does on a node.
//
// Each test states the property it checks; `make soak MINUTES=N` runs the long versions.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "chaos_support.h"
#include "common/protocol.h"
#include "common/unix_socket.h"
#include "control/client.h"
#include "gtest/gtest.h"
#include "harness.h"
#include "protocol_client.h"

namespace nvshare::chaos {
namespace {

using namespace std::chrono_literals;
using e2e::Env;
using e2e::measure;
using e2e::Scheduler;
using e2e::SpawnOptions;
using e2e::TempDir;
using e2e::Trainer;
using e2e::TrainerOptions;
using testing::ProtocolClient;

#define ASSERT_OK(expr)                                                        \
  do {                                                                         \
    const auto& ok_ = (expr);                                                  \
    ASSERT_TRUE(ok_.ok()) << (ok_.ok() ? std::string() : ok_.error().message); \
  } while (0)

constexpr double kGi = 1024.0 * 1024.0 * 1024.0;
constexpr const char* kGpu = "GPU-00000000-0000-4000-8000-000000000000";  // the fake's device 0
constexpr const char* kPod = "c4a05e11-7b3d-4f2a-9e6c-1d8b0a2f3e4d";
constexpr const char* kOtherPod = "5e0b7c2a-9d14-4c3b-8f6e-2a7d1b9c0e5f";

protocol::Hello hello_for(const std::string& gpu) { return testing::hello_for(gpu); }

// Memory the allocator keeps after it was freed, which RSS counts. None normally; under
// AddressSanitizer freed blocks wait in its quarantine (256 MiB by default) before reuse, so the
// growth of a sanitized scheduler includes up to that much.
#if defined(__SANITIZE_ADDRESS__)
constexpr std::size_t kAllocatorHoldsBack = std::size_t{256} << 20;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr std::size_t kAllocatorHoldsBack = std::size_t{256} << 20;
#else
constexpr std::size_t kAllocatorHoldsBack = 0;
#endif
#else
constexpr std::size_t kAllocatorHoldsBack = 0;
#endif

class ChaosTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) {
      GTEST_SKIP() << "the chaos tests make cgroups and drop to an unprivileged uid: run as root";
    }
    state_ = dir_.path() + "/fakecuda.state";
    // Attackers run as nobody and must reach the scheduler's socket in this directory.
    ::chmod(dir_.path().c_str(), 0755);
  }

  void TearDown() override {
    for (auto& t : trainers_) {
      if (t->running()) t->kill(SIGKILL);
    }
    if (HasFailure() && scheduler_) {
      std::fprintf(stderr, "--- scheduler log:\n%s\n", e2e::tail(scheduler_->log(), 80).c_str());
      for (const auto& t : trainers_) std::fprintf(stderr, "%s\n", t->describe().c_str());
    }
  }

  Env gpu_env() const {
    return {{"LD_LIBRARY_PATH", e2e::programs().fakecuda_dir},
            {"NVSHARE_FAKECUDA_STATE", state_},
            {"NVSHARE_FAKECUDA_DEVICES", "1"},
            {"NVSHARE_FAKECUDA_MEMORY", "16Gi"}};
  }

  void start_scheduler(std::vector<std::string> flags) {
    scheduler_ = std::make_unique<Scheduler>(dir_.path(), std::move(flags), gpu_env());
    ASSERT_OK(scheduler_->start());
  }

  Trainer& start_trainer(TrainerOptions options) {
    trainers_.push_back(std::make_unique<Trainer>(std::move(options), dir_.path()));
    Env env = gpu_env();
    env["NVSHARE_SOCKET"] = scheduler_->socket();
    Status started = trainers_.back()->start(env);
    EXPECT_TRUE(started.ok()) << (started.ok() ? "" : started.error().message);
    return *trainers_.back();
  }

  Json control(const Json& request) {
    auto response = control::control_call(scheduler_->control_socket(), request, 5000);
    EXPECT_TRUE(response.ok()) << (response.ok() ? "" : response.error().message);
    return response.ok() ? response.value() : Json();
  }
  Json stats() { return control(Json(Json::Object{{"cmd", "stats"}})); }
  Json status() { return control(Json(Json::Object{{"cmd", "status"}})); }

  void set_pod_memory(const std::string& pod, const std::string& memory) {
    auto set = scheduler_->ctl({"set-limits", "--pod-uid", pod, "--memory", memory});
    ASSERT_OK(set);
    ASSERT_EQ(set.value().exit_code, 0) << set.value().out << set.value().err;
  }

  // A client of the scheduler's socket, registered (its welcome and limits read).
  ProtocolClient registered(std::uint64_t allocated) {
    auto client = ProtocolClient::connect(scheduler_->socket());
    EXPECT_TRUE(client.ok());
    ProtocolClient c = std::move(client).value();
    EXPECT_TRUE(c.hello(hello_for(kGpu)).ok());
    EXPECT_TRUE(c.wait_for<protocol::SetLimits>(2000ms).ok());
    EXPECT_TRUE(c.send(protocol::Usage{allocated, allocated, 0}).ok());
    return c;
  }

  TempDir dir_;
  std::string state_;
  std::unique_ptr<Scheduler> scheduler_;
  std::vector<std::unique_ptr<Trainer>> trainers_;
};

// A hog as any uid on the node can be one: it takes the grant, ignores every revoke, and reports
// 2^60 allocated bytes at a swap bandwidth of 1 byte/s. Returns (through its report) once granted.
std::unique_ptr<Attacker> start_hog(const std::string& socket) {
  auto attacker = Attacker::start(kNobody, 1024, [socket](int report) {
    auto client = ProtocolClient::connect(socket);
    if (!client.ok() || !client.value().hello(hello_for(kGpu)).ok()) return 1;
    ProtocolClient& c = client.value();
    const std::uint64_t lie = std::uint64_t{1} << 60;
    if (!c.send(protocol::Usage{lie, lie, 1}).ok() || !c.send(protocol::Request{}).ok()) return 2;
    if (!c.wait_for<protocol::Grant>(5000ms).ok()) return 3;
    report_line(report, "granted");
    for (;;) (void)c.next(1000ms);  // revokes are read, never answered
  });
  return attacker.ok() ? std::move(attacker).value() : nullptr;
}

// Whatever a hog reports, a client waiting behind it is granted within the hog bound:
// quantum-max + revoke-grace + swap-allowance-max (here 2 + 1 + 1 s; 30 s with the defaults, which
// the soak checks).
TEST_F(ChaosTest, AHogThatLiesAboutItselfDelaysOthersAtMostTheBound) {
  ASSERT_NO_FATAL_FAILURE(start_scheduler({"--quantum-min", "1", "--quantum-max", "2",
                                           "--revoke-grace", "1", "--swap-allowance-max", "1"}));
  auto hog = start_hog(scheduler_->socket());
  ASSERT_NE(hog, nullptr);
  ASSERT_OK(hog->report(5));
  ProtocolClient victim = registered(std::uint64_t{1} << 30);
  const double asked = e2e::monotonic_s();
  ASSERT_TRUE(victim.send(protocol::Request{}).ok());
  auto grant = victim.wait_for<protocol::Grant>(20000ms);
  ASSERT_OK(grant);
  const double waited = e2e::monotonic_s() - asked;
  measure("victim waited behind the hog", waited, "s");
  EXPECT_LE(waited, 4.0 + 0.5) << "the hog bound is 2 + 1 + 1 s";
  // The hog is seen for what it is.
  bool unresponsive = false;
  const Json st = status();
  for (const Json& gpu : *st.find("gpus")->as_array()) {
    for (const Json& c : *gpu.find("clients")->as_array()) {
      unresponsive |= e2e::json_string(&c, "state") == "unresponsive";
    }
  }
  EXPECT_TRUE(unresponsive);
}

// The same with the default knobs: the bound is 15 + 5 + 10 = 30 s.
TEST_F(ChaosTest, WithDefaultKnobsAHogDelaysOthersAtMostThirtySeconds) {
  ASSERT_NO_FATAL_FAILURE(start_scheduler({}));
  auto hog = start_hog(scheduler_->socket());
  ASSERT_NE(hog, nullptr);
  ASSERT_OK(hog->report(5));
  const double hog_granted = e2e::monotonic_s();
  ProtocolClient victim = registered(std::uint64_t{1} << 30);
  ASSERT_TRUE(victim.send(protocol::Request{}).ok());
  auto grant = victim.wait_for<protocol::Grant>(60000ms);
  ASSERT_OK(grant);
  const double since_hog = e2e::monotonic_s() - hog_granted;
  measure("victim granted after the hog's grant", since_hog, "s");
  EXPECT_LE(since_hog, 30.0 + 0.5);
}

// 20,000 connections from one unprivileged uid, none of which ever says hello: other clients still
// get grants, the control socket answers, and a new process in a pod with a 1Gi limit is held to
// it.
TEST_F(ChaosTest, AConnectionFloodFromOneUidLiftsNoLimitAndStarvesNobody) {
  ASSERT_NO_FATAL_FAILURE(start_scheduler({"--hello-timeout", "1"}));
  auto pod = FakePod::create(kPod);
  ASSERT_OK(pod);
  ASSERT_NO_FATAL_FAILURE(set_pod_memory(kPod, "1Gi"));
  const Footprint before = footprint(scheduler_->pid());
  // (The harness's readiness probe opened a session already.)
  const std::int64_t opened_before =
      stats().find("sessions")->find("opened")->as_int64().value_or(0);
  // One uid, two processes (a process's descriptors are capped at 20,000 on some machines).
  constexpr int kConnections = 20000;
  constexpr int kPerProcess = kConnections / 2;
  std::vector<std::unique_ptr<Attacker>> flood;
  for (int p = 0; p < 2; ++p) {
    auto attacker =
        Attacker::start(kNobody, kPerProcess + 100, [socket = scheduler_->socket()](int r) {
          std::vector<UniqueFd> held;
          held.reserve(kPerProcess);
          for (int i = 0; i < kPerProcess; ++i) {
            auto fd = connect_unix(socket);
            if (!fd.ok()) {
              report_line(r, "connect " + std::to_string(i) + ": " + fd.error().message);
              return 1;
            }
            held.push_back(std::move(fd).value());
          }
          int closed = 0;
          for (UniqueFd& fd : held) {
            char byte;
            if (::recv(fd.get(), &byte, 1, MSG_DONTWAIT) == 0) ++closed;
          }
          report_line(r, "held " + std::to_string(held.size()) + ", closed by the scheduler " +
                             std::to_string(closed));
          for (;;) ::pause();
        });
    ASSERT_OK(attacker);
    flood.push_back(std::move(attacker).value());
  }
  for (auto& attacker : flood) {
    auto held = attacker->report(120);
    ASSERT_OK(held);
    std::printf("flood: %s\n", held.value().c_str());
  }
  const Footprint during = footprint(scheduler_->pid());
  measure("scheduler descriptors before the flood", static_cast<double>(before.fds), "");
  measure("scheduler descriptors during the flood", static_cast<double>(during.fds), "");
  EXPECT_LT(during.fds, before.fds + 300) << "one uid may hold 256 sessions";

  // The control socket answers, and another client is granted.
  // Every connection over the uid's 256 is refused as soon as the scheduler takes it from the
  // backlog (checked through the control socket, which answers meanwhile).
  // Sessions that never said hello are closed after the hello timeout, which lets a few more of
  // the flood in meanwhile: every connection was either admitted (within the uid's 256 at any
  // time) or refused.
  std::int64_t refused = 0;
  std::int64_t admitted = 0;
  for (int i = 0; i < 200 && refused + admitted < kConnections; ++i) {
    const Json counters = stats();
    ASSERT_FALSE(counters.is_null());
    refused = counters.find("sessions")->find("refused_limit")->as_int64().value_or(0);
    admitted = counters.find("sessions")->find("opened")->as_int64().value_or(0) - opened_before;
    if (refused + admitted < kConnections) e2e::sleep_s(0.05);
  }
  EXPECT_EQ(refused + admitted, kConnections);
  EXPECT_GE(refused, kConnections - 1000);
  measure("connections refused at once", static_cast<double>(refused), "");
  ProtocolClient other = registered(std::uint64_t{1} << 30);
  ASSERT_TRUE(other.send(protocol::Request{}).ok());
  ASSERT_OK(other.wait_for<protocol::Grant>(3000ms));
  ASSERT_TRUE(other.send(protocol::Released{1, 0, 0}).ok());
  other.close();

  // A process of the limited pod registers (its pod has sessions of its own) and is held to 1Gi.
  SpawnOptions in_pod;
  in_pod.cgroup_procs = pod.value()->procs();
  Trainer& t = start_trainer(
      TrainerOptions("in-pod", {"--bytes", "2Gi", "--kernels", "1"}, {}, true, in_pod));
  auto code = t.wait(30);
  ASSERT_OK(code);
  EXPECT_EQ(code.value(), 1) << t.describe();
  auto report = t.report();
  ASSERT_OK(report);
  EXPECT_EQ(e2e::json_string(&report.value(), "error"), "CUDA_ERROR_OUT_OF_MEMORY: cuMemAlloc")
      << t.describe();

  // The connections that never spoke are gone after the hello timeout.
  e2e::sleep_s(1.5);
  EXPECT_GE(stats().find("sessions")->find("closed_no_hello")->as_int64().value_or(0), 200);
  EXPECT_LT(footprint(scheduler_->pid()).fds, before.fds + 20);
}

// CUDA IPC across pods: a process of the exporter's pod maps the shared allocation and sees its
// bytes; a process of another pod holding the same handle is refused, and learns nothing.
TEST_F(ChaosTest, AnIpcHandleOpensOnlyInTheExportersPod) {
  ASSERT_NO_FATAL_FAILURE(start_scheduler({}));
  auto pod = FakePod::create(kPod);
  ASSERT_OK(pod);
  auto other_pod = FakePod::create(kOtherPod);
  ASSERT_OK(other_pod);
  ASSERT_NO_FATAL_FAILURE(set_pod_memory(kPod, "1Gi"));
  ASSERT_NO_FATAL_FAILURE(set_pod_memory(kOtherPod, "1Gi"));
  SpawnOptions in_pod;
  in_pod.cgroup_procs = pod.value()->procs();
  SpawnOptions in_other_pod;
  in_other_pod.cgroup_procs = other_pod.value()->procs();
  const std::string handle = dir_.path() + "/ipc.handle";
  const std::string done = dir_.path() + "/ipc.done";
  Trainer& exporter = start_trainer(TrainerOptions(
      "exporter", {"--bytes", "64Mi", "--kernels", "1", "--ipc-export", handle, "--ipc-wait", done},
      {}, true, in_pod));
  bool exported = false;
  for (int i = 0; i < 1000 && !exported; ++i) {
    exported = !e2e::read_file(handle).empty();
    if (!exported) e2e::sleep_s(0.02);
  }
  ASSERT_TRUE(exported) << exporter.describe();

  Trainer& stranger = start_trainer(TrainerOptions(
      "other-pod", {"--kernels", "0", "--ipc-import", handle}, {}, true, in_other_pod));
  auto code = stranger.wait(30);
  ASSERT_OK(code);
  EXPECT_EQ(code.value(), 1) << stranger.describe();
  auto refused = stranger.report();
  ASSERT_OK(refused);
  EXPECT_EQ(e2e::json_string(&refused.value(), "error"),
            "CUDA_ERROR_INVALID_HANDLE: cuIpcOpenMemHandle")
      << stranger.describe();

  Trainer& mate = start_trainer(
      TrainerOptions("same-pod", {"--kernels", "0", "--ipc-import", handle, "--ipc-done", done}, {},
                     true, in_pod));
  for (Trainer* t : {&mate, &exporter}) {
    auto finished = t->wait(30);
    ASSERT_OK(finished);
    EXPECT_EQ(finished.value(), 0) << t->describe();
  }
  auto read = mate.report();
  auto seen = exporter.report();
  ASSERT_OK(read);
  ASSERT_OK(seen);
  EXPECT_EQ(e2e::json_string(&read.value(), "ipc_read"), "5a") << mate.describe();
  EXPECT_EQ(e2e::json_string(&seen.value(), "ipc_seen"), "a5") << exporter.describe();
  const Json counters = stats();
  EXPECT_EQ(counters.find("sessions")->find("ipc_refused")->as_int64().value_or(-1), 1);
  EXPECT_EQ(counters.find("sessions")->find("ipc_imports")->as_int64().value_or(-1), 1);
}

// A logged-in user owns a delegated cgroup tree (systemd's user@UID.service) and may name a
// directory there after any pod: a process moved into it is not taken for the pod, so it gets
// neither the pod's limits nor its identity (its class, its gang, its IPC exports).
TEST_F(ChaosTest, ACgroupNamedAfterAPodInAUserTreeIsNotThePod) {
  ASSERT_NO_FATAL_FAILURE(start_scheduler({}));
  auto impostor = FakePod::create(kPod, "user.slice/user-1000.slice/user@1000.service/app.slice");
  ASSERT_OK(impostor);
  ASSERT_NO_FATAL_FAILURE(set_pod_memory(kPod, "1Gi"));
  SpawnOptions in_tree;
  in_tree.cgroup_procs = impostor.value()->procs();
  Trainer& t = start_trainer(
      TrainerOptions("impostor", {"--bytes", "64Mi", "--kernels", "50", "--kernel-us", "20000"}, {},
                     true, in_tree));
  Json seen;
  for (int i = 0; i < 500 && seen.is_null(); ++i) {
    const Json s = status();
    if (const Json* c = e2e::find_client(s, t.pid())) seen = *c;
    if (seen.is_null()) e2e::sleep_s(0.01);
  }
  ASSERT_FALSE(seen.is_null()) << "the process never registered";
  EXPECT_TRUE(seen.find("pod_uid")->is_null()) << seen.dump();
  EXPECT_TRUE(seen.find("memory_limit_bytes")->is_null()) << seen.dump();
  auto code = t.wait(30);
  ASSERT_OK(code);
  EXPECT_EQ(code.value(), 0) << t.describe();
}

// Ten scheduler crashes (SIGKILL, restarted at once) while a process of a pod with a 1Gi limit
// samples cuMemGetInfo every 10 ms: it finishes its work, and never sees more than 1Gi.
TEST_F(ChaosTest, RestartsNeverLetAPodsLimitGoMissing) {
  ASSERT_NO_FATAL_FAILURE(start_scheduler({}));
  auto pod = FakePod::create(kPod);
  ASSERT_OK(pod);
  ASSERT_NO_FATAL_FAILURE(set_pod_memory(kPod, "1Gi"));
  SpawnOptions in_pod;
  in_pod.cgroup_procs = pod.value()->procs();
  Trainer& t = start_trainer(TrainerOptions(
      "sampler",
      {"--bytes", "256Mi", "--kernels", "600", "--kernel-us", "10000", "--meminfo-every-ms", "10"},
      {}, true, in_pod));
  e2e::sleep_s(0.5);
  for (int i = 0; i < 10; ++i) {
    scheduler_->kill_hard();
    ASSERT_OK(scheduler_->start());
    e2e::sleep_s(0.3);
  }
  auto code = t.wait(120);
  ASSERT_OK(code);
  EXPECT_EQ(code.value(), 0) << t.describe();
  auto report = t.report();
  ASSERT_OK(report);
  EXPECT_EQ(e2e::json_string(&report.value(), "result"), "ok") << t.describe();
  const double samples = e2e::json_number(&report.value(), "meminfo_samples", 0);
  measure("cuMemGetInfo samples across the restarts", samples, "");
  EXPECT_GT(samples, 100) << t.describe();
  EXPECT_LE(e2e::json_number(&report.value(), "meminfo_max_total", -1), kGi) << t.describe();
  EXPECT_GE(e2e::json_number(&report.value(), "meminfo_max_total", -1), 0) << t.describe();
}

// One idle hello claiming a 1-byte GPU changes nothing: two clients that fit beside each other on
// the device's 16Gi still run together.
TEST_F(ChaosTest, AHelloCannotShrinkTheGpu) {
  ASSERT_NO_FATAL_FAILURE(start_scheduler({"--mode", "auto"}));
  auto liar = ProtocolClient::connect(scheduler_->socket());
  ASSERT_OK(liar);
  protocol::Hello tiny = hello_for(kGpu);
  tiny.gpu_memory_bytes = 1;
  ASSERT_OK(liar.value().hello(tiny));
  ProtocolClient a = registered(std::uint64_t{4} << 30);
  ProtocolClient b = registered(std::uint64_t{4} << 30);
  ASSERT_TRUE(a.send(protocol::Request{}).ok());
  ASSERT_TRUE(b.send(protocol::Request{}).ok());
  ASSERT_OK(a.wait_for<protocol::Grant>(2000ms));
  ASSERT_OK(b.wait_for<protocol::Grant>(2000ms));
  const Json st = status();
  const Json& gpu = st.find("gpus")->as_array()->at(0);
  EXPECT_EQ(e2e::json_number(&gpu, "capacity_bytes"), 16 * kGi) << gpu.dump();
}

// 50,000 hellos naming GPUs this node does not have, from an unprivileged uid: every one is
// refused, nothing is remembered of them, and a real client is served as before.
TEST_F(ChaosTest, InventedGpusAreRefusedAndLeaveNothingBehind) {
  ASSERT_NO_FATAL_FAILURE(start_scheduler({}));
  const Footprint before = footprint(scheduler_->pid());
  constexpr int kHellos = 50000;
  auto inventor = Attacker::start(kNobody, 1024, [socket = scheduler_->socket()](int r) {
    std::mt19937_64 random(42);
    double first = 0;
    double last = 0;
    for (int i = 0; i < kHellos; ++i) {
      const double started = e2e::monotonic_s();
      auto client = ProtocolClient::connect(socket);
      if (!client.ok()) return 1;
      char uuid[64];
      std::snprintf(uuid, sizeof uuid, "GPU-%016llx", static_cast<unsigned long long>(random()));
      protocol::Hello hello = hello_for(uuid);
      if (!client.value().send(hello).ok()) return 2;
      if (!client.value().closed_within(2000ms)) return 3;
      const double took = e2e::monotonic_s() - started;
      if (i < 5000) first += took;
      if (i >= kHellos - 5000) last += took;
    }
    report_line(r, std::to_string(first / 5000 * 1e6) + " " + std::to_string(last / 5000 * 1e6));
    return 0;
  });
  ASSERT_OK(inventor);
  auto costs = inventor.value()->report(300);
  ASSERT_OK(costs);
  ASSERT_OK(inventor.value()->wait(10));
  EXPECT_EQ(inventor.value()->wait(1).value(), 0);
  double first_us = 0;
  double last_us = 0;
  std::sscanf(costs.value().c_str(), "%lf %lf", &first_us, &last_us);
  measure("refusal, first 5,000 (connect to close)", first_us, "us");
  measure("refusal, last 5,000 (connect to close)", last_us, "us");
  const Footprint after = footprint(scheduler_->pid());
  measure("scheduler RSS growth", static_cast<double>(after.rss_bytes - before.rss_bytes) / 1e6,
          "MB");
  EXPECT_LT(after.rss_bytes, before.rss_bytes + (std::size_t{8} << 20) + kAllocatorHoldsBack);
  EXPECT_EQ(stats().find("sessions")->find("closed_unknown_gpu")->as_int64(), kHellos);
  const Json st = status();
  for (const Json& gpu : *st.find("gpus")->as_array()) {
    EXPECT_EQ(e2e::json_string(&gpu, "uuid"), kGpu);
  }
  ProtocolClient real = registered(std::uint64_t{1} << 30);
  ASSERT_TRUE(real.send(protocol::Request{}).ok());
  ASSERT_OK(real.wait_for<protocol::Grant>(2000ms));
}

// In a pod with a 1Gi limit, whose container got its settings from the device plugin: no
// environment variable lets a process allocate 2Gi, with the scheduler up or down.
class EnvironmentTest : public ChaosTest {
 protected:
  void SetUp() override {
    ChaosTest::SetUp();
    if (IsSkipped()) return;
    ASSERT_TRUE(mount_point_.ok()) << "cannot make /etc/nvshare as a mount point";
    auto pod = FakePod::create(kPod);
    ASSERT_OK(pod);
    pod_ = std::move(pod).value();
    ASSERT_NO_FATAL_FAILURE(start_scheduler({}));
    ASSERT_NO_FATAL_FAILURE(set_pod_memory(kPod, "1Gi"));
    settings_ = dir_.path() + "/container-settings";
    write(std::to_string(1ull << 30));
  }

  void write(const std::string& memory) {
    ASSERT_OK(write_settings(settings_, "enforce=1\nsocket=" + scheduler_->socket() +
                                            "\nregister-wait-ms=3000\nmemory-limit=" + memory +
                                            "\n"));
  }

  // Runs a trainer in the pod's container asking for `bytes` first; returns its error ("" when
  // it succeeded).
  std::string run(const std::string& name, Env env, const std::string& bytes = "2Gi") {
    SpawnOptions container;
    container.cgroup_procs = pod_->procs();
    container.settings_dir = settings_;
    Trainer& t = start_trainer(TrainerOptions(name, {"--bytes", bytes, "--kernels", "1"},
                                              std::move(env), true, container));
    auto code = t.wait(30);
    EXPECT_TRUE(code.ok()) << t.describe();
    auto report = t.report();
    EXPECT_TRUE(report.ok()) << t.describe();
    if (!report.ok()) return "no report";
    const std::string error = e2e::json_string(&report.value(), "error");
    return error.empty() && code.ok() && code.value() == 0 ? "" : error;
  }

  SettingsMountPoint mount_point_;
  std::unique_ptr<FakePod> pod_;
  std::string settings_;
};

constexpr const char* kOom = "CUDA_ERROR_OUT_OF_MEMORY: cuMemAlloc";

TEST_F(EnvironmentTest, NoVariableLiftsThePodsLimitWhileTheSchedulerRuns) {
  EXPECT_EQ(run("enable-0", {{"NVSHARE_ENABLE", "0"}}), kOom);
  EXPECT_EQ(run("wrong-socket", {{"NVSHARE_SOCKET", "/nonexistent/scheduler.sock"}}), kOom);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(run("no-wait-" + std::to_string(i), {{"NVSHARE_REGISTER_WAIT_MS", "0"}}), kOom);
  }
  EXPECT_EQ(run("declares-more", {{"NVSHARE_MEMORY_LIMIT", "8Gi"}}), kOom);
  EXPECT_EQ(run("within", {{"NVSHARE_ENABLE", "0"}}, "512Mi"), "");
}

TEST_F(EnvironmentTest, WithoutASchedulerTheSettingsLimitHolds) {
  scheduler_->kill_hard();
  EXPECT_EQ(run("down-enable-0", {{"NVSHARE_ENABLE", "0"}}), kOom);
  EXPECT_EQ(run("down", {}), kOom);
  EXPECT_EQ(run("down-within", {}, "512Mi"), "");
  // Not known yet (the plugin has not matched the container to its pod): nothing is allocated.
  write("pending");
  EXPECT_EQ(run("down-pending", {}, "1Mi"), kOom);
}

// A control client that pipelines requests and never reads costs the scheduler a bounded amount of
// memory, and other control clients are still answered.
TEST_F(ChaosTest, ASlowControlReaderCannotGrowTheScheduler) {
  ASSERT_NO_FATAL_FAILURE(start_scheduler({}));
  ProtocolClient busy = registered(std::uint64_t{1} << 30);  // something for status to show
  const Footprint before = footprint(scheduler_->pid());
  auto fd = connect_unix(scheduler_->control_socket());
  ASSERT_OK(fd);
  ASSERT_OK(set_nonblocking(fd.value().get()));
  const std::string request = "{\"cmd\":\"status\"}\n";
  std::size_t sent = 0;
  const double until = e2e::monotonic_s() + 3;
  while (e2e::monotonic_s() < until) {
    const ssize_t n = ::send(fd.value().get(), request.data(), request.size(), MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<std::size_t>(n);
    } else {
      e2e::sleep_s(0.001);
    }
  }
  const Footprint after = footprint(scheduler_->pid());
  measure("requests pipelined", static_cast<double>(sent / request.size()), "");
  measure("scheduler RSS growth", static_cast<double>(after.rss_bytes - before.rss_bytes) / 1e6,
          "MB");
  EXPECT_LT(after.rss_bytes, before.rss_bytes + (std::size_t{32} << 20) + kAllocatorHoldsBack);
  EXPECT_TRUE(status().find("ok")->as_bool().value_or(false));
}

// The identity of a session is its connecting process's, read when the connection is accepted: a
// process of a pod connects, forks and exits; its child says hello later (from outside the pod's
// cgroup, even) and the session still belongs to the pod.
TEST_F(ChaosTest, IdentityIsTakenWhenTheConnectionIsAccepted) {
  ASSERT_NO_FATAL_FAILURE(start_scheduler({}));
  auto pod = FakePod::create(kPod);
  ASSERT_OK(pod);
  const std::string procs = pod.value()->procs();
  const std::string root_procs = pod.value()->root_procs();
  auto connector =
      Attacker::start(0, 64, [socket = scheduler_->socket(), procs, root_procs](int r) {
        {
          std::FILE* f = std::fopen(procs.c_str(), "w");
          if (f == nullptr) return 1;
          std::fprintf(f, "0\n");
          std::fclose(f);
        }
        auto client = ProtocolClient::connect(socket);
        if (!client.ok()) return 2;
        e2e::sleep_s(0.3);  // accepted and identified by now
        const pid_t connecting = ::getpid();
        const pid_t child = ::fork();
        if (child < 0) return 3;
        if (child > 0) return 0;                               // the connecting process exits
        while (::getppid() == connecting) e2e::sleep_s(0.01);  // reparented once it is gone
        std::FILE* root = std::fopen(root_procs.c_str(), "w");
        if (root != nullptr) {
          std::fprintf(root, "0\n");
          std::fclose(root);
        }
        auto welcome = client.value().hello(hello_for(kGpu));
        if (!welcome.ok()) _exit(4);
        report_line(r, std::to_string(welcome.value().client_id));
        // Nothing holds this orphan to the test but the report pipe: it ends when the test closes
        // it.
        const int null = ::open("/dev/null", O_WRONLY);
        ::dup2(null, STDOUT_FILENO);
        ::dup2(null, STDERR_FILENO);
        pollfd until_closed{r, 0, 0};
        (void)::poll(&until_closed, 1, 60000);
        _exit(0);
      });
  ASSERT_OK(connector);
  auto id = connector.value()->report(10);
  ASSERT_OK(id);
  const Json st = status();
  const Json* session = nullptr;
  for (const Json& c : *st.find("gpus")->as_array()->at(0).find("clients")->as_array()) {
    if (std::to_string(c.find("id")->as_int64().value_or(0)) == id.value()) session = &c;
  }
  ASSERT_NE(session, nullptr) << st.dump();
  EXPECT_EQ(e2e::json_string(session, "pod_uid"), kPod) << session->dump();
}

// A connection whose process is gone before the scheduler could look at it belongs to nobody it
// can name: refused, unless clients are trusted.
TEST_F(ChaosTest, APeerThatCannotBeIdentifiedIsRefused) {
  ASSERT_NO_FATAL_FAILURE(start_scheduler({}));
  ::kill(scheduler_->pid(), SIGSTOP);
  auto gone = Attacker::start(kNobody, 64, [socket = scheduler_->socket()](int) {
    auto client = ProtocolClient::connect(socket);
    return client.ok() ? 0 : 1;  // connected (queued), then exits at once
  });
  ASSERT_OK(gone);
  ASSERT_OK(gone.value()->wait(5));
  ::kill(scheduler_->pid(), SIGCONT);
  e2e::sleep_s(0.3);
  EXPECT_EQ(stats().find("sessions")->find("refused_identity")->as_int64(), 1);
}

}  // namespace
}  // namespace nvshare::chaos

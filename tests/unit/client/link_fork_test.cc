// fork() with a live link, and the process-wide link_device() as a real process sees it (these run
// the test binary again in a child process, with the environment the case needs).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <future>

#include "client/device_link.h"
#include "client/link/link_engine.h"
#include "test_support.h"

namespace nvshare::client {
namespace {

using namespace std::chrono_literals;
using testing::FakeAgent;
using testing::ScriptedScheduler;
using testing::TempDir;
using testing::wait_until;

constexpr std::uint64_t kGpuMemory = 8ull << 30;
constexpr const char* kChildCase = "NVSHARE_LINK_TEST_CHILD_CASE";

int wait_child(pid_t pid, std::chrono::milliseconds timeout) {
  return testing::wait_process(pid, timeout);
}

// ThreadSanitizer cannot start threads in the child of a multi-threaded fork, which is the case
// here.
#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define NVSHARE_SKIP_UNDER_TSAN() \
  GTEST_SKIP() << "ThreadSanitizer does not support threads after fork"
#endif
#endif
#ifndef NVSHARE_SKIP_UNDER_TSAN
#define NVSHARE_SKIP_UNDER_TSAN() (void)0
#endif

TEST(LinkFork, ChildRegistersAfreshWhileTheParentKeepsItsSession) {
  NVSHARE_SKIP_UNDER_TSAN();
  TempDir dir;
  ScriptedScheduler scheduler(dir.file("s.sock"));
  LinkOptions options;
  options.socket_path = dir.file("s.sock");
  options.process_name = "fork-test";
  FakeAgent held_agent;  // agents outlive the engine that calls them, as the hooks' agents do
  FakeAgent waiting_agent;
  LinkEngine engine(options);
  DeviceLink& held = engine.device({"GPU-held", kGpuMemory}, held_agent);
  DeviceLink& waiting = engine.device({"GPU-wait", kGpuMemory}, waiting_agent);
  std::map<std::string, std::unique_ptr<testing::ScriptedPeer>> peers;
  for (int i = 0; i < 2; ++i) {
    auto peer = scheduler.accept();
    ASSERT_NE(peer, nullptr);
    auto hello = peer->handshake();
    ASSERT_TRUE(hello);
    peers[hello->gpu_uuid] = std::move(peer);
  }
  // GPU-held: granted. GPU-wait: a thread waits for a grant at the moment of fork.
  auto first = std::async(std::launch::async, [&] {
    held.before_submit();
    held.after_submit(true);
  });
  ASSERT_TRUE(peers["GPU-held"]->expect<protocol::Request>());
  peers["GPU-held"]->send(protocol::Grant{1});
  ASSERT_EQ(first.wait_for(3s), std::future_status::ready);
  auto blocked = std::async(std::launch::async, [&] {
    waiting.before_submit();
    waiting.after_submit(true);
  });
  ASSERT_TRUE(peers["GPU-wait"]->expect<protocol::Request>());

  const pid_t child = ::fork();
  if (child == 0) {
    ::alarm(10);  // a deadlock shows as a child killed by SIGALRM
    // The child is a new client: both GPUs register again before anything runs.
    held.before_submit();
    held.after_submit(true);
    waiting.before_submit();
    waiting.after_submit(true);
    ::_exit(0);
  }
  ASSERT_GT(child, 0);
  // The child's sessions: hello with its own pid, then a request per GPU in the order the child
  // submits; grants let it finish.
  std::map<std::string, std::unique_ptr<testing::ScriptedPeer>> child_peers;
  for (int i = 0; i < 2; ++i) {
    auto peer = scheduler.accept(5000ms);
    ASSERT_NE(peer, nullptr) << "the child did not connect";
    auto hello = peer->handshake(100 + i);
    ASSERT_TRUE(hello);
    EXPECT_EQ(hello->pid, static_cast<std::uint32_t>(child));
    child_peers[hello->gpu_uuid] = std::move(peer);
  }
  for (const char* uuid : {"GPU-held", "GPU-wait"}) {
    ASSERT_EQ(child_peers.count(uuid), 1u) << uuid;
    ASSERT_TRUE(child_peers[uuid]->expect<protocol::Request>()) << uuid;
    child_peers[uuid]->send(protocol::Grant{1});
  }
  EXPECT_EQ(wait_child(child, 10s), 0);

  // The parent is unaffected: its grant still holds, its waiter is granted on its own session.
  const auto start = std::chrono::steady_clock::now();
  held.before_submit();
  held.after_submit(true);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 100ms);
  EXPECT_NE(blocked.wait_for(100ms), std::future_status::ready);
  peers["GPU-wait"]->send(protocol::Grant{1});
  EXPECT_EQ(blocked.wait_for(3s), std::future_status::ready);
  EXPECT_TRUE(peers["GPU-held"]->quiet_for(100ms)) << peers["GPU-held"]->last_unexpected();
}

TEST(LinkFork, ChildWithoutASchedulerRunsOpen) {
  NVSHARE_SKIP_UNDER_TSAN();
  TempDir dir;
  LinkOptions options;
  options.socket_path = dir.file("absent.sock");
  FakeAgent agent;  // outlives the engine that calls it, as the hooks' agents do
  LinkEngine engine(options);
  DeviceLink& link = engine.device({"GPU-x", kGpuMemory}, agent);
  link.before_submit();
  link.after_submit(true);
  const pid_t child = ::fork();
  if (child == 0) {
    ::alarm(10);
    for (int i = 0; i < 100; ++i) {
      link.before_submit();
      link.after_submit(true);
    }
    ::_exit(0);
  }
  EXPECT_EQ(wait_child(child, 10s), 0);
}

// ---- link_device(): the process-wide link, in a child process with its own environment ----------

// Runs one test case of this binary again in a child process with `env` added.
int run_case_in_child(const std::string& test, testing::EnvChanges env) {
  env[kChildCase] = test;
  const auto result = testing::run_process(
      {std::filesystem::read_symlink("/proc/self/exe").string(), "--gtest_filter=" + test}, env,
      20s);
  if (result.exit_code != 0) std::fprintf(stderr, "%s%s", result.out.c_str(), result.err.c_str());
  return result.exit_code;
}

bool in_child_case(const std::string& test) {
  const char* value = std::getenv(kChildCase);
  return value != nullptr && test == value;
}

int thread_count() {
  int count = 0;
  for ([[maybe_unused]] const auto& entry :
       std::filesystem::directory_iterator("/proc/self/task")) {
    ++count;
  }
  return count;
}

TEST(GlobalLink, DisabledByEnvironmentIsAPassThrough) {
  const std::string name = "GlobalLink.DisabledByEnvironmentIsAPassThrough";
  if (in_child_case(name)) {
    const int threads = thread_count();
    FakeAgent agent;
    DeviceLink& a = link_device({"GPU-a", kGpuMemory}, agent);
    DeviceLink& b = link_device({"GPU-a", kGpuMemory}, agent);
    EXPECT_EQ(&a, &b);
    for (int i = 0; i < 1000; ++i) {
      a.before_submit();
      a.after_submit(true);
    }
    a.usage_changed();
    std::this_thread::sleep_for(100ms);
    EXPECT_EQ(thread_count(), threads) << "NVSHARE_ENABLE=0 started a thread";
    EXPECT_TRUE(agent.calls().empty());
    return;
  }
  TempDir dir;
  ScriptedScheduler scheduler(dir.file("s.sock"));
  EXPECT_EQ(
      run_case_in_child(name, {{"NVSHARE_ENABLE", "0"}, {"NVSHARE_SOCKET", dir.file("s.sock")}}),
      0);
  EXPECT_EQ(scheduler.accept(100ms), nullptr) << "a disabled library connected to the scheduler";
}

TEST(GlobalLink, RegistersWithTheEnvironmentsDeclarationsAndExitsCleanly) {
  const std::string name = "GlobalLink.RegistersWithTheEnvironmentsDeclarationsAndExitsCleanly";
  if (in_child_case(name)) {
    static FakeAgent agent;  // outlives the process's link, as the hooks' agents do
    DeviceLink& link = link_device({"GPU-global", kGpuMemory}, agent);
    link.before_submit();  // registers, requests, waits for the parent's grant
    link.after_submit(true);
    EXPECT_EQ(agent.limits().front(), (protocol::Limits{2ull << 30, 40}));
    return;  // exit with the link thread running: must not hang or crash
  }
  TempDir dir;
  ScriptedScheduler scheduler(dir.file("s.sock"));
  auto child = std::async(std::launch::async, [&] {
    return run_case_in_child(name, {{"NVSHARE_SOCKET", dir.file("s.sock")},
                                    {"NVSHARE_MEMORY_LIMIT", "2Gi"},
                                    {"NVSHARE_CORE_LIMIT", "40"},
                                    {"NVSHARE_POD_UID", "pod-from-env"},
                                    {"NVSHARE_IDLE_RELEASE_MS", "0"}});
  });
  auto peer = scheduler.accept(10000ms);
  ASSERT_NE(peer, nullptr);
  auto hello = peer->handshake();
  ASSERT_TRUE(hello);
  EXPECT_EQ(hello->gpu_uuid, "GPU-global");
  EXPECT_EQ(hello->declared, (protocol::Limits{2ull << 30, 40}));
  EXPECT_EQ(hello->pod_uid, "pod-from-env");
  EXPECT_EQ(hello->capabilities & protocol::capability::kIdleRelease, 0u);
  ASSERT_TRUE(peer->expect<protocol::Request>());
  peer->send(protocol::Grant{1});
  ASSERT_EQ(child.wait_for(20s), std::future_status::ready);
  EXPECT_EQ(child.get(), 0);
  EXPECT_TRUE(peer->closed_within(1000ms));
}

TEST(GlobalLink, InvalidEnvironmentWarnsAndKeepsDefaults) {
  const std::string name = "GlobalLink.InvalidEnvironmentWarnsAndKeepsDefaults";
  if (in_child_case(name)) {
    static FakeAgent agent;  // outlives the process's link, as the hooks' agents do
    DeviceLink& link = link_device({"GPU-w", kGpuMemory}, agent);
    link.before_submit();  // no scheduler: runs at once
    link.after_submit(true);
    return;
  }
  TempDir dir;
  testing::EnvChanges env = {{kChildCase, name},
                             {"NVSHARE_SOCKET", dir.file("absent.sock")},
                             {"NVSHARE_CORE_LIMIT", "250"}};
  const auto result = testing::run_process(
      {std::filesystem::read_symlink("/proc/self/exe").string(), "--gtest_filter=" + name}, env,
      20s);
  EXPECT_EQ(result.exit_code, 0) << result.out << result.err;
  EXPECT_EQ(testing::count_occurrences(result.err, "NVSHARE_CORE_LIMIT=\"250\""), 1) << result.err;
  EXPECT_EQ(testing::count_occurrences(result.err, "scheduler unreachable"), 1) << result.err;
}

}  // namespace
}  // namespace nvshare::client

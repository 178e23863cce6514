// PodWatcher::memory_limits_by_pod_name against the local Kubernetes API server: the memory limits
// placement reads, keyed "namespace/name" as the kubelet's pod-resources API names pods. They
// follow the watch (list, modify, delete), only managed pods of this node appear, a pod name in two
// namespaces is two keys, and when a pod is recreated under the same name before the old one's
// deletion is seen, the name means the newer pod. No scheduler runs: the map is the watcher's own
// state, whatever the control socket answers.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>

#include "fake_api_server.h"
#include "podwatcher/pod_watcher.h"

namespace nvshare::podwatcher {
namespace {

using testing::FakeApiServer;
using testing::make_pod;
using namespace std::chrono_literals;
using Limits = std::map<std::string, std::uint64_t>;

constexpr const char* kNode = "node-a";
constexpr const char* kMemory = "nvshare.com/gpu-memory-limit";
constexpr std::uint64_t kGi = 1ull << 30;

// Polls `condition` until it holds or a generous deadline passes.
bool eventually(const std::function<bool()>& condition) {
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  while (!condition()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(10ms);
  }
  return true;
}

class PodNameLimitsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/nvshare-pnl-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    auto server = FakeApiServer::start();
    ASSERT_TRUE(server.ok()) << server.error().message;
    server_ = std::move(server.value());
    std::ofstream(dir_ + "/kubeconfig") << server_->kubeconfig("test-token");
  }

  void TearDown() override {
    watcher_.reset();
    server_.reset();
    std::filesystem::remove_all(dir_);
  }

  void start_watcher() {
    PodWatcherConfig config;
    config.node_name = kNode;
    config.kubeconfig_path = dir_ + "/kubeconfig";
    config.control_socket = dir_ + "/control.sock";  // nothing listens: pushes are retried
    config.backoff_initial = 20ms;
    config.backoff_max = 200ms;
    watcher_ = std::make_unique<PodWatcher>(config);
    Status started = watcher_->start();
    ASSERT_TRUE(started.ok()) << started.error().message;
  }

  // Polls until the watcher's map by name equals `expected`; the last value seen is left in
  // `last_` for the failure message.
  bool by_name_becomes(const Limits& expected) {
    return eventually([&] {
      last_ = watcher_->memory_limits_by_pod_name();
      return last_ == expected;
    });
  }

  std::string shown() const {
    std::string out = "{";
    for (const auto& [key, bytes] : last_) out += " " + key + "=" + std::to_string(bytes);
    return out + " }";
  }

  std::string dir_;
  std::unique_ptr<FakeApiServer> server_;
  std::unique_ptr<PodWatcher> watcher_;
  Limits last_;
};

TEST_F(PodNameLimitsTest, FollowsTheWatchByNamespaceAndName) {
  server_->add_pod(make_pod("uid-a", "trainer", kNode, {{kMemory, "4Gi"}}));
  server_->add_pod(
      make_pod("uid-b", "trainer", kNode, {{kMemory, "2Gi"}}, true, "nvshare.com/gpu", "research"));
  server_->add_pod(make_pod("uid-c", "plain", kNode, {}));
  server_->add_pod(make_pod("uid-d", "cpu-only", kNode, {{kMemory, "1Gi"}}, false));
  server_->add_pod(make_pod("uid-e", "elsewhere", "node-b", {{kMemory, "1Gi"}}));
  start_watcher();
  ASSERT_TRUE(by_name_becomes({{"ml/trainer", 4 * kGi}, {"research/trainer", 2 * kGi}})) << shown();
  // The same limits as by UID, under the pods' names.
  EXPECT_EQ(watcher_->memory_limits_by_pod_uid(), (Limits{{"uid-a", 4 * kGi}, {"uid-b", 2 * kGi}}));

  server_->modify_pod(make_pod("uid-a", "trainer", kNode, {{kMemory, "3Gi"}}));
  server_->modify_pod(make_pod("uid-c", "plain", kNode, {{kMemory, "512Mi"}}));
  ASSERT_TRUE(by_name_becomes(
      {{"ml/trainer", 3 * kGi}, {"ml/plain", kGi / 2}, {"research/trainer", 2 * kGi}}))
      << shown();

  // An invalid value keeps the limit in force.
  server_->modify_pod(make_pod("uid-c", "plain", kNode, {{kMemory, "half a gig"}}));
  ASSERT_TRUE(eventually([&] { return !server_->posted_events().empty(); }))
      << "no Warning event for the invalid value";
  EXPECT_EQ(watcher_->memory_limits_by_pod_name().at("ml/plain"), kGi / 2);

  // Removing the annotation, deleting the pod: gone from the map.
  server_->modify_pod(make_pod("uid-c", "plain", kNode, {}));
  server_->delete_pod("uid-b");
  ASSERT_TRUE(by_name_becomes({{"ml/trainer", 3 * kGi}})) << shown();
}

TEST_F(PodNameLimitsTest, ARecreatedPodTakesOverItsName) {
  start_watcher();
  ASSERT_TRUE(by_name_becomes({})) << shown();
  server_->add_pod(make_pod("uid-old", "worker-0", kNode, {{kMemory, "4Gi"}}));
  ASSERT_TRUE(by_name_becomes({{"ml/worker-0", 4 * kGi}})) << shown();

  // worker-0 recreated (a StatefulSet) with a new UID before the old pod's deletion arrives.
  server_->add_pod(make_pod("uid-new", "worker-0", kNode, {{kMemory, "1Gi"}}));
  ASSERT_TRUE(by_name_becomes({{"ml/worker-0", kGi}})) << shown();
  // The newer pod without a limit: the name has none, whatever the old pod had.
  server_->modify_pod(make_pod("uid-new", "worker-0", kNode, {}));
  ASSERT_TRUE(by_name_becomes({})) << shown();
  EXPECT_EQ(watcher_->memory_limits_by_pod_uid(), (Limits{{"uid-old", 4 * kGi}}));
  server_->modify_pod(make_pod("uid-new", "worker-0", kNode, {{kMemory, "2Gi"}}));
  ASSERT_TRUE(by_name_becomes({{"ml/worker-0", 2 * kGi}})) << shown();
  // The old pod's deletion, seen late, leaves the new pod's limit.
  server_->delete_pod("uid-old");
  ASSERT_TRUE(eventually([&] {
    return watcher_->memory_limits_by_pod_uid() == Limits{{"uid-new", 2 * kGi}};
  }));
  EXPECT_EQ(watcher_->memory_limits_by_pod_name(), (Limits{{"ml/worker-0", 2 * kGi}}));
}

}  // namespace
}  // namespace nvshare::podwatcher

// The pod watcher against a local HTTP server speaking the Kubernetes API shapes and the real
// nvshare-scheduler: limits from annotations reach the scheduler's pod records.
#include "podwatcher/pod_watcher.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>

#include "fake_api_server.h"
#include "protocol_client.h"
#include "scheduler_process.h"

namespace nvshare::podwatcher {
namespace {

using nlohmann::json;
using testing::check_event;
using testing::FakeApiServer;
using testing::make_pod;
using testing::SchedulerProcess;
using namespace std::chrono_literals;

constexpr const char* kNode = "node-a";
constexpr const char* kMemory = "nvshare.com/gpu-memory-limit";
constexpr const char* kCore = "nvshare.com/gpu-core-limit";
constexpr const char* kMode = "nvshare.com/gpu-memory-mode";
constexpr std::uint64_t kGi = 1ull << 30;
// Pod UIDs as the API server gives them.
constexpr const char* kUidA = "0a0a0a0a-0000-4000-8000-00000000000a";
constexpr const char* kUidB = "0b0b0b0b-0000-4000-8000-00000000000b";
constexpr const char* kUidC = "0c0c0c0c-0000-4000-8000-00000000000c";
constexpr const char* kUidD = "0d0d0d0d-0000-4000-8000-00000000000d";
constexpr const char* kUidMine = "0e0e0e0e-0000-4000-8000-00000000000e";
constexpr const char* kUidPlain = "0f0f0f0f-0000-4000-8000-00000000000f";

// Polls `condition` until it holds or the (generous) deadline passes.
bool eventually(const std::function<bool()>& condition, std::chrono::seconds limit = 20s) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    if (condition()) return true;
    std::this_thread::sleep_for(10ms);
  }
  return condition();
}

class PodWatcherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/nvshare-pw-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    auto server = FakeApiServer::start();
    ASSERT_TRUE(server.ok()) << server.error().message;
    server_ = std::move(server.value());
    kubeconfig_ = dir_ + "/kubeconfig";
    std::ofstream(kubeconfig_) << server_->kubeconfig("test-token");
  }

  void TearDown() override {
    watcher_.reset();
    scheduler_.reset();
    server_.reset();
    std::filesystem::remove_all(dir_);
  }

  void start_scheduler(const std::vector<std::string>& flags = {}) {
    auto scheduler = SchedulerProcess::start(NVSHARE_SCHEDULER_BIN, dir_, flags);
    ASSERT_TRUE(scheduler.ok()) << scheduler.error().message;
    scheduler_ = std::move(scheduler.value());
  }

  PodWatcherConfig config() const {
    PodWatcherConfig config;
    config.node_name = kNode;
    config.kubeconfig_path = kubeconfig_;
    config.control_socket = dir_ + "/control.sock";
    config.watch_timeout = 300s;
    config.backoff_initial = 20ms;
    config.backoff_max = 200ms;
    config.control_check_interval = 100ms;
    return config;
  }

  void start_watcher(PodWatcherConfig config) {
    watcher_ = std::make_unique<PodWatcher>(std::move(config));
    Status started = watcher_->start();
    ASSERT_TRUE(started.ok()) << started.error().message;
  }
  void start_watcher() { start_watcher(config()); }

  // Waits until a watch is open.
  bool watching() {
    return eventually([&] { return server_->open_watches() > 0; });
  }

  // The scheduler's record of a pod: memory_limit_bytes / core_limit_percent, or null Json.
  Json scheduler_pod(const std::string& uid) {
    auto pod = scheduler_->pod(uid);
    return pod.ok() ? pod.value() : Json();
  }
  bool scheduler_has(const std::string& uid, std::optional<std::uint64_t> memory,
                     std::optional<int> core) {
    Json pod = scheduler_pod(uid);
    if (pod.is_null()) return false;
    const Json* memory_value = pod.find("memory_limit_bytes");
    const Json* core_value = pod.find("core_limit_percent");
    if (memory_value == nullptr || core_value == nullptr) return false;
    const bool memory_ok = memory ? memory_value->as_int64() == static_cast<std::int64_t>(*memory)
                                  : memory_value->is_null();
    const bool core_ok = core ? core_value->as_int64() == *core : core_value->is_null();
    return memory_ok && core_ok;
  }
  bool scheduler_lacks(const std::string& uid) {
    auto pod = scheduler_->pod(uid);
    return pod.ok() && pod.value().is_null();
  }

  std::string describe(const std::string& uid) { return scheduler_pod(uid).dump(); }

  std::string dir_;
  std::string kubeconfig_;
  std::unique_ptr<FakeApiServer> server_;
  std::unique_ptr<SchedulerProcess> scheduler_;
  std::unique_ptr<PodWatcher> watcher_;
};

TEST_F(PodWatcherTest, ListPushesTheLimitsOfManagedPodsOnThisNode) {
  start_scheduler();
  server_->add_pod(make_pod(kUidA, "trainer", kNode, {{kMemory, "4Gi"}, {kCore, "30"}}));
  server_->add_pod(make_pod(kUidB, "cpu-only", kNode, {{kMemory, "1Gi"}}, false));
  server_->add_pod(make_pod(kUidC, "elsewhere", "node-b", {{kMemory, "2Gi"}}));
  server_->add_pod(make_pod(kUidD, "plain", kNode, {}));
  start_watcher();

  ASSERT_TRUE(eventually([&] { return scheduler_has(kUidA, 4 * kGi, 30); })) << describe(kUidA);
  ASSERT_TRUE(eventually([&] { return scheduler_has(kUidD, std::nullopt, std::nullopt); }))
      << describe(kUidD);
  EXPECT_TRUE(scheduler_lacks(kUidB));
  EXPECT_TRUE(scheduler_lacks(kUidC));
  Json pod = scheduler_pod(kUidA);
  EXPECT_EQ(*pod.find("namespace")->as_string(), "ml");
  EXPECT_EQ(*pod.find("name")->as_string(), "trainer");
  EXPECT_EQ(watcher_->memory_limits_by_pod_uid(),
            (std::map<std::string, std::uint64_t>{{kUidA, 4 * kGi}}));
  EXPECT_EQ(watcher_->core_limits_by_pod_uid(), (std::map<std::string, int>{{kUidA, 30}}));

  const auto requests = server_->requests();
  ASSERT_FALSE(requests.empty());
  EXPECT_EQ(requests[0].method, "GET");
  EXPECT_EQ(requests[0].path, "/api/v1/pods");
  EXPECT_EQ(requests[0].query.at("fieldSelector"), "spec.nodeName=node-a");
  EXPECT_EQ(requests[0].headers.at("authorization"), "Bearer test-token");
  ASSERT_TRUE(watching());
  const auto watch = server_->watch_requests().at(0);
  EXPECT_EQ(watch.query.at("resourceVersion"), std::to_string(server_->resource_version()));
  EXPECT_EQ(watch.query.at("allowWatchBookmarks"), "true");
  EXPECT_EQ(watch.query.at("timeoutSeconds"), "300");
  EXPECT_EQ(watch.query.at("fieldSelector"), "spec.nodeName=node-a");
  EXPECT_TRUE(watcher_->stats().synced);
}

TEST_F(PodWatcherTest, WatchEventsAddModifyDeleteAndBookmark) {
  start_scheduler();
  start_watcher();
  ASSERT_TRUE(watching());

  server_->add_pod(make_pod(kUidA, "trainer", kNode, {{kMemory, "2Gi"}}));
  ASSERT_TRUE(eventually([&] { return scheduler_has(kUidA, 2 * kGi, std::nullopt); }))
      << describe(kUidA);
  const auto changed = std::chrono::steady_clock::now();
  server_->modify_pod(make_pod(kUidA, "trainer", kNode, {{kMemory, "3Gi"}, {kCore, "50%"}}));
  ASSERT_TRUE(eventually([&] { return scheduler_has(kUidA, 3 * kGi, 50); })) << describe(kUidA);
  // Reported, not asserted: from the API change to the scheduler's record (status polled every 10
  // ms).
  const auto latency = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::now() - changed);
  RecordProperty("annotation_to_scheduler_ms", static_cast<int>(latency.count()));
  std::printf("annotation change reached the scheduler in %lld ms\n",
              static_cast<long long>(latency.count()));
  EXPECT_EQ(watcher_->memory_limits_by_pod_uid().at(kUidA), 3 * kGi);

  // A bookmark advances the version the next watch starts from.
  const std::string bookmark = server_->bookmark();
  ASSERT_TRUE(eventually([&] { return watcher_->stats().resource_version == bookmark; }));
  const std::size_t watches_before = server_->watch_requests().size();
  server_->end_watches();
  ASSERT_TRUE(eventually([&] { return server_->watch_requests().size() > watches_before; }));
  EXPECT_EQ(server_->watch_requests().at(watches_before).query.at("resourceVersion"), bookmark);

  server_->delete_pod(kUidA);
  ASSERT_TRUE(eventually([&] { return scheduler_lacks(kUidA); })) << describe(kUidA);
  EXPECT_TRUE(watcher_->memory_limits_by_pod_uid().empty());
  EXPECT_EQ(watcher_->stats().lists, 1u);
}

// The memory mode annotation reaches the scheduler's pod record, follows changes, and an invalid
// value keeps the previous mode.
TEST_F(PodWatcherTest, TheMemoryModeAnnotationReachesTheScheduler) {
  start_scheduler();
  start_watcher();
  ASSERT_TRUE(watching());
  const auto mode_of = [&] {
    Json pod = scheduler_pod(kUidA);
    const Json* mode = pod.find("memory_mode");
    return mode != nullptr && mode->as_string() != nullptr ? *mode->as_string() : std::string();
  };
  server_->add_pod(make_pod(kUidA, "trainer", kNode, {{kMode, "unified"}}));
  ASSERT_TRUE(eventually([&] { return mode_of() == "unified"; })) << describe(kUidA);
  server_->modify_pod(make_pod(kUidA, "trainer", kNode, {{kMode, "paged"}}));
  server_->modify_pod(make_pod(kUidA, "trainer", kNode, {{kMode, "paged"}, {kCore, "40"}}));
  ASSERT_TRUE(eventually([&] { return scheduler_has(kUidA, std::nullopt, 40); }))
      << describe(kUidA);
  EXPECT_EQ(mode_of(), "unified");  // the invalid value kept the previous mode
  server_->modify_pod(make_pod(kUidA, "trainer", kNode, {{kMode, "plain"}}));
  ASSERT_TRUE(eventually([&] { return mode_of() == "plain"; })) << describe(kUidA);
  server_->modify_pod(make_pod(kUidA, "trainer", kNode, {}));
  ASSERT_TRUE(eventually([&] { return mode_of().empty(); })) << describe(kUidA);
}

TEST_F(PodWatcherTest, FinishedPodsAreForgotten) {
  start_scheduler();
  start_watcher();
  ASSERT_TRUE(watching());
  server_->add_pod(make_pod(kUidA, "job", kNode, {{kCore, "20"}}));
  ASSERT_TRUE(eventually([&] { return scheduler_has(kUidA, std::nullopt, 20); }));
  json done = make_pod(kUidA, "job", kNode, {{kCore, "20"}});
  done["status"]["phase"] = "Succeeded";
  server_->modify_pod(done);
  ASSERT_TRUE(eventually([&] { return scheduler_lacks(kUidA); })) << describe(kUidA);
  EXPECT_TRUE(watcher_->core_limits_by_pod_uid().empty());
}

class GoneTest : public PodWatcherTest,
                 public ::testing::WithParamInterface<FakeApiServer::GoneStyle> {};

TEST_P(GoneTest, TooOldVersionRelists) {
  server_->set_gone_style(GetParam());
  start_scheduler();
  server_->add_pod(make_pod(kUidA, "a", kNode, {{kMemory, "1Gi"}}));
  server_->add_pod(make_pod(kUidB, "b", kNode, {{kMemory, "1Gi"}}));
  start_watcher();
  ASSERT_TRUE(eventually([&] { return scheduler_has(kUidB, kGi, std::nullopt); }));
  ASSERT_TRUE(watching());

  // Changes whose events were compacted away: only a relist can see them.
  server_->replace_pod_unseen(make_pod(kUidA, "a", kNode, {{kMemory, "5Gi"}}));
  server_->delete_pod_unseen(kUidB);
  server_->expire_history();
  server_->end_watches();

  ASSERT_TRUE(eventually([&] { return scheduler_has(kUidA, 5 * kGi, std::nullopt); }))
      << describe(kUidA);
  ASSERT_TRUE(eventually([&] { return scheduler_lacks(kUidB); })) << describe(kUidB);
  EXPECT_GE(watcher_->stats().relists_gone, 1u);
  // The list is counted once all of it is handled, which may be after the pushes.
  EXPECT_TRUE(eventually([&] { return watcher_->stats().lists >= 2u; }));
  EXPECT_EQ(watcher_->memory_limits_by_pod_uid(),
            (std::map<std::string, std::uint64_t>{{kUidA, 5 * kGi}}));
}

INSTANTIATE_TEST_SUITE_P(Styles, GoneTest,
                         ::testing::Values(FakeApiServer::GoneStyle::kHttpStatus,
                                           FakeApiServer::GoneStyle::kErrorEvent),
                         [](const auto& info) {
                           return info.param == FakeApiServer::GoneStyle::kHttpStatus
                                      ? std::string("HttpStatus")
                                      : std::string("ErrorEvent");
                         });

TEST_F(PodWatcherTest, DroppedConnectionResumesFromTheLastVersion) {
  start_scheduler();
  start_watcher();
  ASSERT_TRUE(watching());
  const std::string last = server_->add_pod(make_pod(kUidA, "a", kNode, {{kMemory, "1Gi"}}));
  ASSERT_TRUE(eventually([&] { return scheduler_has(kUidA, kGi, std::nullopt); }));
  ASSERT_TRUE(eventually([&] { return watcher_->stats().resource_version == last; }));
  const std::size_t watches_before = server_->watch_requests().size();

  server_->drop_watches();
  ASSERT_TRUE(eventually([&] { return server_->watch_requests().size() > watches_before; }));
  EXPECT_EQ(server_->watch_requests().at(watches_before).query.at("resourceVersion"), last);
  ASSERT_TRUE(watching());
  server_->modify_pod(make_pod(kUidA, "a", kNode, {{kMemory, "6Gi"}}));
  ASSERT_TRUE(eventually([&] { return scheduler_has(kUidA, 6 * kGi, std::nullopt); }));
  EXPECT_EQ(watcher_->stats().lists, 1u);  // resumed, not relisted
  EXPECT_GE(watcher_->stats().api_errors, 1u);
}

TEST_F(PodWatcherTest, InvalidAnnotationPostsOneWarningAndKeepsTheLimit) {
  start_scheduler();
  start_watcher();
  ASSERT_TRUE(watching());
  server_->add_pod(make_pod(kUidA, "trainer", kNode, {{kMemory, "4Gi"}, {kCore, "30"}}));
  ASSERT_TRUE(eventually([&] { return scheduler_has(kUidA, 4 * kGi, 30); }));

  server_->modify_pod(make_pod(kUidA, "trainer", kNode, {{kMemory, "4GB"}, {kCore, "30"}}));
  ASSERT_TRUE(eventually([&] { return server_->posted_events().size() == 1; }));
  const json event = server_->posted_events()[0];
  EXPECT_EQ(event["type"], "Warning");
  EXPECT_EQ(event["reason"], "InvalidNvshareAnnotation");
  EXPECT_EQ(event["involvedObject"]["kind"], "Pod");
  EXPECT_EQ(event["involvedObject"]["apiVersion"], "v1");
  EXPECT_EQ(event["involvedObject"]["uid"], kUidA);
  EXPECT_EQ(event["involvedObject"]["name"], "trainer");
  EXPECT_EQ(event["involvedObject"]["namespace"], "ml");
  EXPECT_EQ(event["metadata"]["namespace"], "ml");
  EXPECT_EQ(event["source"]["component"], "nvshare-device-plugin");
  const std::string message = event["message"];
  EXPECT_NE(message.find(kMemory), std::string::npos) << message;
  EXPECT_NE(message.find("\"4GB\""), std::string::npos) << message;
  EXPECT_NE(message.find("suffix"), std::string::npos) << message;
  const auto posts = server_->requests();
  EXPECT_TRUE(std::any_of(posts.begin(), posts.end(), [](const auto& r) {
    return r.method == "POST" && r.path == "/api/v1/namespaces/ml/events";
  }));
  EXPECT_TRUE(scheduler_has(kUidA, 4 * kGi, 30)) << describe(kUidA);
  EXPECT_EQ(watcher_->memory_limits_by_pod_uid().at(kUidA), 4 * kGi);

  // Another change with the same invalid value: the valid field moves, no second warning.
  server_->modify_pod(make_pod(kUidA, "trainer", kNode, {{kMemory, "4GB"}, {kCore, "40"}}));
  ASSERT_TRUE(eventually([&] { return scheduler_has(kUidA, 4 * kGi, 40); }));
  // A different invalid value, and an invalid core: warned again.
  server_->modify_pod(make_pod(kUidA, "trainer", kNode, {{kMemory, "lots"}, {kCore, "150"}}));
  ASSERT_TRUE(eventually([&] { return server_->posted_events().size() == 3; }));
  EXPECT_TRUE(scheduler_has(kUidA, 4 * kGi, 40)) << describe(kUidA);
  EXPECT_EQ(server_->posted_events().size(), 3u);
  // The server records an event before the watcher has read the answer.
  EXPECT_TRUE(eventually([&] { return watcher_->stats().warnings_posted == 3u; }));
  // The API server's own validation accepted every one.
  EXPECT_TRUE(server_->refused_events().empty()) << server_->refused_events()[0].dump();
}

// Events people can act on: a pod whose allocations its memory limit refused, and a pod that waits
// for its compute cap most of the time, each get one Warning Event (pod_alerts.h).
TEST_F(PodWatcherTest, RefusedAllocationsAndALongThrottlePostWarnings) {
  // The test process is in no pod: the scheduler takes the pod UID from the hello.
  start_scheduler({"--gpus", "GPU-alerts=80Gi", "--trust-client-limits"});
  PodWatcherConfig c = config();
  c.status_interval = 100ms;
  c.alerts.throttle_window = 1s;
  start_watcher(c);
  ASSERT_TRUE(watching());
  server_->add_pod(make_pod(kUidA, "trainer", kNode, {{kMemory, "4Gi"}, {kCore, "30"}}));
  ASSERT_TRUE(eventually([&] { return scheduler_has(kUidA, 4 * kGi, 30); }));

  auto client = testing::ProtocolClient::connect(scheduler_->socket());
  ASSERT_TRUE(client.ok()) << client.error().message;
  ASSERT_TRUE(client.value().hello(testing::hello_for("GPU-alerts", kUidA)).ok());
  protocol::Usage usage;
  usage.allocated_bytes = kGi;
  usage.resident_bytes = kGi;
  usage.refused_allocations = 3;
  ASSERT_TRUE(client.value().send(usage).ok());
  auto reason_posted = [&](const std::string& reason) -> std::optional<json> {
    for (const json& e : server_->posted_events()) {
      if (e["reason"] == reason) return e;
    }
    return std::nullopt;
  };
  ASSERT_TRUE(eventually([&] { return reason_posted("GpuMemoryLimitReached").has_value(); }));
  const json refused = *reason_posted("GpuMemoryLimitReached");
  EXPECT_EQ(refused["type"], "Warning");
  EXPECT_EQ(refused["involvedObject"]["uid"], kUidA);
  EXPECT_EQ(refused["involvedObject"]["name"], "trainer");
  const std::string message = refused["message"];
  EXPECT_NE(message.find("3 GPU memory allocation(s) refused"), std::string::npos) << message;
  EXPECT_NE(message.find("4Gi"), std::string::npos) << message;
  EXPECT_EQ(reason_posted("GpuComputeThrottled"), std::nullopt);  // it has not run yet

  // Always busy under its 30% cap: it waits for the cap about 70% of the time.
  ASSERT_TRUE(client.value().send(protocol::Request{}).ok());
  const auto until = std::chrono::steady_clock::now() + 15s;
  while (!reason_posted("GpuComputeThrottled") && std::chrono::steady_clock::now() < until) {
    auto frame = client.value().next(100ms);
    if (!frame) continue;
    if (const auto* revoke = std::get_if<protocol::Revoke>(&frame.value())) {
      if (revoke->reason != protocol::RevokeReason::kYield) {
        ASSERT_TRUE(client.value().send(protocol::Released{revoke->epoch, 0, 0}).ok());
      }
    }
  }
  const std::optional<json> throttled = reason_posted("GpuComputeThrottled");
  ASSERT_TRUE(throttled.has_value()) << watcher_->stats().status_reads << " status reads";
  const std::string text = (*throttled)["message"];
  EXPECT_NE(text.find("compute cap of 30%"), std::string::npos) << text;
  // One of each: more refusals within the repeat interval are counted, not posted.
  usage.refused_allocations = 5;
  ASSERT_TRUE(client.value().send(usage).ok());
  EXPECT_TRUE(eventually([&] { return watcher_->stats().alerts_suppressed > 0; }));
  EXPECT_EQ(server_->posted_events().size(), 2u);
  EXPECT_EQ(watcher_->stats().alerts_raised, 2u);
  EXPECT_TRUE(server_->refused_events().empty()) << server_->refused_events()[0].dump();
}

TEST_F(PodWatcherTest, RemovingAnAnnotationRemovesThatLimit) {
  start_scheduler();
  start_watcher();
  ASSERT_TRUE(watching());
  server_->add_pod(make_pod(kUidA, "trainer", kNode, {{kMemory, "4Gi"}, {kCore, "30"}}));
  ASSERT_TRUE(eventually([&] { return scheduler_has(kUidA, 4 * kGi, 30); }));
  server_->modify_pod(make_pod(kUidA, "trainer", kNode, {{kCore, "30"}}));
  ASSERT_TRUE(eventually([&] { return scheduler_has(kUidA, std::nullopt, 30); }))
      << describe(kUidA);
  EXPECT_TRUE(watcher_->memory_limits_by_pod_uid().empty());
  server_->modify_pod(make_pod(kUidA, "trainer", kNode, {}));
  ASSERT_TRUE(eventually([&] { return scheduler_has(kUidA, std::nullopt, std::nullopt); }))
      << describe(kUidA);
}

TEST_F(PodWatcherTest, PodsWithoutTheResourceAreIgnored) {
  start_scheduler();
  PodWatcherConfig custom = config();
  custom.resource_name = "example.com/vgpu";
  start_watcher(custom);
  ASSERT_TRUE(watching());
  server_->add_pod(make_pod(kUidPlain, "p", kNode, {{kMemory, "bogus"}}, true));
  server_->add_pod(make_pod(kUidMine, "m", kNode, {{kMemory, "1Gi"}}, true, "example.com/vgpu"));
  // Events are handled in order: once the second pod is in, the first was already looked at.
  ASSERT_TRUE(eventually([&] { return scheduler_has(kUidMine, kGi, std::nullopt); }));
  EXPECT_TRUE(scheduler_lacks(kUidPlain));
  EXPECT_TRUE(server_->posted_events().empty());
  EXPECT_EQ(watcher_->memory_limits_by_pod_uid(),
            (std::map<std::string, std::uint64_t>{{kUidMine, kGi}}));
}

TEST_F(PodWatcherTest, SchedulerThatComesBackGetsEverythingAgain) {
  // Not running yet: pushes are retried until it appears.
  server_->add_pod(make_pod(kUidA, "a", kNode, {{kMemory, "2Gi"}, {kCore, "25"}}));
  start_watcher();
  ASSERT_TRUE(eventually([&] { return watcher_->stats().push_failures > 0; }));
  EXPECT_EQ(watcher_->memory_limits_by_pod_uid().at(kUidA), 2 * kGi);
  start_scheduler();
  ASSERT_TRUE(eventually([&] { return scheduler_has(kUidA, 2 * kGi, 25); })) << describe(kUidA);

  // A restarted scheduler remembers nothing; the watcher notices and pushes again.
  scheduler_->kill_and_wait();
  scheduler_.reset();
  start_scheduler();
  ASSERT_TRUE(eventually([&] { return scheduler_has(kUidA, 2 * kGi, 25); })) << describe(kUidA);
}

TEST_F(PodWatcherTest, StopReturnsPromptlyWhileWatching) {
  start_scheduler();
  start_watcher();
  ASSERT_TRUE(watching());
  const auto began = std::chrono::steady_clock::now();
  watcher_->stop();
  const auto took = std::chrono::steady_clock::now() - began;
  std::printf(
      "stop() took %lld ms\n",
      static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(took).count()));
  // The watch would run for 300 s; a stop that waited for it would blow far past this bound.
  EXPECT_LT(took, 10s);
  EXPECT_TRUE(eventually([&] { return server_->open_watches() == 0; }));
  watcher_->stop();  // idempotent
}

TEST_F(PodWatcherTest, StopReturnsPromptlyWhileBackingOff) {
  PodWatcherConfig custom = config();
  custom.backoff_initial = 60s;
  custom.backoff_max = 60s;
  server_.reset();  // nothing listens: the first list fails and the watcher waits a minute
  start_watcher(custom);
  std::this_thread::yield();
  const auto began = std::chrono::steady_clock::now();
  watcher_->stop();
  EXPECT_LT(std::chrono::steady_clock::now() - began, 10s);
}

TEST_F(PodWatcherTest, StartRejectsBadConfiguration) {
  PodWatcherConfig no_node = config();
  no_node.node_name.clear();
  EXPECT_FALSE(PodWatcher(no_node).start().ok());
  PodWatcherConfig bad_timeout = config();
  bad_timeout.watch_timeout = 0s;
  EXPECT_FALSE(PodWatcher(bad_timeout).start().ok());
  PodWatcherConfig missing = config();
  missing.kubeconfig_path = dir_ + "/missing";
  Status status = PodWatcher(missing).start();
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.error().message.find("missing"), std::string::npos);
  PodWatcherConfig in_cluster = config();
  in_cluster.kubeconfig_path.clear();
  in_cluster.in_cluster_host = "127.0.0.1";
  in_cluster.in_cluster_port = "1";
  in_cluster.service_account_dir = dir_ + "/no-sa";
  EXPECT_FALSE(PodWatcher(in_cluster).start().ok());
}

// The API server speaks TLS and wants the token: a kubeconfig with another token gets 401s and
// nothing reaches the scheduler; one that does not trust the server's CA never gets a request
// through (the TLS handshake fails before any HTTP).
TEST_F(PodWatcherTest, TheApiServerWantsTheTokenAndTheCa) {
  start_scheduler();
  server_->add_pod(make_pod(kUidA, "trainer", kNode, {{kMemory, "4Gi"}}));
  std::ofstream(kubeconfig_) << server_->kubeconfig("another-token");
  start_watcher();
  ASSERT_TRUE(eventually([&] { return watcher_->stats().api_errors >= 2; }));
  EXPECT_FALSE(watcher_->stats().synced);
  EXPECT_TRUE(scheduler_lacks(kUidA));
  const auto requests = server_->requests();
  ASSERT_FALSE(requests.empty());
  EXPECT_EQ(requests[0].headers.at("authorization"), "Bearer another-token");
  watcher_.reset();

  auto other = FakeApiServer::start();
  ASSERT_TRUE(other.ok()) << other.error().message;
  std::string text = other.value()->kubeconfig("test-token");  // another server's CA ...
  const std::string server_line = "server: " + other.value()->url();
  text.replace(text.find(server_line), server_line.size(), "server: " + server_->url());
  std::ofstream(kubeconfig_) << text;  // ... for this server
  const std::size_t before = server_->requests().size();
  start_watcher();
  ASSERT_TRUE(eventually([&] { return watcher_->stats().api_errors >= 2; }));
  EXPECT_EQ(server_->requests().size(), before);
  EXPECT_TRUE(scheduler_lacks(kUidA));
}

// What the fake's Event validation refuses, as the API server's does.
TEST(FakeApiServerEvents, RefusesWhatTheApiServerRefuses) {
  const json valid = {
      {"apiVersion", "v1"},
      {"kind", "Event"},
      {"metadata", {{"generateName", "trainer."}, {"namespace", "ml"}}},
      {"involvedObject", {{"kind", "Pod"}, {"name", "trainer"}, {"namespace", "ml"}}},
      {"reason", "InvalidNvshareAnnotation"},
      {"type", "Warning"}};
  EXPECT_EQ(check_event(valid, "ml"), std::nullopt);
  const auto refused = [&](json event, const std::string& path_namespace, int code,
                           const std::string& why) {
    const auto verdict = check_event(event, path_namespace);
    if (!verdict) return ::testing::AssertionFailure() << "accepted " << event.dump();
    if (verdict->first != code || verdict->second.find(why) == std::string::npos) {
      return ::testing::AssertionFailure() << verdict->first << " " << verdict->second;
    }
    return ::testing::AssertionSuccess();
  };
  EXPECT_TRUE(refused(valid, "other", 400, "does not match the namespace sent on the request"));
  json event = valid;
  event["metadata"].erase("generateName");
  EXPECT_TRUE(refused(event, "ml", 400, "name or generateName is required"));
  event = valid;
  event["involvedObject"]["namespace"] = "elsewhere";
  EXPECT_TRUE(refused(event, "ml", 422, "does not match event.namespace"));
  event = valid;
  event["reportingController"] = "nvshare";  // the JSON name is reportingComponent
  EXPECT_TRUE(refused(event, "ml", 400, "unknown field \"reportingController\""));
  event = valid;
  event["metadata"]["generateName"] = "Trainer_";
  EXPECT_TRUE(refused(event, "ml", 422, "metadata.name"));
  event = valid;
  event["eventTime"] = "2026-11-24T00:00:00.000000Z";  // a new-style event needs more
  EXPECT_TRUE(refused(event, "ml", 422, "reportingComponent: Required value"));
  event["reportingComponent"] = "nvshare-device-plugin";
  event["reportingInstance"] = "node-a";
  event["action"] = "Validate";
  event["message"] = std::string(1025, 'x');
  EXPECT_TRUE(refused(event, "ml", 422, "message: can have at most 1024 characters"));
}

}  // namespace
}  // namespace nvshare::podwatcher
